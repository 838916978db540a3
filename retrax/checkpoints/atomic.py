"""Atomic file writes: temp file in the same directory, fsync, rename, fsync dir.

A reader sees either the old file or the complete new one, never a partial
write, even if the process is killed mid-write; after `atomic_write` returns,
the new file survives a power loss. An `OSError` of the disk (full, read-only,
no permission) leaves the old file as it was and names the file meant.
`append` adds records to a log the same way: all of them, or none.
"""

import contextlib
import os
import re
import tempfile


def _read_umask():
  mask = os.umask(0)
  os.umask(mask)
  return mask


# mkstemp creates files readable by the owner only; finished files get the
# permissions an ordinary open() would give them.
_FILE_MODE = 0o666 & ~_read_umask()


def set_default_permissions(fd):
  """Gives a file made by `tempfile.mkstemp` the usual umask-based mode."""
  with contextlib.suppress(OSError):
    os.fchmod(fd, _FILE_MODE)


def fsync_dir(path):
  """Flushes a directory entry (a rename or create in it) to disk."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # E.g. platforms that cannot open directories.
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


@contextlib.contextmanager
def temp_file(directory, prefix, meant):
  """Context manager yielding `(fd, tmp)`: a new temporary file in
  `directory` (named `<prefix><8 letters>.tmp`) for the file `meant`.

  On an exception `tmp` is removed, and an `OSError` of the disk that names
  no file or `tmp` is raised naming `meant` instead (see `naming`).
  """
  try:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix='.tmp')
  except OSError as e:  # A read-only or full disk: name the file meant.
    raise naming(e, meant) from None
  try:
    yield fd, tmp
  except BaseException as e:
    with contextlib.suppress(OSError):
      os.remove(tmp)
    if isinstance(e, OSError) and e.filename in (None, tmp):
      raise naming(e, meant) from None
    raise


@contextlib.contextmanager
def atomic_write(path):
  """Context manager yielding a binary file; on success it replaces `path`.

  On an exception the temporary file is removed and `path` is untouched.
  """
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  with temp_file(directory, '.' + os.path.basename(path) + '.',
                 path) as (fd, tmp):
    with os.fdopen(fd, 'wb') as f:
      set_default_permissions(f.fileno())
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  fsync_dir(directory)


def naming(error, path):
  """`error` (an OSError) naming `path`, the file it was written for (an
  error of `write` or `fsync` names none, one of a temporary file the wrong
  one); its subclass follows its errno, as `OSError(errno, ...)` picks it."""
  if error.errno is None:
    return error
  return OSError(error.errno, error.strerror, os.fspath(path))


def append(path, data):
  """Appends bytes to `path` (created if missing); on an error the file is
  cut back to its old length, so a full disk leaves no torn record."""
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
  try:
    start = os.fstat(fd).st_size
    view = memoryview(data)
    try:
      while view:
        view = view[os.write(fd, view):]
    except OSError as e:
      with contextlib.suppress(OSError):
        os.ftruncate(fd, start)
      raise naming(e, path) from None
  finally:
    os.close(fd)


# `atomic_write`'s temporary names: `.<target>.<8 of mkstemp's letters>.tmp`.
_TEMP_RE = re.compile(r'^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$')
# The files retrax writes with `atomic_write` (and native's `.arrays.` temps).
_OWN_TARGETS = re.compile(
    r'^(metadata\.json|arrays|shards|metrics\.jsonl|run_files\.json|'
    r'run_config\.json|model\.json|.+\.pkl\.gz|.+\.npy\.gz|'
    r'shards_\d{5}_of_\d{5}\.[0-9a-f]{16}\.json)$')


def remove_orphan_temps(directory, targets=None):
  """Removes the temporary files of retrax's interrupted atomic writes in
  `directory` (not recursive); returns their paths.

  Only names of the form `.<target>.<8 letters>.tmp` with a target that
  retrax writes (`metadata.json`, `metrics.jsonl`, `*.pkl.gz`, ...), or
  with `targets` one of those names, go.
  """
  try:
    names = os.listdir(directory)
  except OSError:
    return []
  removed = []
  for name in names:
    m = _TEMP_RE.match(name)
    path = os.path.join(directory, name)
    own = (_OWN_TARGETS.match(m.group('target')) if targets is None else
           m.group('target') in targets) if m else False
    if own and os.path.isfile(path):
      with contextlib.suppress(OSError):
        os.remove(path)
        removed.append(path)
  return removed
