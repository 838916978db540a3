"""Shape and dtype signatures: `ShapeDtype` and `signature()`."""

import numpy as np

from retrax.validation import ArgumentTypeError


class ShapeDtype:
  """A shape and a dtype: the abstract description of one array.

  `ShapeDtype((2, 3), np.int32)` describes any int32 array of shape (2, 3). A
  layer's input signature is a `ShapeDtype` (one input) or a tuple of them.
  """

  __slots__ = ('shape', 'dtype', '_dtype_repr')

  def __init__(self, shape, dtype=np.float32):
    if isinstance(shape, list):
      shape = tuple(shape)
    if not isinstance(shape, tuple):
      raise ArgumentTypeError(f'shape must be a tuple or list; got: {shape!r}')
    self.shape = tuple(int(d) if d is not None else None for d in shape)
    self.dtype = np.dtype(dtype)
    # The repr spells the dtype as given, as Trax's does: a scalar type such
    # as the default `np.float32` shows as "<class 'numpy.float32'>".
    self._dtype_repr = str(dtype if isinstance(dtype, (type, str))
                           else self.dtype)

  def __eq__(self, other):
    return (isinstance(other, ShapeDtype) and self.shape == other.shape and
            self.dtype == other.dtype)

  def __ne__(self, other):
    return not self == other

  def __hash__(self):
    return hash((self.shape, self.dtype))

  def __repr__(self):
    return f'ShapeDtype{{shape:{self.shape}, dtype:{self._dtype_repr}}}'

  def __len__(self):
    """Returns 1: a signature of one item."""
    return 1

  def as_tuple(self):
    """`(shape, dtype)`."""
    return self.shape, self.dtype

  def replace(self, **kwargs):
    """Returns a copy with `shape` and/or `dtype` replaced."""
    return ShapeDtype(kwargs.pop('shape', self.shape),
                      kwargs.pop('dtype', self.dtype))

  def __getstate__(self):
    return {'shape': self.shape, 'dtype': self.dtype}

  def __setstate__(self, state):
    self.shape, self.dtype = tuple(state['shape']), np.dtype(state['dtype'])
    self._dtype_repr = str(self.dtype)


def signature(obj):
  """Returns the `ShapeDtype` signature of an array or a (nested) tuple/list/dict of them."""
  if isinstance(obj, ShapeDtype):
    return obj
  if isinstance(obj, (list, tuple)):
    out = tuple(signature(x) for x in obj)
    return out if isinstance(obj, tuple) else list(out)
  if isinstance(obj, dict):
    return {k: signature(v) for k, v in obj.items()}
  if hasattr(obj, 'shape') and hasattr(obj, 'dtype'):
    return ShapeDtype(obj.shape, obj.dtype)
  # Python scalars and other objects (e.g. strings on the stack) keep their value.
  return obj


def splice_signatures(*sigs):
  """Flattens the top level of several signatures into one signature."""
  result: list = []
  for sig in sigs:
    if isinstance(sig, (list, tuple)):
      result.extend(sig)
    else:
      result.append(sig)
  return result[0] if len(result) == 1 else tuple(result)


def assert_shape_equals(array, shape):
  """Raises AssertionError unless `array.shape == shape` (also under `python -O`)."""
  if tuple(array.shape) != tuple(shape):
    raise AssertionError(
        f'Invalid shape {tuple(array.shape)}; expected {tuple(shape)}.')


def assert_same_shape(array1, array2):
  """Raises AssertionError unless the two arrays have the same shape."""
  assert_shape_equals(array1, array2.shape)
