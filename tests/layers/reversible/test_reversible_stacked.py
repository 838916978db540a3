"""A `ReversibleSerial` of repeated blocks holds its weights stacked once.

References: the same layers run as a loop over per-layer weights
(`repeat_period` patched to find nothing: plain tuples, no scan) for values,
gradients, Trax-order leaves, checkpoints and optimizer updates; the compiled
temp memory of the same gradient given the weights as a plain per-layer tuple
(stacked inside the program, the copies this layout removes) for memory.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import fastmath
from retrax import models
from retrax import optimizers
from retrax.layers.attention import efficient as efficient_attention
from retrax.layers import core
from retrax.layers.reversible import repeats
from retrax.layers import reversible as rv
from retrax.layers.reversible import serial as reversible_serial
from retrax.layers.stacked import StackedLayers
from retrax.shapes import ShapeDtype
from retrax.shapes import signature

from test_reversible import assert_trees_close
from test_reversible import ff
from test_reversible import loss_of
from test_reversible import random_pair
from test_reversible import rev_blocks


def _pair(n_blocks, seed=3, **ff_kwargs):
  """`(stacked model, loop model)`: the same layers and initial weights."""
  x = random_pair(seed)
  stacked = rv.ReversibleSerial(rev_blocks(n_blocks, **ff_kwargs))
  stacked.init(signature(x), rng=jax.random.PRNGKey(seed))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(reversible_serial, 'repeat_period', lambda layers: None)
    loop = rv.ReversibleSerial(rev_blocks(n_blocks, **ff_kwargs))
    loop.init(signature(x), rng=jax.random.PRNGKey(seed))
  return stacked, loop, x


def test_weights_are_stacked_once_and_read_per_layer_in_trax_order():
  stacked, loop, _ = _pair(3)
  w, w_loop = stacked.weights, loop.weights
  assert isinstance(w, StackedLayers) and not isinstance(w_loop, StackedLayers)
  assert len(w) == len(w_loop) == 12 and w.period == 2
  # JAX sees one stacked array per weight of a period ([half-residual,
  # swap]): 6 rows each (both halves of a block have the same layers).
  assert all(np.shape(x)[0] == 6 for x in jax.tree_util.tree_leaves(w))
  # Trax-order code sees the per-layer leaves, as for the loop's tuple.
  assert_trees_close(fastmath.tree_flatten(w), fastmath.tree_flatten(w_loop),
                     rtol=0, atol=0)
  assert_trees_close(w[5], w_loop[5], rtol=0, atol=0)
  assert_trees_close(stacked.sublayers[6].weights, w_loop[6], rtol=0, atol=0)


def test_stacked_values_and_grads_equal_the_loop():
  stacked, loop, x = _pair(3, dropout=0.2)
  rng = jax.random.PRNGKey(4)

  def value_and_grads(model):
    def loss(w, x):
      return loss_of(model.pure_fn(x, w, model.state, rng)[0])
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(model.weights, x)

  (v, (gw, gx)), (v_loop, (gw_loop, gx_loop)) = map(value_and_grads,
                                                    (stacked, loop))
  assert isinstance(gw, StackedLayers) and gw.n == 12
  np.testing.assert_allclose(v, v_loop, rtol=1e-5)
  assert_trees_close(gx, gx_loop)
  assert_trees_close(fastmath.tree_flatten(gw), fastmath.tree_flatten(gw_loop))


def test_trax_files_keep_the_per_layer_leaf_order(tmp_path):
  stacked, loop, x = _pair(2)
  path = str(tmp_path / 'model.pkl.gz')
  stacked.save_to_file(path, input_signature=signature(x))
  fresh = rv.ReversibleSerial(rev_blocks(2))
  fresh.init_from_file(path)
  assert isinstance(fresh.weights, StackedLayers)
  assert_trees_close(fastmath.tree_flatten(fresh.weights),
                     fastmath.tree_flatten(loop.weights), rtol=0, atol=0)
  # The loop model (plain tuples) reads the same file: one leaf order.
  loop.init_from_file(path)
  assert_trees_close(fastmath.tree_flatten(loop.weights),
                     fastmath.tree_flatten(fresh.weights), rtol=0, atol=0)


def test_optimizer_updates_keep_the_stacked_tree():
  stacked, loop, _ = _pair(2)
  grads = jax.tree_util.tree_map(jnp.ones_like, stacked.weights)
  grads_loop = jax.tree_util.tree_map(jnp.ones_like, loop.weights)
  results = []
  for w, g in ((stacked.weights, grads), (loop.weights, grads_loop)):
    opt = optimizers.Adam(learning_rate=0.1)
    slots, params = opt.tree_init(w)
    results.append(jax.jit(lambda w, g, s, p, opt=opt: opt.tree_update(
        1, g, w, s, p, store_slots=False)[:2])(w, g, slots, params))
  (new_w, new_slots), (new_w_loop, new_slots_loop) = results
  assert isinstance(new_w, StackedLayers)
  assert_trees_close(fastmath.tree_flatten(new_w),
                     fastmath.tree_flatten(new_w_loop))
  assert_trees_close(new_slots, new_slots_loop)


def test_a_sublayer_given_new_weights_shows_in_the_parent():
  """Per-layer trainers (ReversibleSerialTrainer) set sublayers directly."""
  stacked, _, _ = _pair(2)
  dense = stacked.sublayers[2].sublayers[0].sublayers[1]
  new_w = jnp.full_like(dense.weights[0], 7.0)
  dense.weights = (new_w, dense.weights[1])
  got = stacked.weights
  assert isinstance(got, StackedLayers)
  np.testing.assert_array_equal(got[2][0][1][0], new_w)


def test_a_traced_run_leaves_no_tracers_on_the_sublayers():
  """Putting the held `StackedLayers` back after a trace spreads it again.

  Decoding runs the blocks in a loop whose sublayers keep the traced weights
  (combinators run them with `use_cache`); predict-mode init traces the model
  that way, and a later read of `weights` took those stale tracers up.
  """
  model = models.ReformerLM(vocab_size=16, d_model=16, d_ff=32, n_layers=2,
                            n_heads=2, max_len=32, pos_axial_shape=None,
                            attention_type=efficient_attention.SelfAttention,
                            mode='predict')
  model.init(ShapeDtype((2, 1), np.int32), rng=jax.random.PRNGKey(0))
  leaves = jax.tree_util.tree_leaves(model.weights)
  assert leaves and not any(isinstance(x, jax.core.Tracer) for x in leaves)
  assert any(isinstance(layer.weights, StackedLayers)
             for layer in model.walk()
             if isinstance(layer, rv.ReversibleSerial))


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
  weights as a plain per-layer tuple stacks them inside (the old layout's
  copies) and grows by at least the added blocks' weights.
  """
  d, d_ff, length = 64, 512, 64
  sig = ShapeDtype((1, length, d))
  x = (jnp.ones(sig.shape), jnp.ones(sig.shape))
  stacked, per_layer = [], []
  for n in (2, 12):
    model = rv.ReversibleSerial(rev_blocks(n, d_model=d, d_ff=d_ff,
                                           dropout=0.1))
    weights, state = model.init((sig, sig), rng=jax.random.PRNGKey(0))
    assert isinstance(weights, StackedLayers)
    stacked.append(_temp_mib(model, weights, state, x))
    per_layer.append(_temp_mib(model, tuple(weights), state, x))
  added_weights_mib = 10 * 2 * 2 * d * d_ff * 4 / 2**20
  assert stacked[1] <= 1.15 * stacked[0], stacked
  assert per_layer[1] - per_layer[0] >= added_weights_mib, per_layer


class _CountingDense(core.Dense):
  """A Dense that counts its calls in a cache attribute it declares."""

  runtime_attributes = core.Dense.runtime_attributes | {'_n_calls'}

  def forward(self, x):
    self._n_calls = getattr(self, '_n_calls', 0) + 1
    return super().forward(x)


class _UndeclaredCountingDense(core.Dense):

  def forward(self, x):
    self._n_calls = getattr(self, '_n_calls', 0) + 1
    return super().forward(x)


@pytest.mark.parametrize('dense_cls,scans', [(_CountingDense, True),
                                             (_UndeclaredCountingDense, False)])
def test_declared_runtime_attributes_do_not_stop_the_scan(dense_cls, scans):
  def block():
    return [rv.ReversibleHalfResidual(dense_cls(8)), rv.ReversibleSwap()]
  layers = block() + block() + block()
  model = rv.ReversibleSerial(layers)
  x = random_pair(5)
  model.init(signature(x), rng=jax.random.PRNGKey(6))
  # Run the first half-residual's Dense alone once: only its cache differs.
  dense, other = (layers[i].sublayers[0].sublayers[0] for i in (0, 2))
  dense(x[0])
  assert dense._n_calls == other._n_calls + 1
  assert (repeats.repeat_period(layers) == 2) == scans
  assert isinstance(model.weights, StackedLayers)  # Stacked before the call.
  # A fresh model of such layers stacks (scans) only if the cache is declared.
  again = rv.ReversibleSerial(layers)
  again.init(signature(x), rng=jax.random.PRNGKey(6))
  assert isinstance(again.weights, StackedLayers) == scans


def test_half_residual_feed_forward_still_compares_configuration():
  assert repeats.repeat_period(rev_blocks(2) + rev_blocks(1, d_ff=32)) is None
  assert repeats.same_layer(rv.ReversibleHalfResidual(*ff()),
                            rv.ReversibleHalfResidual(*ff()))
