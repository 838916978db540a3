"""The Reformer's chunked attention as a Pallas TPU kernel, forward and backward.

`attend` (in `ops`) runs chunked attention as XLA ops: each chunk of `C`
queries attends to its own chunk of keys and to `n_chunks_before` /
`n_chunks_after` neighbouring chunks (wrapping around the ends), the
logits masked by position (causal, a query's own key, padding), and
returns the output and each query's log-normaliser. Its backward pass is
XLA's autodiff, which keeps (or, in blocks, recomputes) the `[N, C, W]`
logits and probabilities in memory. This module computes the same function
in two Pallas kernels that keep nothing but the inputs, the output and the
log-normaliser: the backward kernel recomputes each chunk's logits in
VMEM (as flash attention does) and writes `dq`, `dk`, `dv`.

Layout. Queries, keys and values are `[N, C, d]` (chunked, sorted if LSH);
per-position vectors (position infos, log-normaliser, its cotangent) are
rows `[N, 1, C]`. One grid step takes `G` consecutive chunks (a divisor of
`N` sized by `block_chunks`: up to 1024 query rows): blocks `(G, C,
d)` of queries, keys and values, plus the `n_chunks_before` chunks before
the block and the `n_chunks_after` after it as separate one-chunk blocks
(the neighbours, fetched by index maps modulo `N`). Every block's last two
dimensions are the arrays' own, so the TPU's (8, 128) tiling rule holds for
any chunk length and depth. Logits are computed keys-major, `[C keys, C
queries]` per neighbouring chunk (`k q^T`): the softmax then reduces over
sublanes and the log-normaliser comes out as a `[1, C]` row. The backward
kernel accumulates `dk`, `dv` of the block's own chunks in its output
blocks and writes the neighbours' share separately (`[n_blocks,
n_chunks_before, C, d]` and after), added by XLA to the chunks they belong
to: no two grid steps write the same block, so the grid is parallel.
Shared keys (LSH's) come in as the queries themselves: the kernels
length-normalise and scale each key chunk as they load it, and the
backward kernel adds the key role's gradient (through that normalisation)
into the queries'. Where LSH unsorts outputs and log-normalisers as one
gather, the forward kernel writes them side by side, `[N, C, V + 1]`
(`Config.joint_output`), the log-normaliser turned into a column by a
square transpose; and it reads queries and values from the sorted rows that
hold them side by side (`Config.qv_depth`), whose gradient the backward
kernel writes side by side too.

Numerics: the same masks (additive penalties subtracted from float32
logits, position infos compared as float32), the same broadcast dropout
mask, and the matmul precision XLA's dots get (`matmul_precision`):
operands rounded to bfloat16 under the bfloat16 matmul policy
(`retrax.fastmath.precision`) and, on a TPU, under JAX's default float32
precision (one bfloat16 pass, as XLA:TPU's DEFAULT), float32 accumulation.
The sums run in another order than XLA's (per neighbouring chunk), so
results agree to float rounding, not bit for bit.

Limits (`unsupported` gives the reason; `attend` then runs the XLA path):
chunked self-attention only, `chunk_len` a multiple of 8 (a sublane tile)
and at most `MAX_CHUNK_LEN`, depths at most `MAX_DEPTH`, float32 or
bfloat16 inputs, and the elementwise `mask_self_attention` masks (or none).
Designed for chunk_len 64/128/256 and head depths 64/128. Off a TPU the
kernel runs in Pallas interpret mode (`implementation='pallas'`, for tests:
correct, not fast).
"""

import functools
import math
import os
from typing import NamedTuple, Optional

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from retrax import validation
from retrax.fastmath import precision

IMPLEMENTATIONS = ('xla', 'pallas', 'auto')
# Read when a layer is built with `implementation=None`: 'xla' (default),
# 'pallas' or 'auto' (for benchmarks that build their models from configs).
# The layer keeps the value (its `implementation` property shows it); later
# changes of the variable do not reach layers already built.
ENV_VAR = 'RETRAX_ATTENTION_IMPL'
# A chunk's keys-major logits are `[C, C]` float32 per neighbouring chunk,
# with probabilities and their cotangent beside them in the backward pass:
# 1 MB each at C = 512, well inside a TPU core's 16 MB of scoped VMEM.
MAX_CHUNK_LEN = 512
MAX_DEPTH = 256
# Query rows per grid step: one chunk of 128 is ~8 MFLOP, less than a grid
# step's fixed cost; 1024 rows make each step's matmuls long enough.
ROWS_PER_STEP = 1024
# The chunks of a step are unrolled in the kernel, so at most this many.
MAX_BLOCK_CHUNKS = 16
# A backward step's blocks (q, k, v, d_out in; dq, dk, dv out; all
# double-buffered) stay within this, leaving the rest of the 16 MB of
# scoped VMEM to the logits: 1024 rows up to depths of 128, 682 at 256.
BLOCK_BYTES = 8 << 20
# Interpreted (off a TPU), `attend` gives each step one chunk: the
# interpreter's program grows with the chunks a step unrolls, and compiling
# it is most of a test's time (tests of the kernel itself set more).
INTERPRET_ROWS_PER_STEP = 1
SUBLANES = 8

_NT = (((1,), (1,)), ((), ()))  # a [m, d] x b [n, d] -> [m, n]
_NN = (((1,), (0,)), ((), ()))  # a [m, k] x b [k, n] -> [m, n]
_TN = (((0,), (0,)), ((), ()))  # a [k, m] x b [k, n] -> [m, n]


def implementation_of(owner, implementation):
  """The implementation a layer runs: `implementation`, or for None the environment's.

  Called when a layer is built; None reads `RETRAX_ATTENTION_IMPL` then
  (unset: 'xla'), and the layer keeps the result. 'xla' is the
  default on every backend until a TPU measures the kernel faster; 'pallas'
  runs the kernel (compiled on a TPU, interpreted elsewhere: slow, for
  tests); 'auto' runs it on a TPU only.
  """
  if implementation is None:
    value = os.environ.get(ENV_VAR, '').strip() or 'xla'
    if value not in IMPLEMENTATIONS:
      raise validation.ArgumentValueError(
          f'{owner}: the environment variable {ENV_VAR} must be one of '
          f'{IMPLEMENTATIONS}; got {value!r}.')
    return value
  return validation.check_choice(owner, 'implementation', implementation,
                                 IMPLEMENTATIONS)


class Config(NamedTuple):
  """Static parameters of a kernel call (hashable: a `custom_vjp` static argument)."""
  before: int  # n_chunks_before
  after: int  # n_chunks_after
  causal: bool
  exclude_self: bool
  masked: bool
  mask_penalty: float
  self_penalty: float
  # Matmul operands: None as given (default precision), 'bfloat16' rounded
  # to bfloat16, 'float32' at full precision (`Precision.HIGHEST`).
  matmul_dtype: Optional[str]
  interpret: bool
  rows_per_step: int = ROWS_PER_STEP
  # Shared keys' length normalisation (`attention` with `k=None`).
  key_norm_epsilon: Optional[float] = None
  # Whether `attention` returns the outputs and log-normalisers side by
  # side, one float32 `[N, C, V + 1]` array written by the kernel (LSH
  # unsorts them as one gather), instead of two arrays.
  joint_output: bool = False
  # Set: `attention`'s `q` holds queries (this depth) and values side by
  # side in each row, `[N, C, qv_depth + V]` (LSH's sorted rows; shared
  # keys, `k` and `v` None), and their gradient comes back so.
  qv_depth: Optional[int] = None

  @property
  def width(self):
    """Neighbouring chunks each chunk attends to, itself included."""
    return 1 + self.before + self.after


def matmul_precision(on_tpu):
  """`Config.matmul_dtype` that gives the kernel's matmuls XLA's precision.

  'bfloat16' under the bfloat16 policy. Otherwise, on a TPU, 'bfloat16'
  under JAX's default precision (XLA's float32 dots take one bfloat16
  pass there) and 'float32' (full precision) when
  `jax.default_matmul_precision` asks for more. Off a TPU None: the
  interpreted kernel's dots are XLA's own.
  """
  if precision.matmul_dtype() == 'bfloat16':
    return 'bfloat16'
  if not on_tpu:
    return None
  return ('bfloat16' if precision.float32_dots_round_to_bfloat16(on_tpu)
          else 'float32')


def unsupported(q, k, v):
  """Why the kernel cannot run chunked `q [N, C, D]`, `k`, `v [N, C, V]`; None if it can."""
  if q.ndim != 3:
    return 'the attention is not chunked (chunk_len=None)'
  if k.shape != q.shape or v.shape[:2] != q.shape[:2]:
    return (f'queries {q.shape}, keys {k.shape} and values {v.shape} are not '
            'chunked alike')
  chunk_len = q.shape[1]
  if chunk_len % SUBLANES or chunk_len > MAX_CHUNK_LEN:
    return (f'chunk_len {chunk_len} is not a multiple of {SUBLANES} up to '
            f'{MAX_CHUNK_LEN}')
  if max(q.shape[2], v.shape[2]) > MAX_DEPTH:
    return (f'head depths {q.shape[2]}, {v.shape[2]} exceed {MAX_DEPTH}')
  dtypes = {jnp.dtype(a.dtype) for a in (q, k, v)}
  if not dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16)}:
    return f'dtypes {sorted(map(str, dtypes))} are not float32/bfloat16'
  return None


def block_chunks(n_chunks, chunk_len, d_qk=64, d_v=64,
                 rows_per_step=ROWS_PER_STEP):
  """Chunks per grid step: the largest divisor of `n_chunks` that fits the step.

  At most `rows_per_step` query rows, `MAX_BLOCK_CHUNKS` chunks and
  `BLOCK_BYTES` of blocks; at least one chunk.
  """
  row_bytes = 2 * 4 * 3 * (d_qk + d_v)
  rows = min(rows_per_step, BLOCK_BYTES // row_bytes)
  limit = max(1, min(MAX_BLOCK_CHUNKS, rows // chunk_len))
  return max(g for g in range(1, min(limit, n_chunks) + 1) if n_chunks % g == 0)


def attention(config, q, k, v, q_info, kv_info, scale=None):
  """Chunked attention: `(out [N, C, V], logsumexp [N, 1, C])`, differentiable.

  With `config.joint_output`, one float32 `[N, C, V + 1]` array instead:
  each query's output, then its log-normaliser, in one row (on a TPU,
  joining them after the kernel took a copy of the normalisers into an
  `[N, 1]` column, 128 lanes per 8 values, and a concatenation).

  Args:
    config: a `Config`.
    q: `[N, C, D]` queries.
    k: `[N, C, D]` keys, already scaled; or None: shared with the queries,
      which the kernel length-normalises (`config.key_norm_epsilon`) and
      scales by `1/sqrt(D)` as it loads each chunk, and whose gradient
      comes back whole (query and key roles) as `q`'s. On a TPU the
      normalised copy, its gradient and the two roles' sum were XLA passes
      over every sorted row around the kernel.
    v: `[N, C, V]` values.
    q_info: `[N, 1, C]` query position infos (as `attend` shifted them).
    kv_info: `[N, 1, C]` key infos (negative: padding, when `masked`).
    scale: None, or the dropout factors `[width, C, C]` keys-major
      (`keep / keep_prob`, the same for every chunk).

  Gradients flow to `q`, `k` and `v` (the infos and `scale` are constants).
  """
  if k is None and config.key_norm_epsilon is None:
    raise validation.ArgumentValueError(
        'chunked_kernel.attention: shared keys (k=None) need '
        'config.key_norm_epsilon, the epsilon of their length normalisation.')
  if config.qv_depth is not None and (
      k is not None or v is not None or not config.joint_output):
    raise validation.ArgumentValueError(
        'chunked_kernel.attention: with config.qv_depth the queries and values '
        'come side by side in q (k and v None) and the results as one array '
        '(config.joint_output).')
  out, lse = _attention(config, q, k, v, q_info.astype(jnp.float32),
                        kv_info.astype(jnp.float32), scale)
  return out if config.joint_output else (out, lse)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(config, q, k, v, q_info, kv_info, scale):
  out, lse, _ = _forward(config, q, k, v, q_info, kv_info, scale)
  return out, lse


def _attention_fwd(config, q, k, v, q_info, kv_info, scale):
  out, lse, softmax_factor = _forward(config, q, k, v, q_info, kv_info, scale)
  return (out, lse), (q, k, v, q_info, kv_info, scale, out, lse,
                      softmax_factor)


def _attention_bwd(config, residuals, cts):
  q, k, v, q_info, kv_info, scale, out, lse, softmax_factor = residuals
  d_out, d_lse = cts
  d_joint = None
  if config.joint_output:  # (`lse` itself is not an output then: d_lse is 0)
    # The kernel reads the outputs' cotangent from the joint one's rows.
    n_values = _Layout.of(config, q, k, v).n_values
    d_lse = d_lse + d_out[..., n_values][:, None, :]
    d_joint, d_out, out = d_out, d_out[..., :n_values], out[..., :n_values]
  # With p = exp(s - lse): ds = p * dp + softmax * (d_lse - sum(p * dp)),
  # where sum(p * dp) = d_out . out (dropout included), once per query, and
  # softmax = exp(s - max) / sum = p * softmax_factor, the factor 1 up to
  # the rounding of lse (which matters where a query sees only its own
  # key: its logits are near -1e5, and lse's rounding there is 4e-3). This
  # is the derivative XLA's autodiff takes of `attend`.
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)
  d_term = softmax_factor * (d_lse.astype(jnp.float32) - delta[:, None, :])
  dq, dk, dv = _backward(config, q, k, v, q_info, kv_info, scale, lse,
                         d_out if d_joint is None else d_joint, d_term)
  return (dq.astype(q.dtype), None if k is None else dk.astype(k.dtype),
          None if v is None else dv.astype(v.dtype), None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


class _Blocks(NamedTuple):
  """How the `N` chunks are cut into grid steps of `g` chunks."""
  n: int
  g: int

  @property
  def steps(self):
    return self.n // self.g

  def spec(self, shape):
    """The block of a step's own chunks of a `[N, ...]` array."""
    return pl.BlockSpec((self.g,) + shape, lambda b: (b,) + (0,) * len(shape))

  def neighbour_specs(self, shape, config):
    """One-chunk blocks: the `before` chunks preceding a step's, then the `after` following."""
    n, g = self.n, self.g
    # Chunk b*g - t for t = 1..before (shifted by a multiple of n to stay
    # non-negative), then chunk b*g + g + t for t = 0..after-1; mod n.
    shifts = ([n * (t // n + 1) - t for t in range(1, config.before + 1)] +
              [g + t for t in range(config.after)])
    return [pl.BlockSpec((None,) + shape, _chunk_map(n, g, s, len(shape)))
            for s in shifts]

  def windowed(self, shape, config):
    """Specs of an array passed as its own chunks plus its neighbours."""
    return [self.spec(shape)] + self.neighbour_specs(shape, config)


def _chunk_map(n, g, shift, rank):
  """Index map of the one-chunk block `(b * g + shift) mod n` of step `b`."""
  return lambda b: (lax.rem(b * g + shift, n),) + (0,) * rank


class _Window(NamedTuple):
  """A windowed array's refs: its own chunks, then `before`, then `after` neighbours."""
  refs: tuple
  before: int

  def chunk(self, t, g, *index):
    """Chunk `t` relative to the step's first (`-before <= t < g + after`),
    indexed further by `index` (a load of only that part)."""
    if t < 0:
      ref = self.refs[-t]
    elif t < g:
      return self.refs[0][(t,) + index]
    else:
      ref = self.refs[1 + self.before + t - g]
    return ref[index] if index else ref[...]


class _Layout(NamedTuple):
  """Where the kernels find queries, keys and values (static)."""
  shared: bool  # the keys are the queries, normalised in the kernel
  qv_depth: Optional[int]  # queries|values side by side in one array
  depth: int
  n_values: int

  @classmethod
  def of(cls, config, q, k, v):
    if config.qv_depth is not None:
      return cls(True, config.qv_depth, config.qv_depth,
                 q.shape[-1] - config.qv_depth)
    return cls(k is None, None, q.shape[-1], v.shape[-1])

  def queries(self, rows):
    """The queries' (or keys') columns of a chunk's rows."""
    return rows if self.qv_depth is None else rows[:, :self.qv_depth]

  def values(self, rows):
    return rows if self.qv_depth is None else rows[:, self.qv_depth:]

  def input_kinds(self):
    """`_split_refs` kinds of the q, infos, keys[, values], key infos refs."""
    values = () if self.qv_depth is not None else ('window',)
    return ('own', 'own', 'window') + values + ('window',)


def _split_refs(refs, config, kinds):
  """Splits the kernel's flat refs: windowed arrays become `_Window`s."""
  out, i = [], 0
  for kind in kinds:
    if kind == 'window':
      n = config.width
      out.append(_Window(tuple(refs[i:i + n]), config.before))
      i += n
    else:
      out.append(refs[i])
      i += 1
  return out, refs[i:]


# The kernel's dots name their precision: left to the caller's
# `jax.default_matmul_precision('highest')`, a product of bfloat16 operands
# asks Mosaic for a float32 contraction, which it refuses ("Bad lhs type").
_PRECISIONS = {'bfloat16': lax.Precision.DEFAULT,
               'float32': lax.Precision.HIGHEST}


def _operand(x, config):
  if config.matmul_dtype is None:
    return x
  return x.astype(config.matmul_dtype)


def _dot(a, b, dims, config):
  return lax.dot_general(_operand(a, config), _operand(b, config), dims,
                         precision=_PRECISIONS.get(config.matmul_dtype),
                         preferred_element_type=jnp.float32)


def _masked_logits(q, k, q_info, kv_info, config):
  """Keys-major logits `[C keys, C queries]` of one neighbouring chunk, masked.

  `q_info` is a `[1, C]` row, `kv_info` a `[C, 1]` column; the penalties
  are those of `ops.mask_self_attention` (`x - p` where masked, `x` else).
  """
  s = _dot(k, q, _NT, config)
  if config.causal:
    s = jnp.where(q_info < kv_info, s - config.mask_penalty, s)
  if config.exclude_self:
    s = jnp.where(q_info == kv_info, s - config.self_penalty, s)
  if config.masked:
    s = jnp.where(kv_info < 0, s - config.mask_penalty, s)
  return s


def _keys(k, config, shared):
  """A chunk's keys as the logits take them: shared ones (the queries)
  length-normalised and scaled as `ops._scaled_keys` does; others as given."""
  if not shared:
    return k
  x = k.astype(jnp.float32)
  variance = jnp.mean(x * x, axis=-1, keepdims=True)
  x = x / jnp.sqrt(variance + config.key_norm_epsilon)
  return (x / math.sqrt(k.shape[-1])).astype(k.dtype)


def _keys_vjp(k, dk, config, shared):
  """The gradient of the raw keys `k` from that of `_keys(k)`, `dk` (float32).

  With `n = 1 / sqrt(mean(k^2) + eps)` and `y = k n / sqrt(D)`:
  `dk_raw = n / sqrt(D) * (dk - k n^2 (dk . k) / D)`, row by row.
  """
  if not shared:
    return dk
  x = k.astype(jnp.float32)
  depth = k.shape[-1]
  n2 = 1.0 / (jnp.mean(x * x, axis=-1, keepdims=True) + config.key_norm_epsilon)
  along = jnp.sum(dk * x, axis=-1, keepdims=True)
  return jnp.sqrt(n2) / math.sqrt(depth) * (dk - x * n2 * along / depth)


def _key_infos(kvi_w, t, g):
  """Chunk `t`'s key infos as a `[C, 1]` column, from their `[1, C]` row.

  A one-dimensional load, then a new minor axis (as Pallas' TPU splash
  attention reads its per-query rows).
  """
  return jnp.expand_dims(kvi_w.chunk(t, g, 0), -1)


def _offsets(config):
  return range(-config.before, config.after + 1)


def _fwd_kernel(config, g, has_scale, layout, *refs):
  ins, rest = _split_refs(refs, config, layout.input_kinds())
  q_ref, qi_ref, k_w, kvi_w = ins[0], ins[1], ins[2], ins[-1]
  v_w = ins[3] if len(ins) == 5 else k_w  # (values beside the keys)
  shared = layout.shared
  scale_ref = rest[0] if has_scale else None
  out_ref, lse_ref, factor_ref = rest[-3:]
  for c in range(g):
    q, q_info = layout.queries(q_ref[c]), qi_ref[c]
    logits = [_masked_logits(q, _keys(layout.queries(k_w.chunk(c + o, g)),
                                      config, shared),
                             q_info,
                             _key_infos(kvi_w, c + o, g), config)
              for o in _offsets(config)]
    top = functools.reduce(jnp.maximum, [jnp.max(s, axis=0, keepdims=True)
                                         for s in logits])
    total = functools.reduce(jnp.add, [
        jnp.sum(jnp.exp(s - top), axis=0, keepdims=True) for s in logits])
    lse = jnp.log(total) + top  # [1, C]
    parts = []
    for j, (o, s) in enumerate(zip(_offsets(config), logits)):
      p = jnp.exp(s - lse)
      if scale_ref is not None:
        p = p * scale_ref[j]
      parts.append(_dot(p, layout.values(v_w.chunk(c + o, g)), _TN,
                        config))  # [C, V]
    out = functools.reduce(jnp.add, parts)
    if config.joint_output:
      n_values = out.shape[-1]
      out_ref[c, :, :n_values] = out
      out_ref[c, :, n_values:] = _column(lse)
    else:
      out_ref[c] = out.astype(out_ref.dtype)
    lse_ref[c] = lse
    factor_ref[c] = jnp.exp(lse - top) / total


def _column(row):
  """A `[1, C]` row as a `[C, 1]` column (a square transpose: Mosaic's)."""
  square = jnp.broadcast_to(row, (row.shape[-1], row.shape[-1]))
  return jnp.transpose(square)[:, :1]


def _gradient_refs(outs, config, layout):
  """Where the backward kernel's gradients go, from its output refs.

  Returns `({'k': dest, 'v': dest}, (ref, column))`: for the keys' and the
  values' gradients, `dest = (the block's own chunks' ref, the halo before
  the block, the halo after it, first column or None for whole rows)`; and
  the ref and column of the queries' own gradient.
  """
  if layout.qv_depth is not None:  # queries|values' gradient side by side
    before, after = (outs[1] if config.before else None,
                     outs[-1] if config.after else None)
    return (dict(k=(outs[0], before, after, 0),
                 v=(outs[0], before, after, layout.qv_depth)), (outs[0], 0))
  if layout.shared:  # The keys' gradient within the block goes into the queries'.
    (dq_ref, dv_ref), halo = outs[:2], outs[2:]
    dk_ref = dq_ref
  else:
    (dq_ref, dk_ref, dv_ref), halo = outs[:3], outs[3:]
  # halo: dk, dv before the block; dk, dv after it
  before, after = (halo[:2] if config.before else (None, None),
                   halo[-2:] if config.after else (None, None))
  return (dict(k=(dk_ref, before[0], after[0], None),
               v=(dv_ref, before[1], after[1], None)), (dq_ref, None))


def _bwd_kernel(config, g, has_scale, layout, *refs):
  ins, rest = _split_refs(refs, config, layout.input_kinds() +
                          ('own', 'own', 'own'))
  q_ref, qi_ref, k_w = ins[:3]
  v_w = k_w if layout.qv_depth is not None else ins[3]
  kvi_w, lse_ref, do_ref, dt_ref = ins[-4:]
  shared = layout.shared
  scale_ref = rest[0] if has_scale else None
  to, (q_out, q_column) = _gradient_refs(rest[1:] if has_scale else rest,
                                         config, layout)
  written = set()

  def add(ref, t, value, column=None):
    """`ref[t] += value` (from `column` on), the first time `=`."""
    key = (id(ref), t, column)
    index = (t,) if column is None else (
        t, slice(None), slice(column, column + value.shape[-1]))
    if key in written:
      ref[index] = ref[index] + value
    else:
      ref[index] = value
      written.add(key)

  def to_key_chunk(t, role, value):
    """Adds a neighbouring chunk's gradient where chunk `t` of the step goes."""
    own, before_ref, after_ref, column = to[role]
    if t < 0:
      add(before_ref, -t - 1, value, column)
    elif t < g:
      add(own, t, value, column)
    else:
      add(after_ref, t - g, value, column)

  for c in range(g):
    q, q_info, lse = layout.queries(q_ref[c]), qi_ref[c], lse_ref[c]
    # (`do_ref` may be the joint outputs|normalisers' cotangent: its first
    # V columns.)
    d_out, d_term = do_ref[c, :, :layout.n_values], dt_ref[c]
    dq = None
    for j, o in enumerate(_offsets(config)):
      raw = layout.queries(k_w.chunk(c + o, g))
      v = layout.values(v_w.chunk(c + o, g))
      k = _keys(raw, config, shared)
      s = _masked_logits(q, k, q_info, _key_infos(kvi_w, c + o, g), config)
      p = jnp.exp(s - lse)  # [C keys, C queries]
      dp = _dot(v, d_out, _NT, config)
      p_kept = p
      if scale_ref is not None:
        p_kept = p * scale_ref[j]
        dp = dp * scale_ref[j]
      ds = p * (dp + d_term)
      to_key_chunk(c + o, 'k',
                   _keys_vjp(raw, _dot(ds, q, _NN, config), config, shared))
      to_key_chunk(c + o, 'v', _dot(p_kept, d_out, _NN, config))
      part = _dot(ds, k, _TN, config)  # [C queries, D]
      dq = part if dq is None else dq + part
    add(q_out, c, dq, q_column)


def _compiler_params(config):
  if config.interpret:
    return None
  return pltpu.CompilerParams(dimension_semantics=('parallel',))


def _inputs(config, blocks, layout, q, k, v, q_info, kv_info):
  """`(in_specs, args)` of the queries, their infos, the keys' (and values')
  windows and the key infos' windows."""
  c, width = q.shape[1], config.width
  k = q if k is None else k
  specs = ([blocks.spec(q.shape[1:]), blocks.spec((1, c))] +
           blocks.windowed(k.shape[1:], config))
  args = [q, q_info] + [k] * width
  if layout.qv_depth is None:
    specs += blocks.windowed(v.shape[1:], config)
    args += [v] * width
  return specs + blocks.windowed((1, c), config), args + [kv_info] * width


def _forward(config, q, k, v, q_info, kv_info, scale):
  n, c = q.shape[:2]
  layout = _Layout.of(config, q, k, v)
  blocks = _Blocks(n, block_chunks(n, c, layout.depth, layout.n_values,
                                   config.rows_per_step))
  g = blocks.g
  in_specs, args = _inputs(config, blocks, layout, q, k, v, q_info, kv_info)
  if scale is not None:
    in_specs.append(pl.BlockSpec(scale.shape, lambda b: (0, 0, 0)))
    args.append(scale)
  out = (jax.ShapeDtypeStruct((n, c, layout.n_values + 1), jnp.float32)
         if config.joint_output else
         jax.ShapeDtypeStruct((n, c, layout.n_values), v.dtype))
  return pl.pallas_call(
      functools.partial(_fwd_kernel, config, g, scale is not None, layout),
      grid=(blocks.steps,),
      in_specs=in_specs,
      out_specs=[blocks.spec(out.shape[1:]), blocks.spec((1, c)),
                 blocks.spec((1, c))],
      out_shape=[out,
                 jax.ShapeDtypeStruct((n, 1, c), jnp.float32),
                 jax.ShapeDtypeStruct((n, 1, c), jnp.float32)],
      compiler_params=_compiler_params(config),
      interpret=config.interpret,
      name='chunked_attention_fwd',
  )(*args)


def _backward(config, q, k, v, q_info, kv_info, scale, lse, d_out, d_term):
  """`(dq, dk, dv)`; with shared keys (`k` None) `dq` holds both roles', `dk` is None.

  With `config.qv_depth`, `(d_qv, None, None)`: the queries|values' gradient
  side by side. `d_out` `[N, C, V]`, or the joint `[N, C, V + 1]` (its
  first `V` columns read).
  """
  n, c = q.shape[:2]
  layout = _Layout.of(config, q, k, v)
  d, d_v = layout.depth, layout.n_values
  blocks = _Blocks(n, block_chunks(n, c, d, d_v, config.rows_per_step))
  g = blocks.g
  in_specs, args = _inputs(config, blocks, layout, q, k, v, q_info, kv_info)
  in_specs += [blocks.spec((1, c)), blocks.spec(d_out.shape[1:]),
               blocks.spec((1, c))]
  args += [lse, d_out, d_term]
  if scale is not None:
    in_specs.append(pl.BlockSpec(scale.shape, lambda b: (0, 0, 0)))
    args.append(scale)
  f32 = jnp.float32
  depths: tuple[int, ...]  # dq (and dk), dv; halos of dk, dv
  halo_depths: tuple[int, ...]
  if layout.qv_depth is not None:  # one array (and halo) of both
    depths, halo_depths = (d + d_v,), (d + d_v,)
  else:
    depths = (d, d_v) if layout.shared else (d, d, d_v)
    halo_depths = (d, d_v)
  out_specs = [blocks.spec((c, depth)) for depth in depths]
  out_shape = [jax.ShapeDtypeStruct((n, c, depth), f32) for depth in depths]
  for count in (config.before, config.after):
    if count:
      for depth in halo_depths:
        out_specs.append(pl.BlockSpec((None, count, c, depth),
                                      lambda b: (b, 0, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((blocks.steps, count, c, depth),
                                              f32))
  grads = pl.pallas_call(
      functools.partial(_bwd_kernel, config, g, scale is not None, layout),
      grid=(blocks.steps,),
      in_specs=in_specs,
      out_specs=out_specs,
      out_shape=out_shape,
      compiler_params=_compiler_params(config),
      interpret=config.interpret,
      name='chunked_attention_bwd',
  )(*args)
  if layout.qv_depth is not None:
    d_qv, halo = grads[0], list(grads[1:])
    if config.before:
      d_qv = _add_before(d_qv, halo.pop(0), g)
    if config.after:
      d_qv = _add_after(d_qv, halo.pop(0), g)
    return d_qv, None, None
  if layout.shared:
    (dq, dv), halo = grads[:2], list(grads[2:])
    dk = dq
  else:
    (dq, dk, dv), halo = grads[:3], list(grads[3:])
  if config.before:
    dk = _add_before(dk, halo.pop(0), g)
    dv = _add_before(dv, halo.pop(0), g)
  if config.after:
    dk = _add_after(dk, halo.pop(0), g)
    dv = _add_after(dv, halo.pop(0), g)
  return (dk, None, dv) if layout.shared else (dq, dk, dv)


def _add_before(x, halo, g):
  """Adds `halo [steps, before, C, d]` (chunk `b*g - t` at `[b, t - 1]`) into `x [N, C, d]`.

  Chunk `b*g - t` is chunk `(-t) % g` of step `b - ceil(t / g)` (mod steps).
  """
  steps = halo.shape[0]
  x = jnp.reshape(x, (steps, g) + x.shape[1:])
  for t in range(1, halo.shape[1] + 1):
    x = x.at[:, (-t) % g].add(jnp.roll(halo[:, t - 1], -math.ceil(t / g),
                                       axis=0))
  return jnp.reshape(x, (-1,) + x.shape[2:])


def _add_after(x, halo, g):
  """Adds `halo [steps, after, C, d]` (chunk `b*g + g + t` at `[b, t]`) into `x [N, C, d]`.

  Chunk `b*g + g + t` is chunk `t % g` of step `b + 1 + t // g` (mod steps).
  """
  steps = halo.shape[0]
  x = jnp.reshape(x, (steps, g) + x.shape[1:])
  for t in range(halo.shape[1]):
    x = x.at[:, t % g].add(jnp.roll(halo[:, t], 1 + t // g, axis=0))
  return jnp.reshape(x, (-1,) + x.shape[2:])
