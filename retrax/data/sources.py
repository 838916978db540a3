"""Data sources: text files and folders (by line or by chunk), numpy arrays.

A source is a stream function that ignores its input, so it can open a
`Serial` pipeline: ``Serial(TextLines('corpus/'), Tokenize(...), ...)``.
Files are streamed; none is read whole into memory.

Undecodable bytes: sources decode with ``errors='replace'`` by default, so
each bad byte becomes U+FFFD and reading never stops. Pass ``errors='strict'``
to get a `ValueError` naming the file and line (or chunk), or
``encoding=None`` to get raw ``bytes`` (for byte-level tokenizers).
Empty files yield nothing.
"""

import codecs
import fnmatch
import os
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

import numpy as np

from retrax import local_paths
from retrax.errors import UserInputError
from retrax.validation import ArgumentValueError

Source = Callable[..., Iterator[Any]]


def list_files(path_or_dir: Union[str, os.PathLike, List[Any], Tuple[Any, ...]],
               pattern: str = '*') -> List[str]:
  """Returns the files a source reads, in a deterministic order.

  Args:
    path_or_dir: a file, a directory (walked recursively, sorted; hidden
      entries skipped), or a list of those.
    pattern: ``fnmatch`` pattern on file names, for directories only.

  Raises:
    FileNotFoundError: if a path does not exist.
    ValueError: if a directory holds no matching file.
  """
  if isinstance(path_or_dir, (list, tuple)):
    return [f for p in path_or_dir for f in list_files(p, pattern)]
  path = local_paths.check_local(os.fspath(path_or_dir), 'Text source')
  if os.path.isfile(path):
    return [path]
  if not os.path.isdir(path):
    raise FileNotFoundError(f'Text source {path!r} does not exist (expected a '
                            f'file or a directory).')
  files: List[str] = []
  for root, dirs, names in os.walk(path):
    dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
    files.extend(os.path.join(root, n) for n in sorted(names)
                 if not n.startswith('.') and fnmatch.fnmatch(n, pattern))
  if not files:
    raise UserInputError(f'Directory {path!r} holds no file matching '
                         f'{pattern!r}.')
  return files


def _strip_newline(line):
  """Drops one trailing newline ('\n'; '\r\n' too for bytes lines).

  Text mode translates every line ending to '\n', and a line holds at most
  one, so ``rstrip`` removes exactly the terminator.
  """
  if isinstance(line, bytes):
    return line[:-2] if line.endswith(b'\r\n') else line.rstrip(b'\n')
  return line.rstrip('\n')


def _decode_error(path, where, encoding, e):
  return ValueError(
      f'{path}: bytes that are not valid {encoding} {where} ({e.reason} at '
      f'byte {e.start} of the buffer). Pass errors="replace" or "ignore" to '
      f'TextLines/TextChunks, or encoding=None to read bytes.')


def _read_lines(path, encoding, errors, keep_newlines, skip_empty):
  mode = 'r' if encoding else 'rb'
  kwargs = dict(encoding=encoding, errors=errors) if encoding else {}
  n = 0
  with open(path, mode, **kwargs) as f:
    try:
      for line in f:
        n += 1
        if not keep_newlines:
          line = _strip_newline(line)
        if skip_empty and not line.strip():
          continue
        yield line
    except UnicodeDecodeError as e:
      raise _decode_error(path, f'after line {n}', encoding, e) from e


def TextLines(path_or_dir: Union[str, os.PathLike, List[Any], Tuple[Any, ...]],
              pattern: str = '*',
              encoding: Optional[str] = 'utf-8',
              errors: str = 'replace',
              keep_newlines: bool = False,
              skip_empty: bool = False,
              repeat: bool = False) -> Source:
  """A source yielding the lines of a text file or of all files in a folder.

  Example::

    lines = TextLines('corpus/', pattern='*.txt', skip_empty=True)
    next(lines())   # first non-empty line of the first file, no newline

  Args:
    path_or_dir: file, directory or list of them; see `list_files`.
    pattern: file-name pattern inside directories.
    encoding: text encoding; None yields ``bytes`` lines.
    errors: decoding error handler ('replace', 'strict', 'ignore', ...).
    keep_newlines: keep the line terminator.
    skip_empty: drop lines that are empty or only whitespace.
    repeat: start over after the last file, forever.

  Returns:
    A function ``text_lines(generator=None)`` returning a fresh iterator.

  Raises:
    FileNotFoundError / ValueError: at construction, see `list_files`;
      ValueError when iterating with ``errors='strict'`` on bad bytes.
  """
  files = list_files(path_or_dir, pattern)
  if encoding:
    codecs.lookup(encoding)
    codecs.lookup_error(errors)

  def text_lines(generator=None):
    del generator
    if not repeat:
      for path in files:
        yield from _read_lines(path, encoding, errors, keep_newlines,
                               skip_empty)
      return
    while True:
      n = 0
      for path in files:
        for line in _read_lines(path, encoding, errors, keep_newlines,
                                skip_empty):
          n += 1
          yield line
      if not repeat or n == 0:  # An empty corpus must not spin forever.
        return
  return text_lines


def _read_chunks(path, chunk_size, encoding, errors, drop_remainder):
  mode = 'r' if encoding else 'rb'
  kwargs = dict(encoding=encoding, errors=errors, newline='') if encoding else {}
  n = 0
  with open(path, mode, **kwargs) as f:
    while True:
      try:
        chunk = f.read(chunk_size)
      except UnicodeDecodeError as e:
        raise _decode_error(path, f'in chunk {n}', encoding, e) from e
      if not chunk:
        return
      if len(chunk) < chunk_size:
        if not drop_remainder:
          yield chunk
        return
      n += 1
      yield chunk


def TextChunks(path_or_dir: Union[str, os.PathLike, List[Any], Tuple[Any, ...]],
               chunk_size: int,
               pattern: str = '*',
               encoding: Optional[str] = 'utf-8',
               errors: str = 'replace',
               drop_remainder: bool = False,
               repeat: bool = False) -> Source:
  """A source yielding fixed-size chunks of text files, file by file.

  Each file is cut into chunks of `chunk_size` characters (or bytes, with
  ``encoding=None``), read one at a time; newlines are kept untranslated. The
  last chunk of a file may be shorter (dropped with ``drop_remainder``).
  Useful for long-document LM training and for files without line breaks.

  Args:
    path_or_dir: file, directory or list of them; see `list_files`.
    chunk_size: characters (or bytes) per chunk, > 0.
    pattern: file-name pattern inside directories.
    encoding: text encoding; None yields ``bytes`` chunks.
    errors: decoding error handler ('replace', 'strict', 'ignore', ...).
    drop_remainder: drop each file's short final chunk.
    repeat: start over after the last file, forever.

  Returns:
    A function ``text_chunks(generator=None)`` returning a fresh iterator.
  """
  if not isinstance(chunk_size, int) or chunk_size <= 0:
    raise ArgumentValueError(f'chunk_size must be a positive int, got {chunk_size!r}.')
  files = list_files(path_or_dir, pattern)
  if encoding:
    codecs.lookup(encoding)
    codecs.lookup_error(errors)

  def text_chunks(generator=None):
    del generator
    while True:
      n = 0
      for path in files:
        for chunk in _read_chunks(path, chunk_size, encoding, errors,
                                  drop_remainder):
          n += 1
          yield chunk
      if not repeat or n == 0:  # An empty corpus must not spin forever.
        return
  return text_chunks


def NumpyArrays(*arrays: Any, repeat: bool = False) -> Source:
  """A source yielding the rows (axis 0) of numpy arrays.

  With one array each example is a row; with several, a tuple of rows (e.g.
  ``NumpyArrays(inputs, targets)`` gives ``(inputs[i], targets[i])``). A
  string argument is a ``.npy`` path, memory-mapped so it is never read
  whole.

  Args:
    *arrays: arrays (or ``.npy`` paths) with the same length on axis 0.
    repeat: start over after the last row, forever.

  Raises:
    ValueError: if no arrays are given, one is a scalar, or lengths differ.
    FileNotFoundError: for a missing ``.npy`` path.
  """
  if not arrays:
    raise ArgumentValueError('NumpyArrays needs at least one array.')
  loaded = []
  for a in arrays:
    if isinstance(a, (str, os.PathLike)):
      a = local_paths.check_local(a, 'NumpyArrays')
      if not os.path.isfile(a):
        raise FileNotFoundError(f'NumpyArrays: no .npy file at {a!r}.')
      a = np.load(a, mmap_mode='r')
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    if a.ndim == 0:
      raise ArgumentValueError('NumpyArrays needs arrays with a leading example axis, '
                               'got a scalar.')
    loaded.append(a)
  lengths = [a.shape[0] for a in loaded]
  if len(set(lengths)) != 1:
    raise ArgumentValueError(f'NumpyArrays: arrays must have the same length on axis '
                             f'0, got {lengths}.')

  def numpy_rows(generator=None):
    del generator
    while True:
      for i in range(lengths[0]):
        if len(loaded) == 1:
          yield loaded[0][i]
        else:
          yield tuple(a[i] for a in loaded)
      if not repeat or lengths[0] == 0:
        return
  return numpy_rows
