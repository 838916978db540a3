"""The predict-mode key/value cache (segmented on CPU) against NumPy."""

import functools

import jax
import numpy as np
import pytest

from retrax.layers import attention as attn
from retrax.layers.attention import kv_cache
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def np_attention(q, k, v, mask):
  dots = np.where(mask, q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), -1e9)
  w = np.exp(dots - dots.max(axis=-1, keepdims=True))
  return (w / w.sum(axis=-1, keepdims=True)) @ v


def split(x, backend):
  """A whole `(rows, slots, d)` cache as `kv_cache` holds it on `backend`."""
  bounds = kv_cache.segment_bounds(x.shape[1], backend)
  segments = tuple(x[:, lo:hi] for lo, hi in zip(bounds, bounds[1:]))
  return segments if len(segments) > 1 else segments[0]


def whole(cache):
  return np.concatenate(cache, 1) if isinstance(cache, tuple) else cache


def test_prefix_sizes_and_segments():
  assert kv_cache.prefix_sizes(2048, 'cpu') == (128, 256, 512, 1024, 2048)
  assert kv_cache.prefix_sizes(300, 'cpu') == (128, 256, 300)
  assert kv_cache.prefix_sizes(128, 'cpu') == (128,)
  assert kv_cache.prefix_sizes(20, 'cpu') == (20,)
  assert kv_cache.prefix_sizes(2048, 'gpu') == (2048,)
  assert kv_cache.segment_bounds(300, 'cpu') == (0, 128, 256, 300)


@pytest.mark.parametrize('length,backend,shapes', [
    (300, 'cpu', [(6, 128, 4), (6, 128, 4), (6, 44, 4)]),
    (300, 'gpu', [(6, 300, 4)]),
    (100, 'cpu', [(6, 100, 4)]),
])
def test_init_state_layout(length, backend, shapes):
  sig = ShapeDtype((6, 1, 4))
  ks, vs, idx = kv_cache.init_state((sig,) * 3, length, backend)
  for cache in (ks, vs):
    got = [s.shape for s in cache] if isinstance(cache, tuple) else [cache.shape]
    assert got == shapes
    assert kv_cache.length(cache) == length
  assert int(idx) == 0 and idx.dtype == np.int32


@pytest.mark.parametrize('n', [1, 3])
def test_writes_equal_numpy(n):
  """Eager and jitted writes land where NumPy puts them, across segments.

  Under jit, writes past the end are clamped to end at the last slot, as
  `lax.dynamic_update_slice` does.
  """
  length, cache = 300, randn(2, 300, 4)
  write = jax.jit(kv_cache._write)
  for idx in [0, 5, 126, 127, 128, 254, 255, 256, 297, 310]:
    new = randn(2, n, 4, seed=idx + 1)
    want = cache.copy()
    at = min(idx, length - n)
    want[:, at:at + n] = new
    segmented = split(cache, 'cpu')
    np.testing.assert_array_equal(
        whole(write(segmented, new, np.int32(idx))), want)
    if idx + n <= length:
      np.testing.assert_array_equal(
          whole(kv_cache._write(segmented, new, idx)), want)


@pytest.mark.parametrize('backend', ['cpu', 'gpu'])
def test_attend_equals_numpy(backend):
  """Segment reads (CPU) and whole-cache reads equal NumPy, eager and jitted."""
  n_rows, length, n_q, d = 3, 300, 2, 8
  q, ks, vs = randn(n_rows, n_q, d), randn(n_rows, length, d, seed=1), randn(
      n_rows, length, d, seed=2)
  cache_k, cache_v = split(ks, backend), split(vs, backend)
  attend = functools.partial(kv_cache.attend,
                             attention=attn.dot_product_attention)
  jitted = jax.jit(attend)
  # Positions in the first, second and last segment, at their edges, and past
  # the end of the cache (where every slot is visible).
  for start in [0, 5, 126, 127, 200, 254, 255, 290, 298, 299]:
    q_pos = start + np.arange(n_q)
    mask = np.arange(length)[None, None, :] <= q_pos[None, :, None]
    want = np_attention(np.float64(q), np.float64(ks), np.float64(vs), mask)
    for got in (attend(q, cache_k, cache_v, start),
                jitted(q, cache_k, cache_v, np.int32(start))):
      np.testing.assert_allclose(got, want,
                                 **float32_tolerance(rtol=1e-5, atol=1e-5))


def test_segments_equal_whole_cache():
  """Reading segments is the whole-cache computation up to rounding."""
  q, ks, vs = randn(16, 1, 64), randn(16, 1024, 64, seed=1), randn(
      16, 1024, 64, seed=2)
  attend = jax.jit(functools.partial(kv_cache.attend,
                                     attention=attn.dot_product_attention))
  for start in [0, 100, 128, 400, 1023]:
    start = np.int32(start)
    np.testing.assert_allclose(
        attend(q, split(ks, 'cpu'), split(vs, 'cpu'), start),
        attend(q, ks, vs, start), atol=1e-6, rtol=0)


def test_decode_step_reads_the_cache_in_place():
  """A jitted one-position step writes and reads the segments without copies.

  Slicing a prefix of one `(rows, slots, d)` cache made XLA copy it (16 MiB
  here at 1024 slots); the segmented cache needs only the attention weights.
  """
  rows, length, d = 64, 2048, 64
  sig = ShapeDtype((rows, 1, d))
  state = kv_cache.init_state((sig,) * 3, length, 'cpu')
  assert isinstance(state[0], tuple)

  def step(q, state):
    state, (ks, vs, start) = kv_cache.update_state(q, q, state)
    return kv_cache.attend(q, ks, vs, start, attn.dot_product_attention), state

  compiled = jax.jit(step, donate_argnums=1).lower(
      jax.ShapeDtypeStruct(sig.shape, np.float32), state).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  assert temp < 2 * rows * length * 4 + (1 << 20), temp  # Weights, not caches.
