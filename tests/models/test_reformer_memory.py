"""ReformerLM's gradient step: memory per token is flat in the length, and small.

XLA's plan of the compiled gradient (`memory_analysis()`) at two lengths. The
long-sequence policies (feed-forward over chunks of positions,
`layers.position_chunks`; attention over rematerialized blocks of chunks,
`attention.ops`) start at lengths a test cannot compile in seconds, so
their thresholds are lowered here to what a tiny model reaches at 2K tokens.
"""

import functools

import jax
import numpy as np

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.layers.attention import ops
from retrax.layers import position_chunks as chunks

D_MODEL, D_FF = 16, 512


def _temp_bytes_per_token(length):
  """Planned temporaries / token of the loss gradient of a tiny LSH ReformerLM.

  (The optimizer's update adds per-weight buffers only; leaving it out
  keeps the compile short.)
  """
  lsh = functools.partial(tl.LSHSelfAttention, n_hashes=1, chunk_len=8)
  model = models.ReformerLM(
      16, d_model=D_MODEL, d_ff=D_FF, d_attention_key=16,
      d_attention_value=16, n_layers=2, n_heads=1, dropout=0.0,
      max_len=length, attention_type=lsh)
  net = tl.Serial(model, tl.WeightedCategoryCrossEntropy())
  tokens = np.ones((1, length), np.int32)
  batch = (tokens, tokens, np.ones((1, length), np.float32))
  weights, state = net.init(shapes.signature(batch), rng=jax.random.PRNGKey(0))

  def grads(weights, batch, rng):
    return jax.grad(lambda w: net.pure_fn(batch, w, state, rng)[0])(weights)

  compiled = jax.jit(grads).lower(weights, batch,
                                  jax.random.PRNGKey(1)).compile()
  return compiled.memory_analysis().temp_size_in_bytes / length


def test_gradient_memory_per_token_is_flat_and_below_one_ff_hidden(
    monkeypatch):
  monkeypatch.setattr(chunks, 'CHUNK_ELEMENTS', 2**14)
  monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 2**14)
  short, long = _temp_bytes_per_token(2048), _temp_bytes_per_token(8192)
  assert long <= 1.15 * short, (short, long)  # XLA schedules vary by ~1 row
  # The whole feed-forward hidden [L, d_ff] and its cotangent (what the
  # unchunked step holds at its peak, ~8.7 KB per token here) would alone
  # take 2 * d_ff * 4 bytes per token; the chunked step (~1.2 KB) stays
  # well below that.
  assert long < 0.6 * (2 * D_FF * 4), long
