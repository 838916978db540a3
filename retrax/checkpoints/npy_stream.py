"""Trax's array files: gzip of consecutive `np.save` records (`*.npy.gz`).

`Loop.save_checkpoint` writes weights and optimizer slots this way, one
record per leaf, with bfloat16 bit-cast to uint16 (npy cannot hold
bfloat16). Records are read until the end of the stream (so gzip's CRC is
checked); a record cut short or a CRC mismatch raises
`CheckpointCorruptedError` (Trax would silently drop the record), and a
file or array over the size limit of `limits` raises `CheckpointLimitError`.
"""

import ast
import gzip
import hashlib
import math
import os
import struct
import zlib

import ml_dtypes
import numpy as np

from retrax.checkpoints import limits
from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.errors import CheckpointNotFoundError
from retrax.checkpoints.safe_unpickle import check_dtype
from retrax.validation import ArgumentTypeError


def _bfloat16():
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


class _Hashing:
  """A binary file wrapper that sha256-hashes what passes through it."""

  def __init__(self, f):
    self._f = f
    self.hash = hashlib.sha256()

  def write(self, data):
    self.hash.update(data)
    return self._f.write(data)

  def read(self, size=-1):
    data = self._f.read(size)
    self.hash.update(data)
    return data

  def flush(self):
    self._f.flush()


def write_npy_gz(path, arrays, compresslevel=2):
  """Writes arrays as consecutive npy records in one gzip file, atomically.

  Returns:
    The sha256 hex digest of the file written.
  """
  arrays = to_bits(arrays)
  for i, a in enumerate(arrays):
    if a.dtype.kind in 'OV':
      raise ArgumentTypeError(
          f'array #{i} has dtype {a.dtype}, which an .npy record cannot hold '
          f'without pickle; only bfloat16 is bit-cast automatically.')
  with atomic_write(path) as f:
    hashing = _Hashing(f)
    with gzip.GzipFile(fileobj=hashing, mode='wb', compresslevel=compresslevel,
                       mtime=0) as gz:
      for a in arrays:
        np.lib.format.write_array(gz, a, allow_pickle=False)
  return hashing.hash.hexdigest()


_MAGIC = b'\x93NUMPY'
_MAX_HEADER = 1 << 20


def _read_header(gz, path, index):
  """Parses one npy record header; returns `(dtype, shape, fortran_order)`."""
  what = f'record #{index}'
  magic = limits.read_exact(gz, 8, path, f'{what} header')
  if magic[:6] != _MAGIC or magic[6] not in (1, 2, 3):
    raise CheckpointCorruptedError(
        f'{path}: {what} does not start with an npy header; the file is '
        f'corrupted or not an .npy.gz array file.')
  size_len = 2 if magic[6] == 1 else 4
  (length,) = struct.unpack(
      '<H' if size_len == 2 else '<I',
      limits.read_exact(gz, size_len, path, f'{what} header'))
  if length > _MAX_HEADER:
    raise CheckpointCorruptedError(
        f'{path}: {what} claims a {length}-byte header; the file is corrupted.')
  text = limits.read_exact(gz, length, path, f'{what} header')
  try:
    header = ast.literal_eval(text.decode('utf-8' if magic[6] == 3 else
                                          'latin1'))
    if not isinstance(header, dict) or set(header) != {'descr', 'fortran_order',
                                                       'shape'}:
      raise ValueError('keys')
    dtype = check_dtype(np.lib.format.descr_to_dtype(header['descr']))
    shape = header['shape']
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0
        for d in shape):
      raise ValueError('shape')
  except CheckpointError:
    raise
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError,
          UnicodeDecodeError) as e:
    raise CheckpointCorruptedError(
        f'{path}: {what} has a malformed npy header ({type(e).__name__}).'
    ) from None
  return dtype, shape, bool(header['fortran_order']), 8 + size_len + length


def read_npy_gz(path, max_bytes=None, sha256=None):
  """Reads every npy record of a gzip file written by Trax's `np_to_file`.

  The whole stream is read, so gzip's CRC and length trailer are checked.
  Array headers are checked against the size limit (`limits.max_bytes`)
  before any data is read. With `sha256`, the file's bytes must hash to it.

  Returns:
    List of numpy arrays, in file order, with uint16 left as stored (see
    `from_bits`).

  Raises:
    CheckpointNotFoundError: `path` does not exist.
    CheckpointLimitError: the file or an array is larger than the limit.
    CheckpointCorruptedError: the gzip stream or a record is truncated/damaged.
  """
  path = os.fspath(path)
  limit = limits.max_bytes(max_bytes)
  if not os.path.exists(path):
    raise CheckpointNotFoundError(f'array file not found: {path}')
  out: list = []
  total = 0
  try:
    with open(path, 'rb') as raw, gzip.GzipFile(
        fileobj=(hashing := _Hashing(raw)), mode='rb') as gz:
      while gz.peek(1):
        dtype, shape, fortran, header_bytes = _read_header(gz, path, len(out))
        n_bytes = math.prod(shape) * dtype.itemsize
        total += header_bytes + n_bytes
        if n_bytes > limit or total > limit:
          raise limits.too_big(
              path, f'record #{len(out)} (shape {shape}, {dtype})'
              if n_bytes > limit else 'the decompressed content', limit)
        data = limits.read_exact(gz, n_bytes, path, f'record #{len(out)} data')
        arr = np.frombuffer(bytearray(data), dtype=dtype)
        if fortran:
          arr = arr.reshape(shape[::-1]).transpose()
        else:
          arr = arr.reshape(shape)
        out.append(arr)
      while hashing.read(1 << 20):  # Bytes after the stream count too.
        pass
  except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
    raise CheckpointCorruptedError(
        f'{path}: truncated or corrupted after {len(out)} complete records '
        f'({type(e).__name__}: {e}).') from None
  if sha256 is not None and hashing.hash.hexdigest() != sha256:
    raise CheckpointCorruptedError(
        f'{path}: sha256 differs from the one its checkpoint recorded; the '
        f'file is damaged or belongs to another save.')
  return out
