"""Core layers against NumPy re-statements of Trax's formulas (rtol 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance

RTOL = 1e-5


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def jcall(layer, x, rng=None):
  """layer(x) through a jitted pure_fn (one compile instead of op-by-op)."""
  rng = layer.rng if rng is None else rng
  return jax.jit(layer.pure_fn)(x, layer.weights, layer.state, rng)[0]


def np_log_softmax(x, axis=-1):
  x = np.asarray(x, np.float64)
  m = x.max(axis=axis, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# --- Dense -------------------------------------------------------------------


def test_dense_matches_numpy_affine_map():
  layer = core.Dense(5)
  x = randn(2, 3, 4)
  (w, b), state = layer.init(shapes.signature(x))
  assert (w.shape, b.shape, w.dtype, state) == ((4, 5), (5,), jnp.float32, ())
  ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64) + np.asarray(b)
  np.testing.assert_allclose(layer(x), ref, rtol=RTOL, atol=1e-6)


def test_dense_without_bias_and_with_given_weights():
  layer = core.Dense(4, use_bias=False)
  x = np.array([2., 5., 3.], np.float32)
  layer.init(shapes.signature(x))
  assert layer.weights.shape == (3, 4)
  w = np.array([[100, 200, 300, 400], [10, 10, 10, 10], [1, 2, 1, 2]],
               np.float32)
  assert layer(x, weights=w).tolist() == [253, 456, 653, 856]


def test_dense_bfloat16_weights_and_repr():
  layer = core.Dense(3, use_bfloat16=True)
  w, b = layer.init(ShapeDtype((2, 4)))[0]
  assert w.dtype == jnp.bfloat16 and b.dtype == jnp.bfloat16
  assert repr(core.Dense(7)) == 'Dense_7'


def test_dense_bias_initializer_is_tiny_normal():
  layer = core.Dense(1000)
  _, b = layer.init(ShapeDtype((1, 2)))[0]
  assert 0.5e-6 < float(jnp.std(b)) < 1.5e-6


def test_separate_instances_have_separate_weights():
  model = cb.Serial(core.Dense(5), core.Dense(5))
  model.init(ShapeDtype((5,)))
  assert not np.array_equal(model.sublayers[0].weights[0],
                            model.sublayers[1].weights[0])


def test_dense_call_before_init_raises_layer_error():
  with pytest.raises(base.LayerError, match='layer.init'):
    core.Dense(5)(np.ones(3, np.float32))


# --- Embedding ------------------------------------------------------------------


def test_embedding_looks_up_rows_and_clips_ids():
  layer = core.Embedding(10, 3)
  w, _ = layer.init(None)  # Trax allows init(None) for Embedding.
  assert w.shape == (10, 3)
  ids = np.array([[2, 3, 5], [0, -2, 12]])
  y = layer(ids)
  assert y.shape == (2, 3, 3)
  table = np.asarray(w)
  np.testing.assert_array_equal(y, table[np.clip(ids, 0, 9)])
  assert repr(layer) == 'Embedding_10_3'


def test_embedding_explicit_initializer_and_bfloat16():
  def f(shape, rng):
    del rng
    return np.arange(np.prod(shape)).reshape(shape).astype(np.float32)
  layer = core.Embedding(5, 2, kernel_initializer=f)
  layer.init(ShapeDtype((5,), np.int32))
  assert layer(np.array([0, 1, 2, 3, 4])).tolist() == [
      [0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  layer = core.Embedding(5, 2, use_bfloat16=True)
  w, _ = layer.init(ShapeDtype((3,), np.int32))
  assert w.dtype == jnp.bfloat16
  assert layer(np.array([1, 2, 3])).dtype == jnp.float32


def test_embedding_default_init_is_uniform_fan_out():
  layer = core.Embedding(2000, 50)
  w, _ = layer.init(None, rng=jax.random.PRNGKey(0))
  lim = np.sqrt(3. / 50)  # fan_out = d_feature, scale 1
  assert float(jnp.max(jnp.abs(w))) <= lim
  np.testing.assert_allclose(float(jnp.var(w)), 1. / 50, rtol=0.05)


# --- Dropout -------------------------------------------------------------------


def test_dropout_train_statistics_and_scaling():
  rate = 0.1
  layer = core.Dropout(rate=rate, mode='train')
  _, state = layer.init(ShapeDtype((2, 5, 1000)))
  assert state.dtype == jnp.float32 and float(state) == pytest.approx(rate)
  x = np.ones((2, 5, 1000), np.float32)
  y = np.asarray(layer(x, rng=jax.random.PRNGKey(0)))
  n_kept = np.count_nonzero(y)
  # Binomial(10000, 0.9): mean 9000, sigma 30; 4 sigma is a 6e-5 flake rate.
  assert abs(n_kept - 9000) < 4 * 30
  np.testing.assert_allclose(y[y != 0], 1 / (1 - rate), rtol=RTOL)


def test_dropout_mask_is_trax_bernoulli_draw():
  layer = core.Dropout(rate=0.3)
  x = randn(4, 6)
  key = jax.random.PRNGKey(42)
  keep = np.asarray(jax.random.bernoulli(key, 0.7, (4, 6)))
  np.testing.assert_allclose(jcall(layer, x, rng=key), x * keep / 0.7,
                             rtol=RTOL)


def test_dropout_shared_axes_share_the_mask():
  layer = core.Dropout(rate=0.5, shared_axes=[1])
  x = np.ones((3, 7, 5), np.float32)
  y = np.asarray(jcall(layer, x, rng=jax.random.PRNGKey(1)))
  assert np.all(y == y[:, :1, :])  # one mask value along axis 1
  assert 0 < np.count_nonzero(y[:, 0, :]) < 15


def test_dropout_is_identity_outside_train_and_at_rate_zero():
  x = randn(2, 5)
  for layer in (core.Dropout(0.5, mode='eval'), core.Dropout(0.5, mode='predict'),
                core.Dropout(0.0)):
    np.testing.assert_array_equal(layer(x), x)
  assert core.Dropout(0.1).init(None)[0] == ()
  with pytest.raises(ValueError, match=r'\[0, 1\)'):
    core.Dropout(1.0)


def test_dropout_rate_from_state_dict():
  layer = core.Dropout(rate=0.5)
  x = np.ones((100,), np.float32)
  y = layer(x, state={'Dropout': 0.0}, rng=jax.random.PRNGKey(0))
  np.testing.assert_array_equal(y, x)


# --- Weights, RandomUniform, shapes ----------------------------------------------


def test_weights_layer():
  layer = core.Weights(lambda shape, rng: jnp.zeros(shape, jnp.float32))
  assert (layer.n_in, layer.n_out) == (0, 1)
  layer.init(())
  assert layer(()).tolist() == 0.
  layer = core.Weights(init.RandomNormalInitializer(), (5, 10, 3))
  layer.init(())
  assert layer(()).shape == (5, 10, 3)
  assert repr(layer) == 'Weights_(5, 10, 3)_in0'
  layer = core.Weights(init.RandomNormalInitializer(), (2,), use_bfloat16=True)
  assert layer.init(())[0].dtype == jnp.bfloat16


def test_random_uniform_layer():
  layer = core.RandomUniform(1., 2., shape=(1000,))
  y = np.asarray(layer((), rng=jax.random.PRNGKey(0)))
  assert y.shape == (1000,) and y.min() >= 1. and y.max() < 2.
  assert 1.45 < y.mean() < 1.55


def test_flatten():
  x = np.ones((1, 2, 3, 4, 5))
  assert core.Flatten()(x).shape == (1, 120)
  assert core.Flatten(n_axes_to_keep=3)(x).shape == (1, 2, 3, 20)
  assert core.Flatten(n_axes_to_keep=4)(x).shape == (1, 2, 3, 4, 5)
  with pytest.raises(base.LayerError, match='must exceed'):
    core.Flatten(n_axes_to_keep=5)(x)
  assert repr(core.Flatten(2)) == 'Flatten_keep2'


# --- softmax family and reductions ------------------------------------------------


def test_log_softmax_softmax_logsumexp():
  x = np.array([[2., 1., -10.], [1., 1., -10.]], np.float32)
  np.testing.assert_allclose(jcall(core.LogSoftmax(), x), np_log_softmax(x),
                             **float32_tolerance(rtol=RTOL, atol=0))
  np.testing.assert_allclose(jax.jit(core.log_softmax)(x),
                             [[-0.313, -1.313, -12.313],
                              [-0.693, -0.693, -11.693]], atol=.001)
  np.testing.assert_allclose(jcall(core.Softmax(), x),
                             np.exp(np_log_softmax(x)),
                             **float32_tolerance(rtol=RTOL, atol=0))
  y = randn(3, 4, 5)
  np.testing.assert_allclose(jcall(core.LogSoftmax(axis=1), y),
                             np_log_softmax(y, axis=1),
                             **float32_tolerance(rtol=RTOL, atol=1e-6))
  lse = np.log(np.exp(np.asarray(y, np.float64)).sum(axis=0, keepdims=True))
  np.testing.assert_allclose(jcall(core.LogSumExp(axis=0), y), lse,
                             **float32_tolerance(rtol=RTOL, atol=0))
  assert jcall(core.LogSumExp(), y).shape == (3, 4, 1)


def test_to_float_and_reductions():
  x = np.array([[3., 5.], [2., 6.]], np.float32)
  assert core.ToFloat()(np.array([1, 2])).dtype == jnp.float32
  assert core.Min()(x).tolist() == [3., 2.]
  assert core.Min(axis=0)(x).tolist() == [2., 5.]
  assert core.Min(axis=None)(x).tolist() == 2.
  assert core.Min(keepdims=True)(x).tolist() == [[3.], [2.]]
  assert core.Max()(x).tolist() == [5., 6.]
  assert core.Max(axis=0, keepdims=True)(x).tolist() == [[3., 6.]]
  assert core.Max(axis=None)(x).tolist() == 6.
  assert core.Mean()(x).tolist() == [4., 4.]
  assert core.Mean(axis=0, keepdims=True)(x).tolist() == [[2.5, 5.5]]
  assert core.Sum()(x).tolist() == 16.
  assert core.Sum(axis=1, keepdims=True)(x).tolist() == [[8.], [8.]]
  assert core.Negate()(x).tolist() == [[-3., -5.], [-2., -6.]]


def test_argmax_and_threshold_to_binary():
  x = np.array([[.10, .90, .20, .80], [.22, .88, .11, .99]])
  assert core.ArgMax()(x).tolist() == [1, 3]
  assert core.ArgMax(axis=0)(x).tolist() == [1, 0, 0, 1]
  y = core.ThresholdToBinary()(np.array([.30, .49, .50, .51, .70]))
  assert y.tolist() == [0, 0, 0, 1, 1] and y.dtype == jnp.int32
  assert core.ThresholdToBinary(.3)(np.array([.3, .31])).tolist() == [0, 1]


def test_stop_gradient_is_identity_with_zero_gradient():
  layer = core.StopGradient()
  x = np.array([[3., 5.], [2., 6.]], np.float32)
  assert layer(x).tolist() == x.tolist()
  grad = jax.grad(lambda x: jnp.sum(layer.pure_fn(x, layer.weights, layer.state,
                                                  None)[0] * x))(jnp.asarray(x))
  np.testing.assert_array_equal(grad, x)  # d/dx [sg(x) * x] = sg(x)
  grad = jax.grad(lambda x: jnp.sum(layer(x) ** 2))(jnp.asarray(x))
  np.testing.assert_array_equal(grad, np.zeros_like(x))
  assert repr(layer) == 'Serial[\n  StopGradient\n]'  # Trax's assert_shape wrap


def test_print_shape(capsys):
  layer = core.PrintShape(msg='here')
  x = np.ones((2, 3), np.float32)
  assert layer(x) is x
  assert capsys.readouterr().out == 'PrintShape: here: [(2, 3)[float32]]\n'
  layer = core.PrintShape(n_in=2)
  ys = layer((x, np.zeros(4, np.int32)))
  assert len(ys) == 2
  assert capsys.readouterr().out == (
      'PrintShape: : [(2, 3)[float32], (4,)[int32]]\n')
  assert repr(layer) == 'PrintShape_2_in2_out2'


# --- sequence helpers ---------------------------------------------------------------


def test_shift_right():
  x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
  assert core.ShiftRight()(x).tolist() == [[0, 1, 2, 3], [0, 5, 6, 7]]
  assert core.ShiftRight(n_positions=2)(x).tolist() == [[0, 0, 1, 2],
                                                      [0, 0, 5, 6]]
  y = randn(2, 3, 4)
  shifted = np.asarray(core.ShiftRight()(y))
  np.testing.assert_array_equal(shifted[:, 1:], y[:, :-1])
  np.testing.assert_array_equal(shifted[:, 0], 0)
  np.testing.assert_array_equal(core.ShiftRight(mode='predict')(x), x)
  assert repr(core.ShiftRight()) == 'Serial[\n  ShiftRight(1)\n]'


def test_padding_mask_and_encoder_decoder_mask():
  ids = np.array([[3, 4, 0, 0, 0], [5, 0, 2, 7, 0]])
  mask = core.PaddingMask()(ids)
  assert mask.shape == (2, 1, 1, 5) and mask.dtype == jnp.bool_
  np.testing.assert_array_equal(mask[:, 0, 0], ids != 0)
  np.testing.assert_array_equal(core.PaddingMask(pad=3)(ids)[:, 0, 0], ids != 3)
  with pytest.raises(base.LayerError, match='bs'):
    core.PaddingMask()(np.zeros((2, 3, 4), np.int32))
  dec = np.zeros((2, 3, 8), np.float32)
  enc_dec = core.EncoderDecoderMask()((dec, mask))
  assert enc_dec.shape == (2, 1, 3, 5)
  np.testing.assert_array_equal(
      enc_dec, np.broadcast_to((ids != 0)[:, None, None, :], (2, 1, 3, 5)))
  with pytest.raises(base.LayerError, match='3-D'):
    core.EncoderDecoderMask()((np.zeros((2, 3)), mask))
  assert repr(core.EncoderDecoderMask()) == 'EncoderDecoderMask_in2'


# --- functions ------------------------------------------------------------------------


def test_one_hot():
  assert core.one_hot(np.array([2, 0, 1]), 5).tolist() == [
      [0., 0., 1., 0., 0.], [1., 0., 0., 0., 0.], [0., 1., 0., 0., 0.]]
  oh = core.one_hot(np.array([[1, 3]]), 4, dtype=jnp.int32)
  assert oh.dtype == jnp.int32 and oh.tolist() == [[[0, 1, 0, 0], [0, 0, 0, 1]]]


def test_logsoftmax_sample():
  log_probs = np.log(np.array([[.1, .6, .3], [.7, .2, .1]]))
  np.random.seed(0)
  assert core.logsoftmax_sample(log_probs, temperature=0.).tolist() == [1, 0]
  draws = np.stack([core.logsoftmax_sample(log_probs) for _ in range(4000)])
  freq0 = np.bincount(draws[:, 0], minlength=3) / 4000
  np.testing.assert_allclose(freq0, [.1, .6, .3], atol=0.03)


def test_log_gaussian_pdfs():
  x = np.zeros((2, 5), np.float32)
  sigma = np.concatenate([np.eye(5)[None], 2 * np.eye(5)[None]], axis=0)
  full_pdf = jax.jit(core.log_gaussian_pdf)
  diag_pdf = jax.jit(core.log_gaussian_diag_pdf)
  prob = np.asarray(full_pdf(x, x, sigma.astype(np.float32)))
  ref = -0.5 * (5 * np.log(2 * np.pi) + np.array([0., 5 * np.log(2.)]))
  np.testing.assert_allclose(prob, ref, rtol=RTOL)
  diag = np.array([[1.] * 5, [2.] * 5], np.float32)
  np.testing.assert_allclose(diag_pdf(x, x, diag), ref, rtol=RTOL)
  xr, mu = randn(2, 5), randn(2, 5, seed=1)
  d = np.abs(randn(2, 5, seed=2)) + 0.5
  full = np.stack([np.diag(v) for v in d])
  np.testing.assert_allclose(full_pdf(xr, mu, full), diag_pdf(xr, mu, d),
                             rtol=1e-4)
