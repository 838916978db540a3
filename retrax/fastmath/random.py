"""Explicit PRNG keys (raw uint32[2] keys, as Trax used) and random draws.

Draws use `jax.random`, so a key gives the same numbers under every backend;
under the NumPy backend they come back as `numpy.ndarray`s.
"""

import functools

import jax
import numpy as onp

from retrax.fastmath.backend import is_numpy as _is_numpy
from retrax.validation import ArgumentTypeError


def _backend_array(fn, default_dtype=None):
  """Wraps a jax.random function to return NumPy arrays under the NumPy backend.

  With `default_dtype`, a draw without a `dtype` argument uses it (so 64-bit
  mode, on under 'tensorflow-numpy', gives the same numbers as 'jax').
  """
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    if default_dtype is not None and 'dtype' not in kwargs and len(
        args) <= _DTYPE_POSITION[fn.__name__]:
      kwargs['dtype'] = default_dtype
    out = fn(*args, **kwargs)
    return onp.asarray(out) if _is_numpy() else out
  return wrapped


# Index of `dtype` among each wrapped draw's positional arguments.
_DTYPE_POSITION = {'normal': 2, 'uniform': 2, 'truncated_normal': 4,
                   'gumbel': 2, 'randint': 4}


@_backend_array
def get_prng(seed):
  """Returns a PRNG key (uint32[2]) for an integer seed."""
  if onp.shape(seed):
    raise ArgumentTypeError(f'PRNG seed must be a scalar; got shape {onp.shape(seed)}.')
  return jax.random.PRNGKey(seed)


bernoulli = _backend_array(jax.random.bernoulli)
categorical = _backend_array(jax.random.categorical)
fold_in = _backend_array(jax.random.fold_in)
gumbel = _backend_array(jax.random.gumbel, onp.float32)
normal = _backend_array(jax.random.normal, onp.float32)
permutation = _backend_array(jax.random.permutation)
randint = _backend_array(jax.random.randint, onp.int32)
split = _backend_array(jax.random.split)
truncated_normal = _backend_array(jax.random.truncated_normal, onp.float32)
uniform = _backend_array(jax.random.uniform, onp.float32)
