"""LocallyConnected1d against real Trax 1.4.1 outputs and a numpy loop; SummaryScalar."""

import json
import os

import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers import core

_GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'fixtures', 'golden', 'core')


def _loop_reference(x, w, b, padding):
  """y[m] = sum_k x[src] @ w[src, k] + b[m], src per Trax's slot order."""
  length, k_size = x.shape[-2], w.shape[1]
  c = (k_size - 1) // 2
  n_out = length - k_size + 1 if padding == 'VALID' else length
  y = np.zeros(x.shape[:-2] + (n_out, w.shape[-1]))
  for m in range(n_out):
    for k in range(k_size):
      src = m + k_size - 1 - k if padding == 'VALID' else m + k - c
      if padding == 'WRAP':
        src %= length
      if 0 <= src < length:
        y[..., m, :] += x[..., src, :] @ w[src, k]
  return y + b


@pytest.mark.parametrize('cls', [tl.LocallyConnected1d,
                                 core.LocallyConnected1d])
@pytest.mark.parametrize('k', [1, 3])
@pytest.mark.parametrize('padding', ['VALID', 'SAME', 'WRAP'])
def test_locally_connected_matches_trax_and_loop(cls, k, padding):
  g = np.load(os.path.join(_GOLDEN, 'core.npz'))
  x = g['lc_x']
  w, b = g[f'lc_{k}_{padding}_w'], g[f'lc_{k}_{padding}_b']
  layer = cls(4, k, padding=padding)
  layer.init(shapes.signature(x))
  assert [a.shape for a in layer.weights] == [w.shape, b.shape]
  layer.weights = (w, b)
  y = np.asarray(layer(x))
  np.testing.assert_allclose(y, g[f'lc_{k}_{padding}_y'], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(y, _loop_reference(x.astype(np.float64), w, b,
                                                padding), rtol=1e-4, atol=1e-4)


def test_locally_connected_integer_inputs_and_errors():
  layer = tl.LocallyConnected1d(6, 3, padding='VALID', use_bias=False)
  x = np.array([[0, 1], [2, 3], [4, 5]])
  layer.init(shapes.signature(x))
  y = layer(x)
  assert y.shape == (1, 6) and y.dtype == np.float32
  np.testing.assert_allclose(y, _loop_reference(x.astype(np.float64),
                                                np.asarray(layer.weights),
                                                0., 'VALID'), rtol=1e-5)
  with pytest.raises(ValueError, match='kernel_size must be'):
    tl.LocallyConnected1d(2, 2)
  with pytest.raises(ValueError, match='padding'):
    tl.LocallyConnected1d(2, 3, padding='CAUSAL')
  with pytest.raises(tl.LayerError, match='initialized for'):
    layer(np.ones((4, 2)))


def test_summary_scalar_passes_input_and_keeps_mean():
  layer = tl.SummaryScalar('test')
  x = np.array([[3., 5.], [2., 6.]])
  layer.init(shapes.signature(x))
  assert float(layer.state['summary_test']) == 0.
  np.testing.assert_array_equal(layer(x), x)
  assert float(layer.state['summary_test']) == 4.
  assert str(layer) == 'summary_test'
  mx = tl.SummaryScalar('m', aggregation_fun=np.max)
  mx(x)
  assert float(mx.state['summary_m']) == 6.


def test_dense_promotes_integer_inputs_like_trax():
  g = np.load(os.path.join(_GOLDEN, 'core.npz'))
  with open(os.path.join(_GOLDEN, 'core.json')) as f:
    meta = json.load(f)
  layer = tl.Dense(2)
  layer.init(shapes.signature(g['dense_x']))
  layer.weights = (g['dense_w'], g['dense_b'])
  y = layer(g['dense_x'])
  assert str(y.dtype) == meta['dense_dtype'] == 'float32'
  np.testing.assert_allclose(y, g['dense_y'], rtol=1e-6)
  for dtype in (np.uint8, np.bool_):
    assert layer(g['dense_x'].astype(dtype)).dtype == np.float32
  # Trax's Conv raises on integer inputs (lax.conv needs one dtype); so does ours.
  assert meta['conv_int'].startswith('raises')
  conv = tl.Conv(2, (2, 2))
  with pytest.raises(tl.LayerError, match='floating-point'):
    conv.init(shapes.ShapeDtype((2, 3, 3, 2), np.int32))


def test_shape_dtype_repr_is_trax_s():
  with open(os.path.join(_GOLDEN, 'core.json')) as f:
    meta = json.load(f)
  got = [repr(shapes.ShapeDtype((2, 3))), repr(shapes.ShapeDtype((), np.int32)),
         str(shapes.ShapeDtype((4,), np.int64))]
  assert got == meta['shape_dtype_repr']
