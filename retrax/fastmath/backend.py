"""Backend selection: JAX (default) or plain NumPy for eager debugging.

`fastmath.numpy` dispatches each attribute to `jax.numpy` or `numpy` depending
on the current backend. Under the NumPy backend, `jit` is the identity,
`abstract_eval` runs the function on zeros, random draws come back as NumPy
arrays and `logsumexp`/`expit`/`erf`/`stop_gradient` are NumPy functions, so
layers run eagerly on `numpy.ndarray`s. Trax's `'tensorflow-numpy'` backend
keeps its name (for `backend_name()` / `is_backend`) but computes with JAX
with 64-bit types enabled (TF-numpy, like NumPy, keeps float64 inputs
float64); random draws still default to 32 bits there, so a key gives the
same numbers as under 'jax'.
"""

import contextlib
import enum
import warnings

import jax
import jax.numpy as jnp
import numpy as onp

from retrax.configurable import bound_arguments
from retrax.configurable import configurable
from retrax.validation import ArgumentValueError


class Backend(enum.Enum):
  JAX = 'jax'
  TFNP = 'tensorflow-numpy'
  NUMPY = 'numpy'


_default = None    # set by set_backend
_override = None   # set by use_backend
_warned_tfnp = False


def _parse(name):
  """Returns the `Backend` for a name or enum; raises a clear error if unknown."""
  if isinstance(name, Backend):
    return name
  for b in Backend:
    if b.value == name:
      return b
  raise ArgumentValueError(f'No backend with name {name!r}; use one of '
                           f'{[b.value for b in Backend]}.')


def _warn_tfnp(b):
  global _warned_tfnp
  if b == Backend.TFNP and not _warned_tfnp:
    _warned_tfnp = True
    warnings.warn("retrax has no TensorFlow backend: 'tensorflow-numpy' "
                  'computes with JAX, which gives the same numbers.',
                  stacklevel=2)


_x64_before_tfnp = None  # jax_enable_x64 before set_backend('tensorflow-numpy')


def _set_default_x64(b):
  """Enables 64-bit JAX types while TFNP is the default; restores them after."""
  global _x64_before_tfnp
  if b == Backend.TFNP and _x64_before_tfnp is None:
    # Options are instance attributes JAX's Config sets at runtime (and
    # `config.read` refuses options that have a context manager).
    _x64_before_tfnp = bool(jax.config.jax_enable_x64)  # type: ignore[attr-defined]
    jax.config.update('jax_enable_x64', True)
  elif b != Backend.TFNP and _x64_before_tfnp is not None:
    jax.config.update('jax_enable_x64', _x64_before_tfnp)
    _x64_before_tfnp = None


def set_backend(name):
  """Sets the default backend ('jax', 'numpy' or 'tensorflow-numpy'); None resets it."""
  global _default
  _default = None if name is None else _parse(name)
  _set_default_x64(_default)
  _warn_tfnp(_default)


@contextlib.contextmanager
def use_backend(name):
  """Context manager that switches the backend for the enclosed code."""
  global _override
  b = _parse(name)
  _warn_tfnp(b)
  old = _override
  _override = b
  try:
    if b == Backend.TFNP:
      with jax.enable_x64(True):
        yield
    else:
      yield
  finally:
    _override = old


def current():
  """The `Backend` in use now (override, else default, else gin's
  `backend.name` once Trax's gin names are registered, else JAX)."""
  b = _override or _default
  if b is None:
    name = bound_arguments(backend).get('name')
    b = None if name is None else _parse(name)
  return b or Backend.JAX


def is_numpy():
  """True when computing with plain NumPy."""
  return current() == Backend.NUMPY


def backend_name():
  """Name of the backend in use: 'jax', 'numpy' or 'tensorflow-numpy'."""
  return current().value


def is_backend(backend_):
  """True if `backend_` (a `Backend` or its name) is the backend in use."""
  return current() == _parse(backend_)


@configurable('trax.fastmath.ops')
def backend(name=None):
  """Trax's backend dict (`'np'` and `'name'`) of the backend in use.

  As in Trax, `name` only matters when no backend was set or overridden;
  None means the backend in use (gin's `backend.name`, else JAX). Trax's gin
  configs bind `backend.name` to choose the default backend.
  """
  b = current() if (_override or _default or name is None) else _parse(name)
  return {'np': onp if b == Backend.NUMPY else jnp, 'name': b.value}


class _NumpyProxy:
  """Forwards attribute access to jax.numpy or numpy per the current backend.

  Names NumPy lacks (e.g. `bfloat16`) come from jax.numpy under both.
  """

  def __getattr__(self, name):
    if is_numpy() and hasattr(onp, name):
      return getattr(onp, name)
    return getattr(jnp, name)

  def __dir__(self):
    return dir(jnp)


numpy = _NumpyProxy()
"""`jax.numpy`, or `numpy` under `use_backend('numpy')` (Trax's `fastmath.numpy`)."""
