"""Trax's array files: gzip of consecutive `np.save` records (`*.npy.gz`).

`Loop.save_checkpoint` writes weights and optimizer slots this way, one
record per leaf, with bfloat16 bit-cast to uint16 (npy cannot hold
bfloat16). Records are read until the end of the stream; a record cut short
raises `CheckpointCorruptedError` (Trax would silently drop it).
"""

import gzip
import os
import zlib

import numpy as np

from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointFormatError


def _bfloat16():
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  return np.dtype(ml_dtypes.bfloat16)


def to_bits(arrays):
  """Bit-casts bfloat16 arrays to uint16 (as Trax's `Loop._to_bits`)."""
  out = []
  for a in arrays:
    a = np.asarray(a)
    out.append(a.view(np.uint16) if a.dtype == _bfloat16() else a)
  return out


def from_bits(arrays):
  """Bit-casts uint16 arrays back to bfloat16 (as Trax's `Loop._from_bits`).

  Like Trax, this treats every uint16 array as bit-cast bfloat16; use it only
  for lists known to hold no genuine uint16 leaves (or unflatten against a
  signature, which restores exactly the leaves it declares bfloat16).
  """
  return [a.view(_bfloat16()) if isinstance(a, np.ndarray) and
          a.dtype == np.uint16 else a for a in arrays]


def write_npy_gz(path, arrays, compresslevel=2):
  """Writes arrays as consecutive npy records in one gzip file, atomically."""
  arrays = to_bits(arrays)
  for i, a in enumerate(arrays):
    if a.dtype.kind in 'OV':
      raise TypeError(
          f'array #{i} has dtype {a.dtype}, which an .npy record cannot hold '
          f'without pickle; only bfloat16 is bit-cast automatically.')
  with atomic_write(path) as f:
    with gzip.GzipFile(fileobj=f, mode='wb', compresslevel=compresslevel,
                       mtime=0) as gz:
      for a in arrays:
        np.lib.format.write_array(gz, a, allow_pickle=False)


def read_npy_gz(path):
  """Reads every npy record of a gzip file written by Trax's `np_to_file`.

  Returns:
    List of numpy arrays, in file order, with uint16 left as stored (see
    `from_bits`).

  Raises:
    FileNotFoundError: `path` does not exist.
    CheckpointCorruptedError: the gzip stream or a record is truncated/damaged.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f'array file not found: {path}')
  out = []
  try:
    with gzip.open(path, 'rb') as gz:
      while gz.peek(1):
        out.append(np.lib.format.read_array(gz, allow_pickle=False))
  except (EOFError, zlib.error, gzip.BadGzipFile, ValueError) as e:
    if isinstance(e, ValueError) and 'pickle' in str(e):
      raise CheckpointFormatError(
          f'{path}: record #{len(out)} holds a pickled object array, which is '
          f'refused.') from None
    raise CheckpointCorruptedError(
        f'{path}: truncated or corrupted after {len(out)} complete records '
        f'({type(e).__name__}: {e}).') from None
  return out
