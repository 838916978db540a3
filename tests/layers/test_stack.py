"""The stack helpers (layers/stack.py) and cotangent helpers (layers/cotangents.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import cotangents
from retrax.layers import core
from retrax.layers import stack
from retrax.shapes import ShapeDtype


def test_stack_packing():
  a, b, c = np.zeros(1), np.ones(2), np.ones(3)
  assert stack.make_tuple(a)[0] is a and stack.make_tuple([a, b]) == (a, b)
  assert stack.inputs_from_stack((a, b, c), 1) is a
  assert stack.inputs_from_stack((a, b, c), 2) == (a, b)
  assert stack.outputs_onto_stack(c, (a, b), 1) == (c, b)
  assert stack.outputs_onto_stack((), (a, b), 2) == ()
  assert stack.outputs_onto_stack((a, b), c, 1) == (a, b)


def test_n_inputs_n_outputs_counts_the_deepest_reach():
  # Dup: 1->2, Add: 2->1, Select([0, 1, 2]): 3->3.
  layers = [cb.Dup(), cb.Add(), cb.Select([0, 1, 2])]
  assert stack.n_inputs_n_outputs(layers) == (3, 3)
  assert stack.n_inputs_n_outputs([cb.Drop()]) == (1, 0)


@pytest.mark.parametrize('items, n, exact, message', [
    (np.ones(2), 2, False, 'expects a tuple of 2 inputs; got a single'),
    ((np.ones(2),), 2, False, 'expects 2 inputs; got 1'),
    ((np.ones(2),) * 3, 2, True, 'expects exactly n_in=2 inputs; got 3'),
    ((), 1, True, 'expects exactly n_in=1 inputs; got 0'),
])
def test_check_arity_raises_layer_error_naming_the_layer(items, n, exact,
                                                         message):
  layer = core.Dense(3)
  with pytest.raises(base.LayerError, match=message) as info:
    stack.check_arity(layer, items, n, 'pure_fn', exact=exact)
  assert info.value.layer_name == 'Dense_3'


@pytest.mark.parametrize('items, n, exact', [
    (np.ones(2), 1, False), (np.ones(2), 1, True), ((), 0, True),
    ((np.ones(2),) * 3, 2, False), ((np.ones(2),) * 2, 2, True),
    (np.ones(2), 0, False)])
def test_check_arity_passes(items, n, exact):
  stack.check_arity(core.Dense(3), items, n, 'pure_fn', exact=exact)


def test_run_layers_matches_composition_and_applies_prepare():
  dense = core.Dense(2)
  layers = [dense, base.Fn('Times3', lambda x: 3 * x)]
  parent = cb.Serial(layers)
  x = np.arange(6, dtype=np.float32).reshape(3, 2)
  parent.init(ShapeDtype(x.shape))
  w, b = (np.asarray(a) for a in parent.weights[0])
  rngs = stack.split_rngs(jax.random.PRNGKey(0), 2)
  out, state = stack.run_layers(parent, layers, x, parent.weights,
                                parent.state, rngs)
  np.testing.assert_allclose(out, 3 * (x @ w + b), rtol=1e-6)
  assert state == ((), ())
  seen = []

  def prepare(weights, rng, stack_now):
    seen.append(stack_now.shape)
    return jax.tree_util.tree_map(lambda v: 2 * v, weights), rng
  out2, _ = stack.run_layers(parent, layers, x, parent.weights, parent.state,
                             rngs, prepare=prepare)
  np.testing.assert_allclose(out2, 3 * (x @ (2 * w) + 2 * b), rtol=1e-6)
  assert seen == [(3, 2), (3, 2)]


def test_init_layers_returns_output_signature_and_trees():
  layers = [core.Dense(4), cb.Dup()]
  out, weights, state = stack.init_layers(cb.Serial(layers), layers,
                                          ShapeDtype((5, 3)))
  assert [s.shape for s in out] == [(5, 4), (5, 4)]
  assert weights[0][0].shape == (3, 4) and weights[1] == ()
  assert state == ((), ())


def test_zero_cotangent_and_casts_follow_jax_rules():
  tree = (np.ones((2,), np.float32), np.ones((3,), np.int32),
          jax.random.PRNGKey(0))
  zeros = cotangents.zero_cotangent(tree)
  assert zeros[0].dtype == jnp.float32 and not np.any(zeros[0])
  assert zeros[1].dtype == jax.dtypes.float0 and zeros[1].shape == (3,)
  assert zeros[2].dtype == jax.dtypes.float0
  assert cotangents.add_cotangents(None, 2.0) == 2.0
  assert cotangents.add_cotangents(zeros[1], 3.0) == 3.0
  assert cotangents.add_cotangents(1.0, 2.0) == 3.0
  bf16 = jnp.ones((2,), jnp.bfloat16)
  assert cotangents.cotangent_like(np.ones(2, np.float32),
                                   bf16).dtype == jnp.bfloat16
  assert cotangents.cotangent_like(None, bf16).dtype == jnp.bfloat16
  matched = cotangents.match_structure([np.ones(2), None],
                                       (np.ones(2, np.float32), None))
  assert isinstance(matched, tuple) and matched[1] is None
  with pytest.raises(ValueError, match='does not match'):
    cotangents.match_structure((np.ones(2),), (np.ones(2), np.ones(2)))


def test_split_rngs_gives_the_split_keys_eagerly_and_under_tracing():
  """Concrete keys come as a tuple (one dispatch), traced ones as the array."""
  key = jax.random.PRNGKey(3)
  want = np.asarray(jax.random.split(key, 4))
  got = stack.split_rngs(key, 4)
  assert isinstance(got, tuple) and len(got) == 4
  np.testing.assert_array_equal(np.stack([np.asarray(k) for k in got]), want)
  traced = jax.jit(lambda k: jnp.stack(list(stack.split_rngs(k, 4))))(key)
  np.testing.assert_array_equal(traced, want)
  assert stack.split_rngs(None, 2) == (None, None)


def test_stacked_rows_match_slicing_each_leaf():
  """`stacked.rows` of concrete arrays (one compiled call) equals `x[k]` per leaf."""
  from retrax.layers import stacked
  rng = np.random.RandomState(0)
  tree = {'w': jnp.asarray(rng.randn(3, 4, 5), jnp.float32),
          'b': (jnp.asarray(rng.randn(3, 5), jnp.bfloat16),)}
  for k in range(3):
    got = stacked.rows(tree, k)
    np.testing.assert_array_equal(got['w'], np.asarray(tree['w'])[k])
    assert got['b'][0].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got['b'][0], np.float32),
                                  np.asarray(tree['b'][0], np.float32)[k])
  sig = stacked.rows({'w': ShapeDtype((3, 4), np.float32)}, 1)
  assert sig['w'].shape == (4,)


def test_run_layers_refuses_fewer_keys_than_layers_under_tracing():
  """Traced keys indexed past their end would clamp: one key for two layers."""
  layers = [cb.Dup(), cb.Drop()]
  parent = cb.Serial(*layers)

  def run(x, keys):
    return stack.run_layers(parent, layers, x, ((), ()), ((), ()), keys)[0]
  with pytest.raises(ValueError, match='1 keys for its 2 sublayers'):
    jax.jit(run)(jnp.ones(3), jax.random.split(jax.random.PRNGKey(0), 1))
