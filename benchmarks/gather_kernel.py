"""Row gathers as Pallas TPU kernels: an experiment against XLA's gather.

`gather_rows(x, indices)` returns `out[u, n, :] = x[u, indices[u, n], :]`,
what LSH attention's sort, unsort and `gather_rounds` compute with XLA
gathers (`jnp.take`). On a TPU v5e, XLA gathers 524,288 rows from `[16,
32768, 128]` float32 in ~5.5 ms (~10 ns a row, whatever the row's width),
where HBM bandwidth would allow ~0.3 ms. This module tries three kernels,
to be measured by benchmarks/gather_bench.py; nothing in retrax calls them
(in the LSH step they lost to XLA's per-head gathers on the chip, 2026-12-06),
so they live here, beside their benchmark.

The kernels move 32-bit words only. A 16-bit row packs two to a sublane
(16-row tiles), and Mosaic can neither prove nor lower single-row
accesses at dynamic offsets into it (loads, relayouts and DMAs all fail
on the chip), so a row of 16- or 8-bit values is first viewed as int32
words, each pair (or four) of its elements one word, gathered, and viewed
back. Costs, all outside the kernel, in XLA: the word view can be a
relayout copy of `x` and of the output on a TPU (16-bit arrays tile as
(16, 128), int32 ones as (8, 128)); a width that is not a whole number
of words is padded with zero columns (one for an odd bfloat16 width),
another copy, and sliced back; and VMEM rows are 128 words wide at
least, so a bfloat16 row of up to 256 values takes 512 bytes there (twice
its (16, 128) tile's share for widths up to 128). float32 is moved as it
is.

- 'vmem': grid `(U, N / block_rows)`. The whole `x[u]` is one VMEM block
  (its index map constant along the second axis, so Pallas fetches it
  once per `u`, the next `u`'s while this one's rows are copied); the
  block's indices are an SMEM block; a loop copies row `x[idx]` to output
  row `j` (dynamic sublane offsets on both sides). Needs `x[u]`, padded to
  the (8, 128) tile and double-buffered, within `VMEM_LIMIT_BYTES`.
- 'vmem_aligned': the same blocks, but no access off the tile grid, in
  case the chip's compiler refuses (or is slow at) single rows at dynamic
  sublane offsets: each index loads its whole aligned tile of 8 rows,
  keeps its row by a select and a sublane sum, and a tile's worth of
  output rows is assembled by selects and stored at once. Needs `L` and
  `block_rows` to be whole tiles (multiples of 8). A float32 -0.0 comes
  out +0.0 (a denormal 0 where the chip flushes them); words are summed
  as two exact 16-bit halves in float32 (an integer or a packed word
  summed as a float could lose its bits).
- 'dma': `x` stays in HBM; every output row is one DMA of a row of `x`
  into the output's VMEM block, at most `IN_FLIGHT` outstanding on one DMA
  semaphore (each wait takes one row's bytes, as JAX's paged attention
  waits for the pages it started). No limit on `L`.

The indices go in SMEM by blocks, not as a scalar prefetch of the whole
`[U, N]` array: the LSH shapes' 524,288 int32 (2 MiB) exceed a v5e core's
1 MiB of SMEM. Under `jax.vmap` the vmapped axes are folded into `U` (a
`custom_vmap` rule) rather than left to `pallas_call`'s batching rule,
which would give the 'dma' kernel's HBM operand a per-batch block, and
the TPU lowering takes only whole-array blocks in HBM. Indices are not
checked (the kernels read out of bounds where XLA would clamp). Off a
TPU the kernels run in Pallas interpret mode (correct, slow: for tests).
"""

import functools

import jax
from jax import lax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from retrax import validation

METHODS = ('vmem', 'vmem_aligned', 'dma')
# A v5e core has 128 MiB of VMEM (JAX's `pltpu.get_tpu_info_for_chip`);
# Mosaic's default scoped limit is 16 MiB, so the kernels ask for more.
VMEM_LIMIT_BYTES = 100 << 20
# Output rows per grid step: enough to amortise a step's fixed cost.
BLOCK_ROWS = 1024
# Loop bodies unrolled per iteration (scalar index loads and row copies
# of neighbouring iterations can then overlap).
UNROLL = 8
# DMAs outstanding at once in the 'dma' kernel.
IN_FLIGHT = 16
LANES = 128
# Rows of a VMEM tile of 32-bit values, all the kernels move.
SUBLANES = 8
WORD_BYTES = 4
# float32 is moved as it is, the others as int32 words.
DTYPES = tuple(jnp.dtype(d) for d in (
    jnp.float32, jnp.int32, jnp.uint32, jnp.bfloat16, jnp.float16, jnp.int16,
    jnp.uint16, jnp.int8, jnp.uint8))
_UINTS = {2: jnp.uint16, 1: jnp.uint8}


def _words(width, dtype):
  """32-bit words a row of `width` `dtype` values is moved as."""
  return -(-width * jnp.dtype(dtype).itemsize // WORD_BYTES)


def _padded_bytes(rows, words):
  """VMEM bytes of a `[rows, words]` block of 32-bit words, in whole tiles."""
  return (-(-rows // SUBLANES) * SUBLANES * -(-words // LANES) * LANES *
          WORD_BYTES)


def vmem_bytes(length, width, dtype, block_rows=BLOCK_ROWS):
  """VMEM the 'vmem' kernels' blocks take: source and output, double-buffered.

  Counted in the words moved: a row of `width` `dtype` values is
  `_words(width, dtype)` words, lane-padded to a multiple of 128.
  """
  words = _words(width, dtype)
  return 2 * (_padded_bytes(length, words) + _padded_bytes(block_rows, words))


def _check(x, indices, method, block_rows):
  owner = 'gather_rows'
  validation.check_choice(owner, 'method', method, METHODS)
  if x.ndim != 3 or indices.ndim != 2 or indices.shape[0] != x.shape[0]:
    raise validation.ArgumentValueError(
        f'{owner}: x must be [U, L, W] and indices [U, N]; got x {x.shape}, '
        f'indices {indices.shape}.')
  if jnp.dtype(x.dtype) not in DTYPES:
    raise validation.ArgumentTypeError(
        f'{owner}: x must be of a 32-, 16- or 8-bit type ('
        f'{", ".join(d.name for d in DTYPES)}); got {x.dtype}.')
  if jnp.dtype(indices.dtype) != jnp.dtype(jnp.int32):
    raise validation.ArgumentTypeError(
        f'{owner}: indices must be int32; got {indices.dtype}.')
  validation.check_int(owner, 'block_rows', block_rows, minimum=1)
  n = indices.shape[1]
  # The index block `[1, block_rows]` must be a multiple of 128 lanes or
  # the whole row (and then the output block is all of `N` too).
  if n % block_rows or (block_rows % LANES and block_rows != n):
    raise validation.ArgumentValueError(
        f'{owner}: block_rows ({block_rows}) must divide N ({n}) and be a '
        f'multiple of {LANES} or N itself.')
  if method == 'vmem_aligned' and (x.shape[1] % SUBLANES or
                                   block_rows % SUBLANES):
    raise validation.ArgumentValueError(
        f"{owner}: method 'vmem_aligned' needs L ({x.shape[1]}) and "
        f'block_rows ({block_rows}) to be multiples of {SUBLANES} (tile rows '
        'of the 32-bit words moved).')
  if method != 'dma':
    need = vmem_bytes(x.shape[1], x.shape[2], x.dtype, block_rows)
    if need > VMEM_LIMIT_BYTES:
      raise validation.ArgumentValueError(
          f"{owner}: method {method!r} needs x[u] {x.shape[1:]} {x.dtype} and "
          f'the output block in VMEM, {need} bytes double-buffered, over the '
          f"limit of {VMEM_LIMIT_BYTES}; use method 'dma'.")


def gather_rows(x, indices, *, method='vmem', interpret=None,
                block_rows=None):
  """`out [U, N, W]` with `out[u, n] = x[u, indices[u, n]]`, by a Pallas kernel.

  Vmappable (the vmapped axes join `U`), not differentiable; bit-exact
  for every dtype (but 'vmem_aligned' sums float32 rows: -0.0 is +0.0).

  Args:
    x: `[U, L, W]` of a 32-, 16- or 8-bit type (`DTYPES`); other than
      float32, moved as int32 words (module docstring: the costs).
    indices: int32 `[U, N]` in `[0, L)`.
    method: 'vmem' (`x[u]` held in VMEM, rows copied one by one),
      'vmem_aligned' (the same by whole tiles) or 'dma' (a DMA a row from
      HBM).
    interpret: Pallas interpret mode; None: off a TPU only.
    block_rows: output rows per grid step, dividing `N`: a multiple of 128
      or `N` itself. None: `BLOCK_ROWS` where it divides `N`, else `N`.
  """
  if block_rows is None and indices.ndim == 2:
    n = indices.shape[1]
    block_rows = BLOCK_ROWS if n % BLOCK_ROWS == 0 else n
  _check(x, indices, method, block_rows)
  if interpret is None:
    interpret = jax.default_backend() != 'tpu'
  gather = _batchable(method, bool(interpret), block_rows)
  if jnp.dtype(x.dtype) == jnp.dtype(jnp.float32):
    return gather(x, indices)
  return _from_words(gather(_to_words(x), indices), x.dtype, x.shape[-1])


def _to_words(x):
  """`[..., W]` as int32 `[..., words]`, zero columns padding W to whole words.

  On a TPU, XLA reads a bfloat16/float16 array through float32 when it
  bitcasts it (to integers, here): NaN payloads come out canonical and
  denormals zero (measured on a v5e: a bare jitted bitcast to uint16 changed
  138 of 16,384 random bfloat16 patterns; XLA's own gather of them the
  same 138). The kernels then move these words exactly.
  """
  size = jnp.dtype(x.dtype).itemsize
  if size == WORD_BYTES:
    return lax.bitcast_convert_type(x, jnp.int32)
  # Padded and sliced as unsigned integers: a float pad may be computed
  # in float32 (off a TPU, op by op), which quiets a NaN's payload.
  x = lax.bitcast_convert_type(x, _UINTS[size])
  per_word = WORD_BYTES // size
  width = x.shape[-1]
  words = _words(width, x.dtype)
  if words * per_word != width:
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, words * per_word - width)])
  return lax.bitcast_convert_type(
      x.reshape(x.shape[:-1] + (words, per_word)), jnp.int32)


def _from_words(words, dtype, width):
  """The inverse of `_to_words`: `[..., words]` int32 as `[..., width]` dtype."""
  size = jnp.dtype(dtype).itemsize
  if size == WORD_BYTES:
    return lax.bitcast_convert_type(words, dtype)
  x = lax.bitcast_convert_type(words, _UINTS[size])  # [..., words, per_word]
  x = x.reshape(words.shape[:-1] + (-1,))[..., :width]
  return lax.bitcast_convert_type(x, dtype)


@functools.lru_cache(maxsize=None)
def _batchable(method, interpret, block_rows):
  """`_pallas_gather` with a vmap rule folding the vmapped axis into `U`."""

  @jax.custom_batching.custom_vmap
  def gather(x, indices):
    return _pallas_gather(x, indices, method, interpret, block_rows)

  @gather.def_vmap
  def _(axis_size, in_batched, x, indices):
    # Batched operands come with their vmapped axis first; an unbatched
    # one is repeated (each `u` of the kernel has its own rows).
    x_batched, indices_batched = in_batched
    if not x_batched:
      x = jnp.broadcast_to(x, (axis_size,) + x.shape)
    if not indices_batched:
      indices = jnp.broadcast_to(indices, (axis_size,) + indices.shape)
    b, u = indices.shape[:2]
    # `gather` again, not `_pallas_gather`: an outer vmap folds in too.
    out = gather(x.reshape((b * u,) + x.shape[2:]),
                 indices.reshape((b * u,) + indices.shape[2:]))
    return out.reshape((b, u) + out.shape[1:]), True

  return gather


def _pallas_gather(x, indices, method, interpret, block_rows):
  """The kernel on `x [U, L, words]` of a 32-bit type, as `gather_rows`."""
  u, n = indices.shape
  width = x.shape[2]
  steps = n // block_rows
  # [U, steps, 1, block_rows]: a step's indices are a `[1, block_rows]`
  # SMEM block, whose last two dimensions pass the TPU's tiling rule (equal
  # to the array's, or multiples of (8, 128)).
  blocked = indices.reshape(u, steps, 1, block_rows)
  index_spec = pl.BlockSpec((None, None, 1, block_rows),
                            lambda a, b: (a, b, 0, 0), memory_space=pltpu.SMEM)
  if method != 'dma':
    kernel = (functools.partial(_vmem_kernel, block_rows) if method == 'vmem'
              else functools.partial(_vmem_aligned_kernel, block_rows))
    source_spec = pl.BlockSpec((None,) + x.shape[1:], lambda a, b: (a, 0, 0))
    out_spec = pl.BlockSpec((None, block_rows, width), lambda a, b: (a, b, 0))
    scratch = []
  else:
    kernel = functools.partial(_dma_kernel, block_rows,
                               min(IN_FLIGHT, block_rows))
    # The whole array, index map all zeros: the only HBM block the TPU
    # lowering takes; the kernel offsets by `program_id(0)` itself.
    source_spec = pl.BlockSpec(memory_space=pl.ANY)
    # Not squeezed: in JAX 0.10.2 a DMA into `.at[...]` of a ref with a
    # squeezed block dimension fails Mosaic's verifier (`tpu.memref_slice`:
    # indices and slice shapes must match).
    out_spec = pl.BlockSpec((1, block_rows, width), lambda a, b: (a, b, 0))
    scratch = [pltpu.SemaphoreType.DMA(())]
  return pl.pallas_call(
      kernel,
      grid_spec=pltpu.PrefetchScalarGridSpec(
          num_scalar_prefetch=0, grid=(u, steps),
          in_specs=[index_spec, source_spec], out_specs=out_spec,
          scratch_shapes=scratch),
      out_shape=jax.ShapeDtypeStruct((u, n, width), x.dtype),
      compiler_params=None if interpret else pltpu.CompilerParams(
          # The source block is reused along the second axis: 'arbitrary'
          # keeps a core on one `u` (and one fetch of it).
          dimension_semantics=('parallel', 'arbitrary'),
          vmem_limit_bytes=VMEM_LIMIT_BYTES),
      interpret=interpret,
      name=f'gather_rows_{method}',
  )(blocked, x)


def _vmem_kernel(block_rows, idx_ref, x_ref, o_ref):
  def body(j, carry):
    o_ref[pl.ds(j, 1), :] = x_ref[pl.ds(idx_ref[0, j], 1), :]
    return carry
  lax.fori_loop(0, block_rows, body, 0, unroll=min(UNROLL, block_rows))


def _pick_row(rows, keep):
  """The one row of `rows [8, words]` where `keep [8, 1]`, as `[1, words]`."""
  if rows.dtype == jnp.float32:
    # Exact but for -0.0: the other rows are replaced by zeros (no NaN
    # reaches the sum) and x + 0 is x.
    return jnp.sum(jnp.where(keep, rows, 0.0), axis=0, keepdims=True)
  # A packed word read as a float could be a NaN or a denormal (changed
  # by the sum): sum its two 16-bit halves, exact in float32, instead.
  halves = []
  for half in (lax.shift_right_logical(rows, 16), rows & 0xFFFF):
    halves.append(jnp.sum(jnp.where(keep, half.astype(jnp.float32), 0.0),
                          axis=0, keepdims=True).astype(jnp.int32))
  return (halves[0] << 16) | halves[1]


def _vmem_aligned_kernel(block_rows, idx_ref, x_ref, o_ref):
  tile = SUBLANES
  sublane = lax.broadcasted_iota(jnp.int32, (tile, 1), 0)

  def body(t, carry):
    out = jnp.zeros((tile,) + o_ref.shape[1:], o_ref.dtype)
    for k in range(tile):
      i = idx_ref[0, t * tile + k]
      rows = x_ref[pl.ds(pl.multiple_of(i - i % tile, tile), tile), :]
      out = jnp.where(sublane == k, _pick_row(rows, sublane == i % tile), out)
    o_ref[pl.ds(pl.multiple_of(t * tile, tile), tile), :] = out
    return carry
  lax.fori_loop(0, block_rows // tile, body, 0)


def _dma_kernel(block_rows, in_flight, idx_ref, x_hbm, o_ref, sem):
  u = pl.program_id(0)

  def copy(j, i):
    return pltpu.make_async_copy(x_hbm.at[pl.ds(u, 1), pl.ds(i, 1)],
                                 o_ref.at[:, pl.ds(j, 1)], sem)

  def issue(j, carry):
    copy(j, idx_ref[0, j]).start()

    # A wait takes one row's bytes off the semaphore, whichever row's
    # descriptor it is given: this one keeps `in_flight` rows outstanding.
    @pl.when(j >= in_flight)
    def _():
      copy(0, 0).wait()
    return carry

  def drain(j, carry):
    copy(0, 0).wait()
    return carry

  lax.fori_loop(0, block_rows, issue, 0, unroll=min(UNROLL, block_rows))
  lax.fori_loop(0, in_flight, drain, 0)
