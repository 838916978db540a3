"""Cotangents for custom VJPs: zeros, sums and casts that respect JAX's rules.

JAX wants a cotangent of each primal's dtype, and `float0` zeros for integer
(and PRNG-key) primals; these helpers build and combine such cotangents.
`None` and `float0` arrays count as zero.
"""

import jax
import numpy as np

from retrax.fastmath import numpy as jnp
from retrax.layers.stacked import StackedLayers


def is_int_like(x):
  """True for arrays whose cotangent is `float0` (integer, bool, key dtypes)."""
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return False
  return not jnp.issubdtype(dtype, jnp.inexact)


def float0_zeros(x):
  """The `float0` zero cotangent of an integer-like primal `x`."""
  return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def zero_cotangent(tree):
  """Zero cotangents for a tree of primal values (float0 for integer leaves)."""
  def zero(x):
    x = x if hasattr(x, 'dtype') else jnp.asarray(x)
    if is_int_like(x):
      return float0_zeros(x)
    return jnp.zeros_like(x)
  return jax.tree_util.tree_map(zero, tree)


def is_no_grad(x):
  """True for a cotangent that stands for zero (None or float0)."""
  return x is None or getattr(x, 'dtype', None) == jax.dtypes.float0


def add_cotangents(x, y):
  """Adds two cotangents; `None` and float0 arrays count as zero."""
  if is_no_grad(x):
    return y
  if is_no_grad(y):
    return x
  return x + y


def cotangent_like(ct, primal):
  """Casts a cotangent to the primal's dtype, or float0 for integer primals."""
  if is_int_like(primal):
    return float0_zeros(primal)
  dtype = jax.dtypes.canonicalize_dtype(primal.dtype)
  if ct is None or is_no_grad(ct):
    return jnp.zeros(np.shape(primal), dtype)
  ct = jnp.asarray(ct)
  return ct.astype(dtype) if ct.dtype != dtype else ct


def match_structure(ct, primal):
  """Gives the cotangent tree `ct` the container types and dtypes of `primal`."""
  if isinstance(primal, StackedLayers):
    if not isinstance(ct, StackedLayers) or ct.n != primal.n:
      ct = StackedLayers(_stacked_groups(ct, primal), primal.n)
    return StackedLayers(match_structure(ct.groups, primal.groups), primal.n)
  if isinstance(primal, (list, tuple)):
    if not isinstance(ct, (list, tuple)) or len(ct) != len(primal):
      raise ValueError(
          f'Cotangent structure {jax.tree_util.tree_structure(ct)} does not '
          f'match the primal structure {jax.tree_util.tree_structure(primal)}.')
    return type(primal)(match_structure(c, p) for c, p in zip(ct, primal))
  if isinstance(primal, dict):
    return {k: match_structure(ct[k], v) for k, v in primal.items()}
  if primal is None:
    return None
  return cotangent_like(ct, primal)


def _stacked_groups(ct, primal):
  """A per-layer cotangent tuple stacked like the `StackedLayers` primal."""
  if not isinstance(ct, (list, tuple)) or len(ct) != primal.n:
    raise ValueError(
        f'Cotangent structure {jax.tree_util.tree_structure(ct)} does not '
        f'match {primal.n} stacked layers.')
  p = primal.period
  return tuple(jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *ct[j::p])
               for j in range(p))
