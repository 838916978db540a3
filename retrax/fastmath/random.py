"""Explicit PRNG keys (raw uint32[2] keys, as Trax used) and random draws.

Draws use `jax.random`, so a key gives the same numbers under every backend;
under the NumPy backend they come back as `numpy.ndarray`s.
"""

import functools

import jax
import numpy as onp

from retrax.fastmath.backend import is_numpy as _is_numpy


def _backend_array(fn):
  """Wraps a jax.random function to return NumPy arrays under the NumPy backend."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    out = fn(*args, **kwargs)
    return onp.asarray(out) if _is_numpy() else out
  return wrapped


@_backend_array
def get_prng(seed):
  """Returns a PRNG key (uint32[2]) for an integer seed."""
  if onp.shape(seed):
    raise TypeError(f'PRNG seed must be a scalar; got shape {onp.shape(seed)}.')
  return jax.random.PRNGKey(seed)


bernoulli = _backend_array(jax.random.bernoulli)
categorical = _backend_array(jax.random.categorical)
fold_in = _backend_array(jax.random.fold_in)
gumbel = _backend_array(jax.random.gumbel)
normal = _backend_array(jax.random.normal)
permutation = _backend_array(jax.random.permutation)
randint = _backend_array(jax.random.randint)
split = _backend_array(jax.random.split)
truncated_normal = _backend_array(jax.random.truncated_normal)
uniform = _backend_array(jax.random.uniform)
