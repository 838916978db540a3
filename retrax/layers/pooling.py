"""Pooling layers: `MaxPool`, `SumPool`, `AvgPool` (`lax.reduce_window`).

Windows span all axes but the first (batch) and last (channels): an input of
shape `(d_0, d_1, ..., d_{n-2}, d_{n-1})` is pooled over `d_1 .. d_{n-2}`, so
`pool_size` (and `strides`) must have `n - 2` entries. As in Trax, `strides`
defaults to 1 along every window axis (overlapping windows), not to
`pool_size`.
"""

from jax import lax
import jax.numpy as jnp_jax
import numpy as np

from retrax.errors import InputValueError
from retrax.layers import convolution
from retrax.layers.base import Fn
from retrax.validation import ArgumentValueError


def _window_args(layer_name, x, pool_size, strides, padding):
  """Checks `x` against the window and returns lax's dims, strides, padding."""
  pool_size = tuple(pool_size)
  n = len(pool_size)
  if len(x.shape) != n + 2:
    raise InputValueError(
        f'{layer_name} with pool_size {pool_size} pools {n} axes between the '
        f'batch and channel axes, so it expects rank-{n + 2} inputs; got shape '
        f'{tuple(x.shape)} (rank {len(x.shape)}).')
  strides = tuple(strides) if strides else (1,) * n
  if len(strides) != n:
    raise ArgumentValueError(f'{layer_name}: strides {strides} must have as many '
                             f'entries as pool_size {pool_size}.')
  padding = convolution.check_padding(padding, n)
  convolution.check_windows_fit(layer_name, x.shape, range(1, n + 1), pool_size,
                                (1,) * n, padding, 'pool window')
  if not isinstance(padding, str):
    padding = ((0, 0),) + padding + ((0, 0),)
  return (1,) + pool_size + (1,), (1,) + strides + (1,), padding


def _lowest(dtype):
  dtype = np.dtype(dtype)
  if jnp_jax.issubdtype(dtype, jnp_jax.floating):
    return -np.inf
  if dtype == np.bool_:
    return False
  return np.iinfo(dtype).min


def max_pool(x, pool_size=(2, 2), strides=None, padding='VALID',
             name='MaxPool'):
  """Maximum over each window (padding never wins)."""
  dims, strides, padding = _window_args(name, x, pool_size, strides, padding)
  init = np.array(_lowest(x.dtype), x.dtype)
  return lax.reduce_window(x, init, lax.max, dims, strides, padding)


def sum_pool(x, pool_size=(2, 2), strides=None, padding='VALID',
             name='SumPool'):
  """Sum over each window (padding counts as 0)."""
  dims, strides, padding = _window_args(name, x, pool_size, strides, padding)
  return lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, strides,
                           padding)


def avg_pool(x, pool_size=(2, 2), strides=None, padding='VALID',
             name='AvgPool'):
  """Mean over each window; with 'SAME' padding only real elements are counted."""
  dims, strides, padding = _window_args(name, x, pool_size, strides, padding)
  total = lax.reduce_window(x, np.array(0, x.dtype), lax.add, dims, strides,
                            padding)
  ones = jnp_jax.ones((1,) + tuple(x.shape[1:-1]) + (1,), x.dtype)
  counts = lax.reduce_window(ones, np.array(0, x.dtype), lax.add, dims,
                             strides, padding)
  return total / counts


def _pool_layer(kind, fn, pool_size, strides, padding):
  name = f'{kind}{pool_size}'.replace(' ', '')
  return Fn(name, lambda x: fn(x, pool_size, strides, padding, name=name))


def MaxPool(pool_size=(2, 2), strides=None, padding='VALID'):
  """Reduces each window to its maximum, per channel.

  Args:
    pool_size: Window shape over the axes between batch and channels (for
      rank-n inputs a tuple of n - 2 sizes).
    strides: Offsets between neighboring windows, as many as `pool_size`;
      None means 1 along every window axis.
    padding: 'VALID' (only full windows) or 'SAME' (pads the edges so that
      the output has ceil(size / stride) windows per axis).

  Returns:
    A layer mapping `(batch, *spatial, channels)` to the pooled array of the
    same rank.
  """
  return _pool_layer('MaxPool', max_pool, pool_size, strides, padding)


def SumPool(pool_size=(2, 2), strides=None, padding='VALID'):
  """Reduces each window to its sum, per channel (arguments as `MaxPool`)."""
  return _pool_layer('SumPool', sum_pool, pool_size, strides, padding)


def AvgPool(pool_size=(2, 2), strides=None, padding='VALID'):
  """Reduces each window to its mean, per channel (arguments as `MaxPool`).

  With 'SAME' padding, padded positions are not counted in the mean.
  """
  return _pool_layer('AvgPool', avg_pool, pool_size, strides, padding)
