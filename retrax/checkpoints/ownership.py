"""Which paths belong to a run directory, and which process writes it.

A run directory has one writer at a time. `RunLock(run_dir)` takes an
exclusive advisory lock (`fcntl.flock`) on `<run_dir>/retrax.lock`, which
records the holder's pid and host; a second process is refused with
`RunDirInUseError` naming them. The kernel drops the lock when its process
ends, however it ends (`kill -9` included), so a lock file left by a dead
process is simply taken over. Within one process the newest `RunLock` of a
directory takes it over from older ones (a notebook cell re-run, a resumed
loop); an older one then refuses to write (`check`).

Every path a run writes, truncates or deletes goes through `check_inside`
(after resolving symlinks it must lie inside the run directory), so neither a
crafted `run_files.json` entry (`../x`, an absolute path) nor a symlink leads
a write or a delete outside the run.
"""

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import stat
import weakref

from retrax.errors import UserInputError
from retrax.run_layout import LOCK_FILE


_log = logging.getLogger('retrax.supervised')


class RunDirInUseError(UserInputError):
  """Another process (or a newer Loop of this one) owns the run directory."""


class BadLockFileError(UserInputError):
  """The run directory's lock file is not a regular file (a symlink, FIFO)."""


class OutsideRunDirError(UserInputError):
  """A path a run would write, truncate or delete lies outside its directory."""


# --- containment ------------------------------------------------------------------


def resolved(path):
  """`path` made absolute with every symlink resolved."""
  return os.path.realpath(os.path.expanduser(os.fspath(path)))


def is_inside(root, path):
  """True if `path`, symlinks resolved, is `root` or lies below it."""
  root, path = resolved(root), resolved(path)
  return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_inside(root, path, action='write'):
  """Returns `path` if it lies inside run directory `root` (symlinks
  resolved); else raises `OutsideRunDirError` saying what was refused."""
  if not is_inside(root, path):
    raise OutsideRunDirError(
        f'refused to {action} {path}: it resolves to {resolved(path)}, outside '
        f'the run directory {resolved(root)} (a symlink, or a crafted entry); '
        'a run only touches files inside its own directory.')
  return path


def check_entry(root, relpath, where):
  """A relative path recorded in a run file (`where`), checked: no absolute
  path, no `..`, and inside `root` once joined and resolved."""
  if not isinstance(relpath, str) or not relpath:
    raise OutsideRunDirError(f'{where}: bad entry {relpath!r}.')
  norm = os.path.normpath(relpath)
  if os.path.isabs(norm) or norm == os.pardir or norm.startswith(
      os.pardir + os.sep):
    raise OutsideRunDirError(
        f'{where} lists {relpath!r}, which is not a path inside the run '
        'directory; a run only touches its own files: remove the entry.')
  check_inside(root, os.path.join(root, norm), 'touch')
  return norm


# --- the lock -----------------------------------------------------------------


_HELD: dict[str, list] = {}  # resolved run dir -> [lock file descriptor, owner token]


def _describe(holder):
  if not holder:
    return 'another process'
  return f'process {holder.get("pid")} on host {holder.get("host")}'


def _read_holder(fd):
  try:
    data = os.pread(fd, 4096, 0)
    holder = json.loads(data.decode('utf-8'))
  except (OSError, UnicodeDecodeError, ValueError):
    return None
  return holder if isinstance(holder, dict) else None


def _alive(holder):
  """False if `holder` was a process on this host that no longer runs."""
  if holder.get('host') != socket.gethostname():
    return True  # Cannot tell from here.
  try:
    os.kill(int(holder.get('pid')), 0)
  except (TypeError, ValueError, ProcessLookupError):
    return False
  except PermissionError:
    pass
  return True


def _lock_fd(directory, path):
  """Opens and flocks `path`; the open descriptor (refused: an error).

  Never through a symlink (the holder's pid would overwrite the file it
  points to, outside the run), and only a regular file (a FIFO would block
  or fail).
  """
  try:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW |
                 os.O_NONBLOCK | getattr(os, 'O_CLOEXEC', 0), 0o644)
  except OSError as e:
    if e.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR,
                       errno.EOPNOTSUPP):
      raise
    fd = None
  if fd is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
    os.close(fd)
    fd = None
  if fd is None:
    raise BadLockFileError(
        f'{path} is not a regular file (a symlink, FIFO, directory or '
        'device): a run only writes its lock into its own plain file. '
        'Remove it (retrax creates it again) or choose another output_dir.')
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = _read_holder(fd)
    os.close(fd)
    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
      raise RunDirInUseError(
          f'{directory} is in use by {_describe(holder)} (it holds {path}); '
          'a run directory has one writer at a time: wait for that run to '
          'end or stop it, or choose another output_dir.') from None
    _log.warning('Cannot lock %s (%s); going on without a lock.', path, e)
    return None
  return fd


def _take(fd):
  """Records this process in the lock file; logs a dead holder's takeover."""
  before = _read_holder(fd)
  me = {'pid': os.getpid(), 'host': socket.gethostname()}
  if before and before != me and not _alive(before):
    _log.info('Took over the run directory lock of %s, which no longer runs.',
              _describe(before))
  data = (json.dumps(me) + '\n').encode('utf-8')
  if data != os.pread(fd, 4096, 0):
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _release(key, token):
  held = _HELD.get(key)
  if held is not None and held[1] == token:
    del _HELD[key]
    if held[0] is not None:
      with contextlib.suppress(OSError):
        os.close(held[0])  # Closing the descriptor drops the flock.


class RunLock:
  """This process's ownership of run directory `directory` (see the module).

  Raises:
    RunDirInUseError: another live process holds the directory.
  """

  def __init__(self, directory):
    self.directory = os.fspath(directory)
    self.path = os.path.join(self.directory, LOCK_FILE)
    self._key = resolved(self.directory)
    self._token = secrets.token_hex(8)
    held = _HELD.get(self._key)
    if held is None:  # Else: taken over from an older RunLock of this process.
      fd = _lock_fd(self.directory, self.path)
      if fd is not None:
        _take(fd)
      held = _HELD[self._key] = [fd, None]
    held[1] = self._token
    self._finalizer = weakref.finalize(self, _release, self._key, self._token)

  @property
  def held(self):
    """True while this object (not a newer one of this process) owns it."""
    held = _HELD.get(self._key)
    return held is not None and held[1] == self._token

  def check(self):
    """Raises `RunDirInUseError` if this object no longer owns the directory."""
    if not self.held:
      raise RunDirInUseError(
          f'{self.directory} was taken over by a newer Loop in this process '
          '(or released); this one no longer writes there: use the newer one.')

  def release(self):
    """Gives the directory up (also done when this object is collected)."""
    self._finalizer()
