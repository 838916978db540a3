"""The Pallas row-gather kernels (interpret mode on CPU) against numpy's fancy indexing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.layers.attention import gather_kernel
from retrax.validation import ArgumentTypeError, ArgumentValueError


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


def test_kernels_under_jit_and_vmap():
  """Jitted and vmapped over a leading axis (as the layers vmap heads)."""
  x, indices = _case(1, 6, 32, 128, 64, jnp.float32)
  x, indices = x.reshape(2, 3, 32, 64), indices.reshape(2, 3, 128)
  want = np.asarray(x)[np.arange(2)[:, None, None], np.arange(3)[:, None],
                       np.asarray(indices)]
  for method in gather_kernel.METHODS:
    f = jax.jit(jax.vmap(lambda a, i, m=method: gather_kernel.gather_rows(
        a, i, method=m)))
    np.testing.assert_array_equal(np.asarray(f(x, indices)), want)


@pytest.mark.parametrize('x_shape, x_dtype, i_shape, i_dtype, kwargs, error, '
                         'message', [
    ((2, 8, 4), jnp.float32, (2, 8, 1), jnp.int32, {}, ArgumentValueError,
     'x must be [U, L, W] and indices [U, N]; got x (2, 8, 4), indices'),
    ((2, 8, 4), jnp.float32, (3, 8), jnp.int32, {}, ArgumentValueError,
     'x must be [U, L, W]'),
    ((2, 8, 4), jnp.float16, (2, 8), jnp.int32, {}, ArgumentTypeError,
     'x must be float32 or bfloat16; got float16'),
    ((2, 8, 4), jnp.float32, (2, 8), jnp.uint32, {}, ArgumentTypeError,
     'indices must be int32; got uint32'),
    ((2, 8, 4), jnp.float32, (2, 256), jnp.int32, {'block_rows': 64},
     ArgumentValueError, 'block_rows (64) must divide N (256) and be a '
     'multiple of 128 or N itself'),
    ((2, 8, 4), jnp.float32, (2, 384), jnp.int32, {'block_rows': 256},
     ArgumentValueError, 'block_rows (256) must divide N (384)'),
    ((2, 8, 4), jnp.float32, (2, 8), jnp.int32, {'method': 'xla'},
     ArgumentValueError, 'method'),
    ((2, 40, 4), jnp.bfloat16, (2, 32), jnp.int32, {'method': 'vmem_aligned'},
     ArgumentValueError, "method 'vmem_aligned' needs L (40) and block_rows "
     '(32) to be multiples of 16 (bfloat16 tile rows)'),
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
  """Rows of 64 or 65 lanes take 128 of VMEM, of 130 take 256; bfloat16 tiles are 16 rows."""
  for width, lanes in ((64, 128), (65, 128), (130, 256)):
    assert gather_kernel.vmem_bytes(1024, width, jnp.float32, 128) == (
        2 * (1024 + 128) * lanes * 4)
  assert gather_kernel.vmem_bytes(17, 64, jnp.bfloat16, 16) == (
      2 * (32 + 16) * 128 * 2)
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


@pytest.mark.parametrize('method', gather_kernel.METHODS)
@pytest.mark.parametrize('dtype, width', [
    (jnp.float32, 64), (jnp.float32, 65), (jnp.bfloat16, 128)])
def test_kernels_lower_for_tpu(method, dtype, width):
  """Each method lowers to one Mosaic TPU kernel at two grid steps a unit.

  `jax.export` for the TPU platform runs Pallas' TPU lowering on a CPU
  (block tiling rules, Mosaic's verifier); the chip's compiler itself runs
  on a TPU only (benchmarks/gather_bench.py).
  """
  x = jax.ShapeDtypeStruct((2, 512, width), dtype)
  indices = jax.ShapeDtypeStruct((2, 256), jnp.int32)
  exported = jax.export.export(
      jax.jit(lambda a, i: gather_kernel.gather_rows(
          a, i, method=method, interpret=False, block_rows=128)),
      platforms=['tpu'])(x, indices)
  module = exported.mlir_module()
  assert module.count('tpu_custom_call') == 1
  assert f'gather_rows_{method}' in module
