"""`retrax.fastmath.xla_cpu`: retrax's jitted steps keep YNNPACK for dots only."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.fastmath import xla_cpu

pytestmark = pytest.mark.skipif(jax.default_backend() != 'cpu',
                                reason='XLA:CPU options')


def _ynn_fusion_shapes(fn, *args):
  text = fn.lower(*args).compile().as_text()
  return re.findall(r'%ynn_fusion\S* = (\S+) fusion\(', text)


def test_reductions_stay_out_of_ynnpack_dots_stay_in():
  x = jax.random.normal(jax.random.PRNGKey(0), (512, 64))
  w = jax.random.normal(jax.random.PRNGKey(1), (64, 32))
  f = lambda x, w: jnp.sum(jnp.tanh(x @ w), axis=0)  # A bias-gradient shape.
  assert xla_cpu.compiler_options() == {xla_cpu.OPTION: xla_cpu.VALUE}
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
  assert out.strip() == 'None'
