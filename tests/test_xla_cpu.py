"""`retrax.fastmath.xla_cpu`: retrax's jitted steps keep YNNPACK for dots only."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np
import pytest

from retrax.fastmath import xla_cpu
import retrax.layers as tl
from retrax.shapes import ShapeDtype

pytestmark = pytest.mark.skipif(jax.default_backend() != 'cpu',
                                reason='XLA:CPU options')


def _ynn_fusion_shapes(fn, *args):
  text = fn.lower(*args).compile().as_text()
  return re.findall(r'%ynn_fusion\S* = (\S+) fusion\(', text)


def test_reductions_stay_out_of_ynnpack_dots_stay_in():
  x = jax.random.normal(jax.random.PRNGKey(0), (512, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 32))
  f = lambda x, w: jnp.sum(jnp.tanh(x @ w), axis=0)  # A bias-gradient shape.
  assert xla_cpu.compiler_options() == xla_cpu.OPTIONS
  shapes = _ynn_fusion_shapes(xla_cpu.jit(f), x, w)
  assert shapes and all(s.startswith('f32[512,32]') for s in shapes), shapes
  np.testing.assert_allclose(xla_cpu.jit(f)(x, w),
                             np.sum(np.tanh(np.asarray(x) @ np.asarray(w)), 0),
                             rtol=1e-5, atol=1e-4)


def test_explicit_options_and_user_flags_win():
  f = xla_cpu.jit(lambda x: x * 2, compiler_options={})
  assert float(f(jnp.float32(2))) == 4.0
  code = 'from retrax.fastmath import xla_cpu; print(xla_cpu.compiler_options())'
  env = dict(os.environ, XLA_FLAGS=f'--{xla_cpu.OPTION}={xla_cpu.VALUE}')
  out = subprocess.run([sys.executable, '-c', code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == f"{{'{xla_cpu.REGION_ANALYSIS}': True}}"


def test_region_analysis_drops_copies_of_a_decoding_loop():
  """An LSH predict-mode loop compiles with fewer copies, same outputs."""
  layer = tl.LSHSelfAttention(n_heads=4, d_qk=16, d_v=16, causal=True,
                              chunk_len=8, n_hashes=2, mode='predict',
                              predict_mem_len=32, predict_drop_len=16)
  layer.init(ShapeDtype((8, 1, 32)))
  weights, state = layer.weights, layer.state

  def run(state, xs):
    def body(i, carry):
      out, state = carry
      y, state = layer.pure_fn(xs[i], weights, state, jax.random.PRNGKey(0))
      return out.at[i].set(y), state
    return lax.fori_loop(0, xs.shape[0], body, (jnp.zeros_like(xs), state))[0]

  xs = jax.random.normal(jax.random.PRNGKey(1), (40, 8, 1, 32))
  plain = jax.jit(run).lower(state, xs).compile(
      {xla_cpu.OPTION: xla_cpu.VALUE})
  ours = xla_cpu.jit(run).lower(state, xs).compile()
  count = lambda c: len(re.findall(r' copy\(', c.as_text()))
  assert count(ours) < count(plain), (count(ours), count(plain))
  np.testing.assert_allclose(ours(state, xs), plain(state, xs), rtol=1e-5,
                             atol=1e-5)
