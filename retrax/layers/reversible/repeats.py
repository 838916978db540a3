"""Declared repeated blocks: the model builder says which layers repeat.

A deep model is mostly one block repeated (ReformerLM: attention, swap,
feed-forward, swap, `n_layers` times). Run as a Python loop, each repeat is
traced and compiled again; run as one `lax.scan` over the blocks' stacked
weights, the block is compiled once. Only the code that builds the blocks
knows that they compute the same function of their weights, so it declares
it (`ReversibleSerial(*layers, repeats=k)`); nothing is inferred from the
layers' attributes. `declared_period` checks what can be checked without
running them: the count divides, and every copy is made of the same layer
classes, names and stack arities, arranged the same way.
"""

from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError


def declared_period(layers, repeats):
  """The block length of `layers` declared as `repeats` copies of one block.

  None when there is nothing to scan: `repeats` None (not declared) or 1.

  Raises:
    ArgumentTypeError: `repeats` is not an int.
    ArgumentValueError: `repeats` is not positive or does not divide the
      number of layers, or a copy is not arranged like the first block.
  """
  if repeats is None:
    return None
  if isinstance(repeats, bool) or not isinstance(repeats, int):
    raise ArgumentTypeError(
        f'ReversibleSerial: repeats must be an int (how many copies of one '
        f'block the layers are); got {type(repeats).__name__} {repeats!r}.')
  n = len(layers)
  if repeats < 1 or n % repeats:
    raise ArgumentValueError(
        f'ReversibleSerial: repeats={repeats} must be a positive divisor of '
        f'the number of layers ({n}).')
  if repeats == 1:
    return None
  period = n // repeats
  for i in range(period, n):
    if _arrangement(layers[i]) != _arrangement(layers[i % period]):
      raise ArgumentValueError(
          f'ReversibleSerial: repeats={repeats} declares layer {i} '
          f'({layers[i].name}) a copy of layer {i % period} '
          f'({layers[i % period].name}), but they are built differently.')
  return period


def _arrangement(layer):
  """The classes, names, arities and nesting of `layer` and everything below it."""
  return tuple((type(l), l.name, l.n_in, l.n_out, len(l.sublayers))
               for l in layer.walk())
