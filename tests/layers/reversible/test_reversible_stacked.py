"""A `ReversibleSerial` of declared repeated blocks holds their weights stacked once.

References: the same layers undeclared (a loop over plain per-layer tuples,
no scan) for values, gradients, Trax's trees, checkpoints and optimizer
updates; the compiled temp memory of the same gradient given the weights as
a plain per-layer tuple (stacked inside the program, the copies this layout
removes) for memory.
"""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import fastmath
from retrax import models
from retrax import optimizers
from retrax.layers.attention import efficient as efficient_attention
from retrax.layers import core
from retrax.layers import reversible as rv
from retrax.layers.reversible import repeats
from retrax.layers.stacked import per_layer
from retrax.layers.stacked import StackedLayers
from retrax.layers.stacked import StackedRow
from retrax.shapes import ShapeDtype
from retrax.shapes import signature
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

from test_reversible import assert_trees_close
from test_reversible import ff
from test_reversible import loss_of
from test_reversible import random_pair
from test_reversible import rev_blocks


def _pair(n_blocks, seed=3, **ff_kwargs):
  """`(stacked model, loop model)`: the same layers and initial weights.

  Both halves of a block are the same feed-forward: `2 * n_blocks` copies
  of [half-residual, swap].
  """
  x = random_pair(seed)
  stacked = rv.ReversibleSerial(rev_blocks(n_blocks, **ff_kwargs),
                                repeats=2 * n_blocks)
  stacked.init(signature(x), rng=jax.random.PRNGKey(seed))
  loop = rv.ReversibleSerial(rev_blocks(n_blocks, **ff_kwargs))
  loop.init(signature(x), rng=jax.random.PRNGKey(seed))
  return stacked, loop, x


def _weighted_leaf_layers(model):
  return [layer for layer in model.walk()
          if not layer.sublayers and jax.tree_util.tree_leaves(layer.weights)]


def test_weights_are_stacked_once_and_shown_as_trax_per_layer_tree():
  stacked, loop, _ = _pair(3)
  held, w, w_loop = stacked.stacked_weights, stacked.weights, loop.weights
  assert isinstance(held, StackedLayers) and held.period == 2
  assert not isinstance(loop.stacked_weights, StackedLayers)
  # JAX sees one stacked array per weight of a period ([half-residual,
  # swap]) in the held tree: 6 rows each.
  assert all(np.shape(x)[0] == 6 for x in jax.tree_util.tree_leaves(held))
  # The public tree is Trax's, to JAX as well: plain tuples, per layer.
  assert type(w) is tuple and len(w) == 12
  assert (jax.tree_util.tree_structure(w) ==
          jax.tree_util.tree_structure(w_loop))
  assert_trees_close(w, w_loop, rtol=0, atol=0)
  assert_trees_close(fastmath.tree_flatten(held), fastmath.tree_flatten(w),
                     rtol=0, atol=0)
  # A step's stacked tree shown as Trax's (Trainer.model_weights).
  nested = (held, [held])
  assert (jax.tree_util.tree_structure(per_layer(nested)) ==
          jax.tree_util.tree_structure((w, [w])))
  assert_trees_close(per_layer(nested), (w, [w]), rtol=0, atol=0)
  # The stack is the one copy: the layers below hold rows of it.
  leaves = _weighted_leaf_layers(stacked)
  assert len(leaves) == 6 * 3  # LayerNorm, Dense, Dense per half-residual.
  assert all(isinstance(layer._weights, StackedRow) for layer in leaves)
  assert_trees_close(stacked.sublayers[6].weights, w_loop[6], rtol=0, atol=0)


def test_stacked_values_and_grads_equal_the_loop():
  stacked, loop, x = _pair(3, dropout=0.2)
  rng = jax.random.PRNGKey(4)

  def value_and_grads(model, weights):
    def loss(w, x):
      return loss_of(model.pure_fn(x, w, model.state, rng)[0])
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(weights, x)

  v, (gw, gx) = value_and_grads(stacked, stacked.stacked_weights)
  v_loop, (gw_loop, gx_loop) = value_and_grads(loop, loop.weights)
  assert isinstance(gw, StackedLayers) and gw.n == 12
  np.testing.assert_allclose(v, v_loop, rtol=1e-5)
  assert_trees_close(gx, gx_loop)
  assert_trees_close(fastmath.tree_flatten(gw), fastmath.tree_flatten(gw_loop))
  # Trax's tree in, Trax's tree of gradients out (stacked inside the step).
  v_trax, (gw_trax, _) = value_and_grads(stacked, stacked.weights)
  assert type(gw_trax) is tuple
  np.testing.assert_allclose(v_trax, v_loop, rtol=1e-5)
  assert_trees_close(gw_trax, gw_loop)


def test_trax_tree_set_into_the_model_is_stacked_and_read_back():
  stacked, loop, x = _pair(2)
  rng = np.random.default_rng(0)
  trax_tree = jax.tree_util.tree_map(
      lambda a: rng.normal(size=np.shape(a)).astype(np.float32), loop.weights)
  stacked.weights = trax_tree
  loop.weights = trax_tree
  assert isinstance(stacked.stacked_weights, StackedLayers)
  assert_trees_close(stacked.weights, trax_tree, rtol=0, atol=0)
  key = jax.random.PRNGKey(5)
  assert_trees_close(stacked.pure_fn(x, stacked.stacked_weights, stacked.state,
                                     key)[0],
                     loop.pure_fn(x, loop.weights, loop.state, key)[0])
  # Replacing one layer's entry, Trax-style.
  new = list(stacked.weights)
  new[2] = jax.tree_util.tree_map(lambda a: a + 1.0, new[2])
  stacked.weights = tuple(new)
  assert_trees_close(stacked.weights[2], new[2], rtol=0, atol=0)
  assert_trees_close(stacked.weights[0], trax_tree[0], rtol=0, atol=0)


def test_a_deep_copy_holds_a_stack_of_its_own():
  stacked, loop, x = _pair(2)
  clone = copy.deepcopy(stacked)
  assert isinstance(clone.stacked_weights, StackedLayers)
  assert clone.stacked_weights is not stacked.stacked_weights
  assert_trees_close(clone.weights, loop.weights, rtol=0, atol=0)
  dense = clone.sublayers[2].sublayers[0].sublayers[1]
  assert isinstance(dense._weights, StackedRow)
  assert dense._weights.stacked is clone.stacked_weights
  assert_trees_close(dense.weights, loop.weights[2][0][1], rtol=0, atol=0)


def test_trax_files_keep_the_per_layer_leaf_order(tmp_path):
  stacked, loop, x = _pair(2)
  path = str(tmp_path / 'model.pkl.gz')
  stacked.save_to_file(path, input_signature=signature(x))
  fresh = rv.ReversibleSerial(rev_blocks(2), repeats=4)
  fresh.init_from_file(path)
  assert isinstance(fresh.stacked_weights, StackedLayers)
  assert_trees_close(fastmath.tree_flatten(fresh.weights),
                     fastmath.tree_flatten(loop.weights), rtol=0, atol=0)
  # The loop model (plain tuples) reads the same file: one leaf order.
  loop.init_from_file(path)
  assert_trees_close(fastmath.tree_flatten(loop.weights),
                     fastmath.tree_flatten(fresh.weights), rtol=0, atol=0)


def test_optimizer_updates_keep_the_stacked_tree():
  stacked, loop, _ = _pair(2)
  grads = jax.tree_util.tree_map(jnp.ones_like, stacked.stacked_weights)
  grads_loop = jax.tree_util.tree_map(jnp.ones_like, loop.weights)
  results = []
  for w, g in ((stacked.stacked_weights, grads), (loop.weights, grads_loop)):
    opt = optimizers.Adam(learning_rate=0.1)
    slots, params = opt.tree_init(w)
    results.append(jax.jit(lambda w, g, s, p, opt=opt: opt.tree_update(
        1, g, w, s, p, store_slots=False)[:2])(w, g, slots, params))
  (new_w, new_slots), (new_w_loop, new_slots_loop) = results
  assert isinstance(new_w, StackedLayers)
  assert_trees_close(fastmath.tree_flatten(new_w),
                     fastmath.tree_flatten(new_w_loop))
  assert_trees_close(new_slots, new_slots_loop)


def test_a_sublayer_given_new_weights_is_taken_into_the_stack():
  """Per-layer trainers (ReversibleSerialTrainer) set sublayers directly."""
  stacked, _, _ = _pair(2)
  dense = stacked.sublayers[2].sublayers[0].sublayers[1]
  before = stacked.weights
  new_w = jnp.full_like(dense.weights[0], 7.0)
  dense.weights = (new_w, dense.weights[1])
  np.testing.assert_array_equal(dense.weights[0], new_w)
  got = stacked.weights
  np.testing.assert_array_equal(got[2][0][1][0], new_w)
  assert isinstance(stacked.stacked_weights, StackedLayers)
  assert isinstance(dense._weights, StackedRow)  # Held by the stack again.
  np.testing.assert_array_equal(dense.weights[0], new_w)
  # Nothing else changed.
  got_leaves = jax.tree_util.tree_leaves(got)
  before_leaves = jax.tree_util.tree_leaves(before)
  changed = [i for i, (a, b) in enumerate(zip(got_leaves, before_leaves))
             if not np.array_equal(a, b)]
  assert len(changed) == 1


def test_a_sublayer_run_alone_leaves_the_stack_as_it_was():
  """A layer below called on its own puts its rows back (no restacking)."""
  stacked, _, x = _pair(2)
  held = stacked.stacked_weights
  half = stacked.sublayers[0]
  jax.jit(half.pure_fn)(x, half.weights, half.state, jax.random.PRNGKey(1))
  half(x)
  assert stacked.stacked_weights is held


def test_a_traced_run_leaves_no_tracers_on_the_sublayers():
  """After a traced run the layers below hold their rows of the stack again.

  Run without a key, the blocks run in a loop (no scan) whose sublayers keep
  the traced weights (combinators run them with `use_cache`); a later read
  of `weights` would take those stale tracers up.
  """
  model = models.ReformerLM(vocab_size=16, d_model=16, d_ff=32, n_layers=2,
                            n_heads=2, max_len=32, pos_axial_shape=None,
                            attention_type=efficient_attention.SelfAttention)
  x = np.zeros((2, 8), np.int32)
  model.init(ShapeDtype(x.shape, np.int32), rng=jax.random.PRNGKey(0))
  jax.jit(lambda w, x: model.pure_fn(x, w, model.state, None)[0])(
      model.stacked_weights, x)
  leaves = jax.tree_util.tree_leaves(model.weights)
  assert leaves and not any(isinstance(x, jax.core.Tracer) for x in leaves)
  holders = [layer for layer in model.walk()
             if isinstance(layer, rv.ReversibleSerial)]
  assert holders and all(isinstance(layer.stacked_weights, StackedLayers)
                         for layer in holders)


def test_a_decoding_stack_holds_each_layers_own_weights():
  """In predict mode the blocks' weights are held per layer, not stacked.

  Decoding runs one position at a time and never scans; held stacked, every
  eager call (the blog's per-token loop) sliced each block's rows out again:
  ~40% of a 6-layer ReformerLM's call. Weights given stacked (a trained
  model's `stacked_weights`) are taken per layer, with the same values.
  """
  kw = dict(vocab_size=16, d_model=16, d_ff=32, n_layers=2, n_heads=2,
            max_len=32, pos_axial_shape=None,
            attention_type=efficient_attention.SelfAttention)
  trained = models.ReformerLM(**kw)
  trained.init(ShapeDtype((2, 8), np.int32), rng=jax.random.PRNGKey(0))
  model = models.ReformerLM(mode='predict', **kw)
  model.init(ShapeDtype((2, 1), np.int32), rng=jax.random.PRNGKey(1))
  holders = [layer for layer in model.walk()
             if isinstance(layer, rv.ReversibleSerial)]
  assert holders and not any(isinstance(layer.stacked_weights, StackedLayers)
                             for layer in holders)
  model.weights = trained.stacked_weights
  assert not any(isinstance(layer.stacked_weights, StackedLayers)
                 for layer in holders)
  got = jax.tree_util.tree_leaves(model.weights)
  want = jax.tree_util.tree_leaves(trained.weights)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)


def _temp_mib(model, weights, state, x):
  def loss(w, x, rng):
    return loss_of(model.pure_fn(x, w, state, rng)[0])
  compiled = jax.jit(jax.grad(loss)).lower(
      weights, x, jax.random.PRNGKey(1)).compile()
  return compiled.memory_analysis().temp_size_in_bytes / 2**20


def test_gradient_memory_flat_in_depth_with_weights_larger_than_activations():
  """Temp memory of jax.grad from 2 to 12 blocks: <= 1.15x (issue 40).

  One block's weights (2 x 2 x 64 x 512 floats, 1 MiB) are 16 times one
  d_ff activation (64 tokens x 512): a copy of the weights per block would
  multiply the temp memory several times. The same program given the
  weights as a plain per-layer tuple (Trax's tree, `weights`) stacks them
  inside (the copies the held layout removes) and grows by at least the
  added blocks' weights.
  """
  d, d_ff, length = 64, 512, 64
  sig = ShapeDtype((1, length, d))
  x = (jnp.ones(sig.shape), jnp.ones(sig.shape))
  stacked, per_layer = [], []
  for n in (2, 12):
    model = rv.ReversibleSerial(rev_blocks(n, d_model=d, d_ff=d_ff,
                                           dropout=0.1), repeats=2 * n)
    _, state = model.init((sig, sig), rng=jax.random.PRNGKey(0))
    assert isinstance(model.stacked_weights, StackedLayers)
    stacked.append(_temp_mib(model, model.stacked_weights, state, x))
    per_layer.append(_temp_mib(model, model.weights, state, x))
  added_weights_mib = 10 * 2 * 2 * d * d_ff * 4 / 2**20
  assert stacked[1] <= 1.15 * stacked[0], stacked
  assert per_layer[1] - per_layer[0] >= added_weights_mib, per_layer


class _CountingDense(core.Dense):
  """A Dense that counts its calls in an attribute of its own."""

  def forward(self, x):
    self._n_calls = getattr(self, '_n_calls', 0) + 1
    return super().forward(x)


def test_declared_repeats_scan_whatever_the_layers_keep():
  """Declared, the blocks are stacked whatever attributes their layers set."""
  def block():
    return [rv.ReversibleHalfResidual(_CountingDense(8)), rv.ReversibleSwap()]
  layers = block() + block() + block()
  model = rv.ReversibleSerial(layers, repeats=3)
  x = random_pair(5)
  model.init(signature(x), rng=jax.random.PRNGKey(6))
  dense = layers[0].sublayers[0].sublayers[0]
  dense(x[0])  # Only this Dense has counted a call.
  assert isinstance(model.stacked_weights, StackedLayers)
  jaxpr = jax.make_jaxpr(lambda w: model.pure_fn(
      x, w, model.state, jax.random.PRNGKey(7))[0])(model.stacked_weights)
  assert 'scan' in str(jaxpr)


def test_repeats_must_divide_and_match_the_blocks():
  assert repeats.declared_period(rev_blocks(3), 6) == 2
  assert repeats.declared_period(rev_blocks(3), 3) == 4
  assert repeats.declared_period(rev_blocks(3), 1) is None
  assert repeats.declared_period(rev_blocks(3), None) is None
  with pytest.raises(ArgumentValueError, match='positive divisor of the '
                     r'number of layers \(12\)'):
    rv.ReversibleSerial(rev_blocks(3), repeats=5)
  with pytest.raises(ArgumentValueError, match='repeats=0'):
    rv.ReversibleSerial(rev_blocks(3), repeats=0)
  with pytest.raises(ArgumentTypeError, match='repeats must be an int'):
    rv.ReversibleSerial(rev_blocks(3), repeats=2.0)
  # A feed-forward with another number of layers is no copy.
  other = [rv.ReversibleHalfResidual(*ff(dropout=0.1)), rv.ReversibleSwap()]
  with pytest.raises(ArgumentValueError,
                     match='declares layer 2 .* a copy of layer 0'):
    rv.ReversibleSerial(rev_blocks(1)[:2] + other, repeats=2)
