"""The Optimizer machinery: Trax trees, norms, clipping, slots, jit, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from retrax import optimizers
from retrax.optimizers import base
from tests.backend_tolerance import float32_tolerance

MARKER = {'__marker_for_cached_weights_': ()}


def registry():
  """One instance of every optimizer, with settings that exercise slots."""
  return [
      optimizers.SGD(0.1),
      optimizers.Momentum(0.1),
      optimizers.RMSProp(0.01),
      optimizers.Adam(0.01),
      optimizers.Adafactor(),
      optimizers.Adafactor(factored=False, do_momentum=True, beta1=0.9),
      optimizers.SM3(0.05),
      optimizers.SM3(0.05, second_moment_averaging=0.9,
                     momentum_type=optimizers.MomentumType.NESTEROV),
      optimizers.from_optax(optax.adam, learning_rate=0.01),
      optimizers.as_optimizer(optax.sgd(0.1)),
  ]


def ids(opts):
  return [type(o).__name__ for o in opts]


def test_tree_flatten_follows_trax_order():
  a, b, c, d = (np.full((1,), i, np.float32) for i in range(4))
  tree = ((a, ()), MARKER, [b, {'y': c, 'x': d}], (), None)
  leaves = base.tree_flatten(tree)
  assert [x if x is None else int(x[0]) for x in leaves] == [0, 1, 2, 3, None]
  rebuilt = base.tree_unflatten(leaves, tree)
  assert rebuilt[1] == MARKER and rebuilt[3] == ()
  assert isinstance(rebuilt[2], list) and list(rebuilt[2][1]) == ['y', 'x']
  assert base.tree_flatten(rebuilt) == leaves


def test_tree_unflatten_rejects_wrong_count():
  with pytest.raises(ValueError, match='Cannot unflatten 1 leaves into a tree '
                     'with 2 leaves'):
    base.tree_unflatten([1], (np.zeros(1), [np.zeros(2)]))


def test_l2_norm_and_clip_grads():
  rng = np.random.default_rng(1)
  tree = (rng.normal(size=(3, 2)).astype(np.float32), (), MARKER,
          [rng.normal(size=(5,)).astype(np.float32)])
  leaves = [tree[0], tree[3][0]]
  norm = np.sqrt(sum(np.sum(np.float64(x)**2) for x in leaves))
  np.testing.assert_allclose(optimizers.l2_norm(tree), norm, rtol=1e-6)
  unclipped = optimizers.clip_grads(tree, norm * 2)
  np.testing.assert_array_equal(unclipped[0], tree[0])
  clipped = optimizers.clip_grads(tree, 0.5)
  assert clipped[1] == () and clipped[2] == MARKER
  np.testing.assert_allclose(clipped[3][0], tree[3][0] * 0.5 / norm,
                             rtol=1e-6)
  np.testing.assert_allclose(optimizers.l2_norm(clipped), 0.5, rtol=1e-6)


@pytest.mark.parametrize('opt', registry(), ids=ids(registry()))
def test_eager_equals_jit_and_store_slots(opt):
  rng = np.random.default_rng(2)
  weights = (rng.normal(size=(3, 4)).astype(np.float32), (), MARKER,
             [rng.normal(size=(4,)).astype(np.float32)])
  grads = jax.tree.map(lambda w: np.float32(0.3) * w[::-1], weights)
  slots, params = opt.tree_init(weights)
  assert opt.slots is slots
  eager = opt.tree_update(3, grads, weights, slots, params)
  assert opt.slots is eager[1]
  opt.slots = slots
  jitted = jax.jit(lambda s, g, w, sl, p: opt.tree_update(
      s, g, w, sl, p, store_slots=False))(3, grads, weights, slots, params)
  assert opt.slots is slots  # store_slots=False leaves the object alone
  assert jax.tree.structure(eager) == jax.tree.structure(jitted)
  for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
    np.testing.assert_allclose(x, y, **float32_tolerance(rtol=1e-6, atol=1e-9))
  moved = [not np.allclose(a, b) for a, b in zip(
      base.tree_flatten(jitted[0]), base.tree_flatten(weights))]
  assert all(moved)


@pytest.mark.parametrize('opt', registry(), ids=ids(registry()))
def test_bfloat16_weights_keep_their_dtype(opt):
  weights = (jnp.ones((4, 3), jnp.bfloat16), (), MARKER,
             [jnp.ones((3,), jnp.bfloat16)])
  grads = jax.tree.map(lambda w: 0.5 * w, weights)
  slots, params = opt.tree_init(weights)
  step = jax.jit(lambda s, g, w, sl, p: opt.tree_update(
      s, g, w, sl, p, store_slots=False))
  for i in range(2):
    weights, slots, _ = step(i, grads, weights, slots, params)
  assert all(w.dtype == jnp.bfloat16 for w in base.tree_flatten(weights))
  assert all(np.all(np.isfinite(np.float32(w)))
             for w in base.tree_flatten(weights))


def test_trax_style_subclass_with_init_and_update(tree_case):

  class HalfStep(optimizers.Optimizer):
    """w <- w - lr * g / 2 with a step counter slot."""

    def init(self, weights):
      return jnp.zeros((), jnp.int32)

    def update(self, step, grads, weights, slots, opt_params):
      new = weights - opt_params['learning_rate'] * grads / 2
      return new.astype(weights.dtype), slots + 1

  opt = HalfStep(learning_rate=0.2)
  slots, params = opt.tree_init(tree_case.weights)
  new, slots, _ = opt.tree_update(0, tree_case.grads[0], tree_case.weights,
                                  slots, params)
  np.testing.assert_allclose(
      new[3][0], tree_case.weights[3][0] - 0.1 * tree_case.grads[0][3][0],
      rtol=1e-6)
  assert [int(s) for s in slots] == [1] * 5


def test_subclass_without_rule_says_what_to_define():
  with pytest.raises(NotImplementedError, match='must define either'):
    optimizers.Optimizer().tree_init((jnp.zeros(2),))


def test_wrong_dtype_from_update_is_reported():

  class Upcast(optimizers.Optimizer):

    def init(self, weights):
      return None

    def update(self, step, grads, weights, slots, opt_params):
      return weights.astype(jnp.float32) - grads.astype(jnp.float32), None

  opt = Upcast()
  weights = (jnp.ones((2,), jnp.bfloat16),)
  slots, params = opt.tree_init(weights)
  with pytest.raises(ValueError, match='dtype float32 but the old one has '
                     'dtype bfloat16'):
    opt.tree_update(0, weights, weights, slots, params)


def test_bad_inputs_are_reported(tree_case):
  opt = optimizers.Adam()
  slots, params = opt.tree_init(tree_case.weights)
  w, g = tree_case.weights, tree_case.grads[0]
  with pytest.raises(ValueError, match='grad_tree has 4 arrays but '
                     'weight_tree has 5'):
    opt.tree_update(0, g[:4], w, slots, params)
  with pytest.raises(ValueError, match=r'one entry per weight array \(5\); '
                     'got 4 entries'):
    opt.tree_update(0, g, w, slots[:4], params)
  with pytest.raises(ValueError, match='got None. Create them with '
                     'tree_init'):
    opt.tree_update(0, g, w, None, params)
  bad = (g[0].T,) + g[1:]
  with pytest.raises(ValueError, match=r'Gradient 0 has shape \(4, 3\) but '
                     r'weight array 0 has shape \(3, 4\)'):
    opt.tree_update(0, bad, w, slots, params)
  with pytest.raises(ValueError, match=r'Adam: clip_grad_norm must be a '
                     r'finite number in \(0, inf\); got 0'):
    optimizers.Adam(clip_grad_norm=0)
