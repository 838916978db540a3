"""How many (example, head) units efficient attention computes at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.attention import efficient_base

import efficient_attention_refs as refs


@pytest.mark.parametrize('batch,heads,unit,budget,expected', [
    (1, 16, 100, 1600, 16),   # every head of the example fits
    (1, 16, 100, 1599, 8),    # the largest divisor of 16 that fits
    (1, 16, 100, 50, 1),      # nothing fits: one at a time
    (4, 2, 10, 80, 8),        # whole examples: 4 of them (2 heads each)
    (3, 2, 10, 50, 2),        # 4 units fit but 2 examples do not divide 3
    (1, 6, 100, 500, 3),      # 5 would fit; 3 is the divisor of 6 that does
])
def test_units_that_fit(batch, heads, unit, budget, expected):
  assert efficient_base.units_that_fit(batch, heads, unit, budget) == expected


def _grad_fn(layer, x, state=None):
  weights, init_state = layer.init(shapes.signature(x))
  state = init_state if state is None else state

  def loss(w, x):
    y, _ = layer.pure_fn(x, w, state, jax.random.PRNGKey(0))
    return jnp.sum(y * jnp.arange(y.shape[1], dtype=y.dtype)[None, :, None])
  return jax.jit(jax.grad(loss, argnums=(0, 1))), weights, state


def _lsh(n_parallel_heads):
  return tl.LSHSelfAttention(n_heads=4, d_qk=8, d_v=8, n_hashes=2,
                             chunk_len=16, causal=True, mode='train',
                             n_parallel_heads=n_parallel_heads)


def test_cpus_and_tpus_batch_small_units_and_loop_over_large_ones():
  """The backends' defaults, measured fastest there (group_memory_bytes'
  docstring)."""
  if jax.default_backend() not in ('cpu', 'tpu'):
    pytest.skip('a GPU batches units up to 1/4 of its memory')
  assert efficient_base.group_memory_bytes() == 16 << 20
  assert _lsh(None)._units_at_once((2, 64, 16)) == 8  # both examples, all heads
  # The default ReformerLM's layer at 4K: 40 MiB a unit; the paper-size
  # layer at 16K: 136 MiB a head with the heads projected at once.
  layer = tl.LSHSelfAttention(n_heads=4, d_qk=64, d_v=64, n_hashes=2,
                              chunk_len=64, mode='train')
  assert layer.unit_bytes(4096) == 40 << 20
  assert layer._units_at_once((1, 4096, 256)) == 1
  paper = tl.LSHSelfAttention(n_heads=16, d_qk=64, d_v=64, n_hashes=2,
                              chunk_len=128, mode='train')
  assert paper._units_at_once((1, 16384, 1024)) == 1


def test_default_batches_heads_and_equals_one_at_a_time(monkeypatch):
  """Trax's one-head-at-a-time loop and the batched default (an
  accelerator's budget) agree."""
  monkeypatch.setattr(efficient_base, 'group_memory_bytes', lambda: 1 << 30)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 64, 16))
  default = _lsh(None)
  assert default._units_at_once(x.shape) == 8  # both examples, all heads
  fn, w, state = _grad_fn(default, x)
  fn1, _, _ = _grad_fn(_lsh(1), x, state)  # The same hashing seeds.
  for got, want in zip(jax.tree_util.tree_leaves(fn(w, x)),
                       jax.tree_util.tree_leaves(fn1(w, x))):
    # Heads summed in another order: float32 rounding of the largest values.
    np.testing.assert_allclose(got, want, rtol=1e-4,
                               atol=1e-6 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize('projected', [True, False])
@pytest.mark.parametrize('length,d,chunk_len', [
    (2048, 32, 32),    # every row's logits live in the backward
    pytest.param(65536, 16, 64, marks=pytest.mark.slow),  # in blocks
])
def test_unit_bytes_bounds_the_compiled_group(length, d, chunk_len, projected,
                                              monkeypatch):
  """`unit_bytes` is within 1.5x of what XLA:CPU plans per extra unit, with
  all heads projected at once (the default) and per unit (long inputs)."""
  if not projected:
    monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  x = jax.ShapeDtypeStruct((1, length, 2 * d), jnp.float32)

  def temp_bytes(n):
    layer = tl.LSHSelfAttention(n_heads=4, d_qk=d, d_v=d, n_hashes=2,
                                chunk_len=chunk_len, mode='train',
                                n_parallel_heads=n)
    with refs.on_cpu():
      fn, w, _ = _grad_fn(layer, x)
    return refs.xla_cpu_temp_bytes(fn, w, x), layer
  one, layer = temp_bytes(1)
  four, _ = temp_bytes(4)
  per_unit = (four - one) / 3
  assert (layer._projected_stages(x.shape) is not None) == projected
  estimate = layer.unit_bytes(length, projected=projected)
  assert per_unit / 1.5 <= estimate <= 1.5 * per_unit


def test_default_shrinks_groups_as_sequences_grow(monkeypatch):
  # An accelerator's budgets (a GPU's: a TPU runs one unit at a time).
  monkeypatch.setattr(efficient_base, 'group_memory_bytes', lambda: 1 << 30)
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 1 << 30)
  layer = tl.LSHSelfAttention(n_heads=16, d_qk=64, d_v=64, n_hashes=2,
                              chunk_len=128, mode='train')
  at = [layer._units_at_once((1, n, 1024))
        for n in (4096, 16384, 65536, 262144)]
  # 64K attends in blocks: 193 MB a head's core; from 256K on the heads
  # are projected one by one (1.6 GB a head).
  assert at == [16, 4, 4, 1]
  explicit = tl.LSHSelfAttention(n_heads=16, n_parallel_heads=2)
  assert explicit._units_at_once((1, 65536, 1024)) == 2
