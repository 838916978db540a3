"""JAX operations under Trax's `fastmath` names."""

import jax
import jax.numpy as jnp
from jax import lax
import numpy as onp

from retrax.fastmath import backend as _backend
from retrax.shapes import ShapeDtype


def jit(f=None, **kwargs):
  """`jax.jit`, or the identity under the NumPy backend."""
  if f is None:
    return lambda g: jit(g, **kwargs)
  if _backend.is_backend('numpy'):
    return f
  return jax.jit(f, **kwargs)


grad = jax.grad
value_and_grad = jax.value_and_grad
vjp = jax.vjp
vmap = jax.vmap
pmap = jax.pmap
remat = jax.checkpoint
checkpoint = jax.checkpoint
custom_jvp = jax.custom_jvp
stop_gradient = lax.stop_gradient
disable_jit = jax.disable_jit
psum = lax.psum
scan = lax.scan
map = lax.map  # pylint: disable=redefined-builtin
fori_loop = lax.fori_loop
cond = lax.cond
while_loop = lax.while_loop
dynamic_slice = lax.dynamic_slice
dynamic_slice_in_dim = lax.dynamic_slice_in_dim
dynamic_update_slice = lax.dynamic_update_slice
dynamic_update_slice_in_dim = lax.dynamic_update_slice_in_dim
top_k = lax.top_k
sort_key_val = lax.sort_key_val
lt = lax.lt
logsumexp = jax.nn.logsumexp
expit = jax.nn.sigmoid
sigmoid = jax.nn.sigmoid
erf = jax.scipy.special.erf


def custom_vjp(f, f_fwd, f_bwd, nondiff_argnums=()):
  """Builds `f` with the custom VJP given by `f_fwd` / `f_bwd`."""
  f_ = jax.custom_vjp(f, nondiff_argnums=nondiff_argnums)
  f_.defvjp(f_fwd, f_bwd)
  return f_


def custom_grad(f_vjp, f_original):
  """Returns `f_original` with gradients from `f_vjp(*args) -> (out, vjp_fn)`."""
  @jax.custom_vjp
  def f(*args):
    return f_original(*args)

  def fwd(*args):
    return f_vjp(*args)

  def bwd(vjp_fn, g):
    return vjp_fn(g)

  f.defvjp(fwd, bwd)
  return f


def index_update(x, idx, y):
  return jnp.asarray(x).at[idx].set(y)


def index_add(x, idx, y):
  return jnp.asarray(x).at[idx].add(y)


def index_min(x, idx, y):
  return jnp.asarray(x).at[idx].min(y)


def index_max(x, idx, y):
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
  return lax.conv_general_dilated(x, kernel, window_strides, padding,
                                  rhs_dilation=rhs_dilation,
                                  dimension_numbers=dimension_numbers)


def abstract_eval(f):
  """Returns f over `ShapeDtype`s: shapes and dtypes of f's outputs, no compute."""
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

  def wrapped(*args):
    structs = jax.tree_util.tree_map(to_struct, args, is_leaf=is_leaf)
    out = jax.eval_shape(f, *structs)
    return jax.tree_util.tree_map(to_shapedtype, out)
  return wrapped


def global_device_count():
  return jax.device_count()


def local_device_count():
  return jax.local_device_count()


device_count = global_device_count


def dataset_as_numpy(ds):
  """Yields examples of an iterable as numpy trees."""
  for example in ds:
    yield jax.tree_util.tree_map(onp.asarray, example)
