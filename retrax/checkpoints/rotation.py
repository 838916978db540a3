"""A directory of native checkpoints: naming, keep-last-N, newest valid one.

Checkpoints are subdirectories named `<prefix><step:09d>` (e.g.
`ckpt_000000100`), each written by `native.save_native`.
"""

import contextlib
import os
import re
import shutil
import warnings

from retrax.checkpoints.atomic import fsync_dir
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.native import METADATA_FILE
from retrax.checkpoints.native import verify_native

DEFAULT_PREFIX = 'ckpt_'


def checkpoint_path(directory, step, prefix=DEFAULT_PREFIX):
  """The conventional checkpoint directory for `step`: `<dir>/ckpt_000000100`."""
  return os.path.join(os.fspath(directory), f'{prefix}{int(step):09d}')


def list_checkpoints(directory, prefix=DEFAULT_PREFIX):
  """`[(step, path), ...]` of checkpoint directories, oldest first."""
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


def _remove_checkpoint(path):
  # Metadata first: a half-removed directory then reads as incomplete.
  with contextlib.suppress(FileNotFoundError):
    os.remove(os.path.join(path, METADATA_FILE))
  shutil.rmtree(path, ignore_errors=True)


def rotate_checkpoints(directory, keep, prefix=DEFAULT_PREFIX):
  """Deletes all but the newest `keep` checkpoints; returns the removed paths.

  Call it after a successful `save_native`, so the newest one is known good.
  """
  if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
    raise ValueError(f'keep must be an int >= 1; got {keep!r}.')
  existing = list_checkpoints(directory, prefix)
  removed = [p for _, p in existing[:-keep]]
  for p in removed:
    _remove_checkpoint(p)
  if removed:
    fsync_dir(os.fspath(directory))
  return removed


def latest_valid_checkpoint(directory, prefix=DEFAULT_PREFIX):
  """Path of the newest checkpoint whose files verify, or None.

  A corrupted or incomplete newer checkpoint is skipped with a warning, so a
  run killed mid-save resumes from the previous checkpoint.
  """
  for step, path in reversed(list_checkpoints(directory, prefix)):
    try:
      verify_native(path)
    except (CheckpointError, OSError) as e:
      warnings.warn(f'skipping checkpoint of step {step}: {e}', stacklevel=2)
      continue
    return path
  return None
