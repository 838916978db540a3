"""Checks of constructor arguments (layers, models, optimizers, schedules).

Each check raises an `ArgumentError` naming the owner and the argument, what
was expected and what was got, and returns the value (a Python number for
numeric checks). Sizes accept Python and numpy integers, as Trax does;
booleans are refused where a number is expected.
"""

import math
import numbers

import jax
from jax.experimental import checkify

from retrax.errors import Error
from retrax.errors import InputValueError


class ArgumentError(Error):
  """A constructor argument of the wrong type or out of its range."""


class ArgumentTypeError(ArgumentError, TypeError):
  """An argument of the wrong type (e.g. `Dense('4')`)."""


class ArgumentValueError(ArgumentError, ValueError):
  """An argument of the right type but out of range (e.g. `n_layers=-1`)."""


def _is_int(value):
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


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


def is_real_scalar(value):
  """A real number: Python/numpy int or float (not bool), or a 0-d array of one."""
  if isinstance(value, numbers.Real):
    return not isinstance(value, bool)
  dtype = getattr(value, 'dtype', None)
  return (getattr(value, 'shape', None) == () and dtype is not None and
          getattr(dtype, 'kind', None) in ('i', 'u', 'f'))


def check_real(owner, name, value, minimum=None, maximum=None,
               include_min=True, include_max=True, allow_none=False):
  """`value` as a finite float in the interval `[minimum, maximum]`.

  `include_min`/`include_max` False make that end open; None is unbounded.
  """
  if value is None and allow_none:
    return None
  span = ('[' if include_min and minimum is not None else '(') + (
      '-inf' if minimum is None else f'{minimum:g}') + ', ' + (
          'inf' if maximum is None else f'{maximum:g}') + (
              ']' if include_max and maximum is not None else ')')
  if not is_real_scalar(value):
    raise ArgumentTypeError(f'{owner}: {name} must be a real number in '
                            f'{span}; got {value!r} ({type(value).__name__}).')
  x = float(value)
  low = minimum is not None and (x < minimum or (x == minimum and
                                                 not include_min))
  high = maximum is not None and (x > maximum or (x == maximum and
                                                  not include_max))
  if not math.isfinite(x) or low or high:
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


def check_multiple(owner, name, value, of_name, of):
  """`value` must be a multiple of a positive `of` (e.g. d_model of n_heads)."""
  if of < 1 or value % of:
    raise ArgumentValueError(f'{owner}: {name} ({value}) must be a positive '
                             f'multiple of {of_name} ({of}).')
  return value


def check_predict_position(what, index, n, max_len, hint=''):
  """Predict mode: positions `index .. index + n - 1` must be < `max_len`.

  With a concrete `index` (eager calls) raises a ValueError. Under `jax.jit`
  the index is traced and nothing can raise; this records a
  `checkify.debug_check`, so a step run through `jax.experimental.checkify.
  checkify(step, errors=checkify.user_checks)` returns the error. Without
  checkify the calling layer clamps (see its docstring).
  """
  if not isinstance(index, jax.core.Tracer):
    if int(index) + n > max_len:
      raise InputValueError(f'{what} in predict mode is at position {int(index)} '
                            f'and got {n} more, beyond the {max_len} positions it '
                            f'holds{hint}.')
    return
  checkify.debug_check(
      index + n <= max_len,
      f'{what} in predict mode is at position {{index}} and got {n} more, '
      f'beyond the {max_len} positions it holds{hint}.', index=index)


def check_sizes(owner, **sizes):
  """Each keyword is an int >= 1 (None, an optional size left out, passes)."""
  for name, value in sizes.items():
    check_int(owner, name, value, 1, allow_none=True)


def check_counts(owner, **counts):
  """Each keyword is an int >= 0 (e.g. a number of layers)."""
  for name, value in counts.items():
    check_int(owner, name, value, 0)


def check_rates(owner, **rates):
  """Each keyword is a dropout rate in [0, 1) (None passes)."""
  for name, value in rates.items():
    if value is not None:
      check_rate(owner, name, value)
