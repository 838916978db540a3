"""A directory of native checkpoints: naming, keep-last-N, newest valid one.

Checkpoints are subdirectories named `<prefix><step:09d>` (e.g.
`ckpt_000000100`), each written by `native.save_native` with the step in its
metadata. Everything here orders checkpoints by the step recorded inside
them, never by name alone:

* a checkpoint whose name and recorded step differ is refused
  (`CheckpointFormatError`), so a renamed copy can neither pin a resume to
  its step nor be deleted by rotation;
* an unreadable checkpoint (damaged files, no step) is skipped and reported,
  and never deleted;
* an incomplete one (no `metadata.json`, only files a killed save leaves)
  holds nothing loadable: rotation removes it;
* rotation deletes only the files a save writes (`metadata.json`, the arrays
  file, temporaries), then the emptied directory; never through a symlink
  or outside `directory`, and never another file put in a checkpoint.
"""

import contextlib
import os
import re
import typing
import warnings

from retrax.checkpoints import ownership
from retrax.checkpoints.atomic import fsync_dir
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.native import METADATA_FILE
from retrax.checkpoints.native import read_metadata
from retrax.checkpoints.native import SHARDS_FILE_PATTERN
from retrax.checkpoints.native import verify_native
from retrax.run_layout import ROLLING_PREFIX
from retrax.validation import ArgumentValueError

DEFAULT_PREFIX = ROLLING_PREFIX
# What a save killed before its commit point leaves in a checkpoint directory
# (a sharded save: also each process's shards file and table).
_PARTIAL_FILE_RE = re.compile(
    r'^(arrays\.[0-9a-f]{16}\.safetensors|\.arrays\.[a-z0-9_]+\.tmp|'
    r'\.metadata\.json\.[a-z0-9_]+\.tmp|\.shards\.[a-z0-9_]+\.tmp|'
    f'{SHARDS_FILE_PATTERN}|\\.{SHARDS_FILE_PATTERN}\\.[a-z0-9_]+\\.tmp)$')


class Entry(typing.NamedTuple):
  """A checkpoint directory found by `scan_checkpoints`.

  `step` is the recorded step (None unless `error` is None); `error` says
  why it is unusable; `incomplete` marks a save that never committed.
  """
  path: str
  name_step: int
  step: typing.Optional[int]
  error: typing.Optional[str]
  incomplete: bool = False


def checkpoint_path(directory, step, prefix=DEFAULT_PREFIX):
  """The conventional checkpoint directory for `step`: `<dir>/ckpt_000000100`."""
  return os.path.join(os.fspath(directory), f'{prefix}{int(step):09d}')


def list_checkpoints(directory, prefix=DEFAULT_PREFIX):
  """`[(name step, path), ...]` of checkpoint directories, by name (unverified)."""
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    return []
  pattern = re.compile(re.escape(prefix) + r'(\d+)$')
  found = []
  for name in os.listdir(directory):
    m = pattern.match(name)
    full = os.path.join(directory, name)
    if m and os.path.isdir(full):
      found.append((int(m.group(1)), full))
  return sorted(found)


def _is_incomplete(path):
  try:
    names = os.listdir(path)
  except OSError:
    return False
  return METADATA_FILE not in names and all(
      _PARTIAL_FILE_RE.match(n) for n in names)


# path -> (files' stat signature, {'step': recorded step}).
_VERIFIED: typing.Dict[typing.Any, tuple] = {}


def _signature(path):
  try:
    return tuple(sorted(
        (e.name, e.stat().st_size, e.stat().st_mtime_ns, e.inode())
        for e in os.scandir(path)))
  except OSError:
    return None


def _verify(path, full, cached):
  """Recorded metadata of a checkpoint (only its step when `cached`), or
  raises; cached by the files' signatures."""
  if not full:
    return read_metadata(path)
  if not cached:
    return verify_native(path)
  key, signature = os.path.abspath(path), _signature(path)
  hit = _VERIFIED.get(key)
  if hit is not None and hit[0] == signature:
    return hit[1]
  metadata = verify_native(path)
  step = metadata.get('step') if isinstance(metadata, dict) else None
  _VERIFIED[key] = (signature, {'step': step})  # Small: no history kept.
  return {'step': step}


def mismatch_error(path, name_step, step):
  return CheckpointFormatError(
      f'{path}: its name says step {name_step} but it records step {step} '
      f'(a renamed copy?); rename it to the step it holds or move it out of '
      f'the directory.')


def check_entry(path, name_step, full=True, cached=False):
  """Verifies one checkpoint directory (`full`: also its arrays file, else
  only its metadata); returns its `Entry`.

  Raises:
    CheckpointFormatError: its name and recorded step differ.
  """
  if _is_incomplete(path):
    return Entry(path, name_step, None, 'incomplete: the save that made it '
                 f'was interrupted before writing {METADATA_FILE}', True)
  try:
    metadata = _verify(path, full, cached)
  except (CheckpointError, OSError) as e:
    return Entry(path, name_step, None, str(e))
  step = metadata.get('step') if isinstance(metadata, dict) else None
  if isinstance(step, bool) or not isinstance(step, int):
    return Entry(path, name_step, None, 'its metadata records no step')
  if step != name_step:
    raise mismatch_error(path, name_step, step)
  return Entry(path, name_step, step, None)


def scan_checkpoints(directory, prefixes=(DEFAULT_PREFIX,), full=True,
                     cached=False):
  """Every checkpoint directory of `prefixes`, verified, oldest step first.

  Args:
    directory: where to look.
    prefixes: directory-name prefixes to include.
    full: verify the arrays files too (else only each `metadata.json`).
    cached: reuse the verification of files unchanged (same names, sizes,
      mtimes, inodes) since last verified in this process.

  Returns:
    `Entry`s; usable ones (error None) by recorded step, oldest first, then
    the others, newest name first.

  Raises:
    CheckpointFormatError: a checkpoint's name and recorded step differ.
  """
  entries = [check_entry(path, name_step, full, cached)
             for prefix in prefixes
             for name_step, path in list_checkpoints(directory, prefix)]
  return (sorted((e for e in entries if e.error is None),
                 key=lambda e: (e.step, e.path)) +
          sorted((e for e in entries if e.error is not None),
                 key=lambda e: (-e.name_step, e.path)))


def _removable(directory, path):
  """Why rotation must keep checkpoint `path` of `directory` (None: it may go)."""
  if os.path.islink(path) or not ownership.is_inside(directory, path):
    return ('it is a symbolic link (or leads out of the directory); rotation '
            'never deletes through a link')
  try:
    names = os.listdir(path)
  except OSError as e:
    return f'it cannot be listed ({e})'
  foreign = [n for n in names if n != METADATA_FILE and not (
      _PARTIAL_FILE_RE.match(n))]
  if foreign:
    return (f'it holds files no save writes ({", ".join(sorted(foreign)[:3])}'
            '); rotation deletes only what a save wrote')
  return None


def _remove_checkpoint(path):
  """Deletes a checkpoint's own files, metadata first (a half-removed one
  then reads as incomplete), then the empty directory."""
  names = sorted(os.listdir(path), key=lambda n: n != METADATA_FILE)
  for name in names:
    with contextlib.suppress(FileNotFoundError):
      os.remove(os.path.join(path, name))
  with contextlib.suppress(OSError):
    os.rmdir(path)


_REPORTED: typing.Set[tuple] = set()


def _report_once(path, why, report, state='is unusable and '):
  if (path, why) not in _REPORTED:
    _REPORTED.add((path, why))
    report(f'checkpoint {path} {state}is kept as it is: {why}')


def _warn(message):
  warnings.warn(message, stacklevel=3)


def rotate_checkpoints(directory, keep, prefix=DEFAULT_PREFIX, report=None):
  """Deletes all but the newest `keep` usable checkpoints; returns the removed.

  "Newest" is by recorded step. Unusable checkpoints are not counted, never
  deleted and reported (once per process) through `report` (default: a
  warning); incomplete ones (saves that never committed) are removed. One
  that is a symlink or holds files no save writes is kept and reported.

  Raises:
    ValueError: bad `keep`.
    CheckpointFormatError: a checkpoint's name and recorded step differ.
  """
  if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
    raise ArgumentValueError(f'keep must be an int >= 1; got {keep!r}.')
  entries = scan_checkpoints(directory, (prefix,), cached=True)
  usable = [e for e in entries if e.error is None]
  doomed = usable[:-keep] + [e for e in entries if e.incomplete]
  for e in entries:
    if e.error is not None and not e.incomplete:
      _report_once(e.path, e.error, report or _warn)
  removed = []
  for e in doomed:
    why = _removable(directory, e.path)
    if why is not None:
      _report_once(e.path, why, report or _warn, state='')
      continue
    _remove_checkpoint(e.path)
    _VERIFIED.pop(os.path.abspath(e.path), None)
    removed.append(e.path)
  if removed:
    fsync_dir(os.fspath(directory))
  return removed


def newest_usable(directory, prefixes=(DEFAULT_PREFIX,), report=None):
  """The checkpoint of highest recorded step among `prefixes` that verifies.

  Metadata is read for all, the arrays file checked from the newest down to
  the first that verifies. `report(message)` is called for each unusable one
  met (default: a warning), newest first.

  Returns:
    `(path or None, [(path, why), ...])`: the checkpoint, and the unusable
    ones other than saves that never committed.

  Raises:
    CheckpointFormatError: a checkpoint's name and recorded step differ.
  """
  report = report or _warn
  entries = scan_checkpoints(directory, prefixes, full=False)
  found, problems = None, []
  for e in reversed([e for e in entries if e.error is None]):
    try:
      verify_native(e.path)
    except (CheckpointError, OSError) as err:
      report(f'Checkpoint of step {e.step} at {e.path} is unusable and was '
             f'skipped: {err}')
      problems.append((e.path, str(err)))
      continue
    found = e.path
    break
  for e in entries:
    if e.error is not None:
      report(f'Checkpoint of step {e.name_step} at {e.path} is unusable and '
             f'was skipped: {e.error}')
      if not e.incomplete:
        problems.append((e.path, e.error))
  return found, problems


def latest_valid_checkpoint(directory, prefix=DEFAULT_PREFIX):
  """Path of the checkpoint with the highest recorded step that verifies, or None.

  Unusable checkpoints are skipped with a warning each, so a run killed
  mid-save resumes from the previous checkpoint.

  Raises:
    CheckpointFormatError: a checkpoint's name and recorded step differ.
  """
  return newest_usable(directory, (prefix,))[0]
