"""The key/value cache of predict-mode causal attention (`DotProductCausalAttention`).

State is `(keys, values, index)` as in Trax: `keys` `(batch * heads,
max_inference_length, d_head)`, `values` likewise, `index` the number of
positions written. On CPU a cache longer than `PREFIX_BLOCK` slots is held as
a tuple of segments instead, slots `[0, 128)`, `[128, 256)`, `[256, 512)`, ...
(see `segment_bounds`): attention then reads only the segments holding
visible positions, straight from their buffers. Reading a prefix of one
`(rows, slots, d)` array makes XLA copy it before its matmuls; a batch-8
decoding step of a 6-layer d_model-512 TransformerLM spent a third of its
time in those copies (7.6 of 23 ms).
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp

from retrax import validation

# Smallest cache prefix read by predict-mode causal attention on CPU.
PREFIX_BLOCK = 128


def prefix_sizes(buffer_length, backend=None):
  """Cache prefix lengths that predict-mode attention chooses among.

  On CPU, reading the key/value cache is most of a decoding step's attention
  work, so attention reads the shortest of the prefixes `PREFIX_BLOCK`,
  twice that, ..., `buffer_length` that holds every visible position: at
  most twice the filled part. Elsewhere the whole cache is read: on an H200
  (2048 slots, 64 batch*heads, d_head 64) that measured 47k decode steps/s,
  against 29k for a switch over power-of-two prefixes and 7-10k for a loop
  over filled blocks with an online softmax (conditionals and loops cost
  more than the reads there).
  """
  backend = jax.default_backend() if backend is None else backend
  sizes = []
  if backend == 'cpu':
    size = PREFIX_BLOCK
    while size < buffer_length:
      sizes.append(size)
      size *= 2
  return tuple(sizes) + (buffer_length,)


def segment_bounds(buffer_length, backend=None):
  """`(0, s_1, ..., buffer_length)`: segment j holds slots `[s_j, s_{j+1})`."""
  return (0,) + prefix_sizes(buffer_length, backend)


def _segments(cache):
  return cache if isinstance(cache, tuple) else (cache,)


def _pack(segments):
  return tuple(segments) if len(segments) > 1 else segments[0]


def _bounds(segments):
  bounds = [0]
  for s in segments:
    bounds.append(bounds[-1] + s.shape[-2])
  return tuple(bounds)


def init_state(input_signature, buffer_length, backend=None):
  """Zero key/value caches for `(q, k, v)` signatures, and index 0."""
  bounds = segment_bounds(buffer_length, backend)

  def zeros_for(sig):
    rows = input_signature[0].shape[0]
    return _pack([jnp.zeros((rows, hi - lo, sig.shape[-1]), dtype=sig.dtype)
                  for lo, hi in zip(bounds, bounds[1:])])
  return (zeros_for(input_signature[1]), zeros_for(input_signature[2]),
          jnp.zeros((), dtype=jnp.int32))


def length(cache):
  """Number of slots of a key or value cache."""
  return _bounds(_segments(cache))[-1]


def _write(cache, new, idx):
  """Writes `new` `(rows, n, d)` at slots `[idx, idx + n)` of a cache.

  Like `lax.dynamic_update_slice`, a traced `idx` is clamped so that the
  write ends at the last slot. One-slot writes under tracing update each
  segment in place (writing back its own slot where the position is not
  its own); longer traced writes go through the whole cache.
  """
  segments = _segments(cache)
  new = new.astype(segments[0].dtype)
  if len(segments) == 1:
    return lax.dynamic_update_slice_in_dim(segments[0], new, idx, axis=1)
  bounds, n = _bounds(segments), new.shape[1]
  if not isinstance(idx, jax.core.Tracer):
    idx, out = int(idx), list(segments)
    for j, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
      a, b = max(idx, lo), min(idx + n, hi)
      if a < b:
        out[j] = lax.dynamic_update_slice_in_dim(
            out[j], new[:, a - idx:b - idx], a - lo, axis=1)
    return _pack(out)
  if n > 1:
    whole = lax.dynamic_update_slice_in_dim(
        jnp.concatenate(segments, axis=1), new, idx, axis=1)
    return _pack([whole[:, lo:hi] for lo, hi in zip(bounds, bounds[1:])])
  idx = jnp.minimum(idx, bounds[-1] - 1)
  out = []
  for seg, lo, hi in zip(segments, bounds, bounds[1:]):
    at = jnp.clip(idx - lo, 0, hi - lo - 1)
    own = lax.dynamic_slice_in_dim(seg, at, 1, axis=1)
    value = jnp.where((idx >= lo) & (idx < hi), new, own)
    out.append(lax.dynamic_update_slice_in_dim(seg, value, at, axis=1))
  return _pack(out)


def update_state(new_k, new_v, state, buffer_length=None):
  """Appends keys/values at the index; returns `(new_state, (ks, vs, start))`.

  `start` is the position of the first new entry. Going past
  `buffer_length` raises when the index is concrete (eager calls); under
  `jax.jit` writes clamp to the last slots and `checkify` reports it
  (`validation.check_predict_position`).
  """
  ks, vs, idx = state
  n = new_k.shape[-2]
  if buffer_length is not None:
    validation.check_predict_position(
        'causal attention', idx, n, buffer_length,
        f' (max_inference_length={buffer_length}); build the layer with a '
        'larger max_inference_length')
  ks, vs = _write(ks, new_k, idx), _write(vs, new_v, idx)
  return (ks, vs, idx + n), (ks, vs, idx)


def _attend_to_segments(n_segments, attention, q, ks, vs, start):
  """Attention of queries at positions `start + i` to the first segments."""
  ks, vs = ks[:n_segments], vs[:n_segments]
  q_pos = start + jnp.arange(q.shape[-2])
  mask = jnp.arange(_bounds(ks)[-1])[None, None, :] <= q_pos[None, :, None]
  return attention(q, _pack(ks), _pack(vs), mask)[0]


def attend(q, ks, vs, start, attention):
  """Causal attention of queries at positions `start + i` to a key/value cache.

  Cache slots after the last query's position (unfilled, or not yet
  visible) get exactly zero weight. Reads the fewest leading segments that
  hold them all (past the end of the cache, as with clamped writes under
  `jax.jit`, all of them), chosen in Python for a concrete `start` (eager
  calls) and by `lax.switch` under tracing. `attention(q, k, v, mask)` is
  dot-product attention taking keys and values as one array or a tuple of
  segments.
  """
  ks, vs = _segments(ks), _segments(vs)
  ends = _bounds(ks)[1:]
  end = start + q.shape[-2]
  branches = [functools.partial(_attend_to_segments, n + 1, attention)
              for n in range(len(ks))]
  if not isinstance(start, jax.core.Tracer):
    # A concrete `start` inside a trace (a closed-over state under
    # `lax.cond`) still makes `start + n` a tracer: add in Python.
    end = int(start) + q.shape[-2]
    n = next((j for j, e in enumerate(ends) if e >= end), len(ks) - 1)
    return branches[n](q, ks, vs, start)
  if len(ks) == 1:
    return branches[0](q, ks, vs, start)
  return lax.switch(jnp.sum(jnp.asarray(ends[:-1]) < end), branches,
                    q, ks, vs, start)
