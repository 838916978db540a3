"""Stack operations: layers that copy, reorder, combine or split stack items.

`Select` is the general one (`Dup`, `Swap`, `Drop` are special cases); the
arithmetic ones (`Add`, `Multiply`, `Gate`, ...) take their operands from the
top of the stack. All are weightless; `retrax.layers.combinators` re-exports
them under Trax's names.
"""

from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.fastmath import with_rank
from retrax.layers import base
from retrax.layers.base import Fn
from retrax.validation import ArgumentValueError


def Select(indices, n_in=None, name=None):
  """Copies, reorders or drops stack items: takes `n_in` items, pushes `items[indices]`.

  `n_in` defaults to `max(indices) + 1`.
  """
  if not indices:
    if n_in is None:
      raise ArgumentValueError('Select([]) needs an explicit n_in (items to drop).')
  elif n_in is None:
    n_in = max(indices) + 1
  if any(i < 0 or i >= n_in for i in indices):
    raise ArgumentValueError(f'Select indices {indices} must lie in [0, n_in={n_in}).')
  if name is None:
    name = f'Select{indices}'.replace(' ', '')
  indices = tuple(indices)

  def select(xs):
    if not isinstance(xs, (tuple, list)):
      xs = (xs,)
    selected = tuple(xs[i] for i in indices)
    return selected[0] if len(selected) == 1 else selected
  return base.PureLayer(select, n_in=n_in, n_out=len(indices), name=name)


def Drop():
  """Drops the top stack item."""
  return Fn('Drop', lambda x: (), n_out=0)


def Dup():
  """Duplicates the top stack item."""
  return Fn('Dup', lambda x: (x, x), n_out=2)


def Swap():
  """Swaps the top two stack items."""
  return Fn('Swap', lambda x0, x1: (x1, x0), n_out=2)


def _same_rank(*xs):
  """`xs` with leading axes added up to a common rank (NumPy broadcasting)."""
  ndim = max(jnp.ndim(x) for x in xs)
  return tuple(with_rank(x, ndim) for x in xs)


def _add(x0, x1):
  x0, x1 = _same_rank(x0, x1)
  return x0 + x1


def _subtract_top(x0, x1):
  x0, x1 = _same_rank(x0, x1)
  return x1 - x0


def _multiply(x0, x1):
  x0, x1 = _same_rank(x0, x1)
  return x0 * x1


def _gate(m, g, c):
  m, g, c = _same_rank(m, g, c)
  return g * m + (1.0 - g) * c


def Add():
  """Adds the top two items (broadcasting as NumPy does)."""
  return Fn('Add', _add)


def SubtractTop():
  """Subtracts the top item from the second: x1 - x0."""
  return Fn('SubtractTop', _subtract_top)


def Multiply():
  """Multiplies the top two items."""
  return Fn('Multiply', _multiply)


def Gate():
  """Highway gate on (memory, gate, candidate): `g * m + (1 - g) * c`."""
  return Fn('Gate', _gate)


class Concatenate(base.Layer):
  """Concatenates `n_items` tensors along `axis`."""

  def __init__(self, n_items=2, axis=-1):
    name = 'Concatenate' if axis == -1 else f'Concatenate_axis{axis}'
    super().__init__(n_in=n_items, name=name)
    self._axis = axis

  def forward(self, xs):
    return jnp.concatenate(xs, self._axis)


class Split(base.Layer):
  """Splits a tensor into `n_items` equal parts along `axis`."""

  def __init__(self, n_items=2, axis=-1):
    super().__init__(n_out=n_items)
    self._n_items = n_items
    self._axis = axis

  def forward(self, inputs):
    if inputs.shape[self._axis] % self._n_items:
      raise InputValueError(f'Split: axis {self._axis} of {inputs.shape} is not '
                            f'divisible by n_items={self._n_items}.')
    return tuple(jnp.split(inputs, self._n_items, self._axis))


def FlattenList():
  """Flattens nested lists/tuples on the top of the stack."""
  return Fn('FlattenList', lambda x: tuple(deep_flatten(x)))


def deep_flatten(items):
  """The items of nested lists/tuples, in order, as one flat list."""
  out = []
  for x in items:
    if isinstance(x, (list, tuple)):
      out.extend(deep_flatten(x))
    else:
      out.append(x)
  return out
