"""`retrax.Error`, the base of retrax's errors; the error type for unusable user
input (shared by the CLI and the library); helpers that keep errors to one line."""

import json


class Error(Exception):
  """Base of every error retrax raises on purpose: `except retrax.Error` catches them.

  Each subclass also derives from the builtin its case has always been
  (`ValueError`, `TypeError`, `ImportError`, ...), so code written for Trax
  that catches those keeps working.
  """


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
