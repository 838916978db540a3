"""JAX operations under Trax's `fastmath` names.

The few ops that layers call on activations (`logsumexp`, `expit`/`sigmoid`,
`erf`, `stop_gradient`, `abstract_eval`, `jit`, `fori_loop`) follow the
current backend, so layers also run eagerly on plain NumPy.
"""

import math

import jax
import jax.numpy as jnp
from jax import lax
import numpy as onp

from retrax.fastmath.backend import Backend
from retrax.fastmath.backend import is_numpy as _is_numpy
from retrax.shapes import ShapeDtype
from retrax.shapes import signature as _signature
from retrax.validation import ArgumentValueError

__all__ = [
    'jit',
    'logsumexp',
    'expit',
    'sigmoid',
    'erf',
    'stop_gradient',
    'fori_loop',
    'grad',
    'value_and_grad',
    'vjp',
    'vmap',
    'pmap',
    'remat',
    'checkpoint',
    'custom_jvp',
    'disable_jit',
    'psum',
    'scan',
    'map',
    'cond',
    'with_rank',
    'promoted',
    'while_loop',
    'dynamic_slice',
    'dynamic_slice_in_dim',
    'dynamic_update_slice',
    'dynamic_update_slice_in_dim',
    'top_k',
    'sort_key_val',
    'lt',
    'custom_vjp',
    'custom_grad',
    'index_update',
    'index_add',
    'index_min',
    'index_max',
    'max_pool',
    'sum_pool',
    'avg_pool',
    'conv',
    'abstract_eval',
    'global_device_count',
    'local_device_count',
    'device_count',
    'dataset_as_numpy',
]


def jit(f=None, **kwargs):
  """`jax.jit`, or the identity under the NumPy backend."""
  if f is None:
    return lambda g: jit(g, **kwargs)
  if _is_numpy():
    return f
  return jax.jit(f, **kwargs)


def logsumexp(x, axis=None, keepdims=False):
  """log(sum(exp(x))) along `axis`, computed stably."""
  if not _is_numpy():
    return jax.nn.logsumexp(x, axis=axis, keepdims=keepdims)
  x = onp.asarray(x)
  m = onp.max(x, axis=axis, keepdims=True)
  m = onp.where(onp.isfinite(m), m, 0)
  out = onp.log(onp.sum(onp.exp(x - m), axis=axis, keepdims=True)) + m
  return out if keepdims else onp.squeeze(out, axis=axis)


def expit(x):
  """The logistic sigmoid 1 / (1 + exp(-x))."""
  if _is_numpy():
    return 1. / (1. + onp.exp(-onp.asarray(x)))
  return jax.nn.sigmoid(x)


sigmoid = expit


def erf(x):
  """The error function, element-wise."""
  if _is_numpy():
    x = onp.asarray(x)
    return onp.vectorize(math.erf, otypes=[x.dtype])(x)
  return jax.scipy.special.erf(x)


def stop_gradient(x):
  """Identity whose gradient is zero (the identity under NumPy)."""
  if _is_numpy():
    return x
  return lax.stop_gradient(x)


def fori_loop(lower, upper, body_fn, init_val):
  """`val = body_fn(i, val)` for i in [lower, upper); a Python loop under NumPy."""
  if _is_numpy():
    val = init_val
    for i in range(lower, upper):
      val = body_fn(i, val)
    return val
  return lax.fori_loop(lower, upper, body_fn, init_val)


def scan(f, init, xs, length=None, reverse=False, unroll=1):
  """`lax.scan`: `(carry, y) = f(carry, x)` over the leading axis of `xs`.

  Under the NumPy backend it is a Python loop whose `ys` are stacked with NumPy.
  """
  if not _is_numpy():
    return lax.scan(f, init, xs, length=length, reverse=reverse, unroll=unroll)
  leaves = jax.tree_util.tree_leaves(xs)
  n = length if length is not None else (leaves[0].shape[0] if leaves else 0)
  order = range(n - 1, -1, -1) if reverse else range(n)
  carry, ys = init, []
  for i in order:
    x = jax.tree_util.tree_map(lambda a, i=i: a[i], xs)
    carry, y = f(carry, x)
    ys.append(y)
  if reverse:
    ys = ys[::-1]
  if not ys:
    raise ArgumentValueError('fastmath.scan over zero steps is not supported under '
                             'the NumPy backend.')
  stacked = jax.tree_util.tree_map(lambda *zs: onp.stack(zs), *ys)
  return carry, stacked


def cond(pred, true_fun, false_fun, *operands):
  """`lax.cond`; a Python `if` under the NumPy backend."""
  if _is_numpy():
    return true_fun(*operands) if bool(pred) else false_fun(*operands)
  return lax.cond(pred, true_fun, false_fun, *operands)


def remat(f, **kwargs):
  """`jax.checkpoint` (rematerialize `f` in the backward pass); identity under NumPy."""
  if _is_numpy():
    return f
  return jax.checkpoint(f, **kwargs)


checkpoint = remat
grad = jax.grad
value_and_grad = jax.value_and_grad
vjp = jax.vjp
vmap = jax.vmap
pmap = jax.pmap
custom_jvp = jax.custom_jvp
disable_jit = jax.disable_jit
psum = lax.psum
map = lax.map
while_loop = lax.while_loop
dynamic_slice = lax.dynamic_slice
dynamic_slice_in_dim = lax.dynamic_slice_in_dim
dynamic_update_slice = lax.dynamic_update_slice
dynamic_update_slice_in_dim = lax.dynamic_update_slice_in_dim
top_k = lax.top_k
sort_key_val = lax.sort_key_val
lt = lax.lt


def custom_vjp(f, f_fwd, f_bwd, nondiff_argnums=()):
  """Builds `f` with the custom VJP given by `f_fwd` / `f_bwd`."""
  f_ = jax.custom_vjp(f, nondiff_argnums=nondiff_argnums)
  f_.defvjp(f_fwd, f_bwd)
  return f_


def custom_grad(f_vjp, f_original):
  """`f_original` with gradients from `f_vjp(*args) -> (out, vjp_fn)`.

  `vjp_fn(cotangent)` returns a tuple with one gradient per argument. The
  backward pass calls `f_vjp` again on the saved arguments (a function cannot
  be stored as a JAX residual).
  """
  @jax.custom_vjp
  def f(*args):
    return f_original(*args)

  def fwd(*args):
    out, _ = f_vjp(*args)
    return out, args

  def bwd(args, g):
    _, vjp_fn = f_vjp(*args)
    return tuple(vjp_fn(g))

  f.defvjp(fwd, bwd)
  return f


def with_rank(x, ndim):
  """`x` with leading axes of size 1 up to rank `ndim`: NumPy's rank promotion, explicit.

  `y + with_rank(b, y.ndim)` broadcasts a bias over the leading axes the way
  `y + b` does, and also under `jax_numpy_rank_promotion='raise'`.
  """
  shape = onp.shape(x)
  if len(shape) >= ndim:
    return x
  xp = onp if _is_numpy() else jnp
  return xp.reshape(x, (1,) * (ndim - len(shape)) + tuple(shape))


def promoted(*xs, ranks=True):
  """`xs` as arrays of one dtype (and one rank), by JAX's standard rules, explicit.

  For operands whose mix of dtypes and ranks is meant (a metric's float
  outputs with a user's integer targets or lower-rank weights), so that the
  code also runs under strict dtype promotion and `rank_promotion='raise'`.
  `ranks=False` leaves the shapes alone (operands of a matrix product).
  """
  if _is_numpy():  # The NumPy backend stays on NumPy arrays.
    arrays: list = [onp.asarray(x) for x in xs]
    dtype = onp.result_type(*arrays)
  else:
    arrays = [jnp.asarray(x) for x in xs]
    with jax.numpy_dtype_promotion('standard'):
      dtype = jnp.result_type(*arrays)
  arrays = [x.astype(dtype) for x in arrays]
  if not ranks:
    return tuple(arrays)
  ndim = max(x.ndim for x in arrays)
  return tuple(with_rank(x, ndim) for x in arrays)


def index_update(x, idx, y):
  """`x` with `x[idx] = y` (JAX: `x.at[idx].set(y)`); Trax's name."""
  return jnp.asarray(x).at[idx].set(y)


def index_add(x, idx, y):
  """`x` with `x[idx] += y` (`x.at[idx].add(y)`)."""
  return jnp.asarray(x).at[idx].add(y)


def index_min(x, idx, y):
  """`x` with `x[idx] = minimum(x[idx], y)` (`x.at[idx].min(y)`)."""
  return jnp.asarray(x).at[idx].min(y)


def index_max(x, idx, y):
  """`x` with `x[idx] = maximum(x[idx], y)` (`x.at[idx].max(y)`)."""
  return jnp.asarray(x).at[idx].max(y)


def _pool(x, pool_size, strides, padding, init, op):
  dims = (1,) + tuple(pool_size) + (1,)
  strides = (1,) + tuple(strides or pool_size) + (1,)
  return lax.reduce_window(x, init, op, dims, strides, padding)


def max_pool(x, pool_size, strides, padding):
  return _pool(x, pool_size, strides, padding, -jnp.inf, lax.max)


def sum_pool(x, pool_size, strides, padding):
  return _pool(x, pool_size, strides, padding, 0., lax.add)


def avg_pool(x, pool_size, strides, padding):
  ones = jnp.ones(x.shape[:-1] + (1,), x.dtype)
  return (sum_pool(x, pool_size, strides, padding) /
          sum_pool(ones, pool_size, strides, padding))


def conv(x, kernel, window_strides, padding, dimension_numbers, rhs_dilation=None):
  """N-d convolution (`lax.conv_general_dilated`), Trax's argument order."""
  return lax.conv_general_dilated(x, kernel, window_strides, padding,
                                  rhs_dilation=rhs_dilation,
                                  dimension_numbers=dimension_numbers)


def abstract_eval(f):
  """Returns f over `ShapeDtype`s: shapes and dtypes of f's outputs.

  Under JAX nothing is computed (`jax.eval_shape`); under NumPy `f` runs on
  zeros of the given shapes, as in Trax.
  """
  def to_struct(x):
    if isinstance(x, ShapeDtype):
      return jax.ShapeDtypeStruct(x.shape, x.dtype)
    return x

  def to_shapedtype(x):
    if hasattr(x, 'shape') and hasattr(x, 'dtype'):
      return ShapeDtype(x.shape, x.dtype)
    return x

  def is_leaf(x):
    return isinstance(x, ShapeDtype)

  def to_zeros(x):
    if isinstance(x, ShapeDtype):
      return onp.zeros(x.shape, x.dtype)
    return x

  def wrapped(*args):
    if _is_numpy():
      zeros = jax.tree_util.tree_map(to_zeros, args, is_leaf=is_leaf)
      return _signature(f(*zeros))
    structs = jax.tree_util.tree_map(to_struct, args, is_leaf=is_leaf)
    out = jax.eval_shape(f, *structs)
    return jax.tree_util.tree_map(to_shapedtype, out)
  return wrapped


def global_device_count():
  """Number of devices over all hosts (`jax.device_count()`)."""
  return jax.device_count()


def local_device_count():
  """Number of devices on this host (`jax.local_device_count()`)."""
  return jax.local_device_count()


device_count = global_device_count
"""Trax <= 1.3.7's name for `global_device_count`."""


def dataset_as_numpy(ds):
  """Yields examples of an iterable as numpy trees."""
  for example in ds:
    yield jax.tree_util.tree_map(onp.asarray, example)


# Trax's table of backends (`fastmath.ops._backend_dict`): the dict that
# `fastmath.backend()` returns for each; 'tensorflow-numpy' computes with JAX.
_backend_dict = {
    Backend.JAX: {'np': jnp, 'name': Backend.JAX.value},
    Backend.NUMPY: {'np': onp, 'name': Backend.NUMPY.value},
    Backend.TFNP: {'np': jnp, 'name': Backend.TFNP.value},
}
