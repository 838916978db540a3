"""Memory-efficient attention layers of the Reformer (Trax's `efficient_attention`).

`SelfAttention` is multi-head self-attention that may be chunked (local
attention: each chunk of `chunk_len` positions attends to itself and to
`n_chunks_before`/`n_chunks_after` neighbouring chunks), `EncDecAttention` is
encoder-decoder attention; both run per head in memory-bounded groups with a
recomputing backward pass (see `efficient_base`). LSH attention is in
`lsh`. The array functions Trax exports from this module
(`attend`, `hash_vecs`, `look_adjacent`, ...) are re-exported here.

Shape glossary: `B` batch, `L` length, `M` d_model, `D` d_qk, `V` d_v,
`H` n_heads. Weights are stacked over heads: `w_q [H, M, D]`, `w_k [H, M, D]`,
`w_v [H, M, V]`, `w_o [H, V, M]` (then biases `b_q [H, D]`, `b_k`, `b_v`).

Differences from Trax 1.4.1: chunked lengths that are not a multiple of
`chunk_len` are padded with masked positions (Trax fails to reshape); padding
at positions 0 and 1 is masked too (Trax's `-position` marks leave them
visible); an unchunked predict-mode SelfAttention defaults to a 2048-position
memory (Trax asserts); `EncDecAttention` masks as Trax does (its shifted marks
subtract 1e9 from every logit, so each real key gets weight 1) unless
`penalize_padding_only=True` (softmax attention over the real keys); dropout
keys are split only when a dropout rate is non-zero (same numbers); when
d_model is at most half the head depths, `SelfAttention` (without shared QK
or biases) multiplies `W_q W_k^T` and `W_v W_o` first, the same function in
fewer FLOPs (see `SelfAttention`'s `_attend_inputs`); predict-mode
`SelfAttention` caches its memory's keys and values in its per-unit state
(Trax's is empty and reprojects the whole memory at every call).
"""

import functools
import math
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax import validation
from retrax.layers.attention.efficient_base import drop_oldest
from retrax.layers.attention.efficient_base import fit_to_memory
from retrax.layers.attention.efficient_base import EfficientAttentionBase
from retrax.layers.attention import groups
from retrax.layers.attention.ops import apply_broadcasted_dropout
from retrax.layers.attention.ops import attend
from retrax.layers.attention.ops import attend_queries_scaled
from retrax.layers.attention.ops import combine_heads
from retrax.layers.attention.ops import hash_vecs as hash_vecs  # re-export
from retrax.layers.attention.ops import length_normalized
from retrax.layers.attention.ops import look_adjacent as look_adjacent  # re-export
from retrax.layers.attention.ops import MASK_PENALTY
from retrax.layers.attention.ops import mask_self_attention
from retrax.layers.attention.ops import project_heads
from retrax.layers.attention.ops import project_step_heads
from retrax.layers.attention.ops import permute_via_gather as permute_via_gather  # re-export
from retrax.layers.attention.ops import permute_via_sort as permute_via_sort  # re-export
from retrax.validation import ArgumentValueError

_MODES = ('train', 'eval', 'predict')
# Predict-mode memory of an unchunked SelfAttention when none is given (Trax
# raises instead; these mirror DotProductCausalAttention / LSHSelfAttention).
DEFAULT_PREDICT_MEM_LEN = 2048
DEFAULT_PREDICT_DROP_LEN = 256


def check_mode(name, mode):
  validation.check_choice(name, 'mode', mode, _MODES)


def check_count(name, what, value, minimum=0, allow_none=False):
  return validation.check_int(name, what, value, minimum, allow_none)


def check_depths_and_rates(name, d_qk, d_v, attention_dropout,
                           output_dropout):
  """Per-head depths are ints >= 1, dropout rates in [0, 1)."""
  validation.check_int(name, 'd_qk', d_qk, 1)
  validation.check_int(name, 'd_v', d_v, 1)
  validation.check_rate(name, 'attention_dropout', attention_dropout)
  validation.check_rate(name, 'output_dropout', output_dropout)


def dropout_rngs(rng, attention_dropout, output_dropout):
  """`(attention_rng, output_rng) = split(rng)` as Trax; (None, None) without dropout.

  Skipping the split when no dropout is applied keeps the compiled program
  free of random-number code (slow to compile on CPU); the numbers are the same.
  """
  if attention_dropout > 0 or output_dropout > 0:
    return jax.random.split(rng)
  return None, None


def apply_output_dropout(out, rng, attention_dropout, output_dropout):
  """Trax's output dropout of an attention layer: one keep-mask over `out`'s
  last axis from `rng`'s second half (`dropout_rngs`).

  Every example and head gets the same `rng`, hence the same mask: applied
  to each head's output before the heads are summed or to their sum, it is
  the same function (`groups.UnitStages.combine` applies it to the sum).
  """
  _, output_rng = dropout_rngs(rng, attention_dropout, output_dropout)
  return apply_broadcasted_dropout(out, output_dropout, output_rng)


def check_predict(name, causal, masked, n_chunks_after=0):
  """Predict mode (fast inference) needs a causal, unmasked, look-back-only layer."""
  if not causal:
    raise ArgumentValueError(f'{name}: mode="predict" (fast inference) needs '
                             'causal=True.')
  if masked:
    raise ArgumentValueError(f'{name}: mode="predict" does not support masked=True; '
                             'decode without a padding mask.')
  if n_chunks_after:
    raise ArgumentValueError(f'{name}: mode="predict" needs n_chunks_after=0; got '
                             f'{n_chunks_after}.')


def attention_kernel_init(shape, rng, n_heads):
  """Glorot-uniform over the width of ALL heads (Trax's per-head initializer)."""
  lim = jnp.sqrt(6.0 / (shape[0] + shape[1] * n_heads))
  return jax.random.uniform(rng, shape, jnp.float32, -lim, lim)


def normalize_mask(name, mask, x):
  """Returns `mask` as bool `[B, L]`; accepts `[B, L]` or `[B, 1, 1, L]`."""
  batch, length = x.shape[:2]
  shape = tuple(jnp.shape(mask))
  if shape == (batch, length):
    return mask.astype(bool) if mask.dtype != bool else mask
  if shape == (batch, 1, 1, length):
    return jnp.reshape(mask, (batch, length)).astype(bool)
  raise InputValueError(f'{name}: the mask must have shape (batch, length) = '
                        f'{(batch, length)} (True for real tokens); got {shape}.')


def check_width(name, x, w, what='d_model'):
  if x.shape[-1] != w.shape[1]:
    raise InputValueError(f'{name}: inputs have {what} {x.shape[-1]} but the '
                          f'weights expect {w.shape[1]}.')


@configurable('trax.layers', denylist=('mode',))
class SelfAttention(EfficientAttentionBase):
  """Multi-head self-attention, optionally chunked (local), memory-efficient.

  Inputs: `x [B, L, M]`, plus `mask [B, L]` (True for real tokens) when
  `masked=True`. Output `[B, L, M]`. With `chunk_len`, position `i` in chunk
  `c = i // chunk_len` attends to chunks `c - n_chunks_before .. c +
  n_chunks_after` (wrapping around at the ends); a length that is not a
  multiple of `chunk_len` is padded with masked positions. With `share_qk`
  keys are the length-normalised queries and a position attends to itself only
  when nothing else is visible. In `mode='predict'` (causal only) the layer
  keeps the last `predict_mem_len` inputs (default `chunk_len * (1 +
  n_chunks_before)`, or 2048 unchunked) and forgets `predict_drop_len` of them
  (default `chunk_len`, or 256) when full; its per-unit state caches their
  keys and values, so each decoded position is projected once.

  Args follow Trax: n_heads, d_qk, d_v, share_qk, causal, masked, chunk_len,
  n_chunks_before, n_chunks_after, bias, mode, predict_mem_len,
  predict_drop_len, attention_dropout, output_dropout (both train-only),
  n_parallel_heads, use_python_loop, use_reference_code (see
  `EfficientAttentionBase`); and `implementation` of the chunked attention
  ('xla', 'pallas', 'auto' or None: see `EfficientAttentionBase.implementation`).
  """

  # With `share_qk`, keys are the length-normalised queries (Trax 1.4.1).
  normalizes_shared_keys = True

  def __init__(self, n_heads=2, d_qk=64, d_v=64, share_qk=False, causal=False,
               masked=False, chunk_len=None, n_chunks_before=0,
               n_chunks_after=0, bias=False, mode='train',
               predict_mem_len=None, predict_drop_len=None,
               attention_dropout=0.0, output_dropout=0.0,
               n_parallel_heads=None, use_python_loop=False,
               use_reference_code=False, implementation=None):
    name = type(self).__name__
    check_mode(name, mode)
    check_count(name, 'chunk_len', chunk_len, 1, allow_none=True)
    check_count(name, 'n_chunks_before', n_chunks_before)
    check_count(name, 'n_chunks_after', n_chunks_after)
    check_depths_and_rates(name, d_qk, d_v, attention_dropout, output_dropout)
    if chunk_len is None and (n_chunks_before or n_chunks_after):
      raise ArgumentValueError(f'{name}: n_chunks_before/n_chunks_after need '
                               f'chunk_len; got chunk_len=None.')
    incremental = mode == 'predict'
    if incremental:
      check_predict(name, causal, masked)
      if chunk_len is not None:
        predict_mem_len = predict_mem_len or chunk_len * (1 + n_chunks_before)
        predict_drop_len = predict_drop_len or chunk_len
      else:
        predict_mem_len = predict_mem_len or DEFAULT_PREDICT_MEM_LEN
        predict_drop_len = predict_drop_len or min(DEFAULT_PREDICT_DROP_LEN,
                                                   predict_mem_len)
    super().__init__(n_heads, n_in=2 if masked else 1,
                     n_parallel_heads=n_parallel_heads, incremental=incremental,
                     predict_mem_len=predict_mem_len,
                     predict_drop_len=predict_drop_len,
                     use_python_loop=use_python_loop,
                     use_reference_code=use_reference_code)
    self._record_depths_and_dropout(d_qk, d_v, mode, attention_dropout,
                                    output_dropout)
    self._record_chunking(causal, masked, chunk_len, n_chunks_before,
                          n_chunks_after, implementation)
    self._share_qk = share_qk
    self._bias = bias

  def _kernel_initializer(self, shape, rng):
    return attention_kernel_init(shape, rng, self._n_heads)

  def _init_signature(self, input_signature):
    return input_signature[:1]

  def _predict_mem_signature(self, input_signature):
    return input_signature[:1]

  def _check_inputs(self, inputs, weights):
    inputs = super()._check_inputs(inputs, weights)
    check_width(self.name, inputs[0], weights[0])
    if self._masked:
      inputs = (inputs[0], normalize_mask(self.name, inputs[1], inputs[0]))
    return inputs

  def create_weights_unbatched(self, input_signature, rng):
    if isinstance(input_signature, (tuple, list)):
      input_signature = input_signature[0]
    d_model = input_signature.shape[-1]
    rng_q, rng_k, rng_v, rng_o = jax.random.split(rng, 4)
    w_q = self._kernel_initializer((d_model, self._d_qk), rng_q)
    w_k = (None if self._share_qk
           else self._kernel_initializer((d_model, self._d_qk), rng_k))
    w_v = self._kernel_initializer((d_model, self._d_v), rng_v)
    w_o = jnp.transpose(self._kernel_initializer((d_model, self._d_v), rng_o))
    weights: tuple[Any, ...] = (
        (w_q, w_v, w_o) if self._share_qk else (w_q, w_k, w_v, w_o))
    if self._bias:
      b_q = jnp.zeros(self._d_qk)
      b_v = jnp.zeros(self._d_v)
      weights += ((b_q, b_v) if self._share_qk
                  else (b_q, jnp.zeros(self._d_qk), b_v))
    return weights

  def create_state_unbatched(self, input_signature, rng):
    """Predict mode: key and value caches `([mem_len, D], [mem_len, V])`."""
    del rng
    if not self._incremental:
      return ()
    dtype = jnp.promote_types(input_signature[0].dtype, jnp.float32)
    mem_len = self._predict_mem_len
    return (jnp.zeros((mem_len, self._d_qk), dtype),
            jnp.zeros((mem_len, self._d_v), dtype))

  def _roll_predict_state(self, state):
    return tuple(drop_oldest(c, self._predict_drop_len) for c in state)

  def _unpack_weights(self, weights):
    """Returns `(w_q, w_k, w_v, w_o, b_q, b_k, b_v)` (None where absent)."""
    expected = (3 if self._share_qk else 4) + (
        (2 if self._share_qk else 3) if self._bias else 0)
    if len(weights) != expected:
      raise InputValueError(f'{self.name}: expected {expected} weight arrays '
                            f'(share_qk={self._share_qk}, bias={self._bias}); got '
                            f'{len(weights)}.')
    if self._share_qk:
      w_q, w_v, w_o = weights[:3]
      b_q, b_v = weights[3:] if self._bias else (None, None)
      return w_q, None, w_v, w_o, b_q, None, b_v
    w_q, w_k, w_v, w_o = weights[:4]
    b_q, b_k, b_v = weights[4:] if self._bias else (None, None, None)
    return w_q, w_k, w_v, w_o, b_q, b_k, b_v

  def _project(self, x, weights):
    """Queries, keys (None if shared) and values of `x [L, M]`."""
    w_q, w_k, w_v, _, b_q, b_k, b_v = self._unpack_weights(weights)
    q = precision.matmul(x, w_q)
    k = None if self._share_qk else precision.matmul(x, w_k)
    v = precision.matmul(x, w_v)
    if self._bias:
      q = q + b_q[None]
      v = v + b_v[None]
      if not self._share_qk:
        k = k + b_k[None]
    return q, k, v

  def forward_unbatched(self, x, mask=None, *, weights, state, rng,
                        update_state):
    """Attention of one head over one example `x [L, M]`; returns `(y, state)`."""
    q, k, v, w_o = self._attend_inputs(x, weights)
    units = (q, v) if self._share_qk else (q, k, v)
    o, state = self._attend_unit(*units, mask, state=state, rng=rng,
                                 update_state=update_state)
    out = o if w_o is None else precision.matmul(o, w_o)
    return apply_output_dropout(out, rng, self._attention_dropout,
                                self._output_dropout), state

  def _attend_unit(self, *units_and_mask, state, rng, update_state):
    """One unit's attention of projected `q, [k,] v` `[L, d]` (k absent with
    `share_qk`) and the example's mask (or None): `(o, state)`."""
    del update_state
    n_units = 2 if self._share_qk else 3
    units, rest = units_and_mask[:n_units], units_and_mask[n_units:]
    mask = rest[0] if rest else None
    q, k, v = (units[0], None, units[1]) if self._share_qk else units
    if (mask is not None) != self._masked:
      raise InputValueError(f'{self.name}: masked={self._masked} but a mask was '
                            f'{"given" if mask is not None else "not given"}.')
    attend_rng, _ = dropout_rngs(rng, self._attention_dropout,
                                 self._output_dropout)
    k = self._shared_keys(q, k)
    length = q.shape[-2]
    positions = jnp.arange(length, dtype=jnp.int32)
    valid = None if mask is None else mask.astype(bool)
    chunk = self._chunk_len
    if chunk is not None and length % chunk:
      pad = chunk - length % chunk
      padding = lambda a: jnp.pad(a, ((0, pad), (0, 0)))
      q, v = padding(q), padding(v)
      k = None if k is None else padding(k)
      valid = jnp.ones((length,), bool) if valid is None else valid
      valid = jnp.concatenate([valid, jnp.zeros((pad,), bool)])
      positions = jnp.arange(length + pad, dtype=jnp.int32)
    kv_info = positions
    if valid is not None:
      # Padding gets info <= -2, i.e. < 0 after attend's +1 shift (Trax's
      # `-position` leaves padding at positions 0 and 1 unmasked).
      kv_info = jnp.where(valid, positions, -positions - 2)
    mask_fn = functools.partial(
        mask_self_attention, causal=self._causal,
        exclude_self=self._excludes_self(), masked=valid is not None)
    o, _ = attend(q, k, v, q_chunk_len=chunk, kv_chunk_len=chunk,
                  n_chunks_before=self._n_chunks_before,
                  n_chunks_after=self._n_chunks_after, mask_fn=mask_fn,
                  q_info=positions, kv_info=kv_info,
                  dropout=self._attention_dropout, rng=attend_rng,
                  implementation=self.implementation)
    return o[:length], state

  def _unit_stages(self, shape):
    """Projections of all heads at once, `_attend_unit` per unit.

    None where `_attend_inputs` multiplies the weights first (small
    `d_model`: its keys are the input itself), or where a subclass has its
    own `forward_unbatched`, `_project` or `_attend_inputs`.
    """
    own = self._runs_own(SelfAttention, 'forward_unbatched', '_project',
                         '_attend_inputs')
    weight_products = not (self._share_qk or self._bias or
                           2 * shape[-1] > min(self._d_qk, self._d_v))
    if weight_products or not own:
      return None
    depth = self._d_qk * (1 if self._share_qk else 2) + self._d_v
    return groups.UnitStages(self._project_heads, self._attend_unit,
                             self._combine_heads, depth)

  def _project_heads(self, inputs, weights):
    """`(q, [k,] v)` of every unit, `[B * n_heads, L, d]` (`_project` of all heads)."""
    w_q, w_k, w_v, _, b_q, b_k, b_v = self._unpack_weights(weights)
    x = inputs[0]
    if self._share_qk:
      return project_heads(x, w_q, b_q), project_heads(x, w_v, b_v)
    return (project_heads(x, w_q, b_q), project_heads(x, w_k, b_k),
            project_heads(x, w_v, b_v))

  def _combine_heads(self, o, weights, rng):
    """The heads' outputs `o [B * n_heads, L, d_v]` summed through `w_o`,
    then the output dropout."""
    return apply_output_dropout(
        combine_heads(o, self._unpack_weights(weights)[3]), rng,
        self._attention_dropout, self._output_dropout)

  def _shared_keys(self, q, k):
    """Keys for `attend`: None (normalised queries) when shared, else `k`."""
    if self._share_qk and not self.normalizes_shared_keys:
      return q
    return k

  def _excludes_self(self):
    """Whether a position's own key is masked (normalised shared keys)."""
    return self._share_qk and self.normalizes_shared_keys

  def _attend_inputs(self, x, weights):
    """`(q, k, v, w_o)` of `x [L, M]`, weight products first when that is cheaper.

    Attention is bilinear in queries and keys and linear in values:
    `q k^T = x (W_q W_k^T) x^T` and `(p v) W_o = p (x W_v W_o)`. When d_model
    is at most half of d_qk and d_v (as in small models with the default
    64-wide heads), the `[M, M]` weight products make every per-position
    matmul smaller: the same function in fewer FLOPs, up to rounding. Then
    the keys are `x` itself, `w_o` is None, and the queries carry the
    `1/sqrt(d_qk)` scale (`attend` divides keys by `sqrt(M)`).
    """
    d_model = x.shape[-1]
    if (self._share_qk or self._bias or
        2 * d_model > min(self._d_qk, self._d_v)):
      q, k, v = self._project(x, weights)
      return q, k, v, self._unpack_weights(weights)[3]
    w_q, w_k, w_v, w_o = self._unpack_weights(weights)[:4]
    w_qk = jnp.matmul(w_q, w_k.T) * math.sqrt(d_model / self._d_qk)
    w_vo = jnp.matmul(w_v, w_o)
    return precision.matmul(x, w_qk), x, precision.matmul(x, w_vo), None

  def _project_heads_step(self, x, weights):
    """`(q, k, v)` of a decoding step's rows `x [B, 1, M]`, `[B * H, 1, d]` each (keys as cached)."""
    w_q, w_k, w_v, _, b_q, b_k, b_v = self._unpack_weights(weights)
    q, v = project_step_heads(x, w_q, b_q), project_step_heads(x, w_v, b_v)
    if not self._share_qk:
      return q, project_step_heads(x, w_k, b_k), v
    return q, length_normalized(q) if self.normalizes_shared_keys else q, v

  def _all_units_step(self, inputs, weights, state, q_start, q_len):
    """A decoding step (one position) for all `[batch * n_heads]` units at once.

    One in-place write of the step's keys and values into the caches, one
    batched attention over them (queries scaled, so the caches are only
    read). Per unit this is `_incremental_forward_unbatched`, which the
    reference loop runs.
    """
    if (q_len != 1 or inputs[0].shape[1] == 1 or
        not self._runs_own(SelfAttention, '_incremental_forward_unbatched')):
      return None
    x = lax.dynamic_slice_in_dim(inputs[0], q_start, 1, axis=1)  # [B, 1, M]
    q, k, v = self._project_heads_step(x, weights)  # [B * H, 1, d]
    caches = tuple(
        lax.dynamic_update_slice_in_dim(c, a.astype(c.dtype), q_start, axis=1)
        for a, c in zip((k, v), state))
    mask_fn = functools.partial(mask_self_attention, causal=self._causal,
                                exclude_self=self._excludes_self())
    kv_info = jnp.arange(caches[0].shape[1], dtype=jnp.int32)
    attend_one = lambda q, k, v: attend_queries_scaled(
        q, k, v, mask_fn=mask_fn, q_info=q_start + jnp.zeros(1, jnp.int32),
        kv_info=kv_info)[0]
    o = jax.vmap(attend_one)(q, *caches)
    o = o.reshape(x.shape[:1] + (self._n_heads,) + o.shape[1:])
    out = precision.einsum('bhsv,hvm->bsm', o, self._unpack_weights(weights)[3])
    return out.astype(inputs[0].dtype), caches

  def _incremental_forward_unbatched(self, x, mask=None, *, q_start, q_len,
                                     weights, state, rng, update_state):
    """Fast inference: queries `x[q_start:q_start+q_len]` over memory `x`.

    The state caches the keys and values of the memory's positions. A few new
    positions (`x` is the memory) are projected alone and written into the
    caches at their positions, so a decoding step costs O(memory length *
    head depth), not O(memory length * d_model * head depth); a prompt (`x`
    is the prompt, `q_start == 0`) is projected whole and refills the caches.
    """
    del update_state, mask
    attend_rng, output_rng = dropout_rngs(rng, self._attention_dropout,
                                          self._output_dropout)
    k_cache, v_cache = state
    mem_len = k_cache.shape[0]
    refill = x.shape[0] == q_len  # Else x is the longer memory.
    q_range = q_start + jnp.arange(q_len, dtype=jnp.int32)
    x_q = x if refill else lax.dynamic_slice_in_dim(x, q_start, q_len, axis=0)
    # With one query, duplicate the row so that the matmul is the same
    # computation as in a longer call (Trax does this for float equality).
    q, k, v = self._project(
        jnp.concatenate([x_q] * 2, 0) if q_len == 1 else x_q, weights)
    if self._share_qk:
      k = length_normalized(q) if self.normalizes_shared_keys else q
    k, v = k[:q_len], v[:q_len]
    mask_fn = functools.partial(mask_self_attention, causal=self._causal,
                                exclude_self=self._excludes_self())
    chunk = self._chunk_len

    def cache(old, new):
      new = new.astype(old.dtype)
      if refill:
        return fit_to_memory(new, mem_len)
      return lax.dynamic_update_slice_in_dim(old, new, q_start, axis=0)

    new_state = (cache(k_cache, k), cache(v_cache, v))
    if not refill:
      k, v = new_state  # Attend over the whole memory.
    if refill and chunk is not None and q_len > chunk:
      # A prompt at the start of the sequence: chunked attention, padding at
      # the end (masked by causality).
      pad = -q_len % chunk
      padding = lambda a: jnp.pad(a, ((0, pad), (0, 0)))
      positions = jnp.arange(q_len + pad, dtype=jnp.int32)
      o, _ = attend(padding(q), padding(k), padding(v), q_chunk_len=chunk,
                    kv_chunk_len=chunk, n_chunks_before=self._n_chunks_before,
                    n_chunks_after=self._n_chunks_after, mask_fn=mask_fn,
                    q_info=positions, kv_info=positions,
                    dropout=self._attention_dropout, rng=attend_rng,
                    implementation=self.implementation)
      o = o[:q_len]
    else:
      o, _ = attend(q, k, v, mask_fn=mask_fn, q_info=q_range,
                    kv_info=jnp.arange(k.shape[-2], dtype=jnp.int32),
                    dropout=self._attention_dropout, rng=attend_rng)
    out = precision.matmul(o, self._unpack_weights(weights)[3])
    if q_len == 1:
      out = out[:1]
    return apply_broadcasted_dropout(out, self._output_dropout,
                                     output_rng), new_state


class SharedQKDotProductAttention(SelfAttention):
  """Shared-QK attention as Trax 1.2 computed it: the keys are the queries.

  Trax 1.2's `CausalAttention(share_qk=True)` and `ReformerLM(share_qk=True)`
  with their default `DotProductCausalAttention` duplicated the projected
  queries as keys: keys are not length-normalised and a position may attend
  to itself, unlike `SelfAttention(share_qk=True)` and `LSHSelfAttention`.
  It is the full attention of the Reformer paper's duplication experiment
  (Table 2), under which LSH-trained models attend to their own position and
  score at chance. The weights `(w_q, w_v, w_o)` are those of
  `SelfAttention(share_qk=True)` and `LSHSelfAttention`, so one set of
  trained weights runs under all three. Args as `SelfAttention`; `share_qk`
  is always True.
  """

  normalizes_shared_keys = False

  def __init__(self, n_heads=2, d_qk=64, d_v=64, share_qk=True, **kwargs):
    if not share_qk:
      raise ArgumentValueError(f'{type(self).__name__}: keys are always shared; got '
                               f'share_qk={share_qk!r} (use SelfAttention for '
                               'separate keys).')
    super().__init__(n_heads, d_qk, d_v, share_qk=True, **kwargs)


@configurable('trax.layers', denylist=('mode',))
class EncDecAttention(EfficientAttentionBase):
  """Memory-efficient multi-head encoder-decoder attention.

  Inputs: decoder activations `[B, Lq, M]`, encoder activations `[B, Lk, Mk]`
  and, when `masked=True`, the encoder mask `[B, Lk]` (True for real tokens).
  Output `[B, Lq, M]`. Weights `(w_q [H, M, D], w_k [H, Mk, D], w_v [H, Mk, V],
  w_o [H, V, M])`.
  """

  def __init__(self, n_heads=2, d_qk=64, d_v=64, masked=True, mode='train',
               attention_dropout=0.0, output_dropout=0.0,
               n_parallel_heads=None, use_python_loop=False,
               use_reference_code=False, penalize_padding_only=False):
    check_mode(type(self).__name__, mode)
    check_depths_and_rates(type(self).__name__, d_qk, d_v, attention_dropout,
                           output_dropout)
    super().__init__(n_heads, n_in=3 if masked else 2,
                     n_parallel_heads=n_parallel_heads,
                     use_python_loop=use_python_loop,
                     use_reference_code=use_reference_code)
    self._record_depths_and_dropout(d_qk, d_v, mode, attention_dropout,
                                    output_dropout)
    self._masked = masked
    self._penalize_padding_only = penalize_padding_only

  def _kernel_initializer(self, shape, rng):
    return attention_kernel_init(shape, rng, self._n_heads)

  def _check_inputs(self, inputs, weights):
    inputs = super()._check_inputs(inputs, weights)
    q_in, kv_in = inputs[0], inputs[1]
    if jnp.ndim(kv_in) != 3 or kv_in.shape[0] != q_in.shape[0]:
      raise InputValueError(f'{self.name}: encoder activations must be [batch, '
                            f'length, d] with batch {q_in.shape[0]}; got shape '
                            f'{jnp.shape(kv_in)}.')
    check_width(self.name, q_in, weights[0])
    check_width(self.name, kv_in, weights[1], 'encoder width')
    if self._masked:
      inputs = (q_in, kv_in, normalize_mask(self.name, inputs[2], kv_in))
    return inputs

  def create_weights_unbatched(self, input_signature, rng):
    d_model = input_signature[0].shape[-1]
    d_kv = input_signature[1].shape[-1]
    rng_q, rng_k, rng_v, rng_o = jax.random.split(rng, 4)
    w_q = self._kernel_initializer((d_model, self._d_qk), rng_q)
    w_k = self._kernel_initializer((d_kv, self._d_qk), rng_k)
    w_v = self._kernel_initializer((d_kv, self._d_v), rng_v)
    w_o = jnp.transpose(self._kernel_initializer((d_model, self._d_v), rng_o))
    return (w_q, w_k, w_v, w_o)

  def forward_unbatched(self, q_antecedent, kv_antecedent, mask=None, *,
                        weights, state, rng, update_state):
    """Attention of one head of one example; returns `(y [Lq, M], state)`."""
    del update_state
    attend_rng, output_rng = dropout_rngs(rng, self._attention_dropout,
                                          self._output_dropout)
    w_q, w_k, w_v, w_o = weights
    q = precision.matmul(q_antecedent, w_q)
    k = precision.matmul(kv_antecedent, w_k)
    v = precision.matmul(kv_antecedent, w_v)
    if self._masked:
      if mask is None:
        raise InputValueError(f'{self.name}: masked=True needs a mask input.')
      if self._penalize_padding_only:
        # Real keys get info 0, padding -1 (1 and 0 after attend's +1 shift).
        kv_info = mask.astype(jnp.int32) - 1
        mask_fn = lambda dots, q_info, kv_info: dots - MASK_PENALTY * (
            kv_info < 1).astype(dots.dtype)
      else:
        # Trax 1.4.1: "is padding" 0/1, shifted to 1/2 by attend, times 1e9
        # off every logit. In float32 the real keys' logits and the softmax
        # normaliser all round to -1e9: each real key gets weight 1 (their
        # values are summed), padding 0. Trax checkpoints were trained so.
        kv_info = jnp.logical_not(mask).astype(jnp.int32)
        mask_fn = lambda dots, q_info, kv_info: dots - MASK_PENALTY * (
            kv_info.astype(dots.dtype))
    else:
      kv_info = mask_fn = None
    o, _ = attend(q, k, v, mask_fn=mask_fn, kv_info=kv_info,
                  dropout=self._attention_dropout, rng=attend_rng)
    out = precision.matmul(o, w_o)
    return apply_broadcasted_dropout(out, self._output_dropout,
                                     output_rng), state
