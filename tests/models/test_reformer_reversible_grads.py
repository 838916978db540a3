"""ReformerLM's reconstructing backward pass equals plain autodiff, trained or not.

Issue 54: the reversible arm of `benchmarks/real_text.py` trails its plain
residual twin, and the gap grows with training. If the backward pass, which
rebuilds each layer's input from its output, drifted from the true gradient
as the weights move, that would be a bug. Reference: the same model (same
weights, state and rng) traced inside `reversible.plain_autodiff()`, with
its attention built with `use_reference_code=True` (a plain loop over
examples and heads): `jax.grad` of the forward pass, every activation kept,
no reconstruction and no recomputation. Compared at init and after Adam
steps (taken with the reconstructing gradient, as training does) on a copy
task, with LSH attention (its hashing keys drawn from state, replayed in the
backward pass), dropout on and the two blocks run as one `lax.scan` over
stacked weights.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax.layers import reversible
from retrax.layers.stacked import StackedLayers
from retrax.shapes import signature

VOCAB = 16


def _model(attention, n_layers, reference=False):
  attention = functools.partial(attention, use_reference_code=reference)
  return models.ReformerLM(VOCAB, d_model=16, d_ff=32, d_attention_key=8,
                           d_attention_value=8, n_layers=n_layers, n_heads=2,
                           dropout=0.1, max_len=64, attention_type=attention,
                           mode='train')


def _copy_batch(seed, batch=1, half=16):
  """Token rows `[a, a]`: the second half is predictable only by attention."""
  a = np.random.RandomState(seed).randint(1, VOCAB, (batch, half))
  return np.concatenate([a, a], axis=1).astype(np.int32)


# XLA:CPU compiles the two gradient programs in half the time (~4 s each)
# without its backend optimizations; the slow tests compile as training does.
FAST_COMPILE = {'xla_backend_optimization_level': 0}


def _loss_fn(model, compiler_options):
  def loss(weights, state, x, rng):
    logits, new_state = model.pure_fn(x, weights, state, rng)
    log_probs = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(log_probs, x[..., None], axis=-1).mean()
    return nll, new_state
  return jax.jit(jax.value_and_grad(loss, has_aux=True),
                 compiler_options=compiler_options)


def _layers_with_own_backward(model):
  return {type(layer).__name__ for layer in model.walk()
          if layer.has_backward}


def _max_relative_difference(got, want):
  """Largest `max|got - want| / max|want|` over the leaves (an all-zero
  `want` leaf counts `max|got|`)."""
  worst = 0.0
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want), strict=True):
    g, w = np.asarray(g), np.asarray(w)
    scale = np.max(np.abs(w))
    difference = np.max(np.abs(g - w))
    worst = max(worst, float(difference / scale if scale else difference))
  return worst


def _relative_change(new, old):
  """`|new - old| / |old|` over all the leaves (L2 norms)."""
  squares = lambda tree: sum(float(np.sum(np.square(np.asarray(a))))
                             for a in jax.tree_util.tree_leaves(tree))
  delta = jax.tree_util.tree_map(lambda a, b: a - b, new, old)
  return (squares(delta) / squares(old)) ** 0.5


def _check_against_plain_autodiff(attention, n_layers, n_steps, tolerance,
                                  compiler_options=None):
  """Trains `n_steps` with the reconstructing gradient, comparing it to plain
  autodiff before and after; returns the max relative differences."""
  model = _model(attention, n_layers)
  reference = _model(attention, n_layers, reference=True)
  x = _copy_batch(0)
  _, state = model.init(signature(x), rng=jax.random.PRNGKey(1))
  weights = model.stacked_weights  # The tree training differentiates.
  # The layers repeat: their weights are held stacked and scanned over.
  assert isinstance(model.sublayers[5].stacked_weights, StackedLayers)
  rng = jax.random.PRNGKey(2)
  assert {'ReversibleSerial', 'ReversibleHalfResidual',
          attention.func.__name__} <= _layers_with_own_backward(model)
  with reversible.plain_autodiff():
    assert not _layers_with_own_backward(reference)
  reconstructing = _loss_fn(model, compiler_options)
  plain = _loss_fn(reference, compiler_options)

  def compare(weights, state):
    (loss, _), got = reconstructing(weights, state, x, rng)
    with reversible.plain_autodiff():  # Traced (once) in here.
      (want_loss, _), want = plain(weights, state, x, rng)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    difference = _max_relative_difference(got, want)
    assert difference < tolerance, difference
    return float(loss), difference

  first_loss, at_init = compare(weights, state)
  # Dropout is on: another rng gives another loss.
  (other_loss, _), _ = reconstructing(weights, state, x, jax.random.PRNGKey(3))
  assert abs(float(other_loss) - first_loss) > 1e-4
  optimizer = optimizers.Adam(1e-2)
  slots, opt_params = optimizer.tree_init(weights)
  update = jax.jit(functools.partial(optimizer.tree_update, store_slots=False),
                   compiler_options=compiler_options)
  start = weights
  for step in range(n_steps):
    batch = _copy_batch(step + 1)
    (_, state), grads = reconstructing(weights, state, batch,
                                       jax.random.fold_in(rng, step))
    weights, slots, _ = update(step, grads, weights, slots, opt_params)
  last_loss, trained = compare(weights, state)
  # The weights moved, and towards solving the task.
  assert last_loss < first_loss - 0.1, (first_loss, last_loss)
  assert _relative_change(weights, start) > 0.1
  return at_init, trained


LSH = functools.partial(tl.LSHSelfAttention, n_hashes=2, chunk_len=8)


def test_lsh_reformer_gradients_equal_plain_autodiff_at_init_and_trained():
  _check_against_plain_autodiff(LSH, n_layers=2, n_steps=30, tolerance=1e-4,
                                compiler_options=FAST_COMPILE)


@pytest.mark.slow
@pytest.mark.parametrize('attention', [
    LSH, functools.partial(tl.SelfAttention, share_qk=True, chunk_len=None)],
                         ids=['lsh', 'full-shared-qk'])
def test_deeper_reformer_gradients_equal_plain_autodiff_after_200_steps(
    attention):
  _check_against_plain_autodiff(attention, n_layers=4, n_steps=200,
                                tolerance=1e-4)
