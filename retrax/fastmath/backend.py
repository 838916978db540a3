"""Backend selection: JAX (default) or plain NumPy for eager debugging.

`fastmath.numpy` dispatches each attribute to `jax.numpy` or `numpy` depending
on the current backend; `jit`, `grad` etc. always come from JAX, except that
under the NumPy backend `jit` is the identity so code runs eagerly.
"""

import contextlib
import enum
import warnings

import jax.numpy as jnp
import numpy as onp


class Backend(enum.Enum):
  JAX = 'jax'
  TFNP = 'tensorflow-numpy'
  NUMPY = 'numpy'


_backend = Backend.JAX


def _parse(name):
  if isinstance(name, Backend):
    name = name.value
  if name in (None, 'jax'):
    return Backend.JAX
  if name == 'numpy':
    return Backend.NUMPY
  if name == 'tensorflow-numpy':
    warnings.warn("retrax has no TensorFlow backend; 'tensorflow-numpy' runs "
                  'on JAX, which computes the same numbers.')
    return Backend.JAX
  raise ValueError(f"Unknown backend {name!r}; use 'jax' or 'numpy'.")


def set_backend(name):
  """Sets the global backend ('jax' or 'numpy')."""
  global _backend
  _backend = _parse(name)


@contextlib.contextmanager
def use_backend(name):
  """Context manager that switches the backend for the enclosed code."""
  global _backend
  old = _backend
  _backend = _parse(name)
  try:
    yield
  finally:
    _backend = old


def backend_name():
  return _backend.value


def is_backend(backend):
  return _backend == _parse(backend)


class _NumpyProxy:
  """Forwards attribute access to jax.numpy or numpy per the current backend."""

  def __getattr__(self, name):
    module = onp if _backend == Backend.NUMPY else jnp
    return getattr(module, name)

  def __dir__(self):
    return dir(jnp)


numpy = _NumpyProxy()


def backend(name='jax'):
  """Returns a dict-like namespace of the backend's numpy (Trax compatibility)."""
  return {'np': onp if _parse(name) == Backend.NUMPY else jnp}
