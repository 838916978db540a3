"""Array functions behind the Reformer's efficient attention (Trax's names and numerics).

These are the module-level helpers of `trax.layers.research.efficient_attention`
(the Coursera LSH lab imports them from `trax.layers`): vector normalisation,
random-rotation hashing, chunk neighbourhoods, additive masking, chunked
dot-product attention that also returns the softmax normaliser, broadcast
dropout, permutations whose gradient is a gather by the inverse permutation,
and a decoding step's projections for all heads at once.

Shape glossary: `L` sequence length, `D` depth of query/key vectors, `V` depth of
value vectors, `C` chunk length, `N` number of chunks (`L // C`), `W` window
length (`C * (1 + n_chunks_before + n_chunks_after)`), `H` hashing rounds.
"""

import functools
import math
import warnings

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax.layers.attention import chunked_kernel
from retrax import validation
from retrax.validation import ArgumentValueError

# Additive logit penalties, as in Trax: masked or future keys get -1e9, a
# query's own key (shared-QK attention) -1e5 so it is used only when nothing
# else is visible.
MASK_PENALTY = 1e9
SELF_PENALTY = 1e5
# Float32 chunked attention whose logits `[N, C, W]` have more than
# BLOCK_MIN_LOGITS entries runs BLOCK_CHUNKS chunks at a time (`lax.map`): a
# block's logits (2 MB at C = 64, W = 128) stay in cache. At 64K tokens (64 MB
# of logits a head) the ReformerLM training step is 4-6% faster and takes 4x
# fewer page faults. At 16K (16 MB), and with bfloat16 matmuls (64K: 22.5 ->
# 25.1 s), the loop's slicing and stacking cost more than the cache saves.
# On a TPU v5e the blocks pay too: the paper-size step at 64K took 0.977 s
# with them and 1.229 s with whole arrays (2026-12-06).
BLOCK_CHUNKS = 64
BLOCK_MIN_LOGITS = 2**23
# Above this many logits (256 MB in float32: 512K tokens, 2 rounds, W = 128)
# blocks run under every matmul policy: memory, not speed, decides. The
# blocks are then rematerialized (`jax.checkpoint`), so a backward pass never
# holds more than one block's logits and probabilities.
REMAT_MIN_LOGITS = 2**26
# Whether blocks run for speed (below REMAT_MIN_LOGITS) are rematerialized
# too (`remat_blocks`). They are: measured on XLA:CPU, where a recomputed
# block stays in cache. On a TPU v5e the paper-size 64K step recomputes
# their logits at 34 of its 993 ms (2026-12-06); False is to be measured
# there (`step_profile.py --set`).
REMAT_SPEED_BLOCKS = True
# Whether blocks run for speed take shared-QK queries and values as one
# array too (`attend_shared_qk`), as blocks where memory decides always do.
# A TPU pads a 64-wide minor axis to 128 lanes: one `[.., 128]` array and
# its one cotangent move half the bytes of two padded `[.., 64]` ones. On a
# v5e the paper-size 64K step, whose blocks run for speed, took 950 ms this
# way against 989 (0.960x; tpu.sh's variants stage, 2026-12-07). None: on a
# TPU only (CPUs and GPUs do not pad so; unmeasured there).
JOINT_SPEED_BLOCKS = None
# Whether blocks that take the joint queries|values (above) return each
# block's outputs and log-normalisers side by side, `[.., V + 1]`, when the
# caller wants them so (`attend_shared_qk(..., joint_output=True)`: LSH
# unsorts them as one gather). Otherwise they are concatenated after the
# blocks: on a TPU that copies the normalisers into an `[N, 1]` column (a
# 128-lane tile per 8 values) and writes `[N, V + 1]` once more. On a v5e
# the paper-size 64K step took 891.5 ms this way against 949.8 (0.939x;
# tpu.sh's variants stage, 2026-12-07). None: on a TPU only (unmeasured
# elsewhere).
LSE_IN_BLOCKS = None
# `hash_vecs` hashes in chunks of rows whose rotated vectors (all rounds)
# hold about this many elements (16 MB in float32), once there are 3 or more.
HASH_CHUNK_ELEMENTS = 2**22
# Queries per chunk from which `attend` computes its logits keys-major.
KEYS_MAJOR_MIN_QUERIES = 8
# Matmul policies under which such blocks compute their logits in both layouts
# (`_attend_both_layouts`). With bfloat16 matmuls a block's training step is
# 8% faster; float32 contracts a non-minor axis at ~3/4 of the minor speed,
# which costs less than a second logits matmul.
BOTH_LAYOUTS_POLICIES = ('bfloat16',)


LENGTH_NORM_EPSILON = 1e-6


def length_normalized(x, epsilon=LENGTH_NORM_EPSILON):
  """Scales each vector along the last axis to unit root-mean-square."""
  variance = jnp.mean(x**2, axis=-1, keepdims=True)
  return x / jnp.sqrt(variance + epsilon)


def _rotation_size_and_buckets(n_buckets_in):
  """Columns of the random rotation and total bucket count (factorised or not)."""
  factors = [n_buckets_in] if isinstance(n_buckets_in, int) else list(
      n_buckets_in)
  if not factors:
    raise ArgumentValueError('n_buckets must be a positive even int or a non-empty '
                             'list of them; got an empty list.')
  n_buckets = 1
  for factor in factors:
    if not isinstance(factor, int) or factor <= 0 or factor % 2:
      raise ArgumentValueError(f'Each number of hash buckets must be a positive even '
                               f'int; got {n_buckets_in!r}.')
    n_buckets *= factor
  return sum(factors), n_buckets, factors


def hash_vecs(vecs, n_buckets_in, n_hashes, rng):
  """Hashes vectors into buckets by random rotations (angular LSH).

  A random Gaussian matrix `R` of shape `[D, n_hashes, n_buckets // 2]` is drawn
  from `rng`; a vector's bucket in round `h` is `argmax([xR_h, -xR_h])`. With a
  list of bucket counts the hash is factorised: each factor uses its own slice
  of the rotation columns and the bucket ids combine as mixed-radix digits.

  Args:
    vecs: `[L, D]` vectors to hash.
    n_buckets_in: an even int, or a list of even ints (factorised hashing).
    n_hashes: number of hashing rounds.
    rng: PRNG key for the rotations.

  Returns:
    `(buckets, n_buckets)`: int32 `[n_hashes, L]` bucket ids and the total
    number of buckets (the product of the factors).
  """
  rot_size, n_buckets, factors = _rotation_size_and_buckets(n_buckets_in)
  rotations = jax.random.normal(
      rng, (vecs.shape[-1], n_hashes, rot_size // 2)).astype(jnp.float32)
  # float32 draws (as Trax), promoted explicitly with the vectors.
  dtype = vecs.dtype if jnp.finfo(vecs.dtype).bits >= 32 else jnp.float32
  rotations = rotations.astype(dtype)

  def hash_rows(vecs):  # [L, D] -> [H, L]
    rotated = jnp.einsum('tf,fhb->htb', vecs.astype(dtype),
                         rotations)  # [H, L, rot/2]
    if len(factors) == 1:
      return argmax_of_both_signs(rotated)
    buckets, start, radix = None, 0, 1
    for factor in factors:
      part = rotated[..., start:start + factor // 2]
      start += factor // 2
      digit = argmax_of_both_signs(part)
      buckets = digit if buckets is None else buckets + radix * digit
      radix *= factor
    return buckets

  # Each row hashes on its own: long inputs go in chunks of rows, so that
  # the rotated vectors and the argmax's index arrays ([H, L, rot/2] each)
  # exist one chunk at a time.
  length = vecs.shape[0]
  n_chunks = -(-length * n_hashes * rot_size // HASH_CHUNK_ELEMENTS)
  if n_chunks <= 2 or vecs.ndim != 2:
    return hash_rows(vecs), n_buckets
  chunk = -(-length // n_chunks)
  n_chunks = -(-length // chunk)
  padded = jnp.pad(vecs, ((0, n_chunks * chunk - length), (0, 0)))
  buckets = lax.map(hash_rows, jnp.reshape(padded, (n_chunks, chunk, -1)))
  buckets = jnp.reshape(jnp.moveaxis(buckets, 0, 1), (n_hashes, -1))
  return buckets[:, :length], n_buckets


def argmax_of_both_signs(x):
  """`argmax(concatenate([x, -x], -1), -1)` as int32, without the concatenation.

  The largest entry of `[x, -x]` is `max(x)` or `-min(x)`; the first index
  of either is found by a min-reduction over positions where `x` equals
  it. Ties and NaNs resolve as `jnp.argmax` does (first occurrence; a NaN
  counts as the largest). XLA:CPU runs these plain reductions vectorised,
  where `argmax`'s (value, index) reduction is scalar: hashing 16K
  positions takes half the time (the training step's argmax was 3-6%).
  """
  half = x.shape[-1]
  hi = jnp.max(x, axis=-1, keepdims=True)
  lo = jnp.min(x, axis=-1, keepdims=True)
  positions = jnp.arange(half, dtype=jnp.int32)
  nan = jnp.isnan(x)

  def first(match):
    return jnp.min(jnp.where(match | nan, positions, 2 * half), axis=-1)
  # `~(hi < -lo)` also takes the first half when `hi` is NaN, as argmax does.
  return jnp.where(~(hi < -lo)[..., 0], first(x == hi),
                   half + first(x == lo)).astype(jnp.int32)


def look_adjacent(x, n_chunks_before, n_chunks_after):
  """Concatenates each chunk with its neighbours (wrapping around the ends).

  Args:
    x: `[N, C, ...]` chunked array.
    n_chunks_before: number of previous chunks to include.
    n_chunks_after: number of following chunks to include.

  Returns:
    `[N, C * (1 + n_chunks_before + n_chunks_after), ...]`: for chunk `i`, the
    chunks `i - n_chunks_before, ..., i + n_chunks_after` (indices mod `N`).
  """
  if n_chunks_before == 0 and n_chunks_after == 0:
    return x
  slices = []
  for i in range(-n_chunks_before, n_chunks_after + 1):
    if i == 0:
      slices.append(x)
    else:
      slices.append(jnp.concatenate([x[i:, ...], x[:i, ...]], axis=0))
  return jnp.concatenate(slices, axis=1)


def mask_self_attention(dots, q_info, kv_info, causal=True, exclude_self=True,
                        masked=False):
  """Applies Trax's additive self-attention masks to attention logits.

  `q_info`/`kv_info` are positions (broadcastable against `dots`): keys after
  the query get -1e9 (`causal`), the query's own key -1e5 (`exclude_self`), keys
  with negative info -1e9 (`masked`, i.e. padding).
  """
  q_info = q_info.astype(jnp.float32)
  kv_info = kv_info.astype(jnp.float32)
  if causal:
    dots = dots - MASK_PENALTY * lax.lt(q_info, kv_info).astype(dots.dtype)
  if exclude_self:
    dots = dots - SELF_PENALTY * jnp.equal(q_info, kv_info).astype(dots.dtype)
  if masked:
    dots = dots - MASK_PENALTY * lax.lt(
        kv_info, jnp.zeros_like(kv_info)).astype(dots.dtype)
  return dots


def _chunk(x, chunk_len, what):
  if x.shape[0] % chunk_len:
    raise InputValueError(f'attend: {what} length {x.shape[0]} is not divisible by '
                          f'chunk length {chunk_len}; pad the sequence to a multiple '
                          f'of {chunk_len}.')
  return jnp.reshape(x, (-1, chunk_len) + x.shape[1:])


def attend(q, k=None, v=None, q_chunk_len=None, kv_chunk_len=None,
           n_chunks_before=0, n_chunks_after=0, mask_fn=None, q_info=None,
           kv_info=None, dropout=0.0, rng=None, implementation='xla',
           joint_output=False):
  """Dot-product attention, optionally chunked and masked (Trax's `attend`).

  With `k=None` keys are shared with queries (normalised with
  `length_normalized`). With chunk lengths, query chunk `i` attends to key
  chunks `i - n_chunks_before .. i + n_chunks_after` (wrapping around), so
  memory is `O(L * W)` instead of `O(L^2)`. `q_info`/`kv_info` (default:
  positions) are shifted by one and handed to `mask_fn(dots, q_info, kv_info)`.

  Args:
    q: `[Lq, D]` queries.
    k: `[Lk, D]` keys, or None to share `q`.
    v: `[Lk, V]` values.
    q_chunk_len: query chunk length, or None for no chunking.
    kv_chunk_len: key/value chunk length (must equal `q_chunk_len` with shared
      keys).
    n_chunks_before: adjacent previous key chunks to attend to.
    n_chunks_after: adjacent following key chunks to attend to.
    mask_fn: `(dots, q_info, kv_info) -> dots`, or None.
    q_info: int `[Lq]` query metadata for masking (default positions).
    kv_info: int `[Lk]` key metadata for masking (default positions).
    dropout: attention dropout rate, broadcast across chunks.
    rng: PRNG key for dropout.
    implementation: 'xla' (XLA ops), 'pallas' (the Pallas kernel of
      `chunked_kernel`: compiled on a TPU, interpreted elsewhere) or 'auto'
      (the kernel on a TPU only). Where the kernel cannot run (unchunked, a
      custom `mask_fn`, see `chunked_kernel.unsupported`) the XLA path runs,
      with a warning for 'pallas'.
    joint_output: return the two results side by side, one `[Lq, V + 1]`
      array (float32 or wider), as LSH unsorts them (the kernel writes it so).

  Returns:
    `(out, logsumexp)`: `[Lq, V]` attention output and `[Lq]` log-normaliser of
    each query's logits (used to merge LSH hashing rounds).
  """
  if v is None:
    raise ArgumentValueError('attend: values `v` are required.')
  share_qk = k is None
  q, k, v, q_info, kv_info = _chunked(q, k, v, q_info, kv_info, q_chunk_len,
                                      kv_chunk_len)
  if q_chunk_len is None and (n_chunks_before or n_chunks_after):
    raise ArgumentValueError('attend: n_chunks_before/after need chunk lengths.')
  window = (n_chunks_before, n_chunks_after)
  width = k.shape[-2] * (1 + n_chunks_before + n_chunks_after)
  keep, keep_prob = _dropout_keep(dropout, rng, q.shape[-2:-1] + (width,))
  config = _kernel_config(implementation, q, k, v, window, mask_fn)
  if config is not None:
    if joint_output:
      joint = _attend_with_kernel(config._replace(joint_output=True), q, k, v,
                                  q_info, kv_info, share_qk, keep, keep_prob)
      return jnp.reshape(joint, (-1, joint.shape[-1]))
    out, dots_logsumexp = _attend_with_kernel(config, q, k, v, q_info, kv_info,
                                              share_qk, keep, keep_prob)
  elif _in_blocks(q, width):
    remat = remat_blocks(q.shape[0], q.shape[1], width)
    out, dots_logsumexp = _attend_in_blocks(q, k, v, q_info, kv_info, share_qk,
                                            window, mask_fn, keep, keep_prob,
                                            remat)
  else:
    k = _scaled_keys(k, share_qk)
    k = look_adjacent(k, *window)  # [N, W, D]
    v = look_adjacent(v, *window)  # [N, W, V]
    kv_info = look_adjacent(kv_info, *window)
    out, dots_logsumexp = _softmax_attend(q, k, v, q_info, kv_info, mask_fn,
                                          keep, keep_prob)
  return _results(out, dots_logsumexp, joint_output)


def _results(out, dots_logsumexp, joint_output):
  """Chunked `(out, logsumexp)` as `attend` returns them: `([L, V], [L])`,
  or side by side, `[L, V + 1]` (the wider dtype: logits stay float32)."""
  out = jnp.reshape(out, (-1, out.shape[-1]))
  dots_logsumexp = jnp.reshape(dots_logsumexp, (-1,))
  if joint_output:
    return jnp.concatenate([out, dots_logsumexp[:, None]], axis=-1)
  return out, dots_logsumexp


def _mask_flags(mask_fn):
  """`(causal, exclude_self, masked)` of `mask_fn`, or None unless it is
  None or `mask_self_attention` (maybe a partial of its keywords)."""
  if mask_fn is None:
    return (False, False, False)
  flags = dict(causal=True, exclude_self=True, masked=False)
  if isinstance(mask_fn, functools.partial):
    if (mask_fn.func is not mask_self_attention or mask_fn.args or
        not set(mask_fn.keywords) <= set(flags)):
      return None
    flags.update(mask_fn.keywords)
  elif mask_fn is not mask_self_attention:
    return None
  return tuple(bool(flags[name]) for name in ('causal', 'exclude_self',
                                              'masked'))


def runs_kernel(implementation):
  """Whether `implementation` ('xla', 'pallas', 'auto') runs the Pallas
  kernel on this backend ('auto': on a TPU only)."""
  return implementation == 'pallas' or (
      implementation == 'auto' and jax.default_backend() == 'tpu')


def _kernel_config(implementation, q, k, v, window, mask_fn, warn=True):
  """The `chunked_kernel.Config` to run `attend` with, or None for the XLA path
  (with a warning for 'pallas', unless `warn` is False)."""
  validation.check_choice('attend', 'implementation', implementation,
                          chunked_kernel.IMPLEMENTATIONS)
  on_tpu = jax.default_backend() == 'tpu'
  if not runs_kernel(implementation):
    return None
  flags = _mask_flags(mask_fn)
  if flags is None:
    reason = 'mask_fn is not mask_self_attention'
  else:
    reason = chunked_kernel.unsupported(q, k, v)
  if flags is None or reason is not None:
    if implementation == 'pallas' and warn:
      warnings.warn(f'attend: implementation="pallas" runs the XLA path: '
                    f'{reason}.', stacklevel=3)
    return None
  causal, exclude_self, masked = flags
  return chunked_kernel.Config(
      before=window[0], after=window[1], causal=causal,
      exclude_self=exclude_self, masked=masked, mask_penalty=MASK_PENALTY,
      self_penalty=SELF_PENALTY,
      matmul_dtype=chunked_kernel.matmul_precision(on_tpu),
      key_norm_epsilon=LENGTH_NORM_EPSILON,
      interpret=not on_tpu,
      rows_per_step=(chunked_kernel.ROWS_PER_STEP if on_tpu else
                     chunked_kernel.INTERPRET_ROWS_PER_STEP))


def _attend_with_kernel(config, q, k, v, q_info, kv_info, share_qk, keep,
                        keep_prob):
  """`_softmax_attend` of chunked `q [N, C, D]` by the Pallas kernel.

  Shared keys go in as the queries themselves (`k=None`): the kernel
  normalises and scales each chunk as it loads it. Returns
  `(out [N, C, V], logsumexp [N, 1, C])`, or with `config.joint_output`
  both in one `[N, C, V + 1]` array.
  """
  k = None if share_qk else _scaled_keys(k, False)
  return chunked_kernel.attention(config, q, k, v,
                                  q_info[:, None, :], kv_info[:, None, :],
                                  _kernel_scale(keep, keep_prob, q.shape[1]))


def _kernel_scale(keep, keep_prob, chunk_len):
  """The kernel's dropout factors `[width, C keys, C queries]` from `attend`'s
  keep mask `[C, W]` (query-major), or None."""
  if keep is None:
    return None
  factors = keep.astype(jnp.float32) / keep_prob
  return jnp.transpose(jnp.reshape(factors, (chunk_len, -1, chunk_len)),
                       (1, 2, 0))


def _attend_rows_with_kernel(qv, depth, chunk_len, window, mask_fn, q_info,
                             kv_info, dropout, rng, implementation):
  """Shared-QK `attend` of queries|values rows `qv [L, depth + V]` by the
  kernel, which reads both from the same rows and returns outputs and
  log-normalisers side by side, `[L, V + 1]`; None where the kernel does not
  run (`attend` then takes the XLA path).

  The kernel's gradient is the rows' too: XLA slices no queries and values
  apart, nor pads and adds their gradients back together (on a TPU, for
  each head and pass, four copies of the sorted rows and three sums).
  """
  qv, _, _, q_info, kv_info = _chunked(qv, None, qv, q_info, kv_info,
                                       chunk_len, None)
  part = lambda cols: jax.ShapeDtypeStruct(qv.shape[:-1] + (cols,), qv.dtype)
  n_values = qv.shape[-1] - depth
  config = _kernel_config(implementation, part(depth), part(depth),
                          part(n_values), window, mask_fn, warn=False)
  if config is None:
    return None
  keep, keep_prob = _dropout_keep(dropout, rng, (
      chunk_len, chunk_len * (1 + sum(window))))
  joint = chunked_kernel.attention(
      config._replace(qv_depth=depth, joint_output=True), qv, None, None,
      q_info[:, None, :], kv_info[:, None, :],
      _kernel_scale(keep, keep_prob, chunk_len))
  return jnp.reshape(joint, (-1, n_values + 1))


def _scaled_keys(k, share_qk):
  """Keys divided by `sqrt(D)`; shared keys (the queries) length-normalised first."""
  if share_qk:
    k = length_normalized(k)
  return k / math.sqrt(k.shape[-1])


def _dropout_keep(dropout, rng, shape):
  """`(keep mask [C, W] or None, keep probability)` of attention dropout.

  One mask for every chunk (Trax's broadcast dropout).
  """
  if dropout <= 0.0:
    return None, 1.0
  if rng is None:
    raise ArgumentValueError('attend: dropout > 0 needs an rng.')
  keep_prob = 1.0 - dropout
  return jax.random.bernoulli(rng, keep_prob, shape), keep_prob


def _in_blocks(q, width):
  """Whether chunked `q [N, C, D]` attends in blocks of `BLOCK_CHUNKS` chunks."""
  return q.ndim == 3 and in_blocks(q.shape[0], q.shape[1], width)


def in_blocks(n_chunks, chunk_len, width):
  """Whether `n_chunks` chunks of `chunk_len` queries over `width` keys each
  attend in rematerialized blocks of `BLOCK_CHUNKS` chunks (so that only one
  block's logits are live at a time)."""
  if n_chunks <= BLOCK_CHUNKS:
    return False
  return ((precision.matmul_dtype() == 'float32' and
           n_chunks * chunk_len * width > BLOCK_MIN_LOGITS) or
          memory_decides(n_chunks, chunk_len, width))


def memory_decides(n_chunks, chunk_len, width):
  """Whether chunked attention of `n_chunks` chunks of `chunk_len` queries
  over `width` keys is large enough (`REMAT_MIN_LOGITS`) that memory, not
  speed, chooses how it runs: in rematerialized blocks under every policy,
  and (`attend_shared_qk`) with its queries and values as one array."""
  return n_chunks * chunk_len * width > REMAT_MIN_LOGITS


def remat_blocks(n_chunks, chunk_len, width):
  """Whether the blocks of `in_blocks` are rematerialized: where memory
  decides, and where `REMAT_SPEED_BLOCKS`. Otherwise the backward pass keeps
  every block's logits and probabilities, as whole arrays would."""
  return REMAT_SPEED_BLOCKS or memory_decides(n_chunks, chunk_len, width)


def _attend_in_blocks(q, k, v, q_info, kv_info, share_qk, window, mask_fn,
                      keep, keep_prob, remat, depth=None, rows=None,
                      side_by_side=False, compute_dtype=None):
  """`_softmax_attend` of chunked `q`, `k`, `v` over blocks of `BLOCK_CHUNKS` chunks.

  A `lax.map` over the blocks (the last one, if shorter, on its own): each
  block slices its keys and values from the chunked arrays plus the few
  neighbouring chunks its window reaches (`look_adjacent`'s wrap-around),
  so no `[N, W, ...]` window array is ever built, and with `remat`
  (`remat_blocks`) its body is rematerialized: differentiated, only the
  inputs are kept and each block's logits are recomputed in the backward
  pass. With `depth` (shared keys), `q` holds the queries and the values
  side by side (`[N, C, depth + V]`, `v` None) and each block parts them;
  with `rows` too (`[N, C]` indices), the chunks are `q[rows]` of an
  unchunked `q [L, depth + V]`, each block gathering its own rows.
  Returns `(out [N, C, V], logsumexp [N, C, 1])`; with `side_by_side`, one
  `[N, C, V + 1]` array of both, joined inside each block. `compute_dtype`:
  the dtype each block reads the joint `q` as (None: as it is stored).
  """
  n, size = (q if rows is None else rows).shape[0], BLOCK_CHUNKS
  n_full = n // size
  before, after = window

  def parts(x, start, count, blocks, middle=True):
    """`(before, middle, after)` chunks of `blocks` blocks of `count` from `start`.

    Without `middle` (shared keys: the block's queries) it is None.
    """
    first = start + np.arange(blocks)[:, None] * count
    lo = (first + np.arange(-before, 0)[None, :]) % n
    hi = (first + count + np.arange(after)[None, :]) % n
    mid = None
    if middle:
      mid = jnp.reshape(x[start:start + blocks * count],
                        (blocks, count) + x.shape[1:])
    return (take_rows(x, lo), mid, take_rows(x, hi))

  def block(args):
    q_b, qi_b, k_parts, v_parts, kvi_parts = args
    if rows is not None:  # Indices: the block's rows and its neighbours'.
      q_b = take_rows(q, q_b)
      k_parts = (take_rows(q, k_parts[0]), None, take_rows(q, k_parts[2]))
    if compute_dtype is not None:
      q_b = q_b.astype(compute_dtype)
      k_parts = (k_parts[0].astype(compute_dtype), None,
                 k_parts[2].astype(compute_dtype))
    if depth is not None:  # Keys (the queries) and values part here.
      v_parts = (k_parts[0][..., depth:], q_b[..., depth:],
                 k_parts[2][..., depth:])
      k_parts = (k_parts[0][..., :depth], None, k_parts[2][..., :depth])
      q_b = q_b[..., :depth]
    count = q_b.shape[0]
    if share_qk:  # One input (and one cotangent) for queries and keys.
      k_parts = (k_parts[0], q_b, k_parts[2])
    k_ext = _scaled_keys(jnp.concatenate(k_parts, axis=0), share_qk)
    v_ext = jnp.concatenate(v_parts, axis=0)
    kvi_ext = jnp.concatenate(kvi_parts, axis=0)

    def windows(x):  # look_adjacent's [count, W, ...] from the extended chunks
      return jnp.concatenate([x[j:j + count] for j in range(before + after + 1)],
                             axis=1)
    out, lse = _softmax_attend(q_b, windows(k_ext), windows(v_ext), qi_b,
                               windows(kvi_ext), mask_fn, keep, keep_prob)
    return jnp.concatenate([out, lse], axis=-1) if side_by_side else (out,
                                                                       lse)

  if remat:
    block = jax.checkpoint(block)

  def blocks_of(start, count, blocks):
    def split(x):
      return jnp.reshape(x[start:start + blocks * count],
                         (blocks, count) + x.shape[1:])
    if depth is not None:  # One array (and one cotangent) for all three.
      joint = q if rows is None else rows
      return (split(joint), split(q_info),
              parts(joint, start, count, blocks, False), None,
              parts(kv_info, start, count, blocks))
    return (split(q), split(q_info),
            parts(k, start, count, blocks, middle=not share_qk),
            parts(v, start, count, blocks), parts(kv_info, start, count, blocks))

  results = lax.map(block, blocks_of(0, size, n_full))
  results = jax.tree_util.tree_map(
      lambda x: jnp.reshape(x, (n_full * size,) + x.shape[2:]), results)
  rest = n - n_full * size
  if rest:
    last = jax.tree_util.tree_map(lambda x: x[0],
                                  blocks_of(n_full * size, rest, 1))  # None stays
    results = jax.tree_util.tree_map(
        lambda x, y: jnp.concatenate([x, y], axis=0), results, block(last))
  return results


def _blocks_on_xla(n_rows, chunk_len, width, implementation):
  """Whether shared-QK attention of `n_rows` rows in chunks of `chunk_len`
  over `width` keys runs in blocks (`in_blocks`) on the XLA path."""
  return (not runs_kernel(implementation) and not n_rows % chunk_len and
          in_blocks(n_rows // chunk_len, chunk_len, width))


def on_tpu_unless_set(setting):
  """A setting whose default (None) reads as: on a TPU only."""
  if setting is None:
    return jax.default_backend() == 'tpu'
  return setting


def gathers_in_blocks(n_rows, chunk_len, n_chunks_before, n_chunks_after,
                      implementation):
  """Whether `attend_shared_qk` of `n_rows` rows given with their `rows`
  gathers them block by block: where memory decides, on the XLA path. (In
  the blocks run for speed, the paper-size 64K step on a TPU v5e, gathering
  so took 1.081x the time of one sorted copy, 2026-12-07.)"""
  width = chunk_len * (1 + n_chunks_before + n_chunks_after)
  return (_blocks_on_xla(n_rows, chunk_len, width, implementation) and
          memory_decides(n_rows // chunk_len, chunk_len, width))


def attend_shared_qk(qv, depth, chunk_len, n_chunks_before=0,
                     n_chunks_after=0, mask_fn=None, q_info=None, kv_info=None,
                     dropout=0.0, rng=None, implementation='xla', rows=None,
                     joint_output=False, compute_dtype=None):
  """`attend(x[:, :depth], None, x[:, depth:], chunk_len, ...)`, `x = qv[rows]`.

  Shared-QK chunked attention of queries and values that come side by side
  in one array `qv [L, depth + V]` (`rows` None: `x = qv`). Where memory
  decides (`gathers_in_blocks`; with `JOINT_SPEED_BLOCKS`, wherever
  `in_blocks`) the blocks take `qv` whole, so the backward pass holds one
  cotangent where slices would hold two (on a TPU, whose tiles pad a
  64-wide minor axis to 128 lanes, each of those took as much memory as
  the joint one), and with `rows` (int `[N]`, e.g. LSH's sorted order)
  each block gathers its own rows: `qv[rows]` (all hash rounds) never
  exists, nor its cotangent, which the blocks add into `qv`'s instead.
  Otherwise exactly `attend` (of `qv[rows]`). With `joint_output`, returns
  `attend`'s outputs and log-normalisers side by side, one `[N, V + 1]`
  array (joined inside the blocks with `LSE_IN_BLOCKS`). `qv` may be stored
  narrower than it is computed in (`compute_dtype`, e.g. LSH's sorted rows
  in bfloat16 where the matmuls round them so anyway): its rows are read
  as `compute_dtype` (None: as stored).
  """
  n_rows = qv.shape[0] if rows is None else rows.shape[0]
  n_chunks = n_rows // chunk_len
  width = chunk_len * (1 + n_chunks_before + n_chunks_after)
  joint = _blocks_on_xla(n_rows, chunk_len, width, implementation) and (
      memory_decides(n_chunks, chunk_len, width) or
      (rows is None and on_tpu_unless_set(JOINT_SPEED_BLOCKS)))

  if not joint:
    if rows is not None:
      qv = take_rows(qv, rows)
    if compute_dtype is not None:
      qv = qv.astype(compute_dtype)
    if joint_output and runs_kernel(implementation):
      results = _attend_rows_with_kernel(
          qv, depth, chunk_len, (n_chunks_before, n_chunks_after), mask_fn,
          q_info, kv_info, dropout, rng, implementation)
      if results is not None:
        return results
    return attend(qv[:, :depth], None, qv[:, depth:], chunk_len,
                  n_chunks_before=n_chunks_before,
                  n_chunks_after=n_chunks_after, mask_fn=mask_fn,
                  q_info=q_info, kv_info=kv_info, dropout=dropout, rng=rng,
                  implementation=implementation, joint_output=joint_output)
  # The sorted rows (or their indices) and infos in chunks, as `attend`'s.
  in_order = qv if rows is None else rows[:, None]
  in_order, _, _, q_info, kv_info = _chunked(in_order, None, in_order, q_info,
                                             kv_info, chunk_len, None)
  if rows is None:
    qv = in_order
  else:
    rows = in_order[..., 0]
  keep, keep_prob = _dropout_keep(dropout, rng, (chunk_len, width))
  side_by_side = joint_output and on_tpu_unless_set(LSE_IN_BLOCKS)
  results = _attend_in_blocks(
      qv, None, None, q_info, kv_info, True,
      (n_chunks_before, n_chunks_after), mask_fn, keep, keep_prob,
      remat=remat_blocks(n_chunks, chunk_len, width), depth=depth, rows=rows,
      side_by_side=side_by_side, compute_dtype=compute_dtype)
  if side_by_side:
    return jnp.reshape(results, (-1, results.shape[-1]))
  out, dots_logsumexp = results
  return _results(out, dots_logsumexp, joint_output)


def attend_queries_scaled(q, k, v, mask_fn=None, q_info=None, kv_info=None):
  """`attend(q, k, v, mask_fn=..., ...)` unchunked, scaling queries instead of keys.

  The same function up to float rounding (`(q / sqrt(D)) k^T` instead of `q
  (k / sqrt(D))^T`). For a few queries over a long key cache (a decoding
  step): the cache is read by the matmul only, not rewritten scaled.
  """
  if v is None or k is None:
    raise ArgumentValueError('attend_queries_scaled: keys `k` and values `v` are '
                             'required.')
  q, k, v, q_info, kv_info = _chunked(q, k, v, q_info, kv_info, None, None)
  q = q / math.sqrt(k.shape[-1])
  out, dots_logsumexp = _softmax_attend(q, k, v, q_info, kv_info, mask_fn,
                                        None, 1.0)
  return (jnp.reshape(out, (-1, out.shape[-1])),
          jnp.reshape(dots_logsumexp, (-1,)))


def _chunked(q, k, v, q_info, kv_info, q_chunk_len, kv_chunk_len):
  """`attend`'s inputs with default (1-based) infos, cut into chunks if asked.

  With shared keys (`k=None`) the keys are the (chunked) queries. Returns
  `(q, k, v, q_info, kv_info)`.
  """
  share_qk = k is None
  if q_info is None:
    q_info = jnp.arange(1, q.shape[-2] + 1, dtype=jnp.int32)
  else:
    q_info = q_info + 1
  if kv_info is None and not share_qk:
    kv_info = jnp.arange(1, v.shape[-2] + 1, dtype=jnp.int32)
  elif kv_info is not None:
    kv_info = kv_info + 1

  if q_chunk_len is not None:
    q = _chunk(q, q_chunk_len, 'query')  # [N, C, D]
    q_info = _chunk(q_info, q_chunk_len, 'query info')
  if share_qk:
    if kv_chunk_len is not None and kv_chunk_len != q_chunk_len:
      raise ArgumentValueError(f'attend: with shared keys kv_chunk_len must equal '
                               f'q_chunk_len; got {kv_chunk_len} and {q_chunk_len}.')
    k = q
    kv_chunk_len = q_chunk_len
    if kv_info is None:
      kv_info = q_info
    elif kv_chunk_len is not None:
      kv_info = _chunk(kv_info, kv_chunk_len, 'key info')
  elif kv_chunk_len is not None:
    k = _chunk(k, kv_chunk_len, 'key')
    kv_info = _chunk(kv_info, kv_chunk_len, 'key info')
  if kv_chunk_len is not None:
    v = _chunk(v, kv_chunk_len, 'value')
  if (q_chunk_len is None) != (kv_chunk_len is None):
    raise ArgumentValueError('attend: chunk queries and keys both or neither; got '
                             f'q_chunk_len={q_chunk_len}, kv_chunk_len={kv_chunk_len}.')
  return q, k, v, q_info, kv_info


def _softmax_attend(q, k, v, q_info, kv_info, mask_fn, keep, keep_prob):
  """Masked softmax attention of `q [N, C, D]` to `k [N, W, D]`, `v [N, W, V]`.

  `keep` is the dropout mask `[C, W]` shared by all chunks (None: none).
  Returns `(out [N, C, V], logsumexp [N, C, 1])`.
  """

  def attend_block(q, k, v, q_info, kv_info):
    # With many queries the logits are keys-major, [N, W, C]: the softmax
    # then reduces over a non-minor axis, which XLA:CPU vectorises across
    # queries (2x faster than over the minor axis, which it splits into
    # windows). A decoding step's one query keeps them query-major.
    keys_major = q.shape[-2] >= KEYS_MAJOR_MIN_QUERIES
    if (keys_major and precision.matmul_dtype() in BOTH_LAYOUTS_POLICIES and
        _elementwise(mask_fn) and q.shape[:-2] == k.shape[:-2]):
      return _attend_both_layouts(q, k, v, q_info, kv_info, mask_fn, keep,
                                  keep_prob)
    dots = _masked_logits(q, k, mask_fn, q_info, kv_info, keys_major)
    axis = -2 if keys_major else -1
    dots_logsumexp = jax.nn.logsumexp(dots, axis=axis, keepdims=True)
    dots = jnp.exp(dots - dots_logsumexp)
    if keep is not None:
      kept = keep.T if keys_major else keep
      mask = jnp.reshape(kept, (1,) * (dots.ndim - 2) + kept.shape)
      dots = dots * (mask.astype(dots.dtype) / keep_prob)
    if not keys_major:
      return precision.matmul(dots, v), dots_logsumexp  # [N, C, V]
    out = precision.einsum('...wc,...wv->...cv', dots, v)
    return out, jnp.swapaxes(dots_logsumexp, -1, -2)

  return attend_block(q, k, v, q_info, kv_info)


def _attend_both_layouts(q, k, v, q_info, kv_info, mask_fn, keep, keep_prob):
  """`attend_block` with bfloat16 matmuls: logits in both layouts.

  The softmax normaliser reduces the keys-major logits (fast, see
  `attend_block`); the output multiplies the query-major probabilities, and
  every gradient contracts minor axes (`precision.logits_both_layouts`). The
  keys-major probabilities only feed the values' gradient. Returns `(out [N,
  C, V], logsumexp [N, C, 1])`.
  """
  s_km, s_qm = precision.logits_both_layouts(q, k)
  if mask_fn is not None:
    s_km = mask_fn(s_km, q_info[..., None, :], kv_info[..., :, None])
    s_qm = mask_fn(s_qm, q_info[..., :, None], kv_info[..., None, :])
  lse_km = jax.nn.logsumexp(s_km, axis=-2, keepdims=True)
  lse = jnp.swapaxes(lse_km, -1, -2)
  p_qm, p_km = jnp.exp(s_qm - lse), jnp.exp(s_km - lse_km)
  if keep is not None:
    lead = (1,) * (p_qm.ndim - 2)
    scale = keep.astype(p_qm.dtype) / keep_prob
    p_qm = p_qm * jnp.reshape(scale, lead + scale.shape)
    p_km = p_km * jnp.reshape(scale.T, lead + scale.T.shape)
  out = precision.probs_times_values(p_qm, lax.stop_gradient(p_km), v)
  return out, lse


def _elementwise(mask_fn):
  """Whether `mask_fn` is None or Trax's elementwise `mask_self_attention`."""
  return getattr(mask_fn, 'func', mask_fn) in (None, mask_self_attention)


def _masked_logits(q, k, mask_fn, q_info, kv_info, keys_major):
  """Logits `[..., C, W]` of `q` and `k`, or keys-major `[..., W, C]`, masked.

  `mask_self_attention` is elementwise, so it takes the infos broadcast
  keys-major; any other `mask_fn` sees Trax's query-major layout.
  """
  if keys_major and _elementwise(mask_fn):
    dots = precision.einsum('...wd,...cd->...wc', k, q)
    if mask_fn is None:
      return dots
    return mask_fn(dots, q_info[..., None, :], kv_info[..., :, None])
  dots = precision.matmul(q, jnp.swapaxes(k, -1, -2))
  if mask_fn is not None:
    dots = mask_fn(dots, q_info[..., :, None], kv_info[..., None, :])
  return jnp.swapaxes(dots, -1, -2) if keys_major else dots

def project_heads(x, w, b=None):
  """Rows `x [B, L, M]` times every head's `w [H, M, d]` (+ `b [H, d]`).

  Returns `[B * H, L, d]` (unit `example * H + head`): all heads' projections
  as one matmul (`groups.run_projected`).
  """
  y = precision.einsum('blm,hmd->bhld', x, w)
  if b is not None:
    y = y + b[None, :, None, :]
  return y.reshape((-1,) + y.shape[2:])


def combine_heads(o, w_o):
  """Units' outputs `o [B * H, L, d]` through each head's `w_o [H, d, M]`, summed.

  Returns `[B, L, M]`: all heads' output projections as one matmul.
  """
  o = o.reshape((-1, w_o.shape[0]) + o.shape[1:])
  return precision.einsum('bhld,hdm->blm', o, w_o)


def project_step_heads(x, w, b=None):
  """A decoding step's rows `x [B, 1, M]` times every head's `w [H, M, d]` (+ `b [H, d]`).

  Returns `[B * H, 1, d]` (unit `example * H + head`). Heads are the batch
  dimension of one matmul, so the weights are read in their `[H, M, d]`
  layout (a per-head vmap made XLA transpose them at every step); each row
  is duplicated so that the matmul is the same computation as in a longer
  call (Trax does this for float equality).
  """
  n_heads, batch = w.shape[0], x.shape[0]
  rows = jnp.concatenate([x] * 2, 1).reshape(1, -1, x.shape[-1])  # [1, 2B, M]
  a = precision.matmul(jnp.broadcast_to(rows, (n_heads,) + rows.shape[1:]), w)
  a = a if b is None else a + b[:, None]
  a = a.reshape((n_heads, batch, 2) + a.shape[2:])[:, :, :1]  # [H, B, 1, d]
  return jnp.swapaxes(a, 0, 1).reshape((-1, 1) + a.shape[3:])


def merge_rounds(o, logits):
  """Hashing rounds' outputs `o [R, L, V]` merged by their normalisers `[R, L, 1]`.

  Round `r` weighs `exp(logits[r] - logsumexp(logits, axis=0))`. Written as
  sums of the rounds' slices (same values as `jax.nn.logsumexp` and
  `jnp.sum` over axis 0): XLA:CPU fused that reduce over rounds into the
  next matmul as a prologue it recomputed per output tile, 10x slower.
  """
  rounds = [logits[r] for r in range(logits.shape[0])]
  top = functools.reduce(jnp.maximum, rounds)
  top = lax.stop_gradient(jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top)))
  total = functools.reduce(jnp.add, [jnp.exp(l - top) for l in rounds])
  log_total = jnp.log(total) + top
  return functools.reduce(jnp.add, [o[r] * jnp.exp(l - log_total)
                                    for r, l in enumerate(rounds)])


def apply_broadcasted_dropout(vecs, dropout_rate, rng):
  """Dropout with one keep-mask over the last axis, shared by all other axes."""
  if dropout_rate <= 0.0:
    return vecs
  if rng is None:
    raise ArgumentValueError('apply_broadcasted_dropout: dropout > 0 needs an rng.')
  keep_prob = 1.0 - dropout_rate
  keep = jax.random.bernoulli(rng, keep_prob, (vecs.shape[-1],))
  keep = jnp.reshape(keep, (1,) * (vecs.ndim - 1) + keep.shape)
  return vecs * (keep.astype(vecs.dtype) / keep_prob)


def take_rows(x, indices):
  """`x[indices]` along axis 0, for indices the caller knows are in range.

  `jnp.take`'s default fills out-of-range rows with NaN: a select over the
  whole output, and a clamp, after every gather. The LSH permutations and
  the chunk windows index within range by construction, and on a TPU v5e
  those selects took 6 of a 16K paper-size step's 192 ms.
  """
  return jnp.asarray(x).at[indices].get(mode='promise_in_bounds')


@jax.custom_vjp
def _gather_permute(permutation, inverse_permutation, val):
  return take_rows(val, permutation)


def _gather_permute_fwd(permutation, inverse_permutation, val):
  return take_rows(val, permutation), inverse_permutation


def _gather_permute_bwd(inverse_permutation, ct):
  # A gather by the inverse permutation instead of the scatter-add autodiff
  # would synthesise: the indices are known to form a permutation.
  return None, None, take_rows(ct, inverse_permutation)


_gather_permute.defvjp(_gather_permute_fwd, _gather_permute_bwd)


def permute_via_gather(val, permutation, inverse_permutation, axis=0):
  """`take(val, permutation, axis)`, whose gradient gathers by the inverse.

  `permutation` must index within range (`take_rows`: out-of-range rows are
  not NaN-filled); it is not checked.
  """
  val = jnp.moveaxis(val, axis, 0)
  out = _gather_permute(permutation, inverse_permutation, val)
  return jnp.moveaxis(out, 0, axis)


def permute_via_sort(val, keys, inverse_keys, axis=0):
  """Permutes `val` by sorting it along `axis` by `keys`; gradient sorts by `inverse_keys`."""

  def sort_by(k, x):
    # Keys are 1-D along `axis`; broadcast them over the other axes of `x`.
    x = jnp.moveaxis(x, axis, -1)
    k = jnp.broadcast_to(k, x.shape)
    return jnp.moveaxis(lax.sort_key_val(k, x, dimension=-1)[1], -1, axis)

  @jax.custom_vjp
  def permute(k, ik, x):
    return sort_by(k, x)

  def fwd(k, ik, x):
    return sort_by(k, x), ik

  def bwd(ik, ct):
    return None, None, sort_by(ik, ct)

  permute.defvjp(fwd, bwd)
  return permute(keys, inverse_keys, val)


INVERSE_PERMUTATION_METHODS = ('scatter', 'sort')


def inverse_permutation(permutation, method=None):
  """The inverse of an int32 permutation of `range(n)` (along the last axis).

  `method` 'scatter' writes `arange(n)` at `permutation`; 'sort' sorts the
  pairs `(permutation, arange(n))` by the first. None: 'sort' on a TPU,
  'scatter' elsewhere (the default backend when traced). A TPU v5e scattered
  524,288 indices in 2.4 ms, where it sorts as many int32 keys in 0.34 ms
  (`sort_by_bucket`'s; pairs not timed there); XLA:CPU scatters them in
  1.0 ms and sorts the pairs in 123 ms (32,768: 0.08 vs 6.3 ms).
  """
  if method is None:
    method = 'sort' if jax.default_backend() == 'tpu' else 'scatter'
  validation.check_choice('inverse_permutation', 'method', method,
                          INVERSE_PERMUTATION_METHODS)
  if permutation.ndim > 1:  # One permutation per leading index.
    return jax.vmap(functools.partial(inverse_permutation, method=method))(
        permutation)
  iota = jnp.arange(permutation.shape[-1], dtype=permutation.dtype)
  if method == 'sort':
    return lax.sort((permutation, iota), num_keys=1)[1]
  return jnp.zeros_like(permutation).at[permutation].set(iota)
