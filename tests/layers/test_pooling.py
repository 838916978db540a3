"""Pooling layers against direct NumPy loops over windows."""

import math

import jax
from jax import test_util as jtu
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import pooling

RNG = jax.random.PRNGKey(0)


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def ref_pool(x, kind, pool_size, strides, padding):
  """Pools axes 1..n-2 of x by looping over windows; padding never counts."""
  x = np.asarray(x, np.float64)
  sizes = x.shape[1:-1]
  strides = strides or (1,) * len(pool_size)
  if padding == 'SAME':
    outs = [math.ceil(n / s) for n, s in zip(sizes, strides)]
    lows = [max((o - 1) * s + k - n, 0) // 2
            for o, s, k, n in zip(outs, strides, pool_size, sizes)]
  else:
    outs = [(n - k) // s + 1 for n, k, s in zip(sizes, pool_size, strides)]
    lows = [0] * len(sizes)
  out = np.zeros((x.shape[0],) + tuple(outs) + (x.shape[-1],))
  for o in np.ndindex(*outs):
    window = []
    for k in np.ndindex(*pool_size):
      src = tuple(o[i] * strides[i] + k[i] - lows[i] for i in range(len(o)))
      if all(0 <= s < n for s, n in zip(src, sizes)):
        window.append(x[(slice(None),) + src])
    window = np.stack(window)
    reduce = {'max': np.max, 'sum': np.sum, 'avg': np.mean}[kind]
    out[(slice(None),) + o] = reduce(window, axis=0)
  return out


LAYERS = {'max': pooling.MaxPool, 'sum': pooling.SumPool,
          'avg': pooling.AvgPool}


@pytest.mark.parametrize('kind', sorted(LAYERS))
@pytest.mark.parametrize('pool_size,strides,padding', [
    ((2, 2), None, 'VALID'),
    ((3, 2), (2, 1), 'VALID'),
    ((2, 3), (2, 2), 'SAME'),
    ((3, 3), None, 'SAME'),
])
def test_pooling_matches_window_loops(kind, pool_size, strides, padding):
  x = randn(2, 5, 7, 3)
  layer = LAYERS[kind](pool_size=pool_size, strides=strides, padding=padding)
  assert layer.init(x) == ((), ())
  got = jax.jit(layer.pure_fn)(x, (), (), RNG)[0]
  want = ref_pool(x, kind, pool_size, strides, padding)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_defaults_names_and_overlapping_windows():
  x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
  layer = pooling.MaxPool()
  # Trax's default strides are 1 (not pool_size): windows overlap.
  assert layer(x).shape == (1, 3, 3, 1)
  assert layer(x)[0, :, :, 0].tolist() == [[5, 6, 7], [9, 10, 11],
                                            [13, 14, 15]]
  assert pooling.AvgPool((2, 2), (2, 2))(x)[0, :, :, 0].tolist() == [
      [2.5, 4.5], [10.5, 12.5]]
  assert repr(pooling.MaxPool()) == 'MaxPool(2,2)'
  assert repr(pooling.SumPool((3, 1))) == 'SumPool(3,1)'
  assert repr(pooling.AvgPool(pool_size=(7, 7))) == 'AvgPool(7,7)'


def test_pooling_one_and_three_spatial_axes_and_ints():
  x1 = randn(2, 7, 3)
  got = pooling.AvgPool((3,), (2,), 'SAME')(x1)
  np.testing.assert_allclose(got, ref_pool(x1, 'avg', (3,), (2,), 'SAME'),
                             rtol=1e-5, atol=1e-6)
  x3 = randn(1, 3, 4, 5, 2)
  got = pooling.MaxPool((2, 2, 3), (1, 2, 1))(x3)
  np.testing.assert_allclose(got, ref_pool(x3, 'max', (2, 2, 3), (1, 2, 1),
                                           'VALID'), rtol=1e-6)
  ints = np.array([[[-5], [-7], [-2]]], np.int32)
  out = pooling.MaxPool((2,), padding='SAME')(ints)
  assert out.dtype == np.int32 and out[0, :, 0].tolist() == [-5, -2, -2]


def test_pooling_gradients_match_finite_differences():
  x = randn(1, 4, 5, 2)
  for layer in (pooling.AvgPool((2, 2), (1, 2), 'SAME'),
                pooling.SumPool((3, 2))):
    f = jax.jit(lambda x, layer=layer: layer.pure_fn(x, (), (), RNG)[0])
    jtu.check_grads(f, (x,), order=1, modes=['rev'], atol=1e-2, rtol=1e-2)
  # Max-pool gradients flow only to each window's maximum.
  g = jax.grad(lambda x: pooling.MaxPool((2, 2), (2, 2))(x).sum())(
      np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1))
  assert np.asarray(g)[0, :, :, 0].tolist() == [[0, 0, 0, 0], [0, 1, 0, 1],
                                                 [0, 0, 0, 0], [0, 1, 0, 1]]


def test_bad_inputs_are_clear_errors():
  layer = pooling.MaxPool((2, 2))
  with pytest.raises(base.LayerError, match='expects rank-4 inputs; got shape'
                     r' \(4, 4, 3\)'):
    layer(np.zeros((4, 4, 3), np.float32))
  with pytest.raises(base.LayerError, match='pool window of size 3 along '
                     'spatial axis 2 is larger than the input'):
    pooling.AvgPool((2, 3))(np.zeros((1, 4, 2, 1), np.float32))
  with pytest.raises(base.LayerError, match='strides .* as many entries'):
    pooling.SumPool((2, 2), strides=(1,))(np.zeros((1, 4, 4, 1), np.float32))
