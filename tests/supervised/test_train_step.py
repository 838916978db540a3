"""The jitted training step: numerics against references, donation, chunked loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import supervised_toys as toys
from retrax import layers as tl
from retrax import optimizers
from retrax.layers import base
from retrax.optimizers import placement
from retrax.supervised import devices
from retrax.supervised import train_step
from retrax.supervised import training


def _signature(batch):
  return tuple(jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype)
               for x in batch)


def _setup(model, loss, optimizer, batch, **kwargs):
  model.init(_signature(batch))
  loss.init(model.output_signature(_signature(batch)))
  step = train_step.TrainStep(model, loss, optimizer, devices.DataParallel(1),
                          **kwargs)
  weights = (model.weights, loss.weights)
  slots, opt_params = optimizer.tree_init(weights)
  return step, weights, (model.state, loss.state), slots, opt_params


def test_three_adam_steps_match_a_handwritten_reference():
  batches = toys.copy_batches(3)
  batch = next(batches)
  step_fn, weights, state, slots, opt_params = _setup(
      toys.mlp(), toys.WeightedCrossEntropy(), optimizers.Adam(0.05), batch)
  ref_w = [np.asarray(x, np.float64) for x in toys.leaves(weights)]
  ref_slots = [(np.zeros_like(w), np.zeros_like(w)) for w in ref_w]
  rng = jax.random.PRNGKey(0)
  for step in range(3):
    batch = next(batches)
    # Reference: loss and gradients of the loss written out in jnp, then
    # Trax's Adam formula in float64 numpy.
    tree = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(weights),
        [jnp.asarray(w, jnp.float32) for w in ref_w])
    ref_loss, ref_grads = jax.value_and_grad(toys.mlp_reference_loss)(
        tree, batch)
    ref_grads = [np.asarray(g, np.float64) for g in toys.leaves(ref_grads)]
    updated = [toys.adam_reference(w, g, s, step, 0.05)
               for w, g, s in zip(ref_w, ref_grads, ref_slots)]
    ref_w = [u[0] for u in updated]
    ref_slots = [u[1] for u in updated]
    weights, slots, state, loss, stats = step_fn(
        weights, slots, state, batch, rng, step, opt_params)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-6)
    np.testing.assert_allclose(
        float(stats['gradients_l2']),
        np.sqrt(sum(np.sum(g**2) for g in ref_grads)), rtol=1e-5)
  for got, want in zip(toys.leaves(weights), ref_w):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_step_donates_weights_slots_and_state():
  batch = next(toys.copy_batches(0))
  step_fn, weights, state, slots, opt_params = _setup(
      toys.mlp(), toys.WeightedCrossEntropy(), optimizers.Adam(0.01), batch)
  weights, slots, state = jax.device_put((weights, slots, state))
  old_leaf = jax.tree_util.tree_leaves(weights)[0]
  old_slot = jax.tree_util.tree_leaves(slots)[0]
  new = step_fn(weights, slots, state, batch, jax.random.PRNGKey(0), 1,
                opt_params)
  assert old_leaf.is_deleted() and old_slot.is_deleted()
  assert not jax.tree_util.tree_leaves(new[0])[0].is_deleted()


def test_shared_layer_weights_marker_trains_both_uses():
  dense = tl.Dense(toys.D_EMB)
  model = tl.Serial(tl.Embedding(toys.VOCAB, toys.D_EMB), dense, tl.Relu(),
                    dense, tl.Dense(toys.VOCAB), tl.LogSoftmax())
  batch = next(toys.copy_batches(1))
  step_fn, weights, state, slots, opt_params = _setup(
      model, toys.WeightedCrossEntropy(), optimizers.SGD(0.1), batch)
  assert weights[0][3] == base.GET_WEIGHTS_FROM_CACHE
  emb, w, b, w2, b2 = (np.asarray(x) for x in (
      weights[0][0], *weights[0][1], *weights[0][4]))  # Copies: the step donates.

  def reference(emb, w, b, w2, b2):
    x, targets, loss_weights = batch
    h = jnp.maximum(emb[x] @ w + b[None, None], 0.0) @ w + b[None, None]
    log_probs = jax.nn.log_softmax(h @ w2 + b2[None, None])
    ce = -jnp.sum(log_probs * jax.nn.one_hot(targets, toys.VOCAB), -1)
    return jnp.sum(ce * loss_weights) / jnp.sum(loss_weights)
  grads = jax.grad(reference, argnums=(1, 2))(emb, w, b, w2, b2)
  new_weights, _, _, _, _ = step_fn(weights, slots, state, batch,
                                    jax.random.PRNGKey(0), 1, opt_params)
  assert new_weights[0][3] == base.GET_WEIGHTS_FROM_CACHE
  np.testing.assert_allclose(new_weights[0][1][0], w - 0.1 * grads[0],
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(new_weights[0][1][1], b - 0.1 * grads[1],
                             rtol=1e-5, atol=1e-6)


def test_chunked_loss_equals_unchunked_value_and_gradients():
  # 30 positions in chunks of 7: padded to 35; the first chunks weigh nothing.
  batch = next(toys.copy_batches(5, batch_size=3, length=10))
  weights = batch[2].copy()
  weights[:2] = 0.0
  batch = (batch[0], batch[1], weights)
  results = []
  for size in (0, 7):
    model = toys.mlp()
    model.rng = jax.random.PRNGKey(7)  # Same initial weights for both.
    step_fn, weights, state, _, _ = _setup(
        model, toys.WeightedCrossEntropy(), optimizers.SGD(0.0), batch,
        loss_chunk_size=size)
    forward = step_fn._forward
    loss, grads = jax.jit(jax.value_and_grad(
        lambda w, f=forward, s=state: f(w, s, batch, jax.random.PRNGKey(1))[0]))(
            weights)
    results.append((float(loss), toys.leaves(grads)))
  (loss0, grads0), (loss1, grads1) = results
  np.testing.assert_allclose(loss1, loss0, rtol=1e-6)
  for g1, g0 in zip(grads1, grads0):
    np.testing.assert_allclose(g1, g0, rtol=1e-5, atol=1e-7)


def test_chunked_loss_rejects_models_it_cannot_chunk():
  batch = next(toys.copy_batches(0))
  model = tl.Serial(tl.Embedding(toys.VOCAB, 8), tl.Relu())
  with pytest.raises(ValueError, match='end in a Dense'):
    _setup(model, toys.WeightedCrossEntropy(), optimizers.SGD(0.1), batch,
           loss_chunk_size=4)
  two_input_loss = tl.Fn('L', lambda lp, t: jnp.mean(lp))
  with pytest.raises(ValueError, match='taking \\(output, targets, weights\\)'):
    _setup(toys.mlp(), two_input_loss, optimizers.SGD(0.1), batch,
           loss_chunk_size=4)


def _adasum_reference(grads):
  """Trax's Adasum butterfly over per-device gradient lists, in numpy."""
  n = len(grads)
  shift = 1
  while shift < n:
    partner = [i + shift if i % (2 * shift) < shift else i - shift
               for i in range(n)]
    merged = []
    for i in range(n):
      leaves = []
      for a, b in zip(grads[i], grads[partner[i]]):
        dot = np.vdot(a, b)
        leaves.append((1 - dot / (2 * np.vdot(a, a) + 1e-30)) * a +
                      (1 - dot / (2 * np.vdot(b, b) + 1e-30)) * b)
      merged.append(leaves)
    grads = merged
    shift *= 2
  return [np.mean([g[j] for g in grads], axis=0) for j in range(len(grads[0]))]


def test_adasum_merge_matches_numpy():
  grads = np.random.RandomState(0).randn(4, 3, 2).astype(np.float32)
  want = _adasum_reference([[g.astype(np.float64)] for g in grads])[0]
  got = placement.adasum({'w': jnp.asarray(grads)})['w']
  np.testing.assert_allclose(got, want, rtol=1e-5)
  with pytest.raises(ValueError, match='power-of-two'):
    placement.adasum({'w': jnp.asarray(grads[:3])})


def test_adasum_step_merges_the_gradients_of_each_device_share():
  # Adasum's numbers depend on how the batch is split, not on where the
  # shares run: two shares on one device compute what two devices would.
  parallel = devices.DataParallel(1)
  parallel.n_global_devices = 2
  model, loss = toys.mlp(), toys.WeightedCrossEntropy()
  batch = next(toys.copy_batches(2))
  model.init(_signature(batch))
  loss.init(model.output_signature(_signature(batch)))
  step_fn = train_step.TrainStep(model, loss, optimizers.SGD(1.0), parallel,
                             adasum=True)
  weights = jax.tree_util.tree_map(np.asarray, (model.weights, loss.weights))
  slots, opt_params = optimizers.SGD(1.0).tree_init(weights)
  shares = [tuple(x[i * 4:(i + 1) * 4] for x in batch) for i in range(2)]
  want = _adasum_reference([
      [np.asarray(g, np.float64) for g in toys.leaves(
          jax.grad(toys.mlp_reference_loss)(weights, share))]
      for share in shares])
  new_weights, _, _, step_loss, _ = step_fn(
      weights, slots, (model.state, loss.state), batch, jax.random.PRNGKey(0),
      1, opt_params)
  for w, g, got in zip(toys.leaves(weights), want, toys.leaves(new_weights)):
    np.testing.assert_allclose(got, w - g, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(step_loss, np.mean(
      [toys.mlp_reference_loss(weights, share) for share in shares]), rtol=1e-6)


def test_loss_must_be_scalar():
  per_position = tl.Fn('PerPosition', lambda lp, t, w: w)
  task = training.TrainTask(toys.copy_batches(0), per_position,
                            optimizers.SGD(0.1))
  with pytest.raises(ValueError, match='must return a scalar'):
    training.Loop(toys.mlp(), task, random_seed=0)
