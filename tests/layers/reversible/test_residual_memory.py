"""The fused half-residual's backward: what it holds beside the attention, and its values.

`ReversibleHalfResidual(LayerNorm, attention_layer=...)` differentiates the
LayerNorm after the attention's passes (its forward recomputed), so none of
the LayerNorm's `[L, d_model]` residuals is alive while the attention runs;
where the attention runs its heads one at a time (the longest sequences),
the LayerNorm runs inside the attention's loop (`groups.Prelude`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax.layers import position_chunks
from retrax.layers.attention import efficient_base
from retrax.layers.attention import groups
from retrax.layers.reversible import residual
from retrax.shapes import signature


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _half(length, d_model, n_heads, d_head, chunk_len):
  attn = tl.LSHSelfAttention(n_heads=n_heads, d_qk=d_head, d_v=d_head,
                             causal=True, chunk_len=chunk_len, n_hashes=1,
                             mode='train')
  half = tl.ReversibleHalfResidual(tl.LayerNorm(), attention_layer=attn)
  xs = (_normal(1, (1, length, d_model)), _normal(2, (1, length, d_model)))
  half.init(signature(xs), rng=jax.random.PRNGKey(3))
  y, new_state = half.pure_fn(xs, half.weights, half.state,
                              jax.random.PRNGKey(4))
  ct = (_normal(5, xs[0].shape), _normal(6, xs[0].shape))

  def backward(y, ct):
    return half.reverse_and_grad(y, ct, half.weights, half.state, new_state,
                                 jax.random.PRNGKey(4))

  def forward(xs, w):
    return half.pure_fn(xs, w, half.state, jax.random.PRNGKey(4))[0]
  return half, xs, y, ct, backward, forward


def _fold(monkeypatch):
  """Heads one at a time, the LayerNorm in chunks of 4 positions."""
  monkeypatch.setattr(residual, 'TWO_PASS_MIN_ELEMENTS', 0)
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 4 * 16)


@pytest.mark.parametrize('two_pass,fold', [(False, False), (True, False),
                                            (True, True)])
def test_backward_equals_plain_autodiff(monkeypatch, two_pass, fold):
  if two_pass:
    monkeypatch.setattr(residual, 'TWO_PASS_MIN_ELEMENTS', 0)
  if fold:
    _fold(monkeypatch)
  half, xs, y, ct, backward, forward = _half(64, 16, 2, 8, 8)
  attn = half.sublayers[1]
  assert attn.folds_prelude(xs[1].shape) == fold
  x, (x_ct, w_ct) = jax.jit(backward)(y, ct)
  _, vjp_fn = jax.vjp(forward, xs, half.weights)
  want_x_ct, want_w_ct = vjp_fn(ct)
  for got, want in zip(jax.tree_util.tree_leaves((x, x_ct, w_ct)),
                       jax.tree_util.tree_leaves((xs, want_x_ct, want_w_ct))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_layer_norm_residuals_not_held_through_the_attention(monkeypatch):
  # The long-sequence two-pass backward, forced on. Plain `jax.jit` (no
  # XLA:CPU options): its fusions keep what a `jax.vjp` of the LayerNorm
  # saves. Outputs and arguments are not temporaries, so the plan holds the
  # LayerNorm's output, the attention's input cotangent and its work.
  monkeypatch.setattr(residual, 'TWO_PASS_MIN_ELEMENTS', 0)
  length, d_model = 4096, 128
  *_, backward, _ = _half(length, d_model, 2, 16, 32)
  shapes = jax.ShapeDtypeStruct((1, length, d_model), jnp.float32)
  compiled = jax.jit(backward).lower((shapes, shapes),
                                     (shapes, shapes)).compile()
  per_token = compiled.memory_analysis().temp_size_in_bytes / length
  row = 4 * d_model  # one [L, d_model] float32 array, per token
  # Measured: 5.0 rows per token (8.5 with the LayerNorm's vjp taken before
  # the attention: its residuals alive at the peak).
  assert per_token < 6.5 * row, per_token / row


def test_layer_norm_inside_the_attention_loop(monkeypatch):
  # Heads one at a time, the two-pass backward: the LayerNorm runs chunk by
  # chunk inside the attention's loop and its input cotangent is added onto
  # the stream's, so neither its output nor a separate cotangent exists
  # whole. Its CHUNK_ELEMENTS: chunks of 512 positions.
  monkeypatch.setattr(residual, 'TWO_PASS_MIN_ELEMENTS', 0)
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 2 ** 16)
  length, d_model = 16384, 128
  shapes = jax.ShapeDtypeStruct((1, length, d_model), jnp.float32)

  def rows_per_token():
    *_, backward, _ = _half(length, d_model, 2, 16, 32)
    compiled = jax.jit(backward).lower((shapes, shapes),
                                       (shapes, shapes)).compile()
    return compiled.memory_analysis().temp_size_in_bytes / length / (
        4 * d_model)
  folded = rows_per_token()
  monkeypatch.setattr(tl.LSHSelfAttention, 'folds_prelude',
                      lambda self, shape: False)
  # Measured: 4.07 rows per token folded, 5.09 with the LayerNorm outside.
  assert folded < rows_per_token() - 0.8, folded


def test_reformer_lm_with_the_layer_norm_in_the_loop(monkeypatch):
  # A whole ReformerLM (reversible scan, LSH, chunked feed-forward) trained
  # through `Serial(model, loss)`: the loss and every weight gradient with
  # the fold forced on equal those of the default path at this size.
  model = models.ReformerLM(
      32, d_model=16, d_ff=32, d_attention_key=8, d_attention_value=8,
      n_layers=2, n_heads=2, dropout=0.0, max_len=64, mode='train',
      attention_type=functools.partial(tl.LSHSelfAttention, chunk_len=16,
                                       n_hashes=2))
  net = tl.Serial(model, tl.WeightedCategoryCrossEntropy())
  x = jax.random.randint(jax.random.PRNGKey(0), (2, 64), 0, 32)
  batch = (x, x, jnp.ones(x.shape, jnp.float32))
  net.init(signature(batch), rng=jax.random.PRNGKey(1))

  def loss_and_grads():
    def loss(w):
      return net.pure_fn(batch, w, net.state, jax.random.PRNGKey(2))[0]
    return jax.jit(jax.value_and_grad(loss))(net.weights)
  want = loss_and_grads()
  runs = []
  run = groups.PreludeRunner.run
  monkeypatch.setattr(groups.PreludeRunner, 'run',
                      lambda self, *args: runs.append(1) or run(self, *args))
  _fold(monkeypatch)
  got = loss_and_grads()
  assert runs  # the fold ran
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
