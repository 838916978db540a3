"""Errors raised while reading or writing checkpoints."""


class CheckpointError(Exception):
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
