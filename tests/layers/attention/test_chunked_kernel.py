"""The Pallas chunked-attention kernel (interpret mode on CPU) against numpy and the XLA path.

A float64 numpy reference gives the outputs and log-normalisers, and its
central differences the gradients (along random directions); the XLA path
(`attend(..., implementation='xla')`) gives the same function in float32,
so the kernel path must equal it to float rounding, layers included.
"""

import functools
import math
import warnings

import jax
from jax import export
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.fastmath import precision
from retrax.layers.attention import chunked_kernel
from retrax.layers.attention import ops
from retrax.validation import ArgumentValueError
from tests.backend_tolerance import float32_tolerance


@pytest.fixture(autouse=True)
def _full_precision_matmuls():
  """Float32 dots at full precision, in the kernel and in XLA alike.

  A TPU's default rounds float32 dot operands to bfloat16 (CPUs do not), so
  on the chip too the comparisons below hold to float32 rounding.
  """
  with jax.default_matmul_precision('highest'):
    yield


def numpy_chunked_attention(q, k, v, q_info, kv_info, before, after, causal,
                            exclude_self, masked, keep=None):
  """Float64 chunked attention: `(out [N, C, V], lse [N, C])`.

  Chunk `i` of `q [N, C, D]` attends to key chunks `i - before .. i + after`
  (mod N) of `k` (already scaled), `v`; infos `[N, C]`; `keep` `[C, W]`
  dropout factors (already divided by the keep probability).
  """
  n = q.shape[0]
  outs, lses = [], []
  for i in range(n):
    window = [(i + o) % n for o in range(-before, after + 1)]
    kw = np.concatenate([k[j] for j in window])
    vw = np.concatenate([v[j] for j in window])
    kvi = np.concatenate([kv_info[j] for j in window])[None, :]
    qi = q_info[i][:, None]
    s = q[i] @ kw.T
    if causal:
      s = s - 1e9 * (qi < kvi)
    if exclude_self:
      s = s - 1e5 * (qi == kvi)
    if masked:
      s = s - 1e9 * (kvi < 0)
    top = s.max(-1, keepdims=True)
    lse = top + np.log(np.exp(s - top).sum(-1, keepdims=True))
    p = np.exp(s - lse)
    if keep is not None:
      p = p * keep
    outs.append(p @ vw)
    lses.append(lse[:, 0])
  return np.stack(outs), np.stack(lses)


def _case(name):
  """`(arrays (q, k, v, q_info, kv_info, keep), config kwargs)` of a named case."""
  rs = np.random.RandomState(sum(map(ord, name)))
  n, c, d, d_v = dict(lsh=(4, 8, 16, 8), local=(4, 8, 8, 16),
                      dropout=(3, 8, 8, 8), blocks=(6, 8, 8, 8),
                      one_chunk=(1, 8, 8, 8))[name]
  q = rs.randn(n, c, d)
  k = rs.randn(n, c, d) / math.sqrt(d)
  v = rs.randn(n, c, d_v)
  positions = np.arange(n * c)
  keep = None
  kw = dict(before=1, after=0, causal=False, exclude_self=False, masked=False)
  if name == 'lsh':  # shared keys, sorted positions, padding keys
    k = q / np.sqrt(np.mean(q**2, -1, keepdims=True) + 1e-6) / math.sqrt(d)
    positions = rs.permutation(n * c)
    kw.update(causal=True, exclude_self=True, masked=True)
  elif name == 'local':
    kw.update(after=1)
  elif name == 'dropout':
    keep = (rs.rand(c, 2 * c) > 0.3) / 0.7
    kw.update(causal=True)
  elif name == 'blocks':  # 3 grid steps of 2 chunks, neighbours past a step
    kw.update(before=3, after=1, causal=True, exclude_self=True)
  q_info = positions.reshape(n, c)
  kv_info = q_info
  if kw['masked']:
    kv_info = _padding_that_leaves_a_key_to_each_query(rs, q_info, kw)
  return (q, k, v, q_info, kv_info, keep), kw


def _padding_that_leaves_a_key_to_each_query(rs, q_info, kw):
  """Key infos with about 1/4 padding (`-info - 2`) where every query keeps a real key.

  A query with every key masked attends uniformly in float32 (its logits
  all round to -1e9), to its keys' softmax in float64: such rows are left
  out of the comparison with numpy (the XLA path shares float32's).
  """
  n, c = q_info.shape
  for _ in range(100):
    kv_info = np.where(rs.rand(n, c) < 0.25, -q_info - 2, q_info)
    ok = True
    for i in range(n):
      window = np.concatenate([kv_info[(i + o) % n] for o in
                               range(-kw['before'], kw['after'] + 1)])
      visible = (window[None, :] >= 0) & (q_info[i][:, None] >= window[None])
      ok &= bool(np.all(visible.any(-1)))
    if ok:
      return kv_info
  raise AssertionError('no padding leaves a key to every query')


def _kernel_call(arrays, kw, **config_kw):
  """`(config, attend)`: `attend(config, q, k, v)` runs the interpreted kernel
  on a case's infos and dropout factors; `config` has the case's masks (and
  `config_kw`), shared keys normalised with epsilon 1e-6."""
  q, _, _, q_info, kv_info, keep = arrays
  n, c = q.shape[:2]
  width = 1 + kw['before'] + kw['after']
  config = chunked_kernel.Config(**kw, mask_penalty=1e9, self_penalty=1e5,
                                 matmul_dtype=None, interpret=True,
                                 key_norm_epsilon=1e-6, **config_kw)
  scale = None if keep is None else jnp.asarray(
      keep.reshape(c, width, c).transpose(1, 2, 0), jnp.float32)
  rows = lambda a: jnp.asarray(a.reshape(n, 1, c), jnp.int32)

  def attend(config, q, k, v):
    return chunked_kernel.attention(config, q, k, v, rows(q_info),
                                    rows(kv_info), scale)
  return config, attend


def _kernel(arrays, kw, rows_per_step):
  """`f(q, k, v) -> (out, lse [N, C])` by the interpreted kernel (`k` None:
  shared keys)."""
  config, attend = _kernel_call(arrays, kw, rows_per_step=rows_per_step)

  def f(q, k, v):
    out, lse = attend(config, q, k, v)
    return out, lse[:, 0]
  return f


@pytest.mark.parametrize('name, rows_per_step', [
    ('lsh', 1024), ('local', 16), ('dropout', 1024), ('blocks', 16),
    ('one_chunk', 1024)])
def test_kernel_matches_numpy(name, rows_per_step):
  arrays, kw = _case(name)
  q, k, v, q_info, kv_info, keep = arrays
  f = _kernel(arrays, kw, rows_per_step)
  ref = functools.partial(numpy_chunked_attention, q_info=q_info,
                          kv_info=kv_info, keep=keep, **kw)
  rs = np.random.RandomState(7)
  want_out, want_lse = ref(q, k, v)
  ct_out, ct_lse = rs.randn(*want_out.shape), rs.randn(*want_lse.shape)
  inputs = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  (out, lse), vjp = jax.vjp(jax.jit(f), *inputs)
  grads = vjp((jnp.asarray(ct_out, jnp.float32),
               jnp.asarray(ct_lse, jnp.float32)))
  np.testing.assert_allclose(out, want_out,
                             **float32_tolerance(rtol=1e-5, atol=1e-5))
  np.testing.assert_allclose(lse, want_lse,
                             **float32_tolerance(rtol=1e-6, atol=1e-5))

  def objective(q, k, v):
    o, l = ref(q, k, v)
    return np.sum(o * ct_out) + np.sum(l * ct_lse)
  eps = 1e-6
  for _ in range(2):  # directional derivatives by central differences
    u = [rs.randn(*a.shape) for a in (q, k, v)]
    plus = objective(*(a + eps * b for a, b in zip((q, k, v), u)))
    minus = objective(*(a - eps * b for a, b in zip((q, k, v), u)))
    want = (plus - minus) / (2 * eps)
    got = sum(np.sum(np.asarray(g, np.float64) * b) for g, b in zip(grads, u))
    np.testing.assert_allclose(got, want,
                               **float32_tolerance(rtol=1e-4, atol=1e-4))


def test_kernel_normalises_shared_keys_itself():
  """Shared keys (`k=None`): the kernel's outputs, log-normalisers and the
  queries' gradient (their query and key roles, in one array) against
  float64 numpy on the normalised, scaled queries as keys."""
  arrays, kw = _case('lsh')
  q, _, v, q_info, kv_info, keep = arrays
  d = q.shape[-1]

  def ref(q, v):
    keys = q / np.sqrt(np.mean(q**2, -1, keepdims=True) + 1e-6) / math.sqrt(d)
    return numpy_chunked_attention(q, keys, v, q_info, kv_info, keep=keep,
                                   **kw)
  f = _kernel(arrays, kw, 1024)
  rs = np.random.RandomState(11)
  want_out, want_lse = ref(q, v)
  ct_out, ct_lse = rs.randn(*want_out.shape), rs.randn(*want_lse.shape)
  (out, lse), vjp = jax.vjp(jax.jit(lambda q, v: f(q, None, v)),
                            jnp.asarray(q, jnp.float32),
                            jnp.asarray(v, jnp.float32))
  dq, dv = vjp((jnp.asarray(ct_out, jnp.float32),
                jnp.asarray(ct_lse, jnp.float32)))
  np.testing.assert_allclose(out, want_out,
                             **float32_tolerance(rtol=1e-5, atol=1e-5))
  np.testing.assert_allclose(lse, want_lse,
                             **float32_tolerance(rtol=1e-6, atol=1e-5))

  def objective(q, v):
    o, l = ref(q, v)
    return np.sum(o * ct_out) + np.sum(l * ct_lse)
  eps = 1e-6
  for _ in range(3):  # directional derivatives by central differences
    u = [rs.randn(*a.shape) for a in (q, v)]
    want = (objective(q + eps * u[0], v + eps * u[1]) -
            objective(q - eps * u[0], v - eps * u[1])) / (2 * eps)
    got = sum(np.sum(np.asarray(g, np.float64) * b) for g, b in zip((dq, dv), u))
    np.testing.assert_allclose(got, want,
                               **float32_tolerance(rtol=1e-4, atol=1e-4))


@pytest.mark.parametrize('name', ['lsh', 'dropout'])
def test_joint_output_is_the_outputs_and_normalisers_side_by_side(name):
  """`joint_output`: one `[N, C, V + 1]` array, the two results' values, and
  the same gradients for a cotangent of it as for its two parts'."""
  arrays, kw = _case(name)
  q, k, v = arrays[:3]
  n, c = q.shape[:2]
  config, attend = _kernel_call(arrays, kw)
  shared = name == 'lsh'

  def run(joint, q, k, v):
    return attend(config._replace(joint_output=joint), q,
                  None if shared else k, v)
  inputs = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
  joint, joint_vjp = jax.vjp(jax.jit(functools.partial(run, True)), *inputs)
  (out, lse), vjp = jax.vjp(jax.jit(functools.partial(run, False)), *inputs)
  assert joint.shape == (n, c, v.shape[-1] + 1) and joint.dtype == jnp.float32
  np.testing.assert_allclose(joint[..., :-1], out, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(joint[..., -1], lse[:, 0], rtol=1e-6, atol=1e-6)
  ct = jnp.asarray(np.random.RandomState(2).randn(*joint.shape), jnp.float32)
  for got, want in zip(joint_vjp(ct),
                       vjp((ct[..., :-1], ct[..., -1][:, None, :]))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('name', ['lsh', 'dropout'])
def test_queries_and_values_in_one_array(name):
  """`qv_depth`: queries|values side by side in `q` give the shared-keys
  results, and their gradient comes back side by side."""
  arrays, kw = _case(name)
  q, _, v = arrays[:3]
  d = q.shape[-1]
  config, run = _kernel_call(arrays, kw, joint_output=True)
  q, v = jnp.asarray(q, jnp.float32), jnp.asarray(v, jnp.float32)
  got, vjp_qv = jax.vjp(
      jax.jit(lambda qv: run(config._replace(qv_depth=d), qv, None, None)),
      jnp.concatenate([q, v], -1))
  want, vjp = jax.vjp(jax.jit(lambda q, v: run(config, q, None, v)), q, v)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  ct = jnp.asarray(np.random.RandomState(4).randn(*got.shape), jnp.float32)
  np.testing.assert_allclose(vjp_qv(ct)[0], jnp.concatenate(vjp(ct), -1),
                             rtol=1e-5, atol=1e-6)
  with pytest.raises(ArgumentValueError, match='side by side'):
    run(config._replace(qv_depth=d), q, None, v)


def test_shared_keys_need_the_normalisation_epsilon():
  arrays, kw = _case('lsh')
  config, attend = _kernel_call(arrays, kw)
  with pytest.raises(ArgumentValueError, match='key_norm_epsilon'):
    attend(config._replace(key_norm_epsilon=None), jnp.asarray(arrays[0]),
           None, jnp.asarray(arrays[2]))


def test_block_chunks_divide_the_chunks_within_the_step():
  assert chunked_kernel.block_chunks(128, 128) == 8
  assert chunked_kernel.block_chunks(256, 64) == 16
  assert chunked_kernel.block_chunks(6, 8, rows_per_step=16) == 2
  assert chunked_kernel.block_chunks(7, 128) == 7
  assert chunked_kernel.block_chunks(13, 128) == 1  # prime: one chunk a step
  assert chunked_kernel.block_chunks(4, 512) == 2
  assert chunked_kernel.block_chunks(64, 128, 128, 128) == 8
  assert chunked_kernel.block_chunks(64, 128, 256, 256) == 4  # VMEM-bound
  assert chunked_kernel.block_chunks(64, 512, 256, 256) == 1


def _mask_fn(causal, exclude_self, masked):
  return functools.partial(ops.mask_self_attention, causal=causal,
                           exclude_self=exclude_self, masked=masked)


@pytest.mark.parametrize('case', ['lsh', 'local', 'local_causal'])
def test_attend_kernel_equals_xla(case):
  """`attend` by the kernel equals `attend` by XLA ops: outputs, lse, gradients."""
  rs = np.random.RandomState(3)
  length, d = 32, 8
  q = jnp.asarray(rs.randn(length, d), jnp.float32)
  v = jnp.asarray(rs.randn(length, d), jnp.float32)
  kwargs = dict(q_chunk_len=8, n_chunks_before=1)
  if case == 'lsh':  # shared keys, sorted positions, padding (info < 0)
    info = rs.permutation(length)
    kwargs.update(mask_fn=_mask_fn(True, True, True), q_info=info,
                  kv_info=np.where(info % 7 == 3, -info - 2, info))
    args = (q, v)
    fn = lambda impl, q, v: ops.attend(q, None, v, implementation=impl,
                                       **kwargs)
  else:
    kwargs.update(kv_chunk_len=8, n_chunks_after=int(case == 'local'),
                  mask_fn=_mask_fn(case == 'local_causal', False, False))
    args = (q, jnp.asarray(rs.randn(length, d), jnp.float32), v)
    fn = lambda impl, q, k, v: ops.attend(q, k, v, implementation=impl,
                                          **kwargs)
  cts = (jnp.asarray(rs.randn(length, d), jnp.float32),
         jnp.asarray(rs.randn(length), jnp.float32))
  got, want = ((out, vjp(cts)) for out, vjp in (
      jax.vjp(jax.jit(functools.partial(fn, impl)), *args)
      for impl in ('pallas', 'xla')))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, **float32_tolerance(rtol=1e-5, atol=2e-6))


def _layer_values_and_grads(layer, inputs, weights, state):
  """`(y, (dweights, dx))` of `layer`, the gradients of `sum(y * cos(index))`, jitted."""
  def values_and_grads(w, x):
    def forward(w, x):
      return layer.pure_fn((x,) + inputs[1:] if len(inputs) > 1 else x, w,
                           state, jax.random.PRNGKey(0))[0]
    y, vjp = jax.vjp(forward, w, x)
    return y, vjp(jnp.cos(jnp.arange(y.size).reshape(y.shape)))
  return jax.jit(values_and_grads)(weights, inputs[0])


def _assert_layers_agree(make, inputs):
  """`make(implementation)`'s layers agree: values and gradients (x and weights)."""
  weights, state = make('xla').init(shapes.signature(inputs))
  results = [_layer_values_and_grads(make(impl), inputs, weights, state)
             for impl in ('pallas', 'xla')]
  for g, w in zip(*map(jax.tree.leaves, results)):
    np.testing.assert_allclose(g, w, **float32_tolerance(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize('n_hashes, causal', [
    pytest.param(1, False, marks=pytest.mark.slow), (2, True)])  # ~8 s each
def test_lsh_layer_with_the_kernel_equals_the_xla_layer(n_hashes, causal):
  """LSHSelfAttention, padded and masked, by the kernel and by XLA ops.

  With 2 hashes its 2 heads run at once (the kernel vmapped over units).
  """
  rs = np.random.RandomState(n_hashes)
  x = jnp.asarray(rs.randn(1, 32, 16), jnp.float32)
  mask = jnp.asarray(np.arange(32)[None, :] < 27)
  make = lambda impl: tl.LSHSelfAttention(
      n_heads=n_hashes, d_qk=8, d_v=8, chunk_len=8, n_hashes=n_hashes,
      causal=causal, masked=True, n_parallel_heads=n_hashes,
      implementation=impl)
  _assert_layers_agree(make, (x, mask))


@pytest.mark.parametrize('causal', [
    pytest.param(False, marks=pytest.mark.slow), True])
def test_local_self_attention_with_the_kernel_equals_the_xla_layer(causal):
  """SelfAttention over local windows (look-back 1), 28 positions padded to 32."""
  rs = np.random.RandomState(5)
  x = jnp.asarray(rs.randn(1, 28, 16), jnp.float32)
  mask = jnp.asarray(np.arange(28)[None, :] < 21)
  make = lambda impl: tl.SelfAttention(
      n_heads=1, d_qk=8, d_v=8, chunk_len=8, n_chunks_before=1,
      causal=causal, masked=True, bias=True, implementation=impl)
  _assert_layers_agree(make, (x, mask))


@pytest.mark.slow  # ~20 s: dropout and bfloat16 layers, interpreted
def test_layers_with_dropout_and_bfloat16_matmuls_equal_the_xla_layers():
  rs = np.random.RandomState(9)
  x = jnp.asarray(rs.randn(1, 64, 16), jnp.float32)
  mask = jnp.ones((1, 64), bool)
  make = lambda impl: tl.LSHSelfAttention(
      n_heads=2, d_qk=8, d_v=8, chunk_len=8, n_hashes=2, causal=True,
      masked=True, attention_dropout=0.2, implementation=impl)
  _assert_layers_agree(make, (x, mask))
  make = lambda impl: tl.SelfAttention(
      n_heads=2, d_qk=8, d_v=8, chunk_len=16, n_chunks_before=1, causal=True,
      implementation=impl)
  weights, state = make('xla').init(shapes.signature(x))
  with precision.matmul_precision('bfloat16'):
    got, want = (_layer_values_and_grads(make(impl), (x,), weights, state)
                 for impl in ('pallas', 'xla'))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      scale = float(jnp.max(jnp.abs(w)))
      np.testing.assert_allclose(g, w, atol=2e-2 * scale)


@pytest.mark.parametrize('chunk_len, depth, dropout, matmul_dtype, keys', [
    (128, 64, False, None, 'rows'), (64, 128, True, 'bfloat16', 'given'),
    (256, 64, False, 'float32', 'shared')])
def test_kernel_lowers_for_tpu(chunk_len, depth, dropout, matmul_dtype, keys):
  """Forward and backward, vmapped over units, lower to Mosaic TPU kernels.

  `jax.export` for the TPU platform runs Pallas' TPU lowering on a CPU
  machine: block shapes must satisfy the (8, 128) tiling rule and every op
  must have a Mosaic lowering (the chip's compiler itself runs on a TPU
  only, in benchmarks/tpu.sh).
  """
  n, before, after = 8, 1, int(dropout)
  width = 1 + before + after
  config = chunked_kernel.Config(before, after, True, True, True, 1e9, 1e5,
                                 matmul_dtype, interpret=False,
                                 key_norm_epsilon=1e-6,
                                 joint_output=keys != 'given',
                                 qv_depth=depth if keys == 'rows' else None)
  q = jax.ShapeDtypeStruct((2, n, chunk_len, depth), jnp.float32)
  info = jax.ShapeDtypeStruct((2, n, 1, chunk_len), jnp.int32)
  scale = (jax.ShapeDtypeStruct((width, chunk_len, chunk_len), jnp.float32)
           if dropout else None)

  def grads(q, k, v, q_info, kv_info, scale):
    def loss(q, k, v, q_info, kv_info):
      if keys == 'rows':  # queries|values side by side
        q, k, v = jnp.concatenate([q, v], -1), None, None
      results = chunked_kernel.attention(config, q, None if keys == 'shared'
                                         else k, v, q_info, kv_info, scale)
      return sum(jnp.sum(r) for r in jax.tree.leaves(results))
    return jax.vmap(jax.grad(loss, (0, 1, 2)))(q, k, v, q_info, kv_info)
  exported = export.export(jax.jit(grads), platforms=['tpu'])(
      q, q, q, info, info, scale)
  module = exported.mlir_module()
  assert module.count('tpu_custom_call') == 2  # forward and backward kernels
  assert 'chunked_attention_fwd' in module and 'chunked_attention_bwd' in module


def test_unsupported_shapes_run_the_xla_path_with_a_warning():
  q = jnp.asarray(np.random.RandomState(0).randn(24, 4), jnp.float32)

  def attend(impl, chunk_len=12, mask_fn=_mask_fn(True, True, False), k=None):
    return jax.jit(lambda q: ops.attend(
        q, k, q, q_chunk_len=chunk_len, n_chunks_before=int(bool(chunk_len)),
        mask_fn=mask_fn, implementation=impl))(q)
  want = attend('xla')
  with pytest.warns(UserWarning, match=r'runs the XLA path: chunk_len 12 is '
                    r'not a multiple of 8'):
    got = attend('pallas')
  np.testing.assert_array_equal(got[0], want[0])
  with pytest.warns(UserWarning, match='not chunked'):
    attend('pallas', chunk_len=None, k=q)
  with pytest.warns(UserWarning, match='mask_fn is not mask_self_attention'):
    attend('pallas', chunk_len=8, mask_fn=lambda dots, q_info, kv_info: dots)
  with warnings.catch_warnings():  # 'auto' off a TPU: XLA, silently
    warnings.simplefilter('error')
    attend('auto', chunk_len=8)


def test_implementation_argument_and_environment_variable(monkeypatch):
  monkeypatch.delenv(chunked_kernel.ENV_VAR, raising=False)
  assert tl.LSHSelfAttention().implementation == 'xla'  # the default
  assert tl.SelfAttention(implementation='auto').implementation == 'auto'
  built_before = tl.SelfAttention()
  monkeypatch.setenv(chunked_kernel.ENV_VAR, 'pallas')
  assert tl.LSHSelfAttention().implementation == 'pallas'
  assert tl.SelfAttention(implementation='xla').implementation == 'xla'
  # Read when a layer is built: a layer built before keeps its 'xla'.
  assert built_before.implementation == 'xla'
  assert not built_before._runs_kernel()
  # Layers without the kernel say 'xla' whatever the variable says.
  assert tl.EncDecAttention().implementation == 'xla'
  assert tl.PureLSHSelfAttention().implementation == 'xla'
  with pytest.raises(ArgumentValueError, match=r"LSHSelfAttention: "
                     r"implementation must be one of \('xla', 'pallas', "
                     r"'auto'\); got 'triton'"):
    tl.LSHSelfAttention(implementation='triton')
  monkeypatch.setenv(chunked_kernel.ENV_VAR, 'fast')
  with pytest.raises(ArgumentValueError, match=r"SelfAttention: the "
                     r"environment variable RETRAX_ATTENTION_IMPL must be "
                     r"one of .*; got 'fast'"):
    tl.SelfAttention()
  with pytest.raises(ArgumentValueError, match='attend: implementation'):
    ops.attend(jnp.ones((8, 4)), None, jnp.ones((8, 4)), q_chunk_len=8,
               implementation='cuda')


def test_kernel_matmuls_take_the_precision_xla_dots_get():
  assert chunked_kernel.matmul_precision(on_tpu=False) is None
  assert chunked_kernel.matmul_precision(on_tpu=True) == 'float32'  # fixture
  with jax.default_matmul_precision(None):  # JAX's default
    assert chunked_kernel.matmul_precision(on_tpu=True) == 'bfloat16'
  with precision.matmul_precision('bfloat16'):
    assert chunked_kernel.matmul_precision(on_tpu=False) == 'bfloat16'


def test_kernel_units_keep_no_scores_in_the_memory_estimate():
  xla = tl.LSHSelfAttention(n_hashes=2, chunk_len=128, implementation='xla')
  kernel = tl.LSHSelfAttention(n_hashes=2, chunk_len=128,
                               implementation='pallas')
  rows, window, depths = 2 * 4096, 256, 128
  assert kernel.unit_bytes(4096) == 4 * rows * 6 * depths
  assert xla.unit_bytes(4096) - kernel.unit_bytes(4096) == 4 * rows * 4 * window
