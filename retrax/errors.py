"""`retrax.Error`, the base of retrax's errors; the error types for unusable user
input and for arrays that do not fit; helpers that keep errors to one line.

The families under `Error` (each keeps the builtin its case has always been):

- `UserInputError` (`ValueError`): a config key, file, path or environment
  value the user supplied (`ConfigError`, `ModelFileError`, `MeshError`...).
- `validation.ArgumentError` (`ArgumentTypeError`, `ArgumentValueError`): a
  constructor or function argument of the wrong type or out of range.
- `InputError` (`InputTypeError`, `InputValueError`): arrays, examples,
  batches or a state given to a layer or function at call time whose shape,
  dtype or structure does not fit it.
- `checkpoints.errors.CheckpointError`, `supervised.batch_checks.
  TrainingError` (`BadBatchError`, `NonFiniteLossError`...).
- `layers.LayerError`: names the layer in which an exception happened and
  wraps it (`__cause__`); deliberate only if what it wraps is (`deliberate`).

Outside this tree on purpose: `supervised.interrupts.TrainingStopped` derives
from `BaseException` (as `KeyboardInterrupt` and `SystemExit` do). It is not
an error but the signal that SIGINT/SIGTERM stopped training after saving the
last step: `except Exception` and `except retrax.Error` in user code must not
swallow it, or a scheduler's stop would leave the job running.
"""

import json


class Error(Exception):
  """Base of every error retrax raises on purpose: `except retrax.Error` catches them.

  Each subclass also derives from the builtin its case has always been
  (`ValueError`, `TypeError`, `ImportError`, ...), so code written for Trax
  that catches those keeps working.
  """

  # True for a class that wraps any exception (its `__cause__`) to say where
  # it happened: see `deliberate`.
  wraps_cause = False


class UserInputError(Error, ValueError):
  """A value the user supplied (argument, config key, file, environment) cannot be used.

  The `retrax` command prints these as one line and exits with code 2; every
  other exception is a bug and keeps its traceback. A `ValueError`, so code
  that catches `ValueError` keeps working.
  """


class MissingPackageError(UserInputError, ImportError):
  """An optional package that a feature needs is not installed.

  The message names the feature and the `pip install` that adds the package.
  Also an `ImportError`, so code that catches that keeps working.
  """


class InputError(Error):
  """Arrays (or examples, a batch, a state) given at call time do not fit
  what receives them; the message names the layer or function, what it
  expects and what it got."""


class InputTypeError(InputError, TypeError):
  """An input of the wrong dtype or kind (floats where token ids are
  expected, a dict where a tuple of arrays is)."""


class InputValueError(InputError, ValueError):
  """An input of the right kind but the wrong shape, length, structure or
  value range (a length beyond `max_len`, a feature size the weights do not
  have)."""


def deliberate(error):
  """Whether `error` is a retrax error raised on purpose, not a bug.

  A `retrax.Error` is, except one that only wraps another exception to
  name where it happened (`wraps_cause`, e.g. `LayerError`): that one is as
  deliberate as its `__cause__`.
  """
  while isinstance(error, Error) and error.wraps_cause:
    error = error.__cause__
  return isinstance(error, Error)


def missing_package(package, feature, extra):
  """The `MissingPackageError` of `feature` without `package` (`retrax[extra]`)."""
  return MissingPackageError(
      f'{feature} needs the {package} package, which is not installed: '
      f'pip install "retrax[{extra}]" (or pip install {package}).')


def one_line(text, limit=None):
  """`str(text)` (an exception's message, say) with every run of white space
  one space, cut to `limit` characters: for quoting it inside a one-line
  error."""
  line = ' '.join(str(text).split())
  return line if limit is None else line[:limit]


def read_json(path, error, hint):
  """The JSON document in file `path`.

  Content that is not UTF-8 JSON (truncated, altered, nested too deeply)
  raises `error` (an exception class) with one line naming `path`, what was
  wrong and then `hint` (what the file is for and what to do).
  """
  try:
    with open(path, 'rb') as f:
      return json.loads(f.read().decode('utf-8'))
  except (ValueError, RecursionError) as e:  # Bad UTF-8, JSON, huge ints.
    raise error(f'{path} is unreadable JSON ({one_line(e, 200)}); {hint}'
               ) from None
