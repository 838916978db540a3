"""RNN cells and layers against NumPy loops over Trax's cell equations."""

import jax
from jax import test_util as jtu
import numpy as np
import pytest

from retrax.layers import activation_fns
from retrax.layers import base
from retrax.layers import convolution
from retrax.layers import initializers
from retrax.layers import rnn
from retrax.shapes import ShapeDtype
from retrax.shapes import signature
from tests.backend_tolerance import float32_tolerance

try:
  from tests.layers import predict_utils
except ImportError:  # tests/ is not a package: import the sibling module.
  import predict_utils

RNG = jax.random.PRNGKey(0)


def randn(*shape, seed=0, scale=1.0):
  return (scale * np.random.RandomState(seed).randn(*shape)).astype(np.float32)


def np_init(shape, rng):
  del rng
  return randn(*shape, seed=int(np.prod(shape)) % 997, scale=0.5)


def f64(x):
  return np.asarray(x, np.float64)


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


def ref_lstm_cell(x, state, w, b):
  c, h = np.split(state, 2, axis=-1)
  i, j, f, o = np.split(np.concatenate([x, h], -1) @ f64(w) + f64(b), 4, -1)
  new_c = c * sigmoid(f) + sigmoid(i) * np.tanh(j)
  new_h = np.tanh(new_c) * sigmoid(o)
  return new_h, np.concatenate([new_c, new_h], -1)


def ref_gru_cell(x, s, w1, b1, w2, b2):
  u, r = np.split(sigmoid(np.concatenate([x, s], -1) @ f64(w1) + f64(b1)), 2,
                  -1)
  c = np.concatenate([x, r * s], -1) @ f64(w2) + f64(b2)
  new_s = u * s + (1 - u) * np.tanh(c)
  return new_s, new_s


def ref_scan(cell, xs, state, *weights):
  """Runs `cell` over axis 1 with a Python loop; returns (ys, last state)."""
  ys = []
  for t in range(xs.shape[1]):
    y, state = cell(f64(xs[:, t]), state, *weights)
    ys.append(y)
  return np.stack(ys, 1), state


def jit_apply(layer, x, weights=None, state=None):
  return jax.jit(layer.pure_fn)(
      x, layer.weights if weights is None else weights,
      layer.state if state is None else state, RNG)


# --- LSTM ----------------------------------------------------------------------


def test_lstm_cell_matches_equations_and_trax_layout():
  x, state = randn(3, 4), randn(3, 10, seed=1)
  cell = rnn.LSTMCell(5, kernel_initializer=np_init, bias_initializer=np_init)
  (w, b), cell_state = cell.init(signature((x, state)))
  assert (w.shape, b.shape, cell_state) == ((9, 20), (20,), ())
  # forget_bias (1.0) is added to the whole bias at init, as in Trax.
  np.testing.assert_allclose(b, np_init((20,), None) + 1.0, rtol=1e-6)
  (h, new_state), _ = jit_apply(cell, (x, state))
  want_h, want_state = ref_lstm_cell(f64(x), f64(state), w, b)
  tol = float32_tolerance(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(h, want_h, **tol)
  np.testing.assert_allclose(new_state, want_state, **tol)
  assert repr(cell) == 'LSTMCell_in2_out2'


def test_lstm_cell_default_initializers():
  cell = rnn.LSTMCell(4)
  key = jax.random.PRNGKey(3)
  w, b = cell.init((ShapeDtype((2, 4)), ShapeDtype((2, 8))), rng=key)[0]
  key_w, key_b = jax.random.split(key, 2)
  np.testing.assert_array_equal(
      w, initializers.GlorotUniformInitializer()((8, 16), key_w))
  np.testing.assert_allclose(
      b, initializers.RandomNormalInitializer(1e-6)((16,), key_b) + 1.0,
      rtol=1e-7)


def test_lstm_runs_the_cell_over_time_from_zeros():
  x = randn(2, 6, 4)  # The zero state has twice the input depth: d = n_units.
  layer = rnn.LSTM(4)
  weights, state = layer.init(signature(x))
  assert jax.tree_util.tree_map(np.shape, weights) == (
      ((), ((), ())), (((8, 16), (16,)),), ())
  assert repr(layer) == 'LSTM_4'
  w, b = weights[1][0]
  want, _ = ref_scan(ref_lstm_cell, x, np.zeros((2, 8)), w, b)
  got, _ = jit_apply(layer, x)
  np.testing.assert_allclose(got, want,
                             **float32_tolerance(rtol=1e-5, atol=1e-6))


def test_lstm_return_state_and_initial_state():
  x, s0 = randn(2, 5, 4), randn(2, 8, seed=3)
  with_state = rnn.LSTM(4, return_state=True)
  weights = with_state.init(signature(x))[0]
  assert with_state.n_in == 1 and with_state.n_out == 2
  w, b = weights[1][0]
  (ys, last), _ = jit_apply(with_state, x)
  want_ys, want_last = ref_scan(ref_lstm_cell, x, np.zeros((2, 8)), w, b)
  tol = float32_tolerance(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ys, want_ys, **tol)
  np.testing.assert_allclose(last, want_last, **tol)

  from_stack = rnn.LSTM(4, initial_state=True)
  assert from_stack.n_in == 2 and from_stack.n_out == 1
  from_stack.init(signature((x, s0)))
  ys, _ = jit_apply(from_stack, (x, s0), weights=((weights[1][0],), ()))
  want_ys, _ = ref_scan(ref_lstm_cell, x, f64(s0), w, b)
  np.testing.assert_allclose(ys, want_ys, **tol)
  both = rnn.LSTM(4, return_state=True, initial_state=True)
  assert (both.n_in, both.n_out) == (2, 2)


def test_lstm_is_one_scan_not_an_unrolled_loop():
  layer = rnn.LSTM(3)
  weights, state = layer.init(ShapeDtype((1, 4, 3)))

  def n_eqns(length):
    jaxpr = jax.make_jaxpr(layer.pure_fn)(np.zeros((1, length, 3), np.float32),
                                          weights, state, RNG)
    assert 'scan' in str(jaxpr)
    return len(jaxpr.jaxpr.eqns)
  assert n_eqns(4) == n_eqns(40)


# --- GRU -----------------------------------------------------------------------


def test_gru_cell_and_gru_match_equations():
  x, s = randn(3, 4), randn(3, 5, seed=1)
  cell = rnn.GRUCell(5, kernel_initializer=np_init, bias_initializer=np_init)
  weights = cell.init(signature((x, s)))[0]
  assert [w.shape for w in weights] == [(9, 10), (10,), (9, 5), (5,)]
  (y, new_s), _ = jit_apply(cell, (x, s))
  want, _ = ref_gru_cell(f64(x), f64(s), *weights)
  tol = float32_tolerance(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y, want, **tol)
  np.testing.assert_allclose(new_s, want, **tol)

  xs = randn(2, 6, 4)
  layer = rnn.GRU(4)
  weights = layer.init(signature(xs))[0]
  assert repr(layer) == 'GRU_4'
  w1, b1, w2, b2 = weights[1][0]
  # Trax's GRU defaults: kernels uniform in +-0.01, forget_bias 0.
  assert np.max(np.abs(w1)) <= 0.01 and np.max(np.abs(b1)) < 1e-5
  want, _ = ref_scan(ref_gru_cell, xs, np.zeros((2, 4)), w1, b1, w2, b2)
  np.testing.assert_allclose(jit_apply(layer, xs)[0], want, **tol)


# --- convolutional GRU ---------------------------------------------------------


def ref_conv_same3(x, w, b):
  """3x3 'SAME' convolution, NHWC / HWIO, by loops over the kernel."""
  x = np.pad(f64(x), [(0, 0), (1, 1), (1, 1), (0, 0)])
  h, w_ = x.shape[1] - 2, x.shape[2] - 2
  out = np.zeros(x.shape[:1] + (h, w_) + (w.shape[-1],))
  for i in range(3):
    for j in range(3):
      out += x[:, i:i + h, j:j + w_] @ f64(w[i, j])
  return out + f64(b)


def ref_general_gru(s, weights, sigmoid_bias=0.5):
  (wg, bg), (wr, br), (wc, bc) = zip(*[iter(weights)] * 2)
  s = f64(s)
  u = sigmoid(ref_conv_same3(s, wg, bg) + sigmoid_bias)
  r = sigmoid(ref_conv_same3(s, wr, br) + sigmoid_bias)
  c = np.tanh(ref_conv_same3(r * s, wc, bc))
  return u, c, u * s + (1 - u) * c


def test_general_gru_cell_with_convolutions_matches_equations():
  s = randn(2, 4, 5, 3)
  cell = rnn.GeneralGRUCell(
      lambda: convolution.Conv(3, (3, 3), padding='SAME',
                               kernel_initializer=np_init,
                               bias_initializer=np_init),
      dropout_rate_c=0.0)
  weights = cell.init(signature(s))[0]
  leaves = jax.tree_util.tree_leaves(weights)
  assert [l.shape for l in leaves] == [(3, 3, 3, 3), (3,)] * 3
  _, _, want = ref_general_gru(s, leaves)
  np.testing.assert_allclose(jit_apply(cell, s)[0], want,
                             **float32_tolerance(rtol=1e-5, atol=1e-6))
  f = jax.jit(lambda s, w: cell.pure_fn(s, w, cell.state, RNG)[0])
  jtu.check_grads(f, (s[:1, :3, :3], weights), order=1, modes=['rev'],
                  atol=2e-2, rtol=2e-2)


def test_conv_gru_cell_drops_out_its_candidate_in_training():
  s = randn(4, 5, 5, 4)
  cell = rnn.ConvGRUCell(4)
  weights = cell.init(signature(s))[0]
  leaves = jax.tree_util.tree_leaves(weights)
  assert [l.shape for l in leaves] == [(3, 3, 4, 4), (4,)] * 3
  u, c, _ = ref_general_gru(s, leaves)
  got = f64(jit_apply(cell, s)[0])
  kept = u * f64(s) + (1 - u) * c / 0.9  # Dropout(0.1) rescales kept values.
  dropped = u * f64(s)
  is_kept = np.isclose(got, kept, rtol=1e-4, atol=1e-5)
  is_dropped = np.isclose(got, dropped, rtol=1e-4, atol=1e-5)
  assert np.all(is_kept | is_dropped)
  assert 0.03 < np.mean(is_dropped & ~is_kept) < 0.2


# --- SRU -----------------------------------------------------------------------


def test_sru_matches_equations():
  x = randn(2, 7, 4)
  layer = rnn.SRU(4)
  weights = layer.init(signature(x))[0]
  assert repr(layer) == 'SRU_4'
  w, b = weights[0][1][0]
  assert w.shape == (4, 12) and b.shape == (12,)
  r, f, y = np.split(f64(x) @ f64(w) + f64(b), 3, -1)
  r, f = sigmoid(r), sigmoid(f)
  c, cs = np.zeros((2, 4)), []
  for t in range(7):
    c = f[:, t] * c + (1 - f[:, t]) * y[:, t]
    cs.append(c)
  c = np.stack(cs, 1)
  want = c * r + f64(x) * (1 - r) * np.sqrt(3)
  tol = float32_tolerance(rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(jit_apply(layer, x)[0], want, **tol)
  with_act = rnn.SRU(4, activation=activation_fns.Tanh())
  act_weights = (weights[0],) + with_act.init(signature(x))[0][1:]
  want_act = np.tanh(c) * r + f64(x) * (1 - r) * np.sqrt(3)
  np.testing.assert_allclose(jit_apply(with_act, x, weights=act_weights)[0],
                             want_act, **tol)


def test_inner_sru_cell_and_make_zero_state():
  res, res2 = rnn.InnerSRUCell()((np.float32(2.), np.float32(.5),
                                  np.float32(4.)))
  assert float(res) == float(res2) == 4.0
  zeros = rnn.MakeZeroState(depth_multiplier=3)(np.ones((2, 5, 4), np.int32))
  assert zeros.shape == (2, 12) and zeros.dtype == np.float32
  assert not np.any(zeros)
  with pytest.raises(base.LayerError, match='rank 3 tensor .* got shape '
                     r'\(2, 4\)'):
    rnn.MakeZeroState()(np.ones((2, 4), np.float32))


def test_scan_sru_cell_with_a_mask_keeps_the_state_where_masked():
  class Portal:
    def get_layer(self):
      return base.PureLayer(lambda _: np.array([[0.]], np.float32), n_in=0,
                            name='PortalMask')
  layer = rnn.ScanSRUCell('predict', monkey_patched_mask=Portal())
  xf, f, c0 = randn(1, 3, 2), sigmoid(randn(1, 3, 2, seed=1)), randn(1, 2)
  ys, last = layer((xf, f.astype(np.float32), c0))
  # The mask [0] lands at position 1: there the state stays unchanged.
  c, want = f64(c0), []
  for t in range(3):
    c = c if t == 1 else f[:, t] * c + xf[:, t]
    want.append(c)
  tol = float32_tolerance(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ys, np.stack(want, 1), **tol)
  np.testing.assert_allclose(last, want[-1], **tol)
  with pytest.raises(ValueError, match='predict mode only'):
    rnn.ScanSRUCell('train', monkey_patched_mask=Portal())


# --- gradients, predict mode, errors --------------------------------------------


@pytest.mark.parametrize('make', [lambda: rnn.LSTM(3), lambda: rnn.GRU(3),
                                  lambda: rnn.SRU(3)],
                         ids=['LSTM', 'GRU', 'SRU'])
def test_gradients_match_finite_differences(make):
  layer = make()
  x = randn(2, 3, 3)
  w_sig, _ = layer.weights_and_state_signature(signature(x))
  weights = jax.tree_util.tree_map(lambda s: np_init(s.shape, None), w_sig)
  f = jax.jit(lambda x, w: layer.pure_fn(x, w, layer.state, RNG)[0])
  jtu.check_grads(f, (x, weights), order=1, modes=['rev'], atol=2e-2,
                  rtol=2e-2)


@pytest.mark.parametrize('make', [rnn.LSTM, rnn.GRU, rnn.SRU],
                         ids=['LSTM', 'GRU', 'SRU'])
def test_predict_mode_equals_eval_mode(make):
  x = randn(2, 6, 4)
  worst = predict_utils.assert_eval_equals_predict(
      lambda mode: make(4, mode=mode), x, first_chunk=2, atol=1e-5)
  assert worst < 1e-5


def test_bad_states_and_inputs_are_clear_errors():
  cell = rnn.LSTMCell(4)
  with pytest.raises(base.LayerError, match=r'must be equal to 2\*n_units '
                     r'\(8\)'):
    cell.init((ShapeDtype((2, 3)), ShapeDtype((2, 4))))
  cell.init((ShapeDtype((2, 3)), ShapeDtype((2, 8))))
  with pytest.raises(base.LayerError, match='initialized for inputs of depth '
                     r'3; got input shape \(2, 5\)'):
    cell((np.zeros((2, 5), np.float32), np.zeros((2, 8), np.float32)))
  gru = rnn.GRUCell(4)
  with pytest.raises(base.LayerError, match='final dimension of 4; instead '
                     'got 8'):
    gru.init((ShapeDtype((2, 3)), ShapeDtype((2, 8))))
  with pytest.raises(base.LayerError, match=r'rank 3 tensor'):
    rnn.LSTM(4).init(ShapeDtype((2, 4)))
