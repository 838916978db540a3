"""Sharded native checkpoints (format version 2) with a fake 2-process layout:
each "process" writes the pieces it holds, process 0 commits; loading
assembles the whole arrays. The real 2-process run is in
tests/supervised/test_sharded_runs.py."""

import json
import os

import ml_dtypes
import numpy as np
import pytest

from retrax.checkpoints import native
from retrax.checkpoints import rotation
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointError
from retrax.checkpoints.errors import CheckpointFormatError

_TOKEN = '0123456789abcdef'


def _arrays():
  rng = np.random.default_rng(0)
  return {'w': rng.normal(size=(8, 6)).astype(np.float32),
          'b': rng.normal(size=(4, 10)).astype(ml_dtypes.bfloat16),
          'small': np.arange(3, dtype=np.int32)}


def _trees(p, arrays):
  """What process `p` of 2 passes: its half of `w` (rows) and of `b`
  (columns); `small` is replicated (whole on each)."""
  w, b = arrays['w'], arrays['b']
  rows = slice(4 * p, 4 * p + 4)
  cols = (slice(None), slice(5 * p, 5 * p + 5))
  return {'weights': (native.Shards(w.shape, w.dtype, [((rows,), w[rows])]),
                      {'b': native.Shards(b.shape, b.dtype, [(cols, b[cols])]),
                       'small': arrays['small']}),
          'rng': np.array([1, 2], np.uint32)}


def _save(path, arrays, oks=(True, True), token=_TOKEN):
  """Process 1, then process 0 (the barrier lets 0 commit after both)."""
  for p in (1, 0):
    native.save_native_sharded(path, _trees(p, arrays), {'step': 3},
                               process_index=p, process_count=2, token=token,
                               all_ok=lambda ok: list(oks))


def test_each_process_writes_its_half_and_load_assembles_the_whole(tmp_path):
  path, arrays = str(tmp_path / 'ckpt_000000003'), _arrays()
  _save(path, arrays)
  names = sorted(os.listdir(path))
  shards = [n for n in names if n.startswith('shards_')]
  assert shards == [f'shards_0000{p}_of_00002.{_TOKEN}.safetensors'
                    for p in (0, 1)], names  # The .json tables went.
  with open(os.path.join(path, native.METADATA_FILE)) as f:
    doc = json.load(f)
  assert doc['version'] == native.SHARDED_FORMAT_VERSION
  for table in doc['shard_files']:
    assert sorted(e['key'] for e in table['pieces']) == [
        'weights/0', 'weights/1/b']
  whole = arrays['w'].nbytes + arrays['b'].nbytes
  sizes = [os.path.getsize(os.path.join(path, n)) for n in shards]
  assert all(0.5 * whole < s < 0.5 * whole + 400 for s in sizes), sizes
  loaded = native.load_native(path)
  w, rest = loaded.trees['weights']
  np.testing.assert_array_equal(w, arrays['w'])
  assert rest['b'].dtype == arrays['b'].dtype
  np.testing.assert_array_equal(rest['b'].view(np.uint16),
                                arrays['b'].view(np.uint16))
  np.testing.assert_array_equal(rest['small'], arrays['small'])
  assert loaded.metadata == {'step': 3}
  assert native.verify_native(path) == {'step': 3}


def test_a_save_that_never_committed_is_ignored(tmp_path):
  arrays = _arrays()
  old = str(tmp_path / 'ckpt_000000003')
  _save(old, arrays)
  # Process 1 failed: the shards of the others are written, nothing commits.
  new = str(tmp_path / 'ckpt_000000006')
  with pytest.raises(CheckpointError, match='process'):
    _save(new, {k: v + 1 for k, v in arrays.items()}, oks=(True, False),
          token='fedcba9876543210')
  assert rotation.check_entry(new, 6).incomplete
  said = []
  assert rotation.newest_usable(str(tmp_path), report=said.append) == (old,
                                                                      [])
  assert 'incomplete' in said[0]
  assert rotation.rotate_checkpoints(str(tmp_path), 3) == [new]
  # Over an existing checkpoint: the previous one still loads as it was.
  with pytest.raises(CheckpointError):
    _save(old, {k: v + 1 for k, v in arrays.items()}, oks=(False, True),
          token='fedcba9876543210')
  np.testing.assert_array_equal(native.load_native(old).trees['weights'][0],
                                arrays['w'])
  _save(old, arrays, token='00000000000000aa')  # The next save cleans up.
  assert not [n for n in os.listdir(old) if 'fedcba' in n or _TOKEN in n]


def test_a_damaged_or_missing_shards_file_is_reported(tmp_path):
  path = str(tmp_path / 'c')
  _save(path, _arrays())
  shard = os.path.join(path, f'shards_00001_of_00002.{_TOKEN}.safetensors')
  with open(shard, 'r+b') as f:
    f.seek(-3, os.SEEK_END)
    f.write(b'xyz')
  with pytest.raises(CheckpointCorruptedError, match='sha256'):
    native.verify_native(path)
  os.remove(shard)
  with pytest.raises(CheckpointCorruptedError, match='missing'):
    native.load_native(path)


def test_pieces_that_do_not_cover_the_array_are_refused(tmp_path):
  path, arrays = str(tmp_path / 'c'), _arrays()
  trees = [_trees(p, arrays) for p in (0, 1)]
  trees[1]['weights'][0].pieces = []  # Process 1 lost its rows of `w`.
  for p in (1, 0):
    native.save_native_sharded(path, trees[p], {}, process_index=p,
                               process_count=2, token=_TOKEN,
                               all_ok=lambda ok: [True, True])
  with pytest.raises(CheckpointFormatError, match='cover'):
    native.load_native(path)


def test_save_native_refuses_shards():
  with pytest.raises(TypeError, match='save_native_sharded'):
    native.save_native('/nonexistent', _trees(0, _arrays()))


def _save_pieces(path, w_pieces, shape=(8, 6)):
  """A save whose split array `w` (recorded `shape`) has `w_pieces[p]`
  (row slices) in process p's file."""
  w = np.arange(48, dtype=np.float32).reshape(8, 6)
  for p in (1, 0):
    tree = {'w': native.Shards(shape, w.dtype, [((rows, slice(0, 6)), w[rows])
                                                for rows in w_pieces[p]])}
    native.save_native_sharded(path, tree, {}, process_index=p,
                               process_count=2, token=_TOKEN,
                               all_ok=lambda ok: [True, True])


def test_a_shape_claiming_more_than_the_files_hold_is_refused_unallocated(
    tmp_path):
  path = str(tmp_path / 'c')
  _save_pieces(path, [[slice(0, 4)], [slice(4, 8)]], shape=(2 ** 20, 2 ** 20))
  # 2**40 float32s: 4 TiB, a MemoryError had it been allocated.
  with pytest.raises(CheckpointFormatError, match='1099511627776'):
    native.load_native(path)


def test_overlapping_pieces_are_refused(tmp_path):
  path = str(tmp_path / 'c')
  _save_pieces(path, [[slice(0, 6)], [slice(2, 8)]])  # All rows, 2 twice.
  with pytest.raises(CheckpointFormatError, match='exactly: they hold 72'):
    native.load_native(path)
  path = str(tmp_path / 'd')
  _save_pieces(path, [[slice(0, 4)], [slice(0, 4)]])  # As many values.
  with pytest.raises(CheckpointFormatError, match='two pieces of the shards'):
    native.load_native(path)
