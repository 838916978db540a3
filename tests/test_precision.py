"""The opt-in bfloat16 matmul policy (`retrax.fastmath.precision`)."""

import contextlib
import functools
import os
import re
import subprocess
import sys

import jax
from jax import export
import jax.extend
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import retrax as trax
from retrax import fastmath
from retrax import layers as tl
from retrax import shapes
from retrax.fastmath import precision

GOLDEN = os.path.join(os.path.dirname(__file__), 'fixtures', 'golden')



@pytest.fixture
def bf16():
  with precision.matmul_precision('bfloat16'):
    yield


def _rounded(x):
  """float64 values of `x` rounded to bfloat16 (the policy's operands)."""
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _rand(key, shape):
  return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32)


def test_off_by_default_and_identical_to_numpy_ops():
  assert precision.matmul_dtype() == 'float32'
  a, b, c = _rand(0, (3, 5, 7)), _rand(1, (7, 4)), _rand(2, (3, 4, 6))
  np.testing.assert_array_equal(precision.dot(a, b), jnp.dot(a, b))
  np.testing.assert_array_equal(precision.matmul(jnp.dot(a, b), c),
                                jnp.matmul(jnp.dot(a, b), c))
  with fastmath.use_backend('numpy'):
    out = precision.dot(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32))
  assert isinstance(out, np.ndarray)


def _dot_contractions(fun, *args):
  """The contracting dimensions of every dot_general in `fun`'s jaxpr."""
  found = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == 'dot_general':
        found.append(eqn.params['dimension_numbers'][0])
      for sub in jax.extend.core.jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jax.make_jaxpr(fun)(*args).jaxpr)
  return found


def test_float32_weight_gradients_contract_one_row_axis():
  # A [batch, length, k] input's weight gradient is one contraction over
  # the flattened rows (XLA:CPU runs one over (batch, length) through a
  # transposed copy and a slower kernel), with the values of jnp.dot's.
  x, w, ct = _rand(0, (2, 96, 8)), _rand(1, (8, 5)), _rand(2, (2, 96, 5))

  def loss(dot, x, w):
    return jnp.sum(dot(x, w) * ct)
  for dot in (precision.dot, precision.matmul):
    grads = jax.grad(functools.partial(loss, dot), argnums=(0, 1))
    want = jax.grad(functools.partial(loss, jnp.dot), argnums=(0, 1))(x, w)
    for got, expected in zip(grads(x, w), want):
      np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    contractions = _dot_contractions(grads, x, w)
    assert ((0,), (0,)) in contractions, contractions
    assert all(len(lhs) == 1 for lhs, _ in contractions), contractions


def test_bf16_products_equal_rounded_operands_in_float64(bf16):
  del bf16
  a, b = _rand(0, (2, 64, 48)), _rand(1, (48, 32))
  out = precision.dot(a, b)
  assert out.dtype == jnp.float32
  want = _rounded(a) @ _rounded(b)
  # bf16 x bf16 products are exact in float32; only the sums round.
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  assert np.max(np.abs(np.asarray(jnp.dot(a, b)) - want)) > 1e-3

  q, k = _rand(2, (4, 16, 8)), _rand(3, (4, 24, 8))
  np.testing.assert_allclose(
      precision.matmul(q, jnp.swapaxes(k, -1, -2)),
      _rounded(q) @ np.swapaxes(_rounded(k), -1, -2), rtol=1e-5, atol=1e-5)


def test_bf16_skips_matmuls_of_few_rows(bf16):
  """A decoding step's matmuls (fewer than MIN_ROWS rows) stay float32."""
  del bf16
  for rows in (1, 8, precision.MIN_ROWS - 1):
    a, b = _rand(0, (rows, 48)), _rand(1, (48, 32))
    np.testing.assert_array_equal(precision.dot(a, b), jnp.dot(a, b))
  q, k = _rand(2, (32, 1, 16)), _rand(3, (32, 256, 16))  # A step over a cache.
  np.testing.assert_array_equal(precision.matmul(q, jnp.swapaxes(k, -1, -2)),
                                jnp.matmul(q, jnp.swapaxes(k, -1, -2)))
  a = _rand(0, (precision.MIN_ROWS, 48))
  np.testing.assert_allclose(precision.dot(a, _rand(1, (48, 32))),
                             _rounded(a) @ _rounded(_rand(1, (48, 32))),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('rows', [40, 4096])  # 4096: the blocked weight gradient.
def test_bf16_gradients_round_the_cotangent(bf16, rows):
  del bf16
  a, b, w = _rand(0, (2, rows, 16)), _rand(1, (16, 8)), _rand(2, (2, rows, 8))
  da, db = jax.grad(lambda a, b: jnp.sum(precision.dot(a, b) * w),
                    argnums=(0, 1))(a, b)
  assert da.dtype == db.dtype == jnp.float32
  ct = _rounded(w)
  np.testing.assert_allclose(da, ct @ _rounded(b).T, rtol=1e-5, atol=1e-5)
  want_db = np.einsum('xrk,xrn->kn', _rounded(a), ct)
  np.testing.assert_allclose(db, want_db, rtol=1e-5, atol=1e-4)


def test_bf16_batched_gradients_sum_over_broadcast_batches(bf16):
  del bf16
  a, b = _rand(0, (3, 25, 4)), _rand(1, (1, 4, 6))
  w = _rand(2, (3, 25, 6))
  da, db = jax.grad(lambda a, b: jnp.sum(precision.matmul(a, b) * w),
                    argnums=(0, 1))(a, b)
  assert da.shape == a.shape and db.shape == b.shape
  ct = _rounded(w)
  np.testing.assert_allclose(db[0], np.einsum('xik,xin->kn', _rounded(a), ct),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(da, ct @ np.swapaxes(_rounded(b), -1, -2),
                             rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize('policy', ['float32', 'bfloat16'])
def test_attention_products_in_both_layouts(policy):
  # Values and gradients against float64 NumPy on the policy's operands; the
  # gradients of q and k each sum both logit layouts' cotangents.
  rnd = _rounded if policy == 'bfloat16' else (lambda x: np.asarray(x, np.float64))
  q, k, v = _rand(0, (3, 32, 8)), _rand(1, (3, 48, 8)), _rand(2, (3, 48, 5))
  ct_km, ct_qm = _rand(3, (3, 48, 32)), _rand(4, (3, 32, 48))
  p, ct = jax.nn.softmax(_rand(5, (3, 32, 48))), _rand(6, (3, 32, 5))
  t = functools.partial(np.swapaxes, axis1=-1, axis2=-2)

  def logits_loss(q, k):
    s_km, s_qm = precision.logits_both_layouts(q, k)
    return jnp.sum(s_km * ct_km) + jnp.sum(s_qm * ct_qm), (s_km, s_qm)

  def values_loss(p, p_km, v):
    return jnp.sum(precision.probs_times_values(p, p_km, v) * ct)
  with precision.matmul_precision(policy):
    (dq, dk), (s_km, s_qm) = jax.grad(logits_loss, (0, 1), has_aux=True)(q, k)
    out = precision.probs_times_values(p, jnp.swapaxes(p, -1, -2), v)
    dp, dp_km, dv = jax.grad(values_loss, (0, 1, 2))(
        p, jnp.swapaxes(p, -1, -2), v)
  close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
  close(s_km, rnd(k) @ t(rnd(q)))
  close(s_qm, rnd(q) @ t(rnd(k)))
  close(dq, rnd(ct_qm + t(ct_km)) @ rnd(k))
  close(dk, rnd(ct_km + t(ct_qm)) @ rnd(q))
  close(out, rnd(p) @ rnd(v))
  close(dp, rnd(ct) @ t(rnd(v)))
  close(dv, rnd(t(p)) @ rnd(ct))
  np.testing.assert_array_equal(dp_km, np.zeros(dp_km.shape))
  if policy == 'bfloat16':  # The operands were rounded.
    assert np.max(np.abs(np.asarray(out) - np.asarray(p, np.float64) @ v)) > 1e-4

def _dot_operand_types(fun, platform, *args):
  """`(lhs, rhs, out)` element types of each dot of `fun` lowered for `platform`."""
  text = export.export(jax.jit(fun), platforms=[platform])(
      *args).mlir_module()
  return re.findall(r'stablehlo.dot_general.*: \(tensor<[\dx]*x(\w+)>, '
                    r'tensor<[\dx]*x(\w+)>\) -> tensor<[\dx]*x(\w+)>', text)


def test_vmapped_weight_gradients_are_float32_on_cpus_only(bf16):
  """Under `precision.vmapped`, the weight gradient multiplies float32 copies
  of its bfloat16 operands on CPUs and stays bfloat16 elsewhere; forward
  and input-gradient products stay bfloat16 everywhere."""
  del bf16
  x, w = _rand(0, (3, 128, 16)), _rand(1, (3, 16, 8))

  def grads(x, w, vmapped):
    def loss(x, w):
      with precision.vmapped() if vmapped else contextlib.nullcontext():
        return jnp.sum(jax.vmap(precision.dot)(x, w) ** 2)
    return jax.grad(loss, argnums=(0, 1))(x, w)
  low = ('bf16', 'bf16', 'f32')
  for platform in ('cpu', 'cuda', 'tpu'):
    weight_grad = ('f32', 'f32', 'f32') if platform == 'cpu' else low
    assert _dot_operand_types(functools.partial(grads, vmapped=True),
                              platform, x, w) == [low, low, weight_grad]
  assert _dot_operand_types(functools.partial(grads, vmapped=False), 'cpu',
                            x, w) == [low] * 3
  (dx, dw), (dx0, dw0) = grads(x, w, True), grads(x, w, False)
  np.testing.assert_allclose(dw, dw0, rtol=1e-5, atol=1e-4)  # Same products.
  np.testing.assert_array_equal(dx, dx0)


def test_batched_attention_units_train_in_bf16_on_xla_cpu():
  """The shared-QK full attention of benchmarks/real_text.py with its
  (example, head) units batched: XLA:CPU (jaxlib 0.10.2) stopped at run time
  ("Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32") on
  the weight gradients of its projections. The smallest failing shape found:
  48 units of 64 positions at d_model 88 at once (40 units, or d_model 80,
  ran; at length 1024, 3 units). Values and gradients are float32's within
  bfloat16's rounding."""
  layer = tl.SelfAttention(n_heads=1, d_qk=8, d_v=8, share_qk=True,
                           causal=True, chunk_len=None, n_parallel_heads=48)
  x = np.random.RandomState(0).randn(48, 64, 88).astype(np.float32)
  layer.init(shapes.signature(x))
  weights, state = layer.weights, layer.state

  def loss(weights, x):
    y, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(0))
    return jnp.sum(y ** 2), y
  got = {}
  for policy in ('bfloat16', 'float32'):
    with precision.matmul_precision(policy):
      got[policy] = jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(
          weights, x)
  for low, full in zip(jax.tree_util.tree_leaves(got['bfloat16']),
                       jax.tree_util.tree_leaves(got['float32'])):
    error = np.linalg.norm(np.asarray(low) - full) / np.linalg.norm(full)
    assert 1e-5 < error < 2e-2, error  # Rounded (by bfloat16's 2**-8), no more.


def test_jitted_functions_retrace_when_the_policy_changes():
  a, b = _rand(0, (64, 32)), _rand(1, (32, 8))
  f = jax.jit(precision.dot)
  exact = np.asarray(f(a, b))
  with precision.matmul_precision('bfloat16'):
    low = np.asarray(f(a, b))
  np.testing.assert_allclose(low, _rounded(a) @ _rounded(b), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(f(a, b), exact)
  assert precision.matmul_dtype() == 'float32'


def test_bad_policy_names_are_refused():
  with pytest.raises(ValueError, match="'bfloat16'.*'fp8'"):
    precision.set_matmul_dtype('fp8')
  assert precision.set_matmul_dtype(jnp.float32) == 'float32'
  with pytest.raises(ValueError, match='summed within one operand'):
    with precision.matmul_precision('bfloat16'):
      jax.grad(lambda a: jnp.sum(precision.einsum('ij,jk->k', a, a)))(
          _rand(0, (64, 64)))
  assert precision.matmul_dtype() == 'float32'


def test_environment_variable_sets_the_policy():
  code = 'from retrax.fastmath import precision; print(precision.matmul_dtype())'
  env = dict(os.environ, RETRAX_MATMUL_DTYPE='bfloat16')
  out = subprocess.run([sys.executable, '-c', code], env=env, check=True,
                       capture_output=True, text=True).stdout
  assert out.strip() == 'bfloat16'
  env['RETRAX_MATMUL_DTYPE'] = 'half'
  proc = subprocess.run([sys.executable, '-c', code], env=env,
                        capture_output=True, text=True)
  assert proc.returncode != 0 and "got 'half'" in proc.stderr


def test_dense_keeps_float32_weights_and_gradients(bf16):
  del bf16
  layer = tl.Dense(8)
  x = _rand(0, (4, 16, 16))
  layer.init(shapes.signature(x))
  w, b = layer.weights
  y = layer(x)
  assert y.dtype == w.dtype == jnp.float32
  np.testing.assert_allclose(y, _rounded(x) @ _rounded(w) + np.asarray(b),
                             rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda ws: jnp.sum(layer.pure_fn(x, ws, (), None)[0]))(
      layer.weights)
  assert all(g.dtype == jnp.float32 for g in grads)


def test_reformer_lsh_golden_within_bf16_tolerance(bf16,
                                                   threefry_not_partitionable):
  """Trax 1.4.1's float32 logits, reproduced with bfloat16 matmuls.

  Stated tolerance: 1% of the logits' scale, and the same argmax token at
  97% of positions or more (float32 matches Trax at 2e-5).
  """
  del bf16, threefry_not_partitionable
  io = np.load(os.path.join(GOLDEN, 'reformerlm_lsh', 'io.npz'))
  model = trax.models.ReformerLM(
      vocab_size=32, d_model=32, d_ff=64, n_layers=2, n_heads=2,
      d_attention_key=16, d_attention_value=16, max_len=64, mode='eval',
      attention_type=functools.partial(tl.LSHSelfAttention, n_hashes=2,
                                       chunk_len=8))
  model.init(shapes.signature(io['inputs']))
  model.init_from_file(os.path.join(GOLDEN, 'reformerlm_lsh', 'model.pkl.gz'),
                       weights_only=False)
  logits = np.asarray(jax.jit(model.pure_fn)(
      io['inputs'], model.weights, model.state, model.rng)[0])
  want = io['logits']
  scale = np.max(np.abs(want))
  err = np.max(np.abs(logits - want))
  assert 1e-4 * scale < err < 1e-2 * scale  # Measured: 0.39%.
  agree = np.mean(np.argmax(logits, -1) == np.argmax(want, -1))
  assert agree >= 0.97  # Measured: 98.4% (63 of 64).
