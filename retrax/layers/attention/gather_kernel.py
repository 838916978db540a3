"""Row gathers as Pallas TPU kernels: an experiment against XLA's gather.

`gather_rows(x, indices)` returns `out[u, n, :] = x[u, indices[u, n], :]`,
what LSH attention's sort, unsort and `gather_rounds` compute with XLA
gathers (`jnp.take`). On a TPU v5e, XLA gathers 524,288 rows from `[16,
32768, 128]` float32 in ~5.5 ms (~10 ns a row, whatever the row's width),
where HBM bandwidth would allow ~0.3 ms. This module tries three kernels,
to be measured by benchmarks/gather_bench.py; nothing in the layers calls
them.

- 'vmem': grid `(U, N / block_rows)`. The whole `x[u]` is one VMEM block
  (its index map constant along the second axis, so Pallas fetches it
  once per `u`, the next `u`'s while this one's rows are copied); the
  block's indices are an SMEM block; a loop copies row `x[idx]` to output
  row `j` (dynamic sublane offsets on both sides). Needs `x[u]`, padded to
  the (8, 128) tile and double-buffered, within `VMEM_LIMIT_BYTES`.
- 'vmem_aligned': the same blocks, but no access off the tile grid, in
  case the chip's compiler refuses (or is slow at) single rows at dynamic
  sublane offsets: each index loads its whole aligned tile (8 rows; 16 of
  bfloat16), keeps its row by a select and a sublane sum, and a tile's
  worth of output rows is assembled by selects and stored at once. Needs
  `L` and `block_rows` to be whole tiles; a -0.0 comes out +0.0.
- 'dma': `x` stays in HBM; every output row is one DMA of a row of `x`
  into the output's VMEM block, at most `IN_FLIGHT` outstanding on one DMA
  semaphore (each wait takes one row's bytes, as JAX's paged attention
  waits for the pages it started). No limit on `L`.

The indices go in SMEM by blocks, not as a scalar prefetch of the whole
`[U, N]` array: the LSH shapes' 524,288 int32 (2 MiB) exceed a v5e core's
1 MiB of SMEM. Indices are not checked (the kernels read out of bounds
where XLA would clamp). Off a TPU the kernels run in Pallas interpret
mode (correct, slow: for tests).
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
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))


def _sublanes(dtype):
  """Rows of a VMEM tile: 8 of 32-bit values, packed 16 of bfloat16."""
  return 8 * 4 // jnp.dtype(dtype).itemsize


def _padded_bytes(rows, width, dtype):
  """VMEM bytes of a `[rows, width]` block, padded to whole tiles."""
  sub = _sublanes(dtype)
  return (-(-rows // sub) * sub * -(-width // LANES) * LANES *
          jnp.dtype(dtype).itemsize)


def vmem_bytes(length, width, dtype, block_rows=BLOCK_ROWS):
  """VMEM the 'vmem' kernels' blocks take: source and output, double-buffered."""
  return 2 * (_padded_bytes(length, width, dtype) +
              _padded_bytes(block_rows, width, dtype))


def _check(x, indices, method, block_rows):
  owner = 'gather_rows'
  validation.check_choice(owner, 'method', method, METHODS)
  if x.ndim != 3 or indices.ndim != 2 or indices.shape[0] != x.shape[0]:
    raise validation.ArgumentValueError(
        f'{owner}: x must be [U, L, W] and indices [U, N]; got x {x.shape}, '
        f'indices {indices.shape}.')
  if jnp.dtype(x.dtype) not in DTYPES:
    raise validation.ArgumentTypeError(
        f'{owner}: x must be float32 or bfloat16; got {x.dtype}.')
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
  tile = _sublanes(x.dtype)
  if method == 'vmem_aligned' and (x.shape[1] % tile or block_rows % tile):
    raise validation.ArgumentValueError(
        f"{owner}: method 'vmem_aligned' needs L ({x.shape[1]}) and "
        f'block_rows ({block_rows}) to be multiples of {tile} ({x.dtype} '
        'tile rows).')
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

  Args:
    x: `[U, L, W]` float32 or bfloat16.
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
              else functools.partial(_vmem_aligned_kernel, block_rows,
                                     _sublanes(x.dtype)))
    source_spec = pl.BlockSpec((None,) + x.shape[1:], lambda a, b: (a, 0, 0))
    out_spec = pl.BlockSpec((None, block_rows, width), lambda a, b: (a, b, 0))
    scratch = []
  else:
    kernel = functools.partial(_dma_kernel, block_rows,
                               min(IN_FLIGHT, block_rows))
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


def _vmem_aligned_kernel(block_rows, tile, idx_ref, x_ref, o_ref):
  sublane = lax.broadcasted_iota(jnp.int32, (tile, 1), 0)

  def body(t, carry):
    out = jnp.zeros((tile,) + o_ref.shape[1:], o_ref.dtype)
    for k in range(tile):
      i = idx_ref[0, t * tile + k]
      rows = x_ref[pl.ds(pl.multiple_of(i - i % tile, tile), tile), :]
      # Exact: the other rows are replaced by zeros (no NaN reaches the
      # sum) and x + 0 is x (a -0.0 comes out +0.0).
      row = jnp.sum(jnp.where(sublane == i % tile, rows, 0), axis=0,
                    keepdims=True)
      out = jnp.where(sublane == k, row.astype(out.dtype), out)
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
