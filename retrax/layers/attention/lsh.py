"""LSH self-attention of the Reformer (Kitaev et al. 2020, arXiv:2001.04451).

Queries and keys are shared (`w_q` only). Each head hashes its queries by
random rotations into buckets (`n_hashes` rounds), sorts positions by
(round, bucket, position), cuts the sorted sequence into chunks of `chunk_len`
that attend to themselves and `n_chunks_before`/`n_chunks_after` neighbouring
chunks, unsorts, and merges the rounds weighted by their softmax normalisers
(log-sum-exp). A position attends to itself only if nothing else is visible;
causal masking uses original positions. Memory is `O(n_hashes * L *
chunk_len)` per head, never `O(L^2)`.

State (Trax's layout, rows `example * n_heads + head`): `(buckets int32
[B * H, n_hashes * L], rng uint32 [B * H, 2])`. Every call with
`update_state=True` splits a row's rng into `(new_rng, subkey)`, draws the
rotations `normal(subkey, (d_qk, n_hashes, n_buckets // 2))`, stores the buckets
(round `r` offset by `r * n_buckets`) and `new_rng`; the backward pass replays
the stored buckets. In `mode='predict'` the per-row state is `(buckets
[n_hashes * predict_mem_len], buckets_idx [], rng, keys [predict_mem_len,
d_qk], values [predict_mem_len, d_v])` inside `(mem_end, mem, ...)`: hashing
uses the stored rng itself, and the memory's keys (its length-normalised
queries) and values are cached, so a decoding step projects only its own
position.

Differences from Trax 1.4.1 (which the outputs otherwise match): `bias=True`
works (Trax cannot unpack its 5 weights); padding at positions 0 and 1 is
masked too; in predict mode `n_buckets=None` is derived from
`predict_mem_len` for every call (Trax derived it from each call's length, so
single tokens hashed into 2 buckets unlike the prompt), several positions
appended after the start attend over the memory at their own place, and the
memory's bucket index stays consistent after a prompt longer than the memory;
a decoding step gathers the cached keys and values of the `n_hashes *
chunk_len * (1 + n_chunks_before)` positions it attends to (Trax sorted the
memory and projected the rows it picked at every step), which is the same
function up to float rounding.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax.layers.attention.efficient import apply_output_dropout
from retrax.layers.attention.efficient import attention_kernel_init
from retrax.layers.attention.efficient import check_count
from retrax.layers.attention.efficient import check_depths_and_rates
from retrax.layers.attention.efficient import check_mode
from retrax.layers.attention.efficient import check_predict
from retrax.layers.attention.efficient import check_width
from retrax.layers.attention.efficient import dropout_rngs
from retrax.layers.attention.efficient import normalize_mask
from retrax.layers.attention.efficient_base import drop_oldest
from retrax.layers.attention.efficient_base import EfficientAttentionBase
from retrax.layers.attention.efficient_base import fit_to_memory
from retrax.layers.attention import groups
from retrax.layers.attention.ops import apply_broadcasted_dropout
from retrax.layers.attention.ops import attend_queries_scaled
from retrax.layers.attention.ops import attend_shared_qk
from retrax.layers.attention.ops import combine_heads
from retrax.layers.attention.ops import gathers_in_blocks
from retrax.layers.attention.ops import hash_vecs
from retrax.layers.attention.ops import inverse_permutation
from retrax.layers.attention.ops import length_normalized
from retrax.layers.attention.ops import mask_self_attention
from retrax.layers.attention.ops import memory_decides
from retrax.layers.attention.ops import merge_rounds
from retrax.layers.attention.ops import on_tpu_unless_set
from retrax.layers.attention.ops import permute_via_gather
from retrax.layers.attention.ops import project_heads
from retrax.layers.attention.ops import project_step_heads
from retrax.layers.attention.ops import runs_kernel
from retrax.layers.attention.ops import take_rows
from retrax.validation import ArgumentValueError


# Whether `lsh_attend` unsorts its outputs and their normalisers as one
# gather of `[N, V + 1]` rows (True) or as two, the normalisers a lane-dense
# `[N]` (False). One was faster when a TPU's gathers cost per index (all
# heads' rows in one op, 2026-12-06), and still is with heads gathered one
# at a time: two took 1.106x the paper-size 64K step's time on a TPU v5e
# (2026-12-07).
UNSORT_AS_ONE = True
# Whether all heads' queries and values are projected side by side, one
# `[.., d_qk + d_v]` array per head (`LSHSelfAttention._project_heads`): a
# head's slice is then the lane-dense array its sort gather takes. Apart,
# on a TPU, a head's `[.., 64]`-wide slices were copied into tiles padded
# to 128 lanes and joined again: in the paper-size 64K step compiled for a
# v5e, per head and pass, three such copies and two joins became one copy
# (2026-12-07; its time there not yet measured). On this CPU the default
# model's step took 1.04x the time side by side (16K, 5.57 vs 5.30 s).
# None: on a TPU only.
JOINT_PROJECTION = None
# Whether `lsh_attend` sorts its queries|values into bfloat16 rows where
# every matmul that reads them rounds them to bfloat16 anyway (on a TPU at
# JAX's default matmul precision): the sort gather, the layout copies
# around the chunks' attention and their cotangents then move half the
# bytes; the chunks compute in float32 as before, from keys normalised after
# that rounding. The cotangents of the sorted rows are rounded to bfloat16
# too, which the projections' weight-gradient matmuls do to them anyway.
# In the paper-size 64K step compiled for a v5e (2026-12-07, this CPU),
# layout copies of over 1 GB a step wrote 48.3 GB with float32 rows and 35.4
# with these, gathers 39.1 and 29.4 GB (its time on the chip not yet
# measured). Only where speed decides (`gathers_in_blocks` False: the memory
# path gathers rows block by block from float32). None: on a TPU only.
SORTED_BFLOAT16 = None


def default_n_buckets(length, chunk_len):
  """Trax's bucket count for a length: `2 * max(1, length // chunk_len)`.

  Above 128 buckets the hash is factorised into two even factors, the first a
  power of two near the square root (e.g. 1024 -> [32, 32]).
  """
  n_buckets = 2 * max(1, length // chunk_len)
  if n_buckets <= 128:
    return n_buckets
  first = 2**math.ceil(math.log2(math.sqrt(n_buckets)))
  return [first, 2 * (n_buckets // (2 * first))]


def lsh_buckets(vecs, rng, n_buckets, n_hashes, chunk_len, mask=None,
                length=None):
  """Bucket ids int32 `[n_hashes * L]` of `vecs [L, D]`, rounds offset apart.

  `n_buckets` None: `default_n_buckets(length, chunk_len)` (`length` defaults
  to `L`). With a mask (bool `[L]`), padding goes to an extra last bucket.
  """
  if n_buckets is None:
    n_buckets = default_n_buckets(
        vecs.shape[0] if length is None else length, chunk_len)
  buckets, n_total = hash_vecs(vecs, n_buckets, n_hashes, rng)
  if mask is not None:
    n_total += 1
    buckets = jnp.where(mask[None, :], buckets, n_total - 1)
  offsets = jnp.arange(n_hashes, dtype=jnp.int32) * n_total
  return jnp.reshape(buckets + offsets[:, None], (-1,))


def n_bucket_ids(n_buckets, n_hashes, chunk_len, length):
  """A bound of the bucket ids (all rounds, padding's included) of `lsh_buckets`."""
  if n_buckets is None:
    n_buckets = default_n_buckets(length, chunk_len)
  total = n_buckets if isinstance(n_buckets, int) else math.prod(n_buckets)
  return n_hashes * (total + 1)


def sort_by_bucket(buckets, n_ids=None):
  """The stable argsort (int32) of bucket ids `buckets [N]` in `[0, n_ids)`.

  When `n_ids * N` fits int32: one sort of the unique keys `bucket * N +
  position`, which XLA:CPU runs 4x faster than an argsort's sort of (key,
  index) pairs (32K ids: 1.3 vs 5.2 ms); the order is the same.
  """
  n = buckets.shape[-1]
  if n_ids is None or n_ids * n > jnp.iinfo(jnp.int32).max:
    return jnp.argsort(buckets, stable=True).astype(jnp.int32)
  return lax.sort(buckets * n + jnp.arange(n, dtype=jnp.int32)) % n


def check_n_buckets(name, n_buckets):
  factors = [n_buckets] if isinstance(n_buckets, int) else n_buckets
  if n_buckets is None:
    return
  if (not isinstance(factors, (list, tuple)) or not factors or
      any(not isinstance(f, int) or f <= 0 or f % 2 for f in factors)):
    raise ArgumentValueError(f'{name}: n_buckets must be None, a positive even int or '
                             f'a list of them; got {n_buckets!r}.')


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def gather_rounds(x, sticker, undo_sort, n_hashes):
  """`x [L, D]` in sorted order for every hashing round: `x[sticker % L]`.

  `sticker` is a permutation of `n_hashes * L` rows (round-major), so the
  gradient is a gather by its inverse `undo_sort` summed over the rounds, not
  the scatter-add autodiff would write; and `x` is never tiled `n_hashes`
  times.
  """
  return take_rows(x, sticker % x.shape[0])


def _gather_rounds_fwd(x, sticker, undo_sort, n_hashes):
  return gather_rounds(x, sticker, undo_sort, n_hashes), undo_sort


def _gather_rounds_bwd(n_hashes, undo_sort, ct):
  rounds = take_rows(ct, undo_sort)
  return (jnp.sum(rounds.reshape((n_hashes, -1) + ct.shape[1:]), axis=0),
          None, None)


gather_rounds.defvjp(_gather_rounds_fwd, _gather_rounds_bwd)


def _last_column(x):
  """`x[:, -1]`; on a TPU as a masked sum over each row (the same values).

  The slice's transpose builds its cotangent as an `[N, 1]` column (a TPU
  tile of 8 x 128 per 8 values) padded into `[N, V + 1]`; the sum's is a
  select over the rows, fused with the other columns' cotangent. In the
  paper-size 64K step compiled for a v5e that took out an `[N, 1]` copy,
  two `[N / 2, 1]` copies, four asynchronous copies, two slices and a pad
  of such columns per head and pass (2026-12-07; its time there not yet
  measured). On a CPU the slice reads less.
  """
  if jax.default_backend() != 'tpu':
    return x[:, -1]
  last = jnp.arange(x.shape[-1]) == x.shape[-1] - 1
  return jnp.sum(jnp.where(last, x, 0), axis=-1)


def _sorted_dtype(dtype, implementation):
  """The dtype `lsh_attend` sorts float32 queries|values into (`SORTED_BFLOAT16`)."""
  if dtype != jnp.float32 or runs_kernel(implementation):
    return dtype
  if SORTED_BFLOAT16 is None:
    on_tpu = jax.default_backend() == 'tpu'
    narrow = on_tpu and precision.float32_dots_round_to_bfloat16(on_tpu)
  else:
    narrow = SORTED_BFLOAT16
  return jnp.bfloat16 if narrow else dtype


def lsh_attend(q, v, buckets, mask=None, *, n_hashes, chunk_len,
               n_chunks_before, n_chunks_after, causal, dropout=0.0, rng=None,
               n_ids=None, implementation='xla', depth=None):
  """Shared-QK attention of one head within LSH buckets: returns `o [L, V]`.

  `q [L, D]` are the queries (keys are their normalised copies), `v [L, V]`
  the values, `buckets` int32 `[n_hashes * L]` their bucket ids (rounds offset
  apart, see `LSHSelfAttention.hash_vectors`), `mask` bool `[L]` (True for real
  tokens) or None. Positions are sorted by (round, bucket, position), attend
  in chunks of `chunk_len` to `n_chunks_before`/`n_chunks_after` neighbouring
  chunks, are unsorted, and the rounds are merged weighted by their softmax
  normalisers. The buckets get no gradient; `n_ids` bounds their ids (a
  faster sort, see `sort_by_bucket`). `implementation` is `attend`'s (the
  chunks' attention by XLA ops or the Pallas kernel). With `depth`, `q`
  holds the queries and the values side by side, `[L, depth + V]`, and `v`
  is None.
  """
  if depth is None:
    depth, qv = q.shape[-1], jnp.concatenate([q, v], axis=-1)
  elif v is not None:
    raise ArgumentValueError(
        f'lsh_attend: with depth={depth} the values come in q (queries|values '
        f'side by side, {tuple(q.shape)}); v must be None, got {tuple(v.shape)}.')
  else:
    qv = q
  seqlen, n_values, dtype = qv.shape[0], qv.shape[-1] - depth, qv.dtype
  buckets = lax.stop_gradient(buckets)
  # A stable sort of the offset bucket ids keeps positions in order within a
  # bucket ("s" prefix = sorted order).
  sticker = sort_by_bucket(buckets, n_ids)  # [H*L]
  undo_sort = inverse_permutation(sticker)
  st = sticker % seqlen
  # Queries, values (and the mask) travel as the columns of one gather, and
  # the outputs with their normalisers as one more: an accelerator's gather
  # costs per index, not per byte (a TPU v5e took 5.5 ms per 512K indices,
  # rows of 64 or of 1 alike), and these were 12 of a step's 13 costliest ops.
  width = chunk_len * (1 + n_chunks_before + n_chunks_after)
  in_blocks = gathers_in_blocks(n_hashes * seqlen, chunk_len, n_chunks_before,
                                n_chunks_after, implementation)
  kv_info, compute_dtype = None, None
  if in_blocks:  # No sorted copy: each block of the attention gathers its rows.
    rows = st
    if mask is not None:
      kv_info = jnp.where(take_rows(mask, st), st, -st - 2)
  else:
    columns = qv if mask is None else jnp.concatenate(
        [qv, mask[:, None].astype(dtype)], axis=-1)
    stored = _sorted_dtype(dtype, implementation)
    if stored != dtype:
      columns, compute_dtype = columns.astype(stored), dtype
    sorted_columns = gather_rounds(columns, sticker, undo_sort, n_hashes)
    qv, rows = sorted_columns[:, :depth + n_values], None
    if mask is not None:
      smask = lax.stop_gradient(sorted_columns[:, -1]) > 0
      kv_info = jnp.where(smask, st, -st - 2)  # padding < 0 after +1 shift
  mask_fn = functools.partial(mask_self_attention, causal=causal,
                              exclude_self=True, masked=mask is not None)
  # Where memory decides, apart: on a TPU the normalisers' `[N, 1]` column
  # (and its cotangent) takes 128 lanes, as much as the outputs.
  as_one = UNSORT_AS_ONE and not memory_decides(n_hashes * seqlen // chunk_len,
                                                chunk_len, width)
  attended = attend_shared_qk(
      qv, depth, chunk_len, n_chunks_before=n_chunks_before,
      n_chunks_after=n_chunks_after, mask_fn=mask_fn, q_info=st,
      kv_info=kv_info, dropout=dropout, rng=rng, implementation=implementation,
      rows=rows, joint_output=as_one, compute_dtype=compute_dtype)
  if as_one:  # Outputs and normalisers `[N, V + 1]` side by side.
    unsorted = permute_via_gather(attended, undo_sort, sticker)
    o = unsorted[:, :-1].astype(dtype)  # [H*L, V]
    logits = _last_column(unsorted)  # [H*L]
  else:
    so, slogits = attended
    o = permute_via_gather(so.astype(dtype), undo_sort, sticker)
    logits = permute_via_gather(slogits, undo_sort, sticker)
  if n_hashes > 1:
    o = jnp.reshape(o, (n_hashes, seqlen, o.shape[-1]))
    o = merge_rounds(o, jnp.reshape(logits, (n_hashes, seqlen, 1)))
  return o


def buckets_and_state(name, hash_vectors, vecs, state, mask, *, n_hashes,
                      max_length_for_buckets, update_state, unit):
  """`(buckets, state)` of one unit (head or row) of an LSH layer.

  With `update_state`, hashes `vecs` with a fresh key split from the state's
  and stores the buckets (padded to `max_length_for_buckets` positions) for a
  recomputing backward pass to replay; otherwise replays the stored ones.
  """
  n_rows = n_hashes * vecs.shape[0]
  if update_state:
    _, old_rng = state
    hash_rng, hash_subrng = jax.random.split(old_rng)
    buckets = hash_vectors(vecs, hash_subrng, mask)
    stored = buckets
    if max_length_for_buckets:
      stored = jnp.pad(buckets, (0, n_hashes * max_length_for_buckets - n_rows))
    return buckets, (stored, hash_rng)
  buckets = state[0][:n_rows]
  if buckets.shape[0] != n_rows:
    raise InputValueError(f'{name}: the state holds {buckets.shape[0]} buckets per '
                          f'{unit} but n_hashes * length = {n_rows}; the state '
                          'comes from inputs of another length.')
  return buckets, state


def roll_buckets(buckets, n_hashes, drop_len, shift):
  """Predict-mode buckets `[n_hashes * mem_len]` shifted left by `shift` >= 0 positions.

  Called with the memory's drop when it forgot its oldest positions; freed
  slots are zero. A negative shift counts as 0 (no conditional: under vmap a
  per-unit `lax.cond` would compute both branches anyway).
  """
  b = jnp.reshape(buckets, (n_hashes, -1))
  padded = jnp.concatenate([b, jnp.zeros((n_hashes, drop_len), b.dtype)],
                           axis=1)
  b = lax.dynamic_slice_in_dim(padded, jnp.maximum(shift, 0), b.shape[-1],
                               axis=1)
  return jnp.reshape(b, (-1,))


def recent_matching_mask(is_valid_target, seqlen, q_start, q_len, n_keys):
  """Bool `[seqlen]`: the positions `recent_matching_keys` picks, without a sort.

  Each position's rank within its class (bucket-mates up to the query, other
  positions up to it, later bucket-mates, later others) is a count of the
  class's positions ranked before it, all read off one cumulative sum of
  the bucket-mates.
  """
  positions = jnp.arange(seqlen, dtype=jnp.int32)
  last = jnp.minimum(q_start + q_len, seqlen - 1)  # The last "past" position.
  past = positions <= last
  matching = is_valid_target.astype(bool)
  is_mate = matching.astype(jnp.int32)
  count = jnp.cumsum(is_mate)  # Bucket-mates in [0, i].
  n_matching_past = count[last]
  # Ranks in rank order: up to the query the most recent first, after it
  # the earliest first; bucket-mates before the others.
  matching_past = n_matching_past - count  # Bucket-mates in (i, last].
  other_past = (last - positions) - matching_past
  matching_later = count - is_mate - n_matching_past  # In (last, i).
  other_later = (positions - last - 1) - matching_later
  # Keys left for a class once the classes ranked before it are taken.
  n_matching_later = count[-1] - n_matching_past
  budgets = (n_keys, n_keys - n_matching_past, n_keys - last - 1,
             n_keys - last - 1 - n_matching_later)
  classes = ((matching & past, matching_past),
             (~matching & past, other_past),
             (matching & ~past, matching_later),
             (~matching & ~past, other_later))
  chosen = jnp.zeros(seqlen, bool)
  for (members, rank), budget in zip(classes, budgets):
    chosen = chosen | (members & (rank < budget))
  return chosen


def recent_matching_keys(is_valid_target, seqlen, q_start, q_len, n_keys):
  """The `n_keys` memory positions a predict-mode query attends to (Trax's rule).

  Positions sharing a bucket with the query (`is_valid_target` bool
  `[seqlen]`) come first, most recent first; positions after the query rank
  last.
  """
  positions = jnp.arange(seqlen, dtype=jnp.int32)
  priorities = jnp.where(positions > q_start + q_len,
                         -(seqlen + positions), positions)
  priorities = priorities + seqlen * is_valid_target.astype(jnp.int32)
  _, kv_indices = lax.sort_key_val(priorities, positions)
  return kv_indices[-n_keys:]


@configurable('trax.layers', denylist=('mode',))
class LSHSelfAttention(EfficientAttentionBase):
  """Multi-head LSH self-attention (shared queries and keys), memory-efficient.

  Inputs: `x [B, L, M]`, plus `mask [B, L]` (True for real tokens) when
  `masked=True`; padding hashes into an extra bucket. Output `[B, L, M]`.
  Weights `(w_q [H, M, D], w_v [H, M, V], w_o [H, V, M])`, plus `(b_q, b_v)`
  with `bias=True`. `n_hashes * L` must be a multiple of `chunk_len`.

  Args follow Trax: n_heads, d_qk, d_v, share_qk (ignored: always shared),
  causal, masked, chunk_len, n_chunks_before, n_chunks_after, n_hashes,
  n_buckets (None: `default_n_buckets(L, chunk_len)`; an int; or a list for
  factorised hashing), mode, predict_mem_len, predict_drop_len,
  attention_dropout, output_dropout (train-only), max_length_for_buckets (pad
  the stored buckets to this length, for inputs of varying length), bias,
  n_parallel_heads (default None: as many (example, head) units at once as
  fit a memory budget, on a GPU 1/4 of its memory, on a CPU or a TPU 16 MiB
  (small models batched, long sequences one at a time), see
  `EfficientAttentionBase`; Trax's default, 1, always computes one at a time
  and leaves an accelerator idle),
  use_python_loop, use_reference_code; and `implementation` of the sorted
  chunks' attention ('xla', 'pallas', 'auto' or None: see
  `EfficientAttentionBase.implementation`).
  """

  def __init__(self, n_heads=2, d_qk=64, d_v=64, share_qk='unused',
               causal=False, masked=False, chunk_len=128, n_chunks_before=1,
               n_chunks_after=0, n_hashes=1, n_buckets=None, mode='train',
               predict_mem_len=2048, predict_drop_len=256,
               attention_dropout=0.0, output_dropout=0.0,
               max_length_for_buckets=None, bias=False, n_parallel_heads=None,
               use_python_loop=False, use_reference_code=False,
               implementation=None):
    del share_qk
    name = type(self).__name__
    check_mode(name, mode)
    check_count(name, 'chunk_len', chunk_len, 1)
    check_count(name, 'n_chunks_before', n_chunks_before)
    check_count(name, 'n_chunks_after', n_chunks_after)
    check_count(name, 'n_hashes', n_hashes, 1)
    check_depths_and_rates(name, d_qk, d_v, attention_dropout, output_dropout)
    check_count(name, 'max_length_for_buckets', max_length_for_buckets, 1,
                allow_none=True)
    check_n_buckets(name, n_buckets)
    incremental = mode == 'predict'
    if incremental:
      check_predict(name, causal, masked, n_chunks_after)
      predict_mem_len = predict_mem_len or chunk_len * (1 + n_chunks_before)
      predict_drop_len = predict_drop_len or chunk_len
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
    self._share_qk = True
    self._bias = bias
    self._n_hashes = n_hashes
    self._n_buckets = n_buckets
    self._max_length_for_buckets = max_length_for_buckets

  def _kernel_initializer(self, shape, rng):
    return attention_kernel_init(shape, rng, self._n_heads)

  def _predict_mem_signature(self, input_signature):
    return input_signature[:1]

  def _check_inputs(self, inputs, weights):
    inputs = super()._check_inputs(inputs, weights)
    x = inputs[0]
    check_width(self.name, x, weights[0])
    length = x.shape[1]
    if not self._incremental:
      if (self._n_hashes * length) % self._chunk_len:
        raise InputValueError(
            f'{self.name}: n_hashes * length = {self._n_hashes} * {length} '
            f'must be a multiple of chunk_len={self._chunk_len}; pad the '
            f'input (and use masked=True with a padding mask) or pick a '
            f'chunk_len that divides it.')
      if self._max_length_for_buckets and length > self._max_length_for_buckets:
        raise InputValueError(f'{self.name}: input length {length} exceeds '
                              f'max_length_for_buckets={self._max_length_for_buckets}.')
    if self._masked:
      inputs = (x, normalize_mask(self.name, inputs[1], x))
    return inputs

  def create_weights_unbatched(self, input_signature, rng):
    if isinstance(input_signature, (tuple, list)):
      input_signature = input_signature[0]
    d_model = input_signature.shape[-1]
    rng_q, _, rng_v, rng_o = jax.random.split(rng, 4)
    w_q = self._kernel_initializer((d_model, self._d_qk), rng_q)
    w_v = self._kernel_initializer((d_model, self._d_v), rng_v)
    w_o = jnp.transpose(self._kernel_initializer((d_model, self._d_v), rng_o))
    if self._bias:
      return (w_q, w_v, w_o, jnp.zeros(self._d_qk), jnp.zeros(self._d_v))
    return (w_q, w_v, w_o)

  def create_state_unbatched(self, input_signature, rng):
    if isinstance(input_signature, (tuple, list)):
      input_signature = input_signature[0]
    if self._incremental:
      mem_len = self._predict_mem_len
      dtype = jnp.promote_types(input_signature.dtype, jnp.float32)
      return (jnp.zeros(self._n_hashes * mem_len, jnp.int32),
              jnp.zeros((), jnp.int32), rng,
              jnp.zeros((mem_len, self._d_qk), dtype),
              jnp.zeros((mem_len, self._d_v), dtype))
    length = self._max_length_for_buckets or input_signature.shape[0]
    return (jnp.zeros(self._n_hashes * length, jnp.int32), rng)

  def _unpack_weights(self, weights):
    expected = 5 if self._bias else 3
    if len(weights) != expected:
      raise InputValueError(f'{self.name}: expected {expected} weight arrays '
                            f'(bias={self._bias}); got {len(weights)}.')
    if self._bias:
      return weights
    return tuple(weights) + (None, None)

  def _project(self, x, weights):
    w_q, w_v, _, b_q, b_v = self._unpack_weights(weights)
    q = precision.matmul(x, w_q)
    v = precision.matmul(x, w_v)
    if self._bias:
      q, v = q + b_q[None, :], v + b_v[None, :]
    return q, v

  def hash_vectors(self, vecs, rng, mask=None):
    """Bucket ids `[n_hashes * L]` of `vecs [L, D]`, rounds offset apart.

    With a mask, padding goes to an extra last bucket. With `n_buckets=None`
    the count follows the length (in predict mode: `predict_mem_len`, so that
    all calls hash alike).
    """
    return lsh_buckets(vecs, rng, self._n_buckets, self._n_hashes,
                       self._chunk_len, mask=mask,
                       length=self.hash_length(vecs.shape[0]))

  def forward_unbatched(self, x, mask=None, *, weights, state, rng,
                        update_state):
    """LSH attention of one head over one example `x [L, M]`."""
    q, v = self._project(x, weights)
    o, state = self._attend_unit_apart(q, v, mask, state=state, rng=rng,
                                       update_state=update_state)
    out = precision.matmul(o, self._unpack_weights(weights)[2])
    return apply_output_dropout(out, rng, self._attention_dropout,
                                self._output_dropout), state

  def _attend_unit(self, qv, mask=None, *, state, rng, update_state):
    """One unit's LSH attention of its projected queries and values side by
    side, `qv [L, d_qk + d_v]`: `(o, state)`."""
    if (mask is not None) != self._masked:
      raise InputValueError(f'{self.name}: masked={self._masked} but a mask was '
                            f'{"given" if mask is not None else "not given"}.')
    attend_rng, _ = dropout_rngs(rng, self._attention_dropout,
                                 self._output_dropout)
    buckets, state = buckets_and_state(
        self.name, self.hash_vectors, qv[:, :self._d_qk], state, mask,
        n_hashes=self._n_hashes,
        max_length_for_buckets=self._max_length_for_buckets,
        update_state=update_state, unit='head')
    o = lsh_attend(qv, None, buckets, mask, n_hashes=self._n_hashes,
                   chunk_len=self._chunk_len,
                   n_chunks_before=self._n_chunks_before,
                   n_chunks_after=self._n_chunks_after, causal=self._causal,
                   dropout=self._attention_dropout, rng=attend_rng,
                   implementation=self.implementation,
                   n_ids=n_bucket_ids(self._n_buckets, self._n_hashes,
                                      self._chunk_len,
                                      self.hash_length(qv.shape[0])),
                   depth=self._d_qk)
    return o, state

  def _unit_stages(self, shape):
    """Projections of all heads at once, `_attend_unit` per unit.

    None where a subclass has its own `forward_unbatched` or `_project`.
    """
    del shape
    if not self._runs_own(LSHSelfAttention, 'forward_unbatched', '_project'):
      return None
    joint = on_tpu_unless_set(JOINT_PROJECTION)
    return groups.UnitStages(
        self._project_heads if joint else self._project_heads_apart,
        self._attend_unit if joint else self._attend_unit_apart,
        self._combine_heads, self._d_qk + self._d_v)

  def _project_heads(self, inputs, weights):
    """`(qv,)`: every unit's queries and values side by side, `[B * n_heads,
    L, d_qk + d_v]` (`_project` of all heads, one matmul)."""
    w_q, w_v, _, b_q, b_v = self._unpack_weights(weights)
    w = jnp.concatenate([w_q, w_v], axis=-1)
    b = None if b_q is None else jnp.concatenate([b_q, b_v], axis=-1)
    return (project_heads(inputs[0], w, b),)

  def _project_heads_apart(self, inputs, weights):
    """`(q, v)` of every unit, `[B * n_heads, L, d]` (`_project` of all heads)."""
    w_q, w_v, _, b_q, b_v = self._unpack_weights(weights)
    return (project_heads(inputs[0], w_q, b_q),
            project_heads(inputs[0], w_v, b_v))

  def _attend_unit_apart(self, q, v, mask=None, **kwargs):
    """`_attend_unit` of projected `q`, `v` `[L, d]`."""
    return self._attend_unit(jnp.concatenate([q, v], axis=-1), mask, **kwargs)

  def _combine_heads(self, o, weights, rng):
    """The heads' outputs `o [B * n_heads, L, d_v]` summed through `w_o`,
    then the output dropout."""
    return apply_output_dropout(
        combine_heads(o, self._unpack_weights(weights)[2]), rng,
        self._attention_dropout, self._output_dropout)

  def _roll_predict_state(self, state):
    buckets, buckets_idx, rng, k_cache, v_cache = state
    drop = self._predict_drop_len
    return (buckets, buckets_idx, rng, drop_oldest(k_cache, drop),
            drop_oldest(v_cache, drop))

  def _all_units_step(self, inputs, weights, state, q_start, q_len):
    """A decoding step (one position) for all `[batch * n_heads]` units at once.

    The step's keys and values go into row `q_start` of the caches (one
    in-place update), and one batched attention reads them: `[units, 1, d]`
    queries over `[units, mem_len, d]` caches. Per unit this is
    `_one_position_forward`, which the reference loop runs.
    """
    if (q_len != 1 or not self._runs_own(LSHSelfAttention,
                                         '_incremental_forward_unbatched')):
      return None
    x = lax.dynamic_slice_in_dim(inputs[0], q_start, 1, axis=1)  # [B, 1, M]
    w_q, w_v, w_o, b_q, b_v = self._unpack_weights(weights)
    q, v = project_step_heads(x, w_q, b_q), project_step_heads(x, w_v, b_v)
    buckets, buckets_idx, rng, k_cache, v_cache = state
    k_cache, v_cache = (
        lax.dynamic_update_slice_in_dim(c, a.astype(c.dtype), q_start, axis=1)
        for a, c in ((length_normalized(q), k_cache), (v, v_cache)))
    step = jax.vmap(functools.partial(self._attend_step, q_start=q_start))
    o, buckets = step(q, buckets, buckets_idx, rng, k_cache, v_cache)
    o = o.reshape(x.shape[:1] + (self._n_heads,) + o.shape[1:])
    out = precision.einsum('bhsv,hvm->bsm', o, w_o)
    new_idx = jnp.full_like(buckets_idx, q_start + 1)
    return out.astype(inputs[0].dtype), (buckets, new_idx, rng, k_cache,
                                         v_cache)

  def _attend_step(self, q, buckets, buckets_idx, hash_rng, k_cache, v_cache,
                   *, q_start):
    """One unit's query `q [1, d]` over its caches; `(o [1, d_v], buckets)`.

    Its buckets go into the (rolled) stored ones at `q_start`; it attends
    over the cache rows of its key window (all of them when the window
    covers the memory).
    """
    buckets = jnp.reshape(self._roll_buckets(buckets, buckets_idx, q_start),
                          (self._n_hashes, -1))
    q_buckets = jnp.reshape(self.hash_vectors(jnp.concatenate([q] * 2, 0),
                                              hash_rng),
                            (self._n_hashes, 2))[:, :1]
    buckets = lax.dynamic_update_slice_in_dim(buckets, q_buckets, q_start,
                                              axis=1)
    mem_len = k_cache.shape[0]
    n_keys = self._n_hashes * self._chunk_len * (1 + self._n_chunks_before)
    kv_info = jnp.arange(mem_len, dtype=jnp.int32)
    if n_keys < mem_len:  # Only the key window's rows, in position order.
      chosen = recent_matching_mask(jnp.any(buckets == q_buckets, axis=0),
                                    mem_len, q_start, 1, n_keys)
      kv_info = jnp.nonzero(chosen, size=n_keys)[0].astype(jnp.int32)
      k_cache, v_cache = k_cache[kv_info], v_cache[kv_info]
    mask_fn = functools.partial(mask_self_attention, causal=True, masked=True,
                                exclude_self=True)
    # The queries are scaled, so the key cache is only read.
    o, _ = attend_queries_scaled(q, k_cache, v_cache, mask_fn=mask_fn,
                                 q_info=q_start + jnp.arange(1, dtype=jnp.int32),
                                 kv_info=kv_info)
    return o, jnp.reshape(buckets, (-1,))

  def _project_step(self, row, weights):
    """`_project` of a decoding step's row `[1, M]`: `(q, v)`, each `[1, d]`.

    The row is duplicated so the matmul matches a longer call (as Trax does).
    """
    q, v = self._project(jnp.concatenate([row] * 2, 0), weights)
    return q[:1], v[:1]

  def _roll_buckets(self, buckets, buckets_idx, q_start):
    """Shifts stored buckets like the memory when it dropped old positions."""
    return roll_buckets(buckets, self._n_hashes, self._predict_drop_len,
                        buckets_idx - q_start)

  def _incremental_forward_unbatched(self, x, *, q_start, q_len, weights,
                                     state, rng, update_state):
    """Fast inference over the memory `x [mem_len, M]` (Trax's algorithm).

    Several positions (a prompt): LSH attention over the memory with the
    stored rng's hash, keeping their buckets. One position: it attends to the
    `n_hashes * chunk_len * (1 + n_chunks_before)` most recent earlier positions
    that share a bucket with it in some round (then to the most recent others).
    """
    del update_state
    if q_len == 1:
      return self._one_position_forward(x, q_start, weights, state, rng)
    buckets, buckets_idx, hash_rng, k_cache, v_cache = state
    buckets = jnp.reshape(self._roll_buckets(buckets, buckets_idx, q_start),
                          (self._n_hashes, -1))
    out, buckets, new_idx, caches = self._prompt_forward(
        x, q_start, q_len, weights, buckets, hash_rng, rng, (k_cache, v_cache))
    return out, (jnp.reshape(buckets, (-1,)), new_idx, hash_rng) + caches

  def _prompt_forward(self, x, q_start, q_len, weights, buckets, hash_rng,
                      rng, caches):
    """Positions `[q_start, q_start + q_len)`, several, attend by LSH.

    `x` is the prompt (`q_start == 0`) or the memory. Returns `(out [q_len,
    M], buckets [n_hashes, mem_len], new index, (keys, values) caches)`, the
    caches refilled with the projections of the memory's positions.
    """
    mem_len = self._predict_mem_len
    pad = -x.shape[0] % self._chunk_len
    x_padded = jnp.pad(x, ((0, pad), (0, 0)))
    q, v = self._project(x_padded, weights)
    new_buckets = self.hash_vectors(q, hash_rng)
    caches = tuple(fit_to_memory(a[:x.shape[0]], mem_len).astype(c.dtype)
                   for a, c in zip((length_normalized(q), v), caches))
    out, _ = self.forward_unbatched(
        x_padded, weights=weights, state=(new_buckets, hash_rng), rng=rng,
        update_state=False)
    out = lax.dynamic_slice_in_dim(out, q_start, q_len, axis=0)
    new_buckets = jnp.reshape(new_buckets, (self._n_hashes, -1))
    new_buckets = lax.dynamic_slice_in_dim(new_buckets, q_start, q_len, axis=1)
    if q_len > mem_len:  # A prompt longer than the memory (q_start == 0).
      new_buckets = new_buckets[:, q_len - mem_len:]
    buckets = lax.dynamic_update_slice_in_dim(buckets, new_buckets, q_start,
                                              axis=1)
    return (out, buckets, jnp.asarray(q_start + min(q_len, mem_len), jnp.int32),
            caches)

  def _one_position_forward(self, x, q_start, weights, state, rng):
    """Position `q_start` of one unit attends to recent positions sharing a bucket.

    Writes its key and value into row `q_start` of the caches, then attends
    (`_attend_step`). The per-unit form of `_all_units_step`, run by the
    reference loop. Returns `(out [1, M], new_state)`.
    """
    # Predict mode has no dropout (train only); Trax's split order is kept.
    _, output_rng = dropout_rngs(rng, self._attention_dropout,
                                 self._output_dropout)
    buckets, buckets_idx, hash_rng, k_cache, v_cache = state
    q, v = self._project_step(lax.dynamic_slice_in_dim(x, q_start, 1), weights)
    k_cache, v_cache = (
        lax.dynamic_update_slice_in_dim(c, a.astype(c.dtype), q_start, axis=0)
        for a, c in ((length_normalized(q), k_cache), (v, v_cache)))
    o, buckets = self._attend_step(q, buckets, buckets_idx, hash_rng, k_cache,
                                   v_cache, q_start=q_start)
    out = precision.matmul(o, self._unpack_weights(weights)[2])
    out = apply_broadcasted_dropout(out, self._output_dropout, output_rng)
    return out, (buckets, jnp.asarray(q_start + 1, jnp.int32), hash_rng,
                 k_cache, v_cache)
