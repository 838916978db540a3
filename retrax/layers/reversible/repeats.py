"""Repeated blocks of layers: finding them, and stacking their per-layer trees for `lax.scan`.

A deep model is mostly one block repeated (ReformerLM: attention, swap,
feed-forward, swap, `n_layers` times). Run as a Python loop, each repeat is
traced and compiled again; run as one `lax.scan` over the blocks' stacked
weights, the block is compiled once. `repeat_period` finds the block: the
shortest period whose copies are the same layers up to their weights, state
and key (`same_layer`).
"""

import functools
import types

import jax
import numpy as np

from retrax.layers.base import Layer
from retrax.layers.stacked import stack_groups as stack_groups
from retrax.layers.stacked import stackable as stackable
from retrax.layers.stacked import tree_spec as tree_spec
from retrax.layers.stacked import unstack_groups as unstack_groups

def same_layer(a, b):
  """True if layers `a` and `b` compute the same function of (inputs, weights, state, rng).

  Compares classes, configuration attributes and sublayers recursively;
  closures by code and captured values. Anything it cannot compare counts as
  different.
  """
  return _same(a, b, set())


def _same(a, b, seen):
  if a is b:
    return True
  if type(a) is not type(b):
    return False
  key = (id(a), id(b))
  if key in seen:  # A cycle (a layer linked to another): assume equal here.
    return True
  if isinstance(a, Layer):
    seen.add(key)
    da, db = vars(a), vars(b)
    # Layer's own bookkeeping always; the class's declared caches (a class
    # extends its parent's set, see `Layer.runtime_attributes`).
    names = ((set(da) | set(db)) - Layer.runtime_attributes -
             set(type(a).runtime_attributes))
    return all(_same(da.get(k), db.get(k), seen) for k in names)
  if isinstance(a, (tuple, list)):
    return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b))
  if isinstance(a, dict):
    return a.keys() == b.keys() and all(_same(a[k], b[k], seen) for k in a)
  if isinstance(a, types.FunctionType):
    seen.add(key)
    return (a.__code__ is b.__code__ and
            _same(a.__defaults__, b.__defaults__, seen) and
            _same(a.__kwdefaults__, b.__kwdefaults__, seen) and
            _same(_cells(a), _cells(b), seen))
  if isinstance(a, functools.partial):
    return (_same(a.func, b.func, seen) and _same(a.args, b.args, seen) and
            _same(a.keywords, b.keywords, seen))
  if isinstance(a, (np.ndarray, jax.Array)):
    return (a.shape == b.shape and a.dtype == b.dtype and
            not isinstance(a, jax.core.Tracer) and
            bool(np.array_equal(np.asarray(a), np.asarray(b))))
  if isinstance(a, (bool, int, float, complex, str, bytes, type(None),
                    np.generic, np.dtype, type)):
    return a == b
  return False


def _cells(fn):
  cells = []
  for cell in fn.__closure__ or ():
    try:
      cells.append(cell.cell_contents)
    except ValueError:  # An empty cell.
      cells.append(None)
  return tuple(cells)


def repeat_period(layers):
  """The shortest `p` such that `layers` is >= 2 copies of `layers[:p]`, or None."""
  n = len(layers)
  for p in range(1, n // 2 + 1):
    if n % p == 0 and all(same_layer(layers[i % p], layers[i])
                          for i in range(p, n)):
      return p
  return None
