"""Size limits applied while reading checkpoints (gzip bombs, huge headers).

A `.pkl.gz` or `.npy.gz` file may decompress to at most `max_bytes()` bytes,
and no array in a checkpoint may claim more than that many bytes. The default
is `DEFAULT_MAX_BYTES` (16 GiB); set the environment variable
`RETRAX_CHECKPOINT_MAX_BYTES` (an integer number of bytes) or pass
`max_bytes=` to the readers to change it. Going over the limit raises
`CheckpointLimitError` before the memory is allocated: array data is read in
chunks as it arrives, so a header that claims more data than the file holds
costs no more memory than the data that is really there.
"""

import gzip
import os
import zlib

from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointLimitError
from retrax.errors import UserInputError

DEFAULT_MAX_BYTES = 16 << 30
ENV_VAR = 'RETRAX_CHECKPOINT_MAX_BYTES'
_CHUNK = 1 << 22


def max_bytes(override=None):
  """The byte limit in force: `override`, else $RETRAX_CHECKPOINT_MAX_BYTES,
  else `DEFAULT_MAX_BYTES`."""
  if override is not None:
    value, where = override, 'max_bytes'
  else:
    raw = os.environ.get(ENV_VAR)
    if raw is None or not raw.strip():
      return DEFAULT_MAX_BYTES
    try:
      value = int(raw.strip())
    except ValueError:
      value = None
    where = f'${ENV_VAR}'
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise UserInputError(f'{where} must be a positive integer number of bytes; '
                         f'got {value if override is not None else raw!r}.')
  return value


def too_big(path, what, limit):
  """The `CheckpointLimitError` saying that `what` exceeds `limit`."""
  return CheckpointLimitError(
      f'{path}: {what} exceeds the checkpoint size limit of {limit} bytes '
      f'(raise it with ${ENV_VAR} or max_bytes=).')


def read_exact(stream, n_bytes, path, what):
  """Reads exactly `n_bytes` in chunks (memory grows only with real data)."""
  parts, got = [], 0
  while got < n_bytes:
    chunk = stream.read(min(_CHUNK, n_bytes - got))
    if not chunk:
      raise CheckpointCorruptedError(
          f'{path}: {what} is cut short ({got} of {n_bytes} bytes); the file '
          f'is truncated or corrupted.')
    parts.append(chunk)
    got += len(chunk)
  return b''.join(parts)


def read_gzip(path, limit):
  """The whole decompressed content of a gzip file, its CRC and length checked.

  Raises:
    CheckpointLimitError: it decompresses to more than `limit` bytes.
    CheckpointCorruptedError: a damaged stream, CRC or length trailer.
  """
  parts, total = [], 0
  try:
    with gzip.open(path, 'rb') as gz:
      while True:
        chunk = gz.read(_CHUNK)
        if not chunk:  # End of stream: gzip has checked the CRC and length.
          break
        total += len(chunk)
        if total > limit:
          raise too_big(path, 'the decompressed content', limit)
        parts.append(chunk)
  except (EOFError, zlib.error, gzip.BadGzipFile) as e:
    raise CheckpointCorruptedError(
        f'{path}: gzip stream is truncated or corrupted ({e}).') from None
  return b''.join(parts)
