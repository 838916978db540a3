"""Trax's three-file set is verified as a whole; reading is size-limited.

Issue 16 items 4 and 8: the gzip CRC of the pickle is checked, sidecars are
tied to their pickle (step + sha256), a write killed at any point leaves the
old set or the new one, a missing or foreign sidecar is an error naming the
file, and no file or array header can make the reader allocate without limit.
"""

import gzip
import os
import pathlib
import pickle
import shutil
import struct
import tracemalloc

import numpy as np
import pytest

from retrax.checkpoints import CheckpointError
from retrax.checkpoints import limits
from retrax.checkpoints import npy_stream
from retrax.checkpoints import trax_format
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointLimitError
from retrax.checkpoints.errors import CheckpointNotFoundError


def _write_set(directory, step, scale=1.0):
  """A two-task set whose every array depends on `step` and `scale`."""
  os.makedirs(directory, exist_ok=True)
  w = [np.arange(6, dtype=np.float32).reshape(2, 3) * step * scale,
       np.full(3, step, np.float32)]
  slots = [[w[0] + 1, w[1] * 2], [w[1] - 1]]
  return trax_format.write_trax_loop_checkpoint(
      os.path.join(directory, 'model'), step, w, [np.array([step])],
      [np.array([step])], {'train': {'metrics/loss': [(step, 1.0 / step)]}},
      slots, None)


def _content(ckpt):
  """What a resumed run takes from a checkpoint, as comparable bytes."""
  arrays = ckpt['flat_weights'] + [a for s in ckpt['slots'] for a in s]
  return (ckpt['step'], len(ckpt['slots']), ckpt['history'],
          [a.tobytes() for a in arrays + ckpt['flat_state']])


def _one_line(e):
  assert '\n' not in str(e.value), str(e.value)


def test_every_bit_flip_of_the_pickle_is_detected_or_harmless(tmp_path):
  pkl = _write_set(tmp_path / 'a', 3)
  want = _content(trax_format.read_trax_checkpoint(pkl))
  data = pathlib.Path(pkl).read_bytes()
  positions = sorted(set(np.linspace(10, len(data) - 1, 40).astype(int)))
  positions += [len(data) - 8, len(data) - 5, len(data) - 2]  # CRC, length.
  for pos in positions:
    bad = bytearray(data)
    bad[pos] ^= 1 << (pos % 8)
    with open(pkl, 'wb') as f:
      f.write(bad)
    try:
      got = _content(trax_format.read_trax_checkpoint(pkl))
    except CheckpointError as e:
      assert '\n' not in str(e)
      continue
    assert got == want, f'a flip at byte {pos} loaded altered content'


def test_crc_trailer_is_checked(tmp_path):
  pkl = _write_set(tmp_path / 'a', 3)
  data = bytearray(pathlib.Path(pkl).read_bytes())
  data[-8] ^= 0xFF  # The CRC32 of the decompressed pickle.
  pathlib.Path(pkl).write_bytes(data)
  with pytest.raises(CheckpointCorruptedError, match='gzip') as e:
    trax_format.read_trax_checkpoint(pkl)
  _one_line(e)


@pytest.mark.parametrize('kind', ['weights', 'opt_slots0', 'opt_slots1'])
def test_a_sidecar_of_another_save_is_refused(tmp_path, kind):
  _write_set(tmp_path / 'other', 6)
  pkl = _write_set(tmp_path / 'a', 3)
  name = f'model.{kind}.npy.gz'
  shutil.copy(tmp_path / 'other' / name, tmp_path / 'a' / name)
  with pytest.raises(CheckpointCorruptedError, match=name) as e:
    trax_format.read_trax_checkpoint(pkl)
  _one_line(e)


@pytest.mark.parametrize('kind', ['weights', 'opt_slots0', 'opt_slots1'])
def test_a_missing_sidecar_is_an_error_naming_it(tmp_path, kind):
  pkl = _write_set(tmp_path / 'a', 3)
  os.remove(tmp_path / 'a' / f'model.{kind}.npy.gz')
  with pytest.raises(CheckpointNotFoundError, match=f'model.{kind}.npy.gz'):
    trax_format.read_trax_checkpoint(pkl)


def test_trax_written_set_without_slots_file_is_an_error(tmp_path):
  """Files as real Trax writes them (no checksums): opt_slots0 is required."""
  d = {'step': 2, 'flat_weights': 2, 'flat_state': [], 'flat_eval_state': [],
       'history': {'_values': {}}, 'slots_per_task': 2,
       'input_signature': None, 'version_timestamp': 'Mar-10-2021'}
  with gzip.open(tmp_path / 'model.pkl.gz', 'wb') as f:
    pickle.dump(d, f)
  npy_stream.write_npy_gz(tmp_path / 'model.weights.npy.gz', [np.ones(2)])
  with pytest.raises(CheckpointNotFoundError, match='model.opt_slots0.npy.gz'):
    trax_format.read_trax_checkpoint(tmp_path / 'model.pkl.gz')
  npy_stream.write_npy_gz(tmp_path / 'model.opt_slots0.npy.gz', [np.ones(2)])
  got = trax_format.read_trax_checkpoint(tmp_path / 'model.pkl.gz')
  assert len(got['slots']) == 1 and got['step'] == 2


class _Killed(BaseException):
  pass


@pytest.mark.parametrize('fail_at', range(8))
def test_a_write_killed_at_any_rename_leaves_the_old_or_the_new_set(
    tmp_path, monkeypatch, fail_at):
  """Stops the write of set 6 over set 3 at its `fail_at`-th rename."""
  pkl = _write_set(tmp_path / 'a', 3)
  old = _content(trax_format.read_trax_checkpoint(pkl))
  new = _content(trax_format.read_trax_checkpoint(_write_set(
      tmp_path / 'ref', 6)))
  real_replace, calls = os.replace, []

  def replace(src, dst):
    calls.append(dst)
    if len(calls) > fail_at:
      raise _Killed()
    real_replace(src, dst)

  monkeypatch.setattr(os, 'replace', replace)
  try:
    _write_set(tmp_path / 'a', 6)
    finished = True
  except _Killed:
    finished = False
  monkeypatch.setattr(os, 'replace', real_replace)
  got = _content(trax_format.read_trax_checkpoint(pkl))
  assert got == (new if finished else got)
  assert got in (old, new)
  # The set after the commit point (the pickle's rename) is the new one.
  committed = any(str(c).endswith('.pkl.gz') for c in calls[:fail_at])
  assert got == (new if committed or finished else old)
  # The next save finishes the job: Trax's names hold one consistent set and
  # no staged files are left.
  _write_set(tmp_path / 'a', 9)
  assert sorted(os.listdir(tmp_path / 'a')) == [
      'model.opt_slots0.npy.gz', 'model.opt_slots1.npy.gz', 'model.pkl.gz',
      'model.weights.npy.gz']


def test_gzip_bomb_pickle_hits_the_limit(tmp_path, monkeypatch):
  path = tmp_path / 'model.pkl.gz'
  with gzip.open(path, 'wb') as f:  # ~8 KiB compressed, 8 MiB decompressed.
    pickle.dump({'flat_weights': [np.zeros(1 << 20)]}, f, protocol=4)
  assert os.path.getsize(path) < 64 << 10
  monkeypatch.setenv(limits.ENV_VAR, str(1 << 20))
  with pytest.raises(CheckpointLimitError, match=limits.ENV_VAR) as e:
    trax_format.read_trax_checkpoint(path)
  _one_line(e)
  monkeypatch.setenv(limits.ENV_VAR, str(16 << 20))
  assert trax_format.read_trax_checkpoint(path)['flat_weights'][0].size == (
      1 << 20)
  with pytest.raises(CheckpointLimitError):
    trax_format.read_trax_checkpoint(path, max_bytes=1 << 20)
  monkeypatch.setenv(limits.ENV_VAR, 'lots')
  with pytest.raises(ValueError, match=limits.ENV_VAR):
    trax_format.read_trax_checkpoint(path)


def _npy_header(shape, descr='<f8'):
  header = repr({'descr': descr, 'fortran_order': False, 'shape': shape})
  header = header.encode('latin1').ljust(118) + b'\n'
  return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(header)) + header


def test_huge_array_header_claims_are_refused_without_allocating(tmp_path):
  path = tmp_path / 'model.weights.npy.gz'
  with gzip.open(path, 'wb') as f:
    f.write(_npy_header((10 ** 12,)))
  assert os.path.getsize(path) < 300
  with pytest.raises(CheckpointLimitError, match='record #0') as e:
    npy_stream.read_npy_gz(path)
  _one_line(e)
  # A claim under the limit but with no data behind it: an error, and the
  # reader never holds more than the data that is really there.
  with gzip.open(path, 'wb') as f:
    f.write(_npy_header((1 << 30,)) + bytes(1000))
  tracemalloc.start()
  try:
    with pytest.raises(CheckpointCorruptedError, match='cut short'):
      npy_stream.read_npy_gz(path, max_bytes=1 << 40)
    _, peak = tracemalloc.get_traced_memory()
  finally:
    tracemalloc.stop()
  assert peak < 64 << 20


def test_npy_stream_total_size_is_limited(tmp_path):
  path = tmp_path / 'model.weights.npy.gz'
  npy_stream.write_npy_gz(path, [np.zeros(1000)] * 5)  # 5 x 8000 bytes.
  assert len(npy_stream.read_npy_gz(path, max_bytes=50_000)) == 5
  with pytest.raises(CheckpointLimitError, match='decompressed content'):
    npy_stream.read_npy_gz(path, max_bytes=30_000)
  with pytest.raises(CheckpointLimitError, match='record #0'):
    npy_stream.read_npy_gz(path, max_bytes=7_000)
