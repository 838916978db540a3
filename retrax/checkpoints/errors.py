"""Errors raised while reading or writing checkpoints."""

import contextlib

from retrax.errors import Error
from retrax.errors import one_line


class CheckpointError(Error):
  """Base class of every checkpoint error."""


class UnsafeCheckpointError(CheckpointError):
  """A pickle asks for a global that the restricted unpickler does not admit.

  Raised, for example, by a file whose pickle would call `os.system`:

    >>> read_trax_checkpoint('evil.pkl.gz')
    UnsafeCheckpointError: refused global 'posix.system' ...

  The refused global is never imported or called. Trax checkpoints only need
  numpy arrays, builtin containers and Trax's `ShapeDtype`/`History` records;
  anything else means the file was not written by Trax (or was tampered with).
  """


class CheckpointFormatError(CheckpointError, ValueError):
  """The file is readable but is not a checkpoint of the expected layout."""


class CheckpointCorruptedError(CheckpointFormatError):
  """The file is truncated or its bytes do not match the recorded checksum."""


class TreeStructureError(CheckpointError, ValueError):
  """Flat checkpoint leaves do not fit a weights/state tree (count or shape)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
  """A checkpoint file (or a sidecar its pickle needs) does not exist."""


class CheckpointLimitError(CheckpointFormatError):
  """A file or array is larger than the reading limit (see `limits`)."""


# What Python raises on a malformed file's content (a wrong type where a list
# should be, an unhashable key, a 5,000-digit number, bad base64, a cycle).
_MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError,
              OverflowError, RecursionError)


@contextlib.contextmanager
def malformed_is_format_error(path):
  """Turns what malformed content makes Python raise while reading `path`
  into one `CheckpointFormatError` naming it (checkpoint errors pass)."""
  try:
    yield
  except CheckpointError:
    raise
  except _MALFORMED as e:
    detail = one_line(e, 200)
    raise CheckpointFormatError(
        f'{path}: malformed checkpoint content ({type(e).__name__}: '
        f'{detail}); the file was not written by retrax or Trax, or was '
        'altered.') from e
