"""LSH attention without weights (Trax's `PureLSHSelfAttention`) and its length-mixed form.

`PureLSHSelfAttention` takes queries/keys and values already projected and
split into heads, `qk [B * H, L, D]` and `v [B * H, L, D]` (plus `mask [B, L]`,
True for real tokens, when `masked=True`), and returns `[B * H, L, D]`: the
Reformer's shared-QK LSH attention of each (example, head) row, computed by
`lsh_attention.lsh_buckets`/`lsh_attend`, one group of `n_parallel_heads` rows
at a time with a recomputing backward pass (`EfficientAttentionBase` with one
"head" per row: nothing of the forward pass is kept but the inputs, and the
backward pass replays the forward pass's buckets).

State (Trax's layout, row `example * n_heads + head`): `(buckets int32
[B * H, n_hashes * L], rng uint32 [B * H, 2])`; in `mode='predict'`
`(mem_end, (qk_mem, v_mem) [B * H, predict_mem_len, D], (buckets, buckets_idx,
rng))`.

`MixedLSHSelfAttention` runs `PureLSHSelfAttention` on inputs longer than
`std_length` and plain dot-product attention (queries = keys = `qk`) on
shorter ones.

Differences from Trax 1.4.1: padding at positions 0 and 1 is masked too (as
in retrax's `LSHSelfAttention`); `n_parallel_heads > 1` works (Trax raises);
in predict mode `n_buckets=None` is derived from `predict_mem_len` (Trax
derived it from each call's length).
"""

import functools

import jax.numpy as jnp
from jax import lax

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.layers import predict_state
from retrax.layers.attention.efficient import check_count
from retrax.layers.attention.efficient import check_depths_and_rates
from retrax.layers.attention.efficient import check_mode
from retrax.layers.attention.efficient import check_predict
from retrax.layers.attention.efficient import dropout_rngs
from retrax.layers.attention.efficient import normalize_mask
from retrax.layers.attention.efficient_base import EfficientAttentionBase
from retrax.layers.attention.ops import attend
from retrax.layers.attention.ops import length_normalized
from retrax.layers.attention.ops import mask_self_attention
from retrax.layers.attention.lsh import buckets_and_state
from retrax.layers.attention.lsh import check_n_buckets
from retrax.layers.attention.lsh import lsh_attend
from retrax.layers.attention.lsh import lsh_buckets
from retrax.layers.attention.lsh import n_bucket_ids
from retrax.layers.attention.lsh import recent_matching_keys
from retrax.layers.attention.lsh import roll_buckets
from retrax.validation import ArgumentValueError


def _check_parallel_heads(name, n_parallel_heads, n_heads):
  if n_parallel_heads and (
      (n_parallel_heads > n_heads and n_parallel_heads % n_heads) or
      (n_parallel_heads < n_heads and n_heads % n_parallel_heads)):
    raise ArgumentValueError(f'{name}: n_parallel_heads must be a multiple or a '
                             f'divisor of n_heads ({n_heads}); got {n_parallel_heads}.')


@configurable('trax.layers', denylist=('mode',))
class PureLSHSelfAttention(EfficientAttentionBase):
  """LSH self-attention on projected heads: `(qk, v[, mask]) -> [B * H, L, D]`.

  Args follow Trax: n_heads, d_qk, d_v, share_qk (ignored: always shared),
  causal, masked, chunk_len, n_chunks_before, n_chunks_after, n_hashes,
  n_buckets (None: from the length, see `lsh_attention.default_n_buckets`; an
  even int; or a list for factorised hashing), mode, predict_mem_len,
  predict_drop_len, attention_dropout (train only), output_dropout (unused,
  as in Trax), max_length_for_buckets (pad the stored buckets to this
  length), bias (unused: no weights), n_parallel_heads (rows computed at
  once), use_python_loop, use_reference_code.
  """

  def __init__(self, n_heads=2, d_qk=64, d_v=64, share_qk='unused',
               causal=False, masked=False, chunk_len=128, n_chunks_before=1,
               n_chunks_after=0, n_hashes=1, n_buckets=None, mode='train',
               predict_mem_len=2048, predict_drop_len=256,
               attention_dropout=0.0, output_dropout=0.0,
               max_length_for_buckets=None, bias=False, n_parallel_heads=1,
               use_python_loop=False, use_reference_code=False):
    del share_qk, bias
    name = type(self).__name__
    check_mode(name, mode)
    n_heads = check_count(name, 'n_heads', n_heads, 1)
    check_count(name, 'chunk_len', chunk_len, 1)
    check_count(name, 'n_chunks_before', n_chunks_before)
    check_count(name, 'n_chunks_after', n_chunks_after)
    check_count(name, 'n_hashes', n_hashes, 1)
    check_depths_and_rates(name, d_qk, d_v, attention_dropout, output_dropout)
    check_count(name, 'max_length_for_buckets', max_length_for_buckets, 1,
                allow_none=True)
    check_n_buckets(name, n_buckets)
    _check_parallel_heads(name, n_parallel_heads, n_heads)
    incremental = mode == 'predict'
    if incremental:
      check_predict(name, causal, masked, n_chunks_after)
      predict_mem_len = predict_mem_len or chunk_len * (1 + n_chunks_before)
      predict_drop_len = predict_drop_len or chunk_len
    # One unit per (example, head) row: the base class's "heads" are 1.
    super().__init__(1, n_in=3 if masked else 2,
                     n_parallel_heads=n_parallel_heads, incremental=incremental,
                     predict_mem_len=predict_mem_len,
                     predict_drop_len=predict_drop_len,
                     use_python_loop=use_python_loop,
                     use_reference_code=use_reference_code)
    self._lsh_heads = n_heads
    self._d_qk, self._d_v = d_qk, d_v
    # `lsh_attend` runs XLA ops here: the kernel is not wired in, so the
    # environment's `RETRAX_ATTENTION_IMPL` must not claim it (nor shrink
    # `unit_bytes`' estimate).
    self._record_chunking(causal, masked, chunk_len, n_chunks_before,
                          n_chunks_after, implementation='xla')
    self._n_hashes = n_hashes
    self._n_buckets = n_buckets
    self._max_length_for_buckets = max_length_for_buckets
    self._attention_dropout = attention_dropout if mode == 'train' else 0.0

  @property
  def heads_per_example(self):
    """Trax's `n_heads`: rows of `qk`/`v` per example."""
    return self._lsh_heads

  def predict_state_layout(self, state):
    """Every leaf but the memory's end holds `n_heads` rows per example."""
    if not self._incremental:
      return predict_state.PredictStateLayout(
          predict_state.same_rows(state, self._lsh_heads))
    mem_end, mem, units = state
    return predict_state.PredictStateLayout(
        (predict_state.same_rows(mem_end, 0),
         predict_state.same_rows(mem, self._lsh_heads),
         predict_state.same_rows(units, self._lsh_heads)))

  def _check_inputs(self, inputs, weights):
    inputs = super()._check_inputs(inputs, weights)
    qk, v = inputs[0], inputs[1]
    if qk.shape != v.shape:
      raise InputValueError(f'{self.name}: qk and v must have the same shape '
                            f'[batch * n_heads, length, d_head]; got {qk.shape} and '
                            f'{v.shape}.')
    if qk.shape[0] % self._lsh_heads:
      raise InputValueError(f'{self.name}: the first axis of qk ({qk.shape[0]}) '
                            f'must be batch * n_heads (n_heads={self._lsh_heads}).')
    if not self._incremental and (self._n_hashes * qk.shape[1]) % self._chunk_len:
      raise InputValueError(
          f'{self.name}: n_hashes * length = {self._n_hashes} * {qk.shape[1]} '
          f'must be a multiple of chunk_len={self._chunk_len}.')
    if self._masked:
      batch = qk.shape[0] // self._lsh_heads
      mask = normalize_mask(self.name, inputs[2], qk[:batch])
      return (qk, v, jnp.repeat(mask, self._lsh_heads, axis=0))
    return inputs

  def create_weights_unbatched(self, input_signature, rng):
    del input_signature, rng
    return ()

  def create_state_unbatched(self, input_signature, rng):
    if self._incremental:
      buckets = jnp.zeros(self._n_hashes * self._predict_mem_len, jnp.int32)
      return (buckets, jnp.zeros((), jnp.int32), rng)
    length = self._max_length_for_buckets or input_signature[0].shape[0]
    return (jnp.zeros(self._n_hashes * length, jnp.int32), rng)

  def _predict_mem_signature(self, input_signature):
    return input_signature[:2]

  def hash_vectors(self, vecs, rng, mask=None):
    """Bucket ids `[n_hashes * L]` of `vecs [L, D]` (see `lsh_attention.lsh_buckets`)."""
    return lsh_buckets(vecs, rng, self._n_buckets, self._n_hashes,
                       self._chunk_len, mask=mask,
                       length=self.hash_length(vecs.shape[0]))

  def _attend(self, qk, v, buckets, mask, rng):
    attend_rng, _ = dropout_rngs(rng, self._attention_dropout, 0.0)
    return lsh_attend(qk, v, buckets, mask, n_hashes=self._n_hashes,
                      chunk_len=self._chunk_len,
                      n_chunks_before=self._n_chunks_before,
                      n_chunks_after=self._n_chunks_after, causal=self._causal,
                      dropout=self._attention_dropout, rng=attend_rng,
                      n_ids=n_bucket_ids(self._n_buckets, self._n_hashes,
                                         self._chunk_len,
                                         self.hash_length(qk.shape[0])))

  def forward_unbatched(self, qk, v, mask=None, *, weights, state, rng,
                        update_state):
    """LSH attention of one row: `qk, v [L, D]`, `mask [L]` -> `[L, D]`."""
    del weights
    buckets, state = buckets_and_state(
        self.name, self.hash_vectors, qk, state, mask, n_hashes=self._n_hashes,
        max_length_for_buckets=self._max_length_for_buckets,
        update_state=update_state, unit='row')
    return self._attend(qk, v, buckets, mask, rng), state

  def _incremental_forward_unbatched(self, qk, v, *, q_start, q_len, weights,
                                     state, rng, update_state):
    """Fast inference over the memory `qk, v [mem_len, D]` (Trax's algorithm).

    Several positions (a prompt, at the start): LSH attention over the padded
    memory with the stored rng's hash. One position: it attends to the
    `n_hashes * chunk_len * (1 + n_chunks_before)` most recent earlier
    positions sharing a bucket with it in some round.
    """
    del weights, update_state
    buckets, buckets_idx, hash_rng = state
    buckets = jnp.reshape(
        roll_buckets(buckets, self._n_hashes, self._predict_drop_len,
                     buckets_idx - q_start), (self._n_hashes, -1))
    if q_len > 1:
      out, buckets, new_idx = self._prompt_forward(qk, v, q_start, q_len,
                                                   buckets, hash_rng, rng)
    else:
      out, buckets, new_idx = self._one_position_forward(
          qk, v, q_start, q_len, buckets, hash_rng, rng)
    return out, (jnp.reshape(buckets, (-1,)), new_idx, hash_rng)

  def _prompt_forward(self, qk, v, q_start, q_len, buckets, hash_rng, rng):
    pad = -qk.shape[0] % self._chunk_len
    qk_p = jnp.pad(qk, ((0, pad), (0, 0)))
    v_p = jnp.pad(v, ((0, pad), (0, 0)))
    new_buckets = self.hash_vectors(qk_p, hash_rng)
    out = self._attend(qk_p, v_p, new_buckets, None, rng)
    out = lax.dynamic_slice_in_dim(out, q_start, q_len, axis=0)
    new_buckets = lax.dynamic_slice_in_dim(
        jnp.reshape(new_buckets, (self._n_hashes, -1)), q_start, q_len, axis=1)
    mem_len = self._predict_mem_len
    if q_len > mem_len:  # A prompt longer than the memory (q_start == 0).
      new_buckets = new_buckets[:, q_len - mem_len:]
    buckets = lax.dynamic_update_slice_in_dim(buckets, new_buckets, q_start,
                                              axis=1)
    return out, buckets, jnp.asarray(q_start + min(q_len, mem_len), jnp.int32)

  def _one_position_forward(self, qk, v, q_start, q_len, buckets, hash_rng,
                            rng):
    attend_rng, _ = dropout_rngs(rng, self._attention_dropout, 0.0)
    q_range = q_start + jnp.arange(q_len, dtype=jnp.int32)
    # Duplicate the row so the hash matches a longer call (as Trax does).
    q = jnp.concatenate([jnp.take(qk, q_range, axis=0)] * 2, 0)
    q_buckets = jnp.reshape(self.hash_vectors(q, hash_rng),
                            (self._n_hashes, 2))[:, :q_len]
    all_buckets = lax.dynamic_update_slice_in_dim(buckets, q_buckets, q_start,
                                                  axis=1)
    n_keys = self._n_hashes * self._chunk_len * (1 + self._n_chunks_before)
    kv_indices = recent_matching_keys(
        jnp.any(all_buckets == q_buckets, axis=0), qk.shape[0], q_start, q_len,
        n_keys)
    k = length_normalized(jnp.take(qk, kv_indices, axis=0))
    mask_fn = functools.partial(mask_self_attention, causal=True, masked=True,
                                exclude_self=True)
    o, _ = attend(q, k, jnp.take(v, kv_indices, axis=0), mask_fn=mask_fn,
                  q_info=q_range, kv_info=kv_indices,
                  dropout=self._attention_dropout, rng=attend_rng)
    return o[:1], all_buckets, jnp.asarray(q_start + q_len, jnp.int32)
