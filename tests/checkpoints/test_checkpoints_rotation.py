"""Tests for a directory of native checkpoints: rotation and fallback."""

import os

import numpy as np
import pytest

from retrax.checkpoints import CheckpointFormatError
from retrax.checkpoints import native
from retrax.checkpoints import rotation


def _arrays_file(path):
  [name] = [n for n in os.listdir(path) if n.endswith('.safetensors')]
  return os.path.join(path, name)


def test_rotation_and_latest_valid(tmp_path):
  for step in (1, 2, 3, 10, 11):
    native.save_native(rotation.checkpoint_path(tmp_path, step),
                       {'w': [np.full(2, step)]}, {'step': step})
  (tmp_path / 'unrelated').mkdir()
  assert [s for s, _ in rotation.list_checkpoints(tmp_path)] == [1, 2, 3, 10, 11]
  removed = rotation.rotate_checkpoints(tmp_path, keep=3)
  assert [os.path.basename(p) for p in removed] == ['ckpt_000000001',
                                                    'ckpt_000000002']
  assert [s for s, _ in rotation.list_checkpoints(tmp_path)] == [3, 10, 11]
  assert rotation.latest_valid_checkpoint(tmp_path) == rotation.checkpoint_path(
      tmp_path, 11)
  # Newest corrupted, the one before left incomplete: fall back to step 3.
  arrays = _arrays_file(rotation.checkpoint_path(tmp_path, 11))
  with open(arrays, 'r+b') as f:
    f.truncate(10)
  os.remove(os.path.join(rotation.checkpoint_path(tmp_path, 10),
                         native.METADATA_FILE))
  with pytest.warns(UserWarning) as record:
    latest = rotation.latest_valid_checkpoint(tmp_path)
  messages = [str(w.message) for w in record]
  assert len(messages) == 2
  assert 'step 11' in messages[0] and 'truncated' in messages[0]
  assert 'step 10' in messages[1] and 'metadata.json' in messages[1]
  assert latest == rotation.checkpoint_path(tmp_path, 3)
  assert native.load_native(latest).metadata['step'] == 3
  with pytest.raises(ValueError, match='keep'):
    rotation.rotate_checkpoints(tmp_path, keep=0)
  assert rotation.latest_valid_checkpoint(tmp_path / 'nothing_here') is None


def _save(directory, step, recorded=None, name_prefix='ckpt_'):
  return native.save_native(
      rotation.checkpoint_path(directory, step, name_prefix),
      {'w': [np.full(2, step)]}, {'step': step if recorded is None else
                                  recorded})


def test_rotation_orders_by_recorded_step_and_keeps_damaged_ones(tmp_path):
  """Issue 16 item 3: damaged newest-named checkpoints neither evict a fresh
  one nor get deleted; incomplete saves go."""
  for step in (5, 20, 21):
    _save(tmp_path, step)
  for step in (20, 21):
    with open(_arrays_file(rotation.checkpoint_path(tmp_path, step)),
              'r+b') as f:
      f.truncate(10)
  half = rotation.checkpoint_path(tmp_path, 30)  # A save killed early.
  os.makedirs(half)
  open(os.path.join(half, '.arrays.abcdefgh.tmp'), 'wb').close()
  _save(tmp_path, 6)
  reports = []
  removed = rotation.rotate_checkpoints(tmp_path, keep=1,
                                        report=reports.append)
  assert sorted(os.path.basename(p) for p in removed) == [
      'ckpt_000000005', 'ckpt_000000030']
  assert [s for s, _ in rotation.list_checkpoints(tmp_path)] == [6, 20, 21]
  assert len(reports) == 2 and all('kept' in r for r in reports)
  with pytest.warns(UserWarning):
    assert rotation.latest_valid_checkpoint(tmp_path) == (
        rotation.checkpoint_path(tmp_path, 6))


def test_name_and_recorded_step_mismatch_is_refused(tmp_path):
  _save(tmp_path, 3)
  _save(tmp_path, 999, recorded=3)
  with pytest.raises(CheckpointFormatError, match='ckpt_000000999') as e:
    rotation.latest_valid_checkpoint(tmp_path)
  assert 'records step 3' in str(e.value)
  with pytest.raises(CheckpointFormatError, match='ckpt_000000999'):
    rotation.rotate_checkpoints(tmp_path, keep=1)
  assert len(rotation.list_checkpoints(tmp_path)) == 2  # Nothing deleted.


def test_rotation_deletes_only_what_a_save_wrote_never_through_a_link(
    tmp_path):
  """Issue 29 item 2: a symlinked checkpoint and one holding a user's file
  are kept (and reported); the others go, file by file."""
  run, elsewhere = tmp_path / 'run', tmp_path / 'elsewhere'
  run.mkdir()
  _save(elsewhere, 1)
  os.symlink(rotation.checkpoint_path(elsewhere, 1),
             rotation.checkpoint_path(run, 1))
  for step in (2, 3, 4):
    _save(run, step)
  (tmp_path / 'run' / 'ckpt_000000002' / 'notes.txt').write_text('mine')
  messages = []
  removed = rotation.rotate_checkpoints(run, keep=1, report=messages.append)
  assert removed == [rotation.checkpoint_path(run, 3)]
  assert native.verify_native(rotation.checkpoint_path(elsewhere, 1))
  assert (run / 'ckpt_000000002' / 'notes.txt').read_text() == 'mine'
  assert native.verify_native(rotation.checkpoint_path(run, 2))['step'] == 2
  assert any('symbolic link' in m for m in messages)
  assert any('notes.txt' in m for m in messages)
