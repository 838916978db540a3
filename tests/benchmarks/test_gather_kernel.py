"""benchmarks/gather_kernel.py's Pallas row gathers (interpret mode on CPU)
against numpy's fancy indexing."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax import lax

from retrax.validation import ArgumentTypeError, ArgumentValueError
from tests import benchmark_scripts

gather_kernel = benchmark_scripts.load('gather_kernel')


def _case(seed, u, length, n, width, dtype):
  rng = np.random.RandomState(seed)
  x = jnp.asarray(rng.randn(u, length, width), dtype)
  # Fewer rows than indices: every row drawn ~n/length times, repeats sure.
  indices = rng.randint(0, length, (u, n)).astype(np.int32)
  indices[:, 0] = length - 1  # the last row too
  return x, jnp.asarray(indices)


@pytest.mark.parametrize('method', gather_kernel.METHODS)
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('length, n, width, block_rows', [
    (48, 256, 64, 128), (304, 128, 65, 128), (32, 48, 128, None)])
def test_kernels_equal_fancy_indexing(method, dtype, length, n, width,
                                      block_rows):
  x, indices = _case(length + width, 2, length, n, width, dtype)
  got = gather_kernel.gather_rows(x, indices, method=method,
                                  block_rows=block_rows)
  want = np.asarray(x)[np.arange(2)[:, None], np.asarray(indices)]
  assert got.dtype == x.dtype and got.shape == (2, n, width)
  np.testing.assert_array_equal(np.asarray(got), want)
  np.testing.assert_array_equal(
      np.asarray(got),
      np.asarray(jnp.take_along_axis(x, indices[..., None], axis=1)))


@pytest.mark.parametrize('method', ['vmem', 'dma'])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_rows_off_the_tile_grid(method, dtype):
  """37 rows: the last tile partial (the aligned method refuses them)."""
  x, indices = _case(7, 1, 37, 128, 64, dtype)
  got = gather_kernel.gather_rows(x, indices, method=method)
  np.testing.assert_array_equal(np.asarray(got),
                                np.asarray(x)[0][np.asarray(indices[0])][None])


@pytest.mark.parametrize('dtype, width', [
    (jnp.bfloat16, 64), (jnp.bfloat16, 65), (jnp.float16, 130),
    (jnp.int16, 3), (jnp.uint16, 1), (jnp.int8, 64), (jnp.uint8, 67),
    (jnp.int8, 66), (jnp.int8, 5), (jnp.int32, 65), (jnp.uint32, 8)])
def test_narrow_types_move_as_words_bit_exact(dtype, width):
  """Pairs (fours) of 16-bit (8-bit) values as a word, odd widths padded.

  Every bit pattern, NaN payloads, -0.0 and denormals of bfloat16 and
  float16 included, comes out as it went in, by every method; on a TPU, as
  XLA's own bitcast reads it (`_to_words`: there 16-bit floats are read
  through float32, NaN payloads canonical and denormals zero).
  """
  rng = np.random.RandomState(width)
  bits = jnp.dtype(dtype).itemsize * 8
  raw = rng.randint(0, 1 << min(bits, 31), (2, 40, width)).astype(
      f'uint{bits}')
  if bits == 16:
    raw[0, :3, 0] = [0x7fc1, 0x8000, 0x0001]  # a NaN's payload, -0, denormal
  x = jnp.asarray(raw.view(jnp.dtype(dtype)))
  indices = rng.randint(0, 40, (2, 128)).astype(np.int32)
  indices[0, :3] = [0, 1, 2]
  indices = jnp.asarray(indices)
  read = np.asarray(lax.bitcast_convert_type(x, jnp.dtype(f'uint{bits}')))
  if jax.default_backend() != 'tpu':
    np.testing.assert_array_equal(read, raw)
  want = read[np.arange(2)[:, None], np.asarray(indices)]
  for method in gather_kernel.METHODS:
    got = gather_kernel.gather_rows(x, indices, method=method)
    assert got.dtype == x.dtype and got.shape == (2, 128, width)
    np.testing.assert_array_equal(np.asarray(got).view(want.dtype), want,
                                  err_msg=method)


@pytest.mark.parametrize('method', gather_kernel.METHODS)
def test_kernels_under_jit_and_vmap(method):
  """Jitted and vmapped (as the layers vmap heads): the axes fold into U.

  Once and twice vmapped, and with `x` shared (not vmapped) by indices
  that are, in float32 and (moved as words) an odd-width bfloat16.
  """
  gather = functools.partial(gather_kernel.gather_rows, method=method)
  for dtype, width in ((jnp.float32, 64), (jnp.bfloat16, 65)):
    x, indices = _case(1, 6, 32, 128, width, dtype)
    x, indices = x.reshape(2, 3, 32, width), indices.reshape(2, 3, 128)
    xs, ids = np.asarray(x), np.asarray(indices)
    want = xs[np.arange(2)[:, None, None], np.arange(3)[:, None], ids]
    f = jax.jit(jax.vmap(gather))
    np.testing.assert_array_equal(np.asarray(f(x, indices)), want)
    # Each [1, L, W] slice vmapped twice: an outer vmap folds in too.
    f = jax.jit(jax.vmap(jax.vmap(lambda a, i: gather(a[None], i[None])[0])))
    np.testing.assert_array_equal(np.asarray(f(x[:, :2], indices[:, :2])),
                                  want[:, :2])
    # x[0] not vmapped, shared by both batches of indices.
    f = jax.vmap(gather, in_axes=(None, 0))
    got = f(x[0], indices)
    np.testing.assert_array_equal(
        np.asarray(got), xs[0][np.arange(3)[:, None], ids])


@pytest.mark.parametrize('x_shape, x_dtype, i_shape, i_dtype, kwargs, error, '
                         'message', [
    ((2, 8, 4), jnp.float32, (2, 8, 1), jnp.int32, {}, ArgumentValueError,
     'x must be [U, L, W] and indices [U, N]; got x (2, 8, 4), indices'),
    ((2, 8, 4), jnp.float32, (3, 8), jnp.int32, {}, ArgumentValueError,
     'x must be [U, L, W]'),
    ((2, 8, 4), jnp.bool_, (2, 8), jnp.int32, {}, ArgumentTypeError,
     'x must be of a 32-, 16- or 8-bit type (float32, int32, uint32, '
     'bfloat16, float16, int16, uint16, int8, uint8); got bool'),
    ((2, 8, 4), jnp.complex64, (2, 8), jnp.int32, {}, ArgumentTypeError,
     'got complex64'),
    ((2, 8, 4), jnp.float32, (2, 8), jnp.uint32, {}, ArgumentTypeError,
     'indices must be int32; got uint32'),
    ((2, 8, 4), jnp.float32, (2, 256), jnp.int32, {'block_rows': 64},
     ArgumentValueError, 'block_rows (64) must divide N (256) and be a '
     'multiple of 128 or N itself'),
    ((2, 8, 4), jnp.float32, (2, 384), jnp.int32, {'block_rows': 256},
     ArgumentValueError, 'block_rows (256) must divide N (384)'),
    ((2, 8, 4), jnp.float32, (2, 8), jnp.int32, {'method': 'xla'},
     ArgumentValueError, 'method'),
    # Words are moved whatever the type: 8-row tiles for bfloat16 too.
    ((2, 36, 4), jnp.bfloat16, (2, 32), jnp.int32, {'method': 'vmem_aligned'},
     ArgumentValueError, "method 'vmem_aligned' needs L (36) and block_rows "
     '(32) to be multiples of 8 (tile rows of the 32-bit words moved)'),
    ((2, 40, 4), jnp.float32, (2, 12), jnp.int32, {'method': 'vmem_aligned'},
     ArgumentValueError, 'block_rows (12) to be multiples of 8'),
    # 2**18 rows of 128 float32: 128 MiB, double-buffered 256 MiB.
    ((1, 1 << 18, 128), jnp.float32, (1, 128), jnp.int32, {},
     ArgumentValueError, "method 'vmem' needs x[u] (262144, 128) float32"),
])
def test_bad_arguments_are_one_clear_line(x_shape, x_dtype, i_shape, i_dtype,
                                          kwargs, error, message):
  x = jax.ShapeDtypeStruct(x_shape, x_dtype)
  indices = jax.ShapeDtypeStruct(i_shape, i_dtype)
  with pytest.raises(error) as info:
    jax.eval_shape(lambda a, i: gather_kernel.gather_rows(a, i, **kwargs),
                   x, indices)
  text = str(info.value)
  assert message in text and '\n' not in text


def test_vmem_limit_counts_padded_tiles():
  """Counted in the words moved: (8, 128) tiles of 32 bits, whatever the type.

  Rows of 64 or 65 float32 take 128 lanes, of 130 take 256; bfloat16 rows
  of 64 values are 32 words, of 257 values 129 words (256 lanes), 8-bit
  rows of 512 values 128 words.
  """
  for width, lanes in ((64, 128), (65, 128), (130, 256)):
    assert gather_kernel.vmem_bytes(1024, width, jnp.float32, 128) == (
        2 * (1024 + 128) * lanes * 4)
  assert gather_kernel.vmem_bytes(17, 64, jnp.bfloat16, 16) == (
      2 * (24 + 16) * 128 * 4)
  assert gather_kernel.vmem_bytes(8, 257, jnp.bfloat16, 8) == (
      2 * (8 + 8) * 256 * 4)
  assert gather_kernel.vmem_bytes(8, 512, jnp.int8, 8) == 2 * 16 * 128 * 4
  assert gather_kernel.vmem_bytes(8, 513, jnp.uint8, 8) == 2 * 16 * 256 * 4
  # The limit is where 'vmem' starts refusing and 'dma' does not.
  rows = gather_kernel.VMEM_LIMIT_BYTES // (2 * 128 * 4) - 128 + 8
  x = jax.ShapeDtypeStruct((1, rows, 128), jnp.float32)
  indices = jax.ShapeDtypeStruct((1, 128), jnp.int32)
  for method in ('vmem', 'vmem_aligned'):
    with pytest.raises(ArgumentValueError, match='limit'):
      jax.eval_shape(lambda a, i, m=method: gather_kernel.gather_rows(
          a, i, method=m), x, indices)
  out = jax.eval_shape(
      lambda a, i: gather_kernel.gather_rows(a, i, method='dma'), x, indices)
  assert out.shape == (1, 128, 128)
  x = jax.ShapeDtypeStruct((1, rows - 8, 128), jnp.float32)
  for method in ('vmem', 'vmem_aligned'):
    out = jax.eval_shape(lambda a, i, m=method: gather_kernel.gather_rows(
        a, i, method=m), x, indices)
    assert out.shape == (1, 128, 128)


# A tensor type of 8 or 16 bits in the module's text.
_NARROW = re.compile(r'tensor<[0-9x]*(bf16|f16|i16|ui16|i8|ui8)>')


@pytest.mark.parametrize('method', gather_kernel.METHODS)
@pytest.mark.parametrize('dtype, width', [
    (jnp.float32, 64), (jnp.float32, 65), (jnp.bfloat16, 128),
    (jnp.bfloat16, 65), (jnp.int8, 64)])
@pytest.mark.parametrize('vmapped', [False, True])
def test_kernels_lower_for_tpu(method, dtype, width, vmapped):
  """Each method lowers to one Mosaic TPU kernel on 32-bit values only.

  `jax.export` for the TPU platform runs Pallas' TPU lowering on a CPU
  (block tiling rules, e.g. the 'dma' kernel's HBM operand must be one
  whole-array block, vmapped too; Mosaic's verifier); the chip's compiler
  itself runs on a TPU only (benchmarks/gather_bench.py), so the kernel's
  operands are checked to be 32-bit: 16-bit single rows at dynamic
  offsets fail to compile there.
  """
  lead = (2, 3) if vmapped else (2,)
  x = jax.ShapeDtypeStruct(lead + (512, width), dtype)
  indices = jax.ShapeDtypeStruct(lead + (256,), jnp.int32)
  gather = functools.partial(gather_kernel.gather_rows, method=method,
                             interpret=False, block_rows=128)
  exported = export.export(
      jax.jit(jax.vmap(gather) if vmapped else gather),
      platforms=['tpu'])(x, indices)
  module = exported.mlir_module()
  assert module.count('tpu_custom_call') == 1
  assert f'gather_rows_{method}' in module
  call = next(line for line in module.splitlines()
              if 'tpu_custom_call' in line)
  words = -(-width * jnp.dtype(dtype).itemsize // 4)
  units = 6 if vmapped else 2
  kind = 'f32' if dtype == jnp.float32 else 'i32'
  assert f'-> tensor<{units}x256x{words}x{kind}>' in call
  assert not _NARROW.search(call)
  assert exported.out_avals[0].shape == lead + (256, width)
  assert exported.out_avals[0].dtype == dtype
