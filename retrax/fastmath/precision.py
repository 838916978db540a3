"""Mixed precision: an opt-in policy that runs the big matmuls in bfloat16.

Off by default (float32 everywhere, Trax's numbers). With
`set_matmul_dtype('bfloat16')`, the `matmul_precision('bfloat16')` context or
the environment variable `RETRAX_MATMUL_DTYPE=bfloat16`, the matmuls of
`Dense` and of the attention layers round their float32 operands to bfloat16
and accumulate in float32; their gradients round the cotangent the same way
and accumulate in float32 too. Weights, optimizer slots, activations between
layers, softmax, normalisation, hashing and losses stay float32, so the
reversible layers still reconstruct their inputs and checkpoints keep their
dtypes. On CPUs with AMX or AVX512-BF16, and on GPUs, bfloat16 matmuls run
several times faster than float32 ones. Matmuls of fewer than 64 rows (a
decoding step's) stay float32: rounding their operands, a whole key cache
included, costs more than the bfloat16 product saves.

The policy is read when a function is traced; changing it clears JAX's
compilation caches so that jitted steps pick the new one up.
"""

import contextlib
import functools
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from retrax.fastmath.backend import is_numpy
from retrax.fastmath.backend import numpy as backend_numpy
from retrax.validation import ArgumentValueError

ENV_VAR = 'RETRAX_MATMUL_DTYPE'
_DTYPES = {'float32': None, 'bfloat16': jnp.bfloat16}
# 'vmapped': matmuls are being traced inside a caller's vmap (see `vmapped`).
_current: dict[str, Any] = {'name': 'float32', 'vmapped': False}
# Matmuls whose first operand has fewer rows stay float32 (see above).
MIN_ROWS = 64


def _checked(name):
  if name is None:
    name = 'float32'
  elif not isinstance(name, str):
    name = str(jnp.dtype(name))
  if name not in _DTYPES:
    raise ArgumentValueError(f'matmul dtype must be one of {sorted(_DTYPES)}; got '
                             f'{name!r}.')
  return name


def matmul_dtype():
  """The policy's matmul operand dtype name: 'float32' (default) or 'bfloat16'."""
  return _current['name']


def set_matmul_dtype(name):
  """Sets the matmul operand dtype ('float32'/None or 'bfloat16'); returns the old one."""
  name, old = _checked(name), _current['name']
  if name != old:
    _current['name'] = name
    jax.clear_caches()  # Jitted steps traced under the old policy retrace.
  return old


@contextlib.contextmanager
def matmul_precision(name):
  """Runs the enclosed code (tracing included) under matmul dtype `name`."""
  old = set_matmul_dtype(name)
  try:
    yield
  finally:
    set_matmul_dtype(old)


@contextlib.contextmanager
def vmapped():
  """Marks the policy's matmuls traced inside as vmapped by the caller.

  XLA:CPU (jaxlib 0.10) fails at run time on some vmapped bfloat16 weight
  gradients ("Unsupported element type for DotThunk::Execute: BF16 x BF16 =
  F32"): its float normalization keeps bfloat16 for a batched dot that
  transpose folding later turns into one YNNPACK does not take, and XLA's
  own dot kernel has no bfloat16 x bfloat16 -> float32. Under this context
  the weight gradients of `dot` (and of `matmul` by a matrix) multiply
  float32 copies of their bfloat16 operands on CPUs: the same products
  (exact in float32) and float32 sums, as XLA computes such a dot where it
  upcasts it itself; other platforms keep bfloat16. Read when a matmul is
  traced and kept for its gradient: wrap the tracing of the vmapped
  function (attention's groups of (example, head) units do).
  """
  old, _current['vmapped'] = _current['vmapped'], True
  try:
    yield
  finally:
    _current['vmapped'] = old


def float32_dots_round_to_bfloat16(on_tpu):
  """Whether the float32 matmuls traced now round their operands to bfloat16.

  Under the bfloat16 policy (matmuls of `MIN_ROWS` rows or more), and, where
  `on_tpu`, at JAX's default matmul precision: XLA's float32 dots take one
  bfloat16 pass there, unless `jax.default_matmul_precision` asks for more.
  """
  if _current['name'] == 'bfloat16':
    return True
  asked = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
  return on_tpu and asked in (None, 'default', 'fastest', 'bfloat16')


def _policy_dtype(a, b):
  """The dtype to round `a` and `b` to, or None to leave them as they are."""
  dtype = _DTYPES[_current['name']]
  if dtype is None or is_numpy() or (
      jnp.result_type(a) != jnp.float32) or (
      jnp.result_type(b) != jnp.float32) or (
      math.prod(jnp.shape(a)[:-1]) < MIN_ROWS):
    return None
  return dtype


def einsum(spec, a, b):
  """`jnp.einsum(spec, a, b)` under the policy (two operands, explicit output).

  Every index of an operand must appear in the other operand or the output
  (matmul-like contractions), so that the gradients are einsums too.
  """
  dtype = _policy_dtype(a, b)
  if dtype is None:
    return backend_numpy.einsum(spec, a, b)
  return _low_precision_einsum(spec, dtype, _current['vmapped'], a, b)


def dot(a, b):
  """`numpy.dot(a, b)` under the policy (bfloat16 for a 2-D `b`)."""
  dtype = _policy_dtype(a, b)
  if jnp.ndim(b) != 2 or jnp.ndim(a) < 1:
    return backend_numpy.dot(a, b)
  if dtype is None:
    return _rows_times(a, b)
  return _low_precision_einsum(_DOT, dtype, _current['vmapped'], a, b)


def matmul(a, b):
  """`numpy.matmul(a, b)` (batch dims broadcast) under the policy."""
  dtype = _policy_dtype(a, b)
  if jnp.ndim(a) < 2 or jnp.ndim(b) < 2:
    return backend_numpy.matmul(a, b)
  if dtype is None:
    return (_rows_times(a, b) if jnp.ndim(b) == 2
            else backend_numpy.matmul(a, b))
  spec = _DOT if jnp.ndim(b) == 2 else '...ik,...kn->...in'
  return _low_precision_einsum(spec, dtype, _current['vmapped'], a, b)


def _rows_times(a, b):
  """`a [..., k] @ b [k, n]` with `a`'s rows flattened to one axis.

  Its gradient is then one contraction over the rows: XLA:CPU runs a weight
  gradient contracted over several axes (batch and length) through a
  transposed copy and a slow kernel, 20-25% of a feed-forward block's time.
  """
  rows = a.reshape(math.prod(a.shape[:-1]), a.shape[-1])
  return backend_numpy.dot(rows, b).reshape(a.shape[:-1] + b.shape[-1:])


# `[..., k] x [k, n]`: a layer's input times its weight matrix.
_DOT = '...k,kn->...n'
# Rows per block of a weight gradient (see `_weight_grad`).
_WEIGHT_GRAD_BLOCK = 2048


def _weight_grad(x, ct, vmapped=False):
  """`x [..., k]` and `ct [..., n]` contracted over all rows: `[k, n]`.

  Written as a contraction over (blocks, rows in a block): XLA:CPU runs that
  several times faster than one contraction over many rows in bfloat16
  (4x for `[16384, 256] x [16384, 1024]`), with the same float32 sums.
  `vmapped`: see `vmapped` (float32 copies of the operands on CPUs).
  """
  if vmapped:
    return lax.platform_dependent(
        x, ct, cpu=lambda x, ct: _weight_grad(
            x.astype(jnp.float32), ct.astype(jnp.float32)),
        default=_weight_grad)
  x = x.reshape(-1, x.shape[-1])
  ct = ct.reshape(-1, ct.shape[-1])
  rows = x.shape[0]
  if rows > _WEIGHT_GRAD_BLOCK and rows % _WEIGHT_GRAD_BLOCK == 0:
    x = x.reshape(-1, _WEIGHT_GRAD_BLOCK, x.shape[-1])
    ct = ct.reshape(-1, _WEIGHT_GRAD_BLOCK, ct.shape[-1])
    return jnp.einsum('bmk,bmn->kn', x, ct, preferred_element_type=jnp.float32)
  return jnp.einsum('mk,mn->kn', x, ct, preferred_element_type=jnp.float32)


def _sum_to(x, shape):
  """`x` summed over the leading/broadcast axes it has beyond `shape`."""
  lead = x.ndim - len(shape)
  axes = tuple(range(lead)) + tuple(
      lead + i for i, n in enumerate(shape) if n == 1 and x.shape[lead + i] != 1)
  x = jnp.sum(x, axis=axes, keepdims=True) if axes else x
  return x.reshape(shape)


def _operands(spec):
  ins, out = spec.replace(' ', '').split('->')
  sa, sb = ins.split(',')
  for s, other in ((sa, sb), (sb, sa)):
    loose = set(s.replace('...', '')) - set(other + out)
    if loose:
      raise ArgumentValueError(f'precision.einsum({spec!r}): indices {sorted(loose)} '
                               'are summed within one operand; not a matmul.')
  return sa, sb, out


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _low_precision_einsum(spec, dtype, vmapped, a, b):
  del vmapped  # Only the gradient reads it.
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                    preferred_element_type=jnp.float32)


def _fwd(spec, dtype, vmapped, a, b):
  del vmapped
  _operands(spec)
  a_low, b_low = a.astype(dtype), b.astype(dtype)
  out = jnp.einsum(spec, a_low, b_low, preferred_element_type=jnp.float32)
  return out, (a_low, b_low)


def _bwd(spec, dtype, vmapped, residuals, ct):
  a_low, b_low = residuals
  sa, sb, out = _operands(spec)
  ct_low = ct.astype(dtype)
  da = jnp.einsum(f'{out},{sb}->{sa}', ct_low, b_low,
                  preferred_element_type=jnp.float32)
  if spec == _DOT:
    db = _weight_grad(a_low, ct_low, vmapped)
  else:
    db = jnp.einsum(f'{sa},{out}->{sb}', a_low, ct_low,
                    preferred_element_type=jnp.float32)
  return _sum_to(da, a_low.shape), _sum_to(db, b_low.shape)


_low_precision_einsum.defvjp(_fwd, _bwd)


# Attention blocks. Under the bfloat16 policy XLA:CPU runs a batched matmul
# that contracts a non-minor axis of its first operand (`P^T v` for keys-major
# probabilities `P^T [.., W, C]`, the queries' gradient `dS^T k`) through
# float32 copies of both operands and a slow kernel: ~4x the time of one that
# contracts a minor axis. The two functions below compute a block's logits in
# both layouts, so that every product and gradient contracts minor axes.


def _mm(spec, dtype, a, b):
  """`einsum(spec, a, b)`, in `dtype` with float32 sums (None: as given)."""
  if dtype is None:
    return jnp.einsum(spec, a, b)
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                    preferred_element_type=jnp.float32)


def logits_both_layouts(q, k):
  """`(k q^T, q k^T)`: logits keys-major `[..., W, C]` and query-major `[..., C, W]`.

  `q [..., C, D]` and `k [..., W, D]` share their leading axes. Under the
  policy both products, and the gradients, run in bfloat16 with float32 sums.
  The queries' gradient contracts the query-major cotangent plus the
  keys-major one transposed, the keys' gradient the other way round.
  """
  return _logits_both(_policy_dtype(q, k), q, k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _logits_both(dtype, q, k):
  return (_mm('...wd,...cd->...wc', dtype, k, q),
          _mm('...cd,...wd->...cw', dtype, q, k))


def _logits_both_fwd(dtype, q, k):
  return _logits_both(dtype, q, k), (q, k)


def _logits_both_bwd(dtype, residuals, cts):
  q, k = residuals
  ct_km, ct_qm = cts
  ds_qm = ct_qm + jnp.swapaxes(ct_km, -1, -2)
  ds_km = ct_km + jnp.swapaxes(ct_qm, -1, -2)
  return (_mm('...cw,...wd->...cd', dtype, ds_qm, k).astype(q.dtype),
          _mm('...wc,...cd->...wd', dtype, ds_km, q).astype(k.dtype))


_logits_both.defvjp(_logits_both_fwd, _logits_both_bwd)


def probs_times_values(p, p_keys_major, v):
  """`p [..., C, W] @ v [..., W, V]`; the gradient of `v` is `p_keys_major @ ct`.

  `p_keys_major` holds `p` transposed (`[..., W, C]`) and gets no gradient:
  pass it through `jax.lax.stop_gradient`. Under the policy the product and
  both gradients run in bfloat16 with float32 sums.
  """
  dtype = _policy_dtype(p, v)
  if jnp.result_type(p_keys_major) != jnp.float32:
    dtype = None
  return _probs_values(dtype, p, p_keys_major, v)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _probs_values(dtype, p, p_keys_major, v):
  del p_keys_major  # Only the gradient reads it.
  return _mm('...cw,...wv->...cv', dtype, p, v)


def _probs_values_fwd(dtype, p, p_keys_major, v):
  low = p_keys_major if dtype is None else p_keys_major.astype(dtype)
  return _probs_values(dtype, p, p_keys_major, v), (low, v)


def _probs_values_bwd(dtype, residuals, ct):
  p_keys_major, v = residuals
  dp = _mm('...cv,...wv->...cw', dtype, ct, v)
  dv = _mm('...wc,...cv->...wv', dtype, p_keys_major, ct).astype(v.dtype)
  # Under the policy `p_keys_major` was float32 (see probs_times_values).
  zero = jnp.zeros(p_keys_major.shape,
                   p_keys_major.dtype if dtype is None else jnp.float32)
  return dp, zero, dv


_probs_values.defvjp(_probs_values_fwd, _probs_values_bwd)

if os.environ.get(ENV_VAR):
  _current['name'] = _checked(os.environ[ENV_VAR])
