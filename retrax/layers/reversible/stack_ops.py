"""Reversible stack operations: select, swap, concatenate, reshape, print.

Each reorders or reshapes stack items without weights, and its `reverse`
undoes that exactly (see `retrax.layers.reversible`).
"""

from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers.reversible.layer import check_items
from retrax.layers.reversible.layer import ReversibleLayer
from retrax.layers.stack import make_tuple
from retrax.validation import ArgumentValueError


class ReversibleSelect(ReversibleLayer):
  """Reversible `Select`: reorders (and may copy) stack items; every input must be kept.

  `ReversibleSelect([1, 0])` swaps the top two items; its reverse picks each
  input back from its (first) position in `indices`.
  """

  def __init__(self, indices, n_in=None, name=None):
    indices = list(indices)
    if not indices:
      raise ArgumentValueError('ReversibleSelect needs at least one index; got [].')
    if n_in is None:
      n_in = max(indices) + 1
    if max(indices) >= n_in or min(indices) < 0:
      raise ArgumentValueError(f'ReversibleSelect indices {indices} must lie in '
                               f'[0, n_in={n_in}).')
    if name is None:
      name = f'ReversibleSelect{indices}'.replace(' ', '')
    super().__init__(n_in=n_in, n_out=len(indices), name=name)
    self._indices = indices
    missing = [i for i in range(n_in) if i not in indices]
    if missing:
      raise ArgumentValueError(
          f'To be reversible, all inputs to Select must be in indices; '
          f'indices {indices} miss input(s) {missing} of n_in={n_in}.')
    self._reverse_indices = [indices.index(i) for i in range(n_in)]

  def forward(self, inputs):
    check_items(self, inputs, 'inputs', 'pure_fn')
    inputs = make_tuple(inputs)
    selected = tuple(inputs[i] for i in self._indices)
    return selected[0] if len(selected) == 1 else selected

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    output = make_tuple(output)
    if len(output) != self.n_out:
      raise InputValueError(f'{self.name}.reverse expects {self.n_out} outputs; '
                            f'got {len(output)}.')
    selected = tuple(output[i] for i in self._reverse_indices)
    return selected[0] if len(selected) == 1 else selected


def ReversibleSwap():
  """Swaps the top two stack items; its own reverse: `(x1, x2) -> (x2, x1)`."""
  return ReversibleSelect([1, 0], name='ReversibleSwap')


class ReversibleConcatenatePair(ReversibleLayer):
  """Maps `(x, y) -> (xy, xy)` with `xy` their concatenation on the last axis.

  The reverse splits the first output in two equal halves, so `x` and `y`
  must have the same last dimension.
  """

  def __init__(self):
    super().__init__(n_in=2, n_out=2)

  def forward(self, inputs):
    check_items(self, inputs, 'inputs', 'pure_fn')
    x, y = inputs
    if x.shape[-1] != y.shape[-1]:
      raise InputValueError(f'{self.name} needs equal last dimensions to be '
                            f'reversible; got shapes {x.shape} and {y.shape}.')
    pair = jnp.concatenate((x, y), axis=-1)
    return pair, pair

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    pair, _ = output
    x, y = jnp.split(pair, 2, axis=-1)
    return x, y


class ReversibleReshape(ReversibleLayer):
  """Reshapes `n_in` items' leading axes from `shape1` to `shape2` (reverse: back).

  Each input's leading `len(shape1)` axes are replaced by `shape2`; the
  trailing axes are kept.
  """

  def __init__(self, shape1, shape2, n_in=1):
    name = f'ReversibleReshape_{shape1}_{shape2}'
    super().__init__(n_in=n_in, n_out=n_in, name=name)
    self._shape1 = list(shape1)
    self._shape2 = list(shape2)

  @staticmethod
  def _reshape(xs, from_shape, to_shape):
    res = []
    for x in make_tuple(xs):
      lead = list(x.shape)[:len(from_shape)]
      if any(f != -1 and f != d for f, d in zip(from_shape, lead)):
        raise InputValueError(f'ReversibleReshape expects leading axes {from_shape};'
                              f' got an input of shape {tuple(x.shape)}.')
      res.append(jnp.reshape(x, to_shape + list(x.shape)[len(from_shape):]))
    return res[0] if len(res) == 1 else tuple(res)

  def forward(self, inputs):
    check_items(self, inputs, 'inputs', 'pure_fn')
    return self._reshape(inputs, self._shape1, self._shape2)

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    return self._reshape(output, self._shape2, self._shape1)


class ReversiblePrintShape(ReversibleLayer):
  """Prints the shapes and dtypes of its `n_in` inputs and returns them unchanged."""

  def __init__(self, n_in=1, msg=''):
    super().__init__(n_in=n_in, n_out=n_in)
    self._msg = msg

  def forward(self, xs):
    check_items(self, xs, 'inputs', 'pure_fn')
    shapes = ', '.join(f'{x.shape}[{x.dtype}]' for x in make_tuple(xs))
    print(f'PrintShape: {self._msg}: [{shapes}]')
    return xs

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    return output
