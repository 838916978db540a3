"""Adafactor against a NumPy re-implementation of Trax's rule."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from retrax import optimizers


def adafactor_rule(factored=True, multiply_by_parameter_scale=True,
                   do_clipping=True, do_momentum=False, bfloat16_momentum=False):
  """Trax's Adafactor for one array, in NumPy float64."""

  def is_factored(w):
    return factored and w.ndim >= 2

  def init(w):
    if is_factored(w):
      slots = [np.zeros(w.shape[:-1]), np.zeros(w.shape[:-2] + w.shape[-1:])]
    else:
      slots = [np.zeros_like(w)]
    if do_momentum:
      slots.append(np.zeros_like(w))
    return slots

  def update(step, g, w, slots, p):
    wd, n_steps = p['weight_decay_rate'], p['weight_decay_n_steps']
    if n_steps >= 1:
      wd = wd * max(n_steps - step, 0.0) / n_steps
    decay = 1.0 - (step + 1.0)**(-p['decay_rate'])
    mixing = 1.0 - decay
    scale = p['learning_rate']
    if multiply_by_parameter_scale:
      scale = scale * max(np.sqrt(np.mean(w * w)), p['epsilon2'])
    eps1 = p['epsilon1']
    if is_factored(w):
      rows, cols = slots[0], slots[1]
      rows = decay * rows + mixing * np.mean(g * g, axis=-1)
      cols = decay * cols + mixing * np.mean(g * g, axis=-2)
      row_factor = np.sqrt(np.mean(rows, axis=-1, keepdims=True)
                           / (rows + eps1))
      col_factor = 1.0 / np.sqrt(cols + eps1)
      y = g * row_factor[..., :, None] * col_factor[..., None, :]
      new_slots = [rows, cols]
    else:
      v = decay * slots[0] + mixing * g * g
      y = g / np.sqrt(v + eps1)
      new_slots = [v]
    if do_clipping:
      y = y / max(1.0, np.sqrt(np.mean(y * y)) / p['clipping_threshold'])
    subtrahend = scale * y
    if do_momentum:
      m = p['beta1'] * slots[-1] + (1.0 - p['beta1']) * subtrahend
      subtrahend = m
      if bfloat16_momentum:
        m = m.astype(ml_dtypes.bfloat16).astype(np.float64)
      new_slots.append(m)
    return (1.0 - wd) * w - subtrahend, new_slots

  return init, update


def test_defaults_are_trax_defaults():
  params = optimizers.Adafactor().opt_params
  assert {k: float(v) for k, v in params.items()} == pytest.approx(
      dict(learning_rate=0.05, beta1=0.0, decay_rate=0.8,
           clipping_threshold=1.0, weight_decay_rate=1e-5,
           weight_decay_n_steps=0, epsilon1=1e-16, epsilon2=1e-3))


FLAGS = ('factored', 'multiply_by_parameter_scale', 'do_clipping',
         'do_momentum')


@pytest.mark.parametrize('kwargs', [
    dict(),
    dict(factored=False, clipping_threshold=0.5, weight_decay_rate=0.05),
    dict(do_momentum=True, beta1=0.9, weight_decay_rate=0.05,
         weight_decay_n_steps=3),
    dict(multiply_by_parameter_scale=False, do_clipping=False,
         decay_rate=0.5, epsilon1=1e-3, clip_grad_norm=1.0),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  flags = {k: v for k, v in kwargs.items() if k in FLAGS}
  init, update = adafactor_rule(**flags)
  check_optimizer(optimizers.Adafactor(**kwargs), init, update, tree_case)


def test_slot_layout(tree_case):
  slots, _ = optimizers.Adafactor(do_momentum=True).tree_init(
      tree_case.weights)
  assert [tuple(s.shape for s in slot) for slot in slots] == [
      ((3,), (4,), (3, 4)),           # (3, 4): rows, cols, momentum
      ((4,), (4,)),                   # (4,): full v, momentum
      ((2, 3), (2, 5), (2, 3, 5)),    # (2, 3, 5): factored over last 2 axes
      ((2,), (2,), (2, 2)),
      ((), ()),                       # scalar
  ]
  assert all(isinstance(slot, list) for slot in slots)
  assert slots[0][0].dtype == jnp.float32


def test_momentum_in_bfloat16(tree_case):
  opt = optimizers.Adafactor(do_momentum=True, beta1=0.9,
                             momentum_in_bfloat16=True)
  init, update = adafactor_rule(do_momentum=True, bfloat16_momentum=True)
  slots, params = opt.tree_init(tree_case.weights)
  assert all(slot[-1].dtype == jnp.bfloat16 for slot in slots)
  weights = tree_case.weights
  step_fn = jax.jit(lambda i, g, w, s: opt.tree_update(
      i, g, w, s, params, store_slots=False))
  ref_w = [np.asarray(w, np.float64) for w in jax.tree.leaves(weights)]
  ref_slots = [init(w) for w in ref_w]
  ref_params = {k: float(v) for k, v in params.items()}
  for step, grads in enumerate(tree_case.grads):
    weights, slots, _ = step_fn(step, grads, weights, slots)
    for i, g in enumerate(jax.tree.leaves(grads)):
      ref_w[i], ref_slots[i] = update(step, np.asarray(g, np.float64),
                                      ref_w[i], ref_slots[i], ref_params)
  assert all(slot[-1].dtype == jnp.bfloat16 for slot in slots)
  for ours, ref in zip(jax.tree.leaves(weights), ref_w):
    np.testing.assert_allclose(ours, ref, rtol=1e-2, atol=1e-8)
