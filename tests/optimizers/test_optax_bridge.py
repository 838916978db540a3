"""Optax transformations accepted wherever an optimizer is expected."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from retrax import optimizers
from retrax.optimizers import base
from tests.backend_tolerance import float32_tolerance

MARKER = {'__marker_for_cached_weights_': ()}


def jitted_update(opt):
  return jax.jit(lambda s, g, w, sl, p: opt.tree_update(
      s, g, w, sl, p, store_slots=False))


def optax_style_adam(w, grads_seq, lr, b1=0.9, b2=0.999, eps=1e-8):
  """Adam as optax defines it (count-based bias correction), in NumPy."""
  w = np.float64(w)
  m = v = np.zeros_like(w)
  for t, g in enumerate(grads_seq, start=1):
    g = np.float64(g)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
  return w


def test_optax_adam_on_a_trax_tree(tree_case):
  opt = optimizers.as_optimizer(optax.adam(0.01))
  assert isinstance(opt, optimizers.OptaxOptimizer)
  slots, opt_params = opt.tree_init(tree_case.weights)
  assert opt_params == {}
  step = jitted_update(opt)
  weights = tree_case.weights
  for i, grads in enumerate(tree_case.grads):
    weights, slots, stats = step(i, grads, weights, slots, {})
  assert weights[1] == () and weights[2] == MARKER
  for k, w0 in enumerate(base.tree_flatten(tree_case.weights)):
    grads_k = [base.tree_flatten(g)[k] for g in tree_case.grads]
    np.testing.assert_allclose(base.tree_flatten(weights)[k],
                               optax_style_adam(w0, grads_k, 0.01),
                               **float32_tolerance(rtol=1e-5, atol=1e-6))
  assert set(stats) == {'gradients_l2', 'weights_l2'}


def test_tree_wide_transformation_sees_the_whole_tree():
  weights = (jnp.zeros((2,)), (), MARKER, [jnp.zeros((2,))])
  grads = (jnp.array([3.0, 0.0]), (), MARKER, [jnp.array([0.0, 4.0])])
  opt = optimizers.as_optimizer(
      optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1.0)))
  slots, _ = opt.tree_init(weights)
  new, _, stats = opt.tree_update(0, grads, weights, slots, {})
  # Global norm 5 is clipped to 1: each gradient is divided by 5.
  np.testing.assert_allclose(new[0], [-0.6, 0.0], rtol=1e-6)
  np.testing.assert_allclose(new[3][0], [0.0, -0.8], rtol=1e-6)
  np.testing.assert_allclose(stats['gradients_l2'], 5.0, rtol=1e-6)


def test_clip_grad_norm_applies_to_optax_transformations():
  weights = (jnp.zeros((2,)),)
  grads = (jnp.array([3.0, 4.0]),)
  opt = optimizers.from_optax(optax.sgd(1.0), clip_grad_norm=2.5)
  slots, _ = opt.tree_init(weights)
  new, _, _ = opt.tree_update(0, grads, weights, slots, {})
  np.testing.assert_allclose(new[0], [-1.5, -2.0], rtol=1e-6)


def test_factory_hyperparameters_are_opt_params_a_schedule_can_set():
  opt = optimizers.from_optax(optax.sgd, learning_rate=0.1, momentum=0.5,
                              nesterov=True)
  assert sorted(opt.opt_params) == ['learning_rate', 'momentum']
  weights = (jnp.ones((3,)), ())
  g = np.array([1.0, -2.0, 0.5], np.float32)
  before = dict(opt.opt_params)
  slots, params = opt.tree_init(weights)
  assert sorted(params) == sorted(before)
  assert all(float(params[k]) == float(before[k]) for k in params)
  step = jitted_update(opt)
  lrs = [0.1, 0.3, 0.2]
  w_ref, v = np.ones(3), np.zeros(3)
  for i, lr in enumerate(lrs):
    weights, slots, _ = step(i, (g, ()), weights, slots,
                             dict(params, learning_rate=jnp.float32(lr)))
    v = 0.5 * v + g  # Nesterov momentum, as optax.sgd defines it.
    w_ref = w_ref - lr * (0.5 * v + g)
  np.testing.assert_allclose(weights[0], w_ref, rtol=1e-6)


def test_scheduled_hyperparameters_are_not_opt_params():
  schedule = optax.linear_schedule(0.1, 0.0, 10)
  opt = optimizers.from_optax(optax.adam, learning_rate=schedule, b1=0.8)
  slots, params = opt.tree_init((jnp.ones(2),))
  assert 'learning_rate' not in params and float(params['b1']) == (
      pytest.approx(0.8))
  with pytest.raises(ValueError, match=r"opt_params \['learning_rate'\] are "
                     r"not settable.*settable: \['b1', 'b2'"):
    opt.tree_update(0, (jnp.ones(2),), (jnp.ones(2),), slots,
                    {'learning_rate': 0.1})


def test_plain_transformation_rejects_opt_params():
  opt = optimizers.as_optimizer(optax.adam(1e-3))
  slots, _ = opt.tree_init((jnp.ones(2),))
  with pytest.raises(ValueError, match='no injectable hyperparameters.*'
                     'inject_hyperparams'):
    opt.tree_update(0, (jnp.ones(2),), (jnp.ones(2),), slots,
                    {'learning_rate': 0.1})


def test_as_optimizer_accepts_optimizers_and_classes():
  adam = optimizers.Adam(0.5)
  assert optimizers.as_optimizer(adam) is adam
  made = optimizers.as_optimizer(optimizers.Momentum)
  assert isinstance(made, optimizers.Momentum)
  assert float(made.opt_params['mass']) == pytest.approx(0.9)


def test_bad_optimizers_are_rejected_with_a_hint():
  with pytest.raises(TypeError, match='call it .*from_optax'):
    optimizers.as_optimizer(optax.adam)
  with pytest.raises(TypeError, match='Expected a retrax Optimizer'):
    optimizers.as_optimizer('adam')
  with pytest.raises(TypeError, match='can only be given with a factory'):
    optimizers.from_optax(optax.adam(1e-3), learning_rate=0.1)
  with pytest.raises(TypeError, match='expects an optax.GradientTransformation'
                     ' or a factory'):
    optimizers.from_optax(3)
  with pytest.raises(TypeError, match="Cannot call adam with \\['lr'\\]"):
    optimizers.from_optax(optax.adam, lr=0.1)
  with pytest.raises(TypeError, match='OptaxOptimizer expects'):
    optimizers.OptaxOptimizer(optimizers.Adam())
