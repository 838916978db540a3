"""Relative attention (`layers.research.rel_attention`) and resampling layers.

References: outputs and gradients written by real Trax 1.4.1
(`fixtures/golden/hourglass/make_hourglass_goldens.py`: equal, pooled-key and
pooled-query lengths, the wrapper, attention resampling down/up, the matrix
shift, the funnel masks, `separate_cls`), a numpy re-derivation of the
equal-length shift, and causality checks.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.research import rel_attention as ra
from retrax.layers.research import resampling

try:
  from tests.layers.research import golden_leaves as gl
except ImportError:
  import golden_leaves as gl

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'hourglass', 'goldens.npz')
CALL_SEED = 11


@pytest.fixture(scope='module')
def golden():
  with np.load(GOLDEN) as f:
    return dict(f)


@pytest.fixture(autouse=True)
def trax_random_bits():
  with jax.threefry_partitionable(False):
    yield


def _lm_layer(total_pooling, mode, dropout=0.0):
  cb, lb = ra.get_rel_att_inputs(8, 2)
  return ra.RelativeAttentionLMLayer(8, cb, lb, total_pooling, n_heads=2,
                                     dropout=dropout, mode=mode)


def _resampling(is_upsampling, fn, mode):
  cb, lb = ra.get_rel_att_inputs(8, 2)
  return tl.Serial(resampling.AttentionResampling(
      2, 8, is_upsampling, 16, 2, 0.0, None, mode, tl.FastGelu, cb, lb, 1, fn))


def _wrapper(mode):
  cb, lb = ra.get_rel_att_inputs(8, 2)
  return ra.RelativeAttentionWrapper(8, 2, 0.0, mode=mode,
                                     context_bias_layer=cb,
                                     location_bias_layer=lb, total_pooling=1)


# Same constructor arguments as make_hourglass_goldens.py.
CASES = {
    'lm_equal': (lambda m: _lm_layer(1, m), 'eval'),
    'lm_equal_pool3': (lambda m: _lm_layer(3, m), 'eval'),
    'lm_down': (lambda m: _lm_layer(1, m), 'eval'),
    'lm_up': (lambda m: _lm_layer(2, m), 'eval'),
    'wrapper': (_wrapper, 'eval'),
    'lm_dropout_train': (lambda m: _lm_layer(1, m, dropout=0.3), 'train'),
    'down_avg': (lambda m: _resampling(False, resampling.AveragePooling, m),
                 'eval'),
    'down_linear': (lambda m: _resampling(False, resampling.LinearPooling, m),
                    'eval'),
    'up_linear': (lambda m: _resampling(True, resampling.LinearUpsampling, m),
                  'eval'),
    'up_naive': (lambda m: _resampling(True, resampling.NaiveUpsampling, m),
                 'eval'),
}
GRAD_CASES = ('lm_equal', 'lm_down', 'lm_up', 'up_linear')


def _run(golden, name):
  make, mode = CASES[name]
  layer = make(mode)
  inputs, arg, weights, state = gl.loaded(golden, name, layer)
  return layer, inputs, arg, weights, state


@pytest.mark.parametrize('name', sorted(CASES))
def test_outputs_match_trax(golden, name):
  layer, _, arg, weights, state = _run(golden, name)
  y, _ = gl.call(layer, arg, weights, state, jax.random.PRNGKey(CALL_SEED))
  ys = gl.outputs(y)
  expected = gl.group(golden, name, 'out')
  assert len(ys) == len(expected)
  for a, b in zip(ys, expected):
    gl.close(a, b)


@pytest.mark.parametrize('name', GRAD_CASES)
def test_gradients_match_trax(golden, name):
  layer, inputs, _, weights, state = _run(golden, name)
  gw, gx = gl.grads(layer, inputs, weights, state,
                    jax.random.PRNGKey(CALL_SEED))(golden[f'{name}/ct'])
  gl.close_trees(gw, gl.group(golden, name, 'gw'))
  gl.close_trees(gx, gl.group(golden, name, 'gx'))


@pytest.mark.parametrize('name,factor,up', [('shift_equal', 1, False),
                                            ('shift_down', 2, False),
                                            ('shift_up', 2, True)])
def test_fast_matrix_shift_matches_trax(golden, name, factor, up):
  y = ra.fast_matrix_shift(jnp.asarray(golden[f'{name}/in0']), factor, up)
  np.testing.assert_array_equal(np.asarray(y), golden[f'{name}/out'])


def test_equal_length_shift_puts_distance_j_minus_i_at_i_j():
  q = 5
  x = np.random.RandomState(0).normal(size=(2, 3, q, q)).astype(np.float32)
  y = np.asarray(ra.fast_matrix_shift(jnp.asarray(x)))
  for i in range(q):
    for j in range(i + 1):
      np.testing.assert_array_equal(y[:, :, i, j], x[:, :, i, j + q - 1 - i])


@pytest.mark.parametrize('name,q,k', [('mask_down', 3, 6), ('mask_up', 6, 2)])
def test_funnel_masks_match_trax(golden, name, q, k):
  xs = (jnp.zeros((2, q, 4)), jnp.zeros((2, k, 4)), jnp.zeros((2, k, 4)))
  layer = ra.CreateAttentionMaskLayer()
  layer.init(shapes.signature(xs))
  np.testing.assert_array_equal(np.asarray(layer(xs)[3]),
                                golden[f'{name}/out'])


def test_separate_cls_matches_trax(golden):
  args = [jnp.asarray(x) for x in gl.group(golden, 'dpa_cls', 'in')]
  y, dots = ra.DotProductAttention(*args, None, separate_cls=True,
                                   dropout=0.0, mode='eval', rng=None)
  gl.close(y, golden['dpa_cls/out'])
  gl.close(dots, golden['dpa_cls/dots'])


@pytest.mark.parametrize('q_len,k_len,pool', [(6, 6, 1), (3, 6, 1), (6, 3, 2)])
def test_lm_layer_is_causal(q_len, k_len, pool):
  """Query block i sees only keys of positions before block i ends."""
  layer = _lm_layer(pool, 'eval')
  rs = np.random.RandomState(0)
  q, k = (rs.normal(size=(1, n, 8)).astype(np.float32) for n in (q_len, k_len))
  layer.init(shapes.signature((q, k, k)))
  base = np.asarray(layer((q, k, k)))
  k2 = k.copy()
  k2[:, -1] += 1.0  # changes the last key only
  changed = np.asarray(layer((q, k2, k2)))
  q_per_k = max(1, q_len // k_len)  # queries whose block holds the last key
  np.testing.assert_array_equal(changed[:, :-q_per_k], base[:, :-q_per_k])
  assert not np.allclose(changed[:, -1], base[:, -1])


def test_resampling_shapes_and_closed_forms():
  x = np.arange(2 * 6 * 4, dtype=np.float32).reshape((2, 6, 4))
  avg = resampling.AveragePooling(3)
  avg.init(shapes.signature(x))
  np.testing.assert_allclose(np.asarray(avg(x)),
                             x.reshape((2, 2, 3, 4)).mean(axis=2), rtol=1e-6)
  naive = resampling.NaiveUpsampling(2, 4)
  np.testing.assert_array_equal(np.asarray(naive(x)), np.repeat(x, 2, axis=1))
  zeros = resampling.NoUpsampling(3, 4)
  assert np.asarray(zeros(x)).shape == (2, 18, 4)
  assert not np.asarray(zeros(x)).any()
  for layer, shape in ((resampling.LinearPooling(3, 5), (2, 2, 5)),
                       (resampling.LinearUpsampling(2, 5), (2, 12, 5))):
    layer.init(shapes.signature(x))
    assert np.asarray(layer(x)).shape == shape


def test_shift_right_cls():
  x = np.array([[3, 4, 5], [6, 7, 8]], dtype=np.int32)
  np.testing.assert_array_equal(np.asarray(ra.ShiftRightCls(9)(x)),
                                [[9, 3, 4], [9, 6, 7]])


def test_bad_arguments_raise_clear_errors():
  cb, lb = ra.get_rel_att_inputs(8, 2)
  with pytest.raises(ValueError, match=r'd_model \(7\).*n_heads \(2\)'):
    ra.get_rel_att_inputs(7, 2)
  with pytest.raises(ValueError, match='context_bias_layer, location_bias'):
    ra.RelativeAttentionWrapper(8, 2)
  with pytest.raises(ValueError, match="RelativeAttentionWrapper: mode='predict'"):
    ra.RelativeAttentionWrapper(8, 2, mode='predict', context_bias_layer=cb,
                                location_bias_layer=lb, total_pooling=1)
  with pytest.raises(ValueError, match=r'd_feature \(9\).*n_heads \(2\)'):
    ra.RelativeAttentionLayer(9, cb, lb, 1, False, n_heads=2)
  with pytest.raises(ValueError, match=r'dropout must be in \[0, 1\); got 1.0'):
    ra.RelativeAttention(False, dropout=1.0)
  with pytest.raises(ValueError, match='separate_cls=True'):
    ra.PositionalEmbeddings(8, True, 1)
  with pytest.raises(ValueError, match=r'queries \(5\) and keys \(3\)'):
    ra.calc_funnel_ratio(3, 5)
  with pytest.raises(ValueError, match='shorten_factor must be a positive'):
    resampling.LinearPooling(0, 8)
  layer = resampling.LinearPooling(4, 8)
  with pytest.raises(Exception, match=r'length \(6\).*shorten_factor \(4\)'):
    layer.init(shapes.ShapeDtype((2, 6, 8), np.float32))
