"""LayerNorm, BatchNorm and FilterResponseNorm against NumPy re-statements of Trax's formulas."""

import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.layers import base
from retrax.layers import normalization as norm
from retrax.shapes import ShapeDtype


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def np_layer_norm(x, scale, bias, eps=1e-6, center=True):
  x = np.asarray(x, np.float64)
  mean = x.mean(-1, keepdims=True)
  c = x - mean if center else x
  var = (c * c).mean(-1, keepdims=True)
  y = c / np.sqrt(var + eps) * scale
  return y + bias if center else y


def test_layer_norm_matches_numpy():
  x = randn(2, 3, 6) * 3 + 1
  layer = norm.LayerNorm()
  (scale, bias), state = layer.init(shapes.signature(x))
  assert (scale.shape, bias.shape, scale.dtype, state) == (
      (6,), (6,), jnp.float32, ())
  np.testing.assert_array_equal(scale, 1.)
  np.testing.assert_array_equal(bias, 0.)
  np.testing.assert_allclose(layer(x), np_layer_norm(x, 1., 0.), rtol=1e-5,
                             atol=1e-5)
  s, b = randn(6, seed=1), randn(6, seed=2)
  np.testing.assert_allclose(layer(x, weights=(s, b)),
                             np_layer_norm(x, s, b), rtol=1e-5, atol=1e-5)


def test_layer_norm_without_centering_keeps_trax_weight_tree():
  x = randn(4, 5) + 2
  layer = norm.LayerNorm(center=False, epsilon=1e-3)
  (scale, bias), _ = layer.init(shapes.signature(x))
  assert bias.shape == (5,)  # Trax keeps an (unused) bias
  np.testing.assert_allclose(
      layer(x), np_layer_norm(x, 1., 0., eps=1e-3, center=False), rtol=1e-5)


def test_layer_norm_errors():
  layer = norm.LayerNorm()
  with pytest.raises(base.LayerError, match='layer.init'):
    layer(np.ones((2, 3), np.float32))
  layer.init(ShapeDtype((2, 3)))
  with pytest.raises(base.LayerError, match='last dimension 3'):
    layer(np.ones((2, 4), np.float32))


def test_batch_norm_train_updates_running_stats_with_momentum():
  x = randn(4, 3, 2, 5) * 2 + 3
  layer = norm.BatchNorm(momentum=0.9)
  (beta, gamma), (mean0, var0, n0) = layer.init(shapes.signature(x))
  assert (beta.shape, gamma.shape) == ((5,), (5,))
  assert (mean0.shape, var0.shape, n0.shape) == ((1, 1, 1, 5), (1, 1, 1, 5), ())
  assert n0.dtype == jnp.int32
  y = layer(x)
  x64 = x.astype(np.float64)
  mean = x64.mean((0, 1, 2), keepdims=True)
  var = (x64 ** 2).mean((0, 1, 2), keepdims=True) - mean ** 2
  np.testing.assert_allclose(y, (x64 - mean) / np.sqrt(var + 1e-5), rtol=1e-4,
                             atol=1e-4)
  run_mean, run_var, n = layer.state
  np.testing.assert_allclose(run_mean, 0.9 * 0. + 0.1 * mean, rtol=1e-5)
  np.testing.assert_allclose(run_var, 0.9 * 1. + 0.1 * var, rtol=1e-5)
  assert int(n) == 1
  layer(x)
  np.testing.assert_allclose(layer.state[0], 0.9 * 0.1 * mean + 0.1 * mean,
                             rtol=1e-5)
  assert int(layer.state[2]) == 2


def test_batch_norm_eval_uses_running_stats():
  x = randn(6, 4) * 2 + 1
  train = norm.BatchNorm(axis=(0,))
  train.init(shapes.signature(x))
  mean = np.full((1, 4), 0.5, np.float32)
  var = np.full((1, 4), 4.0, np.float32)
  beta, gamma = randn(4, seed=1), randn(4, seed=2)
  ev = norm.BatchNorm(axis=(0,), mode='eval')
  ev.init(shapes.signature(x))
  ev.state = (mean, var, jnp.zeros((), jnp.int32))
  ev.weights = (beta, gamma)
  y = ev(x)
  ref = gamma * (x - 0.5) / np.sqrt(4.0 + 1e-5) + beta
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(ev.state[0], mean)  # eval leaves stats alone


def test_batch_norm_without_center_or_scale():
  x = randn(8, 3) + 4
  layer = norm.BatchNorm(axis=(0,), center=False, scale=False)
  weights, _ = layer.init(shapes.signature(x))
  assert weights == ((), ())
  x64 = x.astype(np.float64)
  mean = x64.mean(0)
  var = (x64 ** 2).mean(0) - mean ** 2
  np.testing.assert_allclose(layer(x), (x64 - mean) / np.sqrt(var + 1e-5),
                             rtol=1e-4, atol=1e-4)


def test_batch_norm_rejects_dtype_change():
  layer = norm.BatchNorm(axis=(0,))
  layer.init(ShapeDtype((4, 3), jnp.bfloat16))
  with pytest.raises(base.LayerError, match='should not change the dtype'):
    layer(jnp.ones((4, 3), jnp.bfloat16))


def test_filter_response_norm_matches_numpy():
  x = randn(2, 4, 5, 3) * 2
  layer = norm.FilterResponseNorm()
  (gamma, beta, eps_l), _ = layer.init(shapes.signature(x))
  assert (gamma.shape, beta.shape, eps_l) == ((3,), (3,), ())
  g, b = randn(3, seed=1), randn(3, seed=2)
  x64 = x.astype(np.float64)
  nu2 = (x64 ** 2).mean(axis=(1, 2), keepdims=True)
  np.testing.assert_allclose(layer(x, weights=(g, b, ())),
                             g * x64 / np.sqrt(nu2 + 1e-6) + b, rtol=1e-5,
                             atol=1e-5)


def test_filter_response_norm_learned_epsilon():
  x = randn(2, 3, 4) * 1e-2
  layer = norm.FilterResponseNorm(learn_epsilon=True, init_epsilon=1e-3,
                                  init_learnt_epsilon=1e-2)
  (_, _, eps_l), _ = layer.init(shapes.signature(x))
  assert len(eps_l) == 1 and float(eps_l[0]) == pytest.approx(1e-2)
  x64 = x.astype(np.float64)
  nu2 = (x64 ** 2).mean(axis=1, keepdims=True)
  ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
  y = layer(x, weights=(ones, zeros, (np.float32(-0.02),)))
  np.testing.assert_allclose(y, x64 / np.sqrt(nu2 + 1e-3 + 0.02), rtol=1e-5)
  with pytest.raises(ValueError, match='> 0'):
    norm.FilterResponseNorm(init_epsilon=0.)
