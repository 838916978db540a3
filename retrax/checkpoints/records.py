"""Plain records standing in for the Trax classes that checkpoints pickle.

Trax pickles reference `trax.shapes.ShapeDtype` (input signatures) and, in the
legacy `Trainer` format, `trax.supervised.history.History`. The restricted
unpickler builds these records instead; they hold data only and run no code
from the file. `convert_shape_dtypes` turns them into `retrax.shapes.ShapeDtype`
(or any other factory) for the layer code.
"""

import numpy as np

from retrax.checkpoints.errors import CheckpointFormatError
from retrax.shapes import ShapeDtype


def _check_shape(shape):
  if isinstance(shape, list):
    shape = tuple(shape)
  if not isinstance(shape, tuple) or not all(
      d is None or (isinstance(d, (int, np.integer)) and not isinstance(d, bool))
      for d in shape):
    raise CheckpointFormatError(
        f'ShapeDtype.shape must be a tuple of ints/None; got {shape!r}.')
  return tuple(None if d is None else int(d) for d in shape)


class TraxShapeDtype:
  """Shape and dtype of one array, as recorded in a Trax `ShapeDtype`."""

  __slots__ = ('shape', 'dtype')

  def __init__(self, shape=(), dtype=np.float32):
    self.shape = _check_shape(shape)
    self.dtype = np.dtype(dtype)

  def __setstate__(self, state):
    # Trax's ShapeDtype has __slots__, so pickle hands `(None, slot_dict)`.
    if isinstance(state, tuple) and len(state) == 2 and state[0] is None:
      state = state[1]
    if not isinstance(state, dict) or set(state) != {'shape', 'dtype'}:
      raise CheckpointFormatError(
          f'ShapeDtype state must be a dict with keys shape and dtype; got '
          f'{state!r}.')
    self.shape = _check_shape(state['shape'])
    dtype = state['dtype']
    if not isinstance(dtype, np.dtype):
      raise CheckpointFormatError(
          f'ShapeDtype.dtype must be a numpy dtype; got {dtype!r}.')
    self.dtype = dtype

  def __eq__(self, other):
    return (hasattr(other, 'shape') and hasattr(other, 'dtype') and
            not hasattr(other, '__array__') and
            tuple(other.shape) == self.shape and
            np.dtype(other.dtype) == self.dtype)

  def __hash__(self):
    return hash((self.shape, self.dtype))

  def __repr__(self):
    return f'ShapeDtype{{shape:{self.shape}, dtype:{self.dtype}}}'

  def as_tuple(self):
    return self.shape, self.dtype


class TraxHistory:
  """The data of a legacy `trax.supervised.history.History`: `_values`."""

  def __init__(self, values=None):
    self._values = {} if values is None else values

  def __setstate__(self, state):
    if not isinstance(state, dict) or not isinstance(state.get('_values'),
                                                     dict):
      raise CheckpointFormatError(
          f'History state must be a dict holding a `_values` dict; got '
          f'{type(state).__name__}.')
    self._values = state['_values']

  @property
  def values(self):
    """The metrics, `{mode: {metric: [(step, value), ...]}}`."""
    return self._values

  @values.setter
  def values(self, values):
    self._values = values

  def to_dict(self):
    """Returns `{'_values': ...}`, the form Trax's `History.to_dict` gives."""
    return {'_values': self._values}


def is_shape_dtype(x):
  """True for a `ShapeDtype`-like record (not an array): has shape and dtype."""
  return (type(x).__name__ in ('ShapeDtype', 'TraxShapeDtype') and
          hasattr(x, 'shape') and hasattr(x, 'dtype') and
          not hasattr(x, '__array__'))


def convert_shape_dtypes(tree, factory=None):
  """Replaces every `ShapeDtype`-like leaf of `tree` by `factory(shape, dtype)`.

  Args:
    tree: a `TraxShapeDtype`, or nested tuples/lists/dicts holding them.
    factory: callable `(shape, dtype) -> record`; `retrax.shapes.ShapeDtype`
      when None.

  Returns:
    The tree with converted leaves; other leaves are kept as they are.
  """
  if factory is None:
    factory = ShapeDtype
  if is_shape_dtype(tree):
    return factory(tuple(tree.shape), tree.dtype)
  if isinstance(tree, (list, tuple)):
    items = [convert_shape_dtypes(x, factory) for x in tree]
    return items if isinstance(tree, list) else tuple(items)
  if isinstance(tree, dict):
    return {k: convert_shape_dtypes(v, factory) for k, v in tree.items()}
  return tree
