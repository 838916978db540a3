"""Shared fixtures: a Trax-style weight tree and a runner that checks an
optimizer, jitted, against a NumPy re-implementation of its update rule."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.backend_tolerance import float32_tolerance

MARKER_KEY = '__marker_for_cached_weights_'


def trax_flatten(tree):
  """Trax's flattening (tuples, lists, dict values), written independently."""
  if isinstance(tree, (list, tuple)):
    return [leaf for item in tree for leaf in trax_flatten(item)]
  if isinstance(tree, dict):
    return [leaf for item in tree.values() for leaf in trax_flatten(item)]
  return [tree]


def slot_leaves(slots):
  """Slot arrays as Trax writes them to opt_slots files (no None, no ())."""
  return [leaf for leaf in trax_flatten(slots) if leaf is not None]


@dataclasses.dataclass
class TreeCase:
  """Weights (with (), a marker dict, lists, ranks 0-3) and 4 gradient trees."""
  weights: tuple
  grads: list


def make_tree_case(seed=0):
  rng = np.random.default_rng(seed)

  def normal(shape, scale):
    return (scale * rng.normal(size=shape)).astype(np.float32)

  def tree(scales):
    return (
        normal((3, 4), scales[0]),
        (),
        {MARKER_KEY: ()},
        [normal((4,), scales[1]),
         (normal((2, 3, 5), scales[2]), ()),
         normal((2, 2), scales[3])],
        normal((), scales[4]),
    )

  # The last 2-D array holds tiny weights (below Adafactor's epsilon2); the
  # 3-D array gets tiny gradients (where Adam's / RMSProp's eps matter).
  weights = tree([1.0, 0.5, 1e-4, 1e-5, 1.0])
  grads = [tree([1.0, 0.5, 1e-4, 2.0, 0.3]) for _ in range(4)]
  return TreeCase(weights, grads)


@pytest.fixture
def tree_case():
  return make_tree_case()


def reference_run(init_fn, update_fn, weights, grads_seq, params_seq, steps,
                  clip_grad_norm=None):
  """Runs a NumPy per-array rule the way Trax's tree_update drives it."""
  w = [np.asarray(x, np.float64) for x in trax_flatten(weights)]
  slots = [init_fn(x) for x in w]
  for step, grads, params in zip(steps, grads_seq, params_seq):
    g = [np.asarray(x, np.float64) for x in trax_flatten(grads)]
    norm = np.sqrt(sum(np.sum(x * x) for x in g))
    if clip_grad_norm is not None and not norm < clip_grad_norm:
      g = [x * (clip_grad_norm / norm) for x in g]
    for i in range(len(w)):
      w[i], slots[i] = update_fn(step, g[i], w[i], slots[i], params)
  return w, slots


def assert_close_list(actual, desired, rtol, what):
  assert len(actual) == len(desired), (
      f'{what}: {len(actual)} arrays, expected {len(desired)}')
  for i, (a, d) in enumerate(zip(actual, desired)):
    a, d = np.asarray(a, np.float64), np.asarray(d, np.float64)
    assert a.shape == d.shape, f'{what}[{i}]: shape {a.shape} != {d.shape}'
    # Elements that cancel to near zero are judged against the array's scale.
    np.testing.assert_allclose(
        a, d, err_msg=f'{what}[{i}]',
        **float32_tolerance(rtol=rtol, atol=1e-6, scale=np.abs(d).max()))


def run_and_compare(optimizer, init_fn, update_fn, case, steps=(0, 1, 2, 3),
                    lr_factors=(1.0, 0.5, 2.0, 1.5)):
  """Runs `optimizer` jitted on `case` and compares with the NumPy rule.

  The learning rate changes every step (as a schedule would) and is passed
  in opt_params as a traced value; the step is traced too. Weights and slots
  must match to rtol 1e-5 (atol 1e-6 of each array's largest magnitude), and
  each array's total change to rtol 1e-4 (on a TPU, its float32 floor:
  `float32_tolerance`).

  Returns:
    The final (weights, slots) of the retrax run.
  """
  slots, opt_params = optimizer.tree_init(case.weights)
  step_fn = jax.jit(
      lambda step, g, w, s, p: optimizer.tree_update(
          step, g, w, s, p, store_slots=False))
  params_seq = []
  for factor in lr_factors:
    params = dict(opt_params)
    params['learning_rate'] = opt_params['learning_rate'] * factor
    params_seq.append(params)
  weights = case.weights
  with jax.numpy_dtype_promotion('strict'):
    for step, grads, params in zip(steps, case.grads, params_seq):
      weights, slots, stats = step_fn(step, grads, weights, slots, params)
  ref_params = [{k: np.asarray(v, np.float64) for k, v in p.items()}
                for p in params_seq]
  ref_w, ref_slots = reference_run(
      init_fn, update_fn, case.weights, case.grads, ref_params, steps,
      optimizer.clip_grad_norm)
  # The tree keeps its structure: (), marker dict, lists, dtypes.
  assert jax.tree.structure(weights) == jax.tree.structure(case.weights)
  assert weights[1] == () and weights[2] == {MARKER_KEY: ()}
  assert isinstance(weights[3], list)
  flat = trax_flatten(weights)
  assert all(a.dtype == jnp.float32 for a in flat)
  assert_close_list(flat, ref_w, 1e-5, 'weights')
  assert_close_list(slot_leaves(slots), slot_leaves(ref_slots), 1e-5,
                    'slots')
  start = trax_flatten(case.weights)
  for i, (new, ref, old) in enumerate(zip(flat, ref_w, start)):
    delta = np.asarray(new, np.float64) - old
    ref_delta = ref - old
    # float32 weights resolve a change only to a few ulps of their magnitude.
    resolution = 8 * np.spacing(np.float32(np.abs(ref).max()))
    tol = float32_tolerance(rtol=1e-4, atol=1e-4, scale=np.abs(ref_delta).max())
    np.testing.assert_allclose(
        delta, ref_delta, rtol=tol['rtol'], atol=tol['atol'] + resolution,
        err_msg=f'update of weight array {i}')
  last_grads = [np.asarray(g, np.float64) for g in trax_flatten(case.grads[-1])]
  np.testing.assert_allclose(
      stats['gradients_l2'], np.sqrt(sum(np.sum(g * g) for g in last_grads)),
      rtol=1e-5)
  return weights, slots


@pytest.fixture
def check_optimizer():
  """The runner above, as a fixture."""
  return run_and_compare
