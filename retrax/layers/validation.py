"""Checks of constructor arguments (layers, models, optimizers, schedules).

Each check raises an `ArgumentError` naming the owner and the argument, what
was expected and what was got, and returns the value (a Python number for
numeric checks). Sizes accept Python and numpy integers, as Trax does;
booleans are refused where a number is expected.
"""

import math
import numbers


class ArgumentError(Exception):
  """A constructor argument of the wrong type or out of its range."""


class ArgumentTypeError(ArgumentError, TypeError):
  """An argument of the wrong type (e.g. `Dense('4')`)."""


class ArgumentValueError(ArgumentError, ValueError):
  """An argument of the right type but out of range (e.g. `n_layers=-1`)."""


def _is_int(value):
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_int(owner, name, value, minimum=None, allow_none=False):
  """`value` as an int (Python or numpy integer) >= `minimum`."""
  if value is None and allow_none:
    return None
  bound = '' if minimum is None else f' >= {minimum}'
  if not _is_int(value):
    raise ArgumentTypeError(f'{owner}: {name} must be an int{bound}; got '
                            f'{value!r} ({type(value).__name__}).')
  if minimum is not None and value < minimum:
    raise ArgumentValueError(f'{owner}: {name} must be an int{bound}; got '
                             f'{value!r}.')
  return int(value)


def check_real(owner, name, value, minimum=None, maximum=None,
               include_max=True, allow_none=False):
  """`value` as a finite float in `[minimum, maximum]` (or `[., maximum)`)."""
  if value is None and allow_none:
    return None
  lo = '-inf' if minimum is None else f'{minimum}'
  hi = 'inf' if maximum is None else f'{maximum}'
  span = f'[{lo}, {hi}{"]" if include_max and maximum is not None else ")"}'
  if not _is_real(value):
    try:  # A scalar array (numpy or jax) holding a real number.
      ok = getattr(value, 'shape', None) == () and value.dtype.kind in 'iuf'
    except AttributeError:
      ok = False
    if not ok:
      raise ArgumentTypeError(f'{owner}: {name} must be a real number in '
                              f'{span}; got {value!r} '
                              f'({type(value).__name__}).')
  x = float(value)
  too_high = maximum is not None and (x > maximum or (
      x == maximum and not include_max))
  if not math.isfinite(x) or (minimum is not None and x < minimum) or too_high:
    raise ArgumentValueError(f'{owner}: {name} must be a finite number in '
                             f'{span}; got {value!r}.')
  return x


def check_rate(owner, name, value):
  """A dropout rate: a real number in [0, 1)."""
  return check_real(owner, name, value, 0.0, 1.0, include_max=False)


def check_choice(owner, name, value, choices):
  """`value` must be one of `choices`."""
  if value not in choices:
    raise ArgumentValueError(f'{owner}: {name} must be one of '
                             f'{tuple(choices)}; got {value!r}.')
  return value
