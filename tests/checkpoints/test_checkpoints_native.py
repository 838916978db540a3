"""Tests for the native safetensors + JSON checkpoint format."""

import collections
import json
import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from retrax.checkpoints import native
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.trax_format import read_trax_checkpoint
from retrax.checkpoints.tree import GET_STATE_FROM_CACHE
from retrax.checkpoints.tree import GET_WEIGHTS_FROM_CACHE
from retrax.checkpoints.tree import tree_leaves
from retrax.checkpoints.tree import unflatten_like
from retrax.shapes import ShapeDtype

AdamState = collections.namedtuple('AdamState', 'count mu nu')


def _sample_trees():
  rng = np.random.default_rng(0)
  weights = (
      (), rng.standard_normal((4, 3)).astype(np.float32),
      GET_WEIGHTS_FROM_CACHE,
      [rng.standard_normal(5).astype(ml_dtypes.bfloat16),
       jnp.arange(3, dtype=jnp.bfloat16), None],
      {'z': np.array(2.5, np.float64), 'a': np.arange(4, dtype=np.int8)},
      np.array([1 + 2j, 3 - 1j], np.complex128),
      np.array([0.5, -1.0], ml_dtypes.float8_e4m3fn),
      np.zeros((0, 7), np.float16), np.array([True, False]),
      np.arange(3, dtype='>u4'), np.uint64(2**63 + 5))
  state = (GET_STATE_FROM_CACHE, np.array(0.1, np.float32), 7, 2.0 / 3,
           float('inf'), 'name', b'\x00\xff', True, ())
  slots = AdamState(np.int32(3), (np.ones(2),), {'w': np.full(2, 0.5)})
  return {'weights': weights, 'state': state, 'slots': slots,
          'rng': jax.random.key(42), 'old_rng': jax.random.PRNGKey(7),
          'input_signature': (ShapeDtype((4, None), np.int32),)}


def _assert_identical(a, b, path='root'):
  if isinstance(b, jax.Array) and jax.dtypes.issubdtype(
      b.dtype, jax.dtypes.prng_key):
    assert jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key), path
    np.testing.assert_array_equal(jax.random.key_data(a),
                                  jax.random.key_data(b))
  elif isinstance(b, (np.ndarray, jax.Array)):
    b = np.asarray(b)
    assert type(a) is np.ndarray, path
    assert a.dtype.newbyteorder('=') == b.dtype.newbyteorder('='), path
    assert a.shape == b.shape, path
    assert a.astype(a.dtype.newbyteorder('<')).tobytes() == b.astype(
        b.dtype.newbyteorder('<')).tobytes(), path
  elif isinstance(b, np.generic):
    assert type(a) is type(b) and a.tobytes() == b.tobytes(), path
  elif isinstance(b, tuple) and hasattr(b, '_fields'):
    assert type(a).__name__ == type(b).__name__ and a._fields == b._fields
    for f in b._fields:
      _assert_identical(getattr(a, f), getattr(b, f), f'{path}.{f}')
  elif isinstance(b, (list, tuple)):
    assert type(a) is type(b) and len(a) == len(b), path
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_identical(x, y, f'{path}[{i}]')
  elif isinstance(b, dict):
    assert type(a) is dict and list(a) == list(b), path
    for k in b:
      _assert_identical(a[k], b[k], f'{path}[{k!r}]')
  else:
    assert type(a) is type(b) and a == b, path


def test_round_trip_is_exact(tmp_path):
  trees = _sample_trees()
  meta = {'step': 12, 'history': {'eval': {'acc': [[1, np.float32(0.5)]]}},
          'note': 'x', 'nan': float('nan')}
  native.save_native(tmp_path / 'ck', trees, meta)
  ckpt = native.load_native(tmp_path / 'ck')
  assert list(ckpt.trees) == list(trees)
  for name in trees:
    _assert_identical(ckpt.trees[name], trees[name], name)
  assert ckpt.metadata['step'] == 12 and ckpt.metadata['note'] == 'x'
  assert ckpt.metadata['history'] == {'eval': {'acc': [[1, 0.5]]}}
  assert np.isnan(ckpt.metadata['nan'])
  # Markers and () survive exactly, so the weights unflatten as before.
  assert ckpt.trees['weights'][2] == GET_WEIGHTS_FROM_CACHE
  assert ckpt.trees['state'][0] == GET_STATE_FROM_CACHE
  # The exact optax-like class comes back through a live template.
  slots = unflatten_like(tree_leaves(ckpt.trees['slots']), trees['slots'])
  assert type(slots) is AdamState


def test_golden_weights_survive_native(golden, tmp_path):
  ckpt = read_trax_checkpoint(golden / 'reformerlm_lsh' / 'model.pkl.gz')
  native.save_native(tmp_path / 'n', {
      'weights': ckpt['flat_weights'], 'state': ckpt['flat_state'],
      'slots': ckpt['slots']}, {'step': ckpt['step'],
                                'history': ckpt['history']})
  back = native.load_native(tmp_path / 'n')
  _assert_identical(back.trees['weights'], ckpt['flat_weights'])
  _assert_identical(back.trees['state'], ckpt['flat_state'])
  _assert_identical(back.trees['slots'], ckpt['slots'])
  assert back.metadata['step'] == 100


def _arrays_file(path):
  [name] = [n for n in os.listdir(path) if n.endswith('.safetensors')]
  return os.path.join(path, name)


@pytest.fixture
def saved(tmp_path):
  path = tmp_path / 'ck'
  native.save_native(path, {'w': [np.arange(1000, dtype=np.float32)]},
                     {'step': 3})
  return path


def test_truncated_arrays_detected(saved):
  arrays = _arrays_file(saved)
  with open(arrays, 'r+b') as f:
    f.truncate(os.path.getsize(arrays) - 100)
  with pytest.raises(CheckpointCorruptedError, match='truncated'):
    native.load_native(saved)


def test_flipped_byte_detected(saved):
  arrays = _arrays_file(saved)
  with open(arrays, 'rb') as f:
    data = bytearray(f.read())
  data[len(data) // 2] ^= 0x01
  with open(arrays, 'wb') as f:
    f.write(bytes(data))
  with pytest.raises(CheckpointCorruptedError, match='sha256'):
    native.load_native(saved)


def test_edited_or_truncated_metadata_detected(saved):
  meta = saved / native.METADATA_FILE
  doc = json.loads(meta.read_text())
  doc['metadata']['step'] = 4  # Valid JSON, wrong content.
  meta.write_text(json.dumps(doc))
  with pytest.raises(CheckpointCorruptedError, match='checksum'):
    native.verify_native(saved)
  text = meta.read_text()
  meta.write_text(text[:len(text) // 2])
  with pytest.raises(CheckpointCorruptedError, match='JSON'):
    native.load_native(saved)


def test_missing_pieces(tmp_path, saved):
  os.remove(_arrays_file(saved))
  with pytest.raises(CheckpointCorruptedError, match='missing'):
    native.load_native(saved)
  with pytest.raises(CheckpointCorruptedError, match='metadata.json'):
    native.load_native(tmp_path)
  other = tmp_path / 'other'
  other.mkdir()
  (other / native.METADATA_FILE).write_text('{"format": "something-else"}')
  with pytest.raises(CheckpointFormatError, match='not a retrax-native'):
    native.load_native(other)


def test_overwrite_is_atomic_even_if_interrupted(saved, monkeypatch):
  native.save_native(saved, {'w': [np.ones(3)]}, {'step': 4})
  assert native.load_native(saved).metadata['step'] == 4
  assert len([n for n in os.listdir(saved) if n.endswith('.safetensors')]) == 1

  def crash(*args, **kwargs):
    raise KeyboardInterrupt('killed while writing metadata')

  monkeypatch.setattr(native, 'atomic_write', crash)
  with pytest.raises(KeyboardInterrupt):
    native.save_native(saved, {'w': [np.zeros(5)]}, {'step': 5})
  # The interrupted save left the previous checkpoint whole.
  ckpt = native.load_native(saved)
  assert ckpt.metadata['step'] == 4
  np.testing.assert_array_equal(ckpt.trees['w'][0], np.ones(3))


def test_unsupported_values_are_named(tmp_path):
  with pytest.raises(TypeError, match=r"weights\[1\]\['k'\]"):
    native.save_native(tmp_path / 'a', {'weights': (1, {'k': object()})})
  with pytest.raises(TypeError, match='dtype object'):
    native.save_native(tmp_path / 'b', {'w': np.array([None, 1])})
  with pytest.raises(TypeError, match='JSON-able'):
    native.save_native(tmp_path / 'c', {}, {'x': np.zeros(3)})
  with pytest.raises(TypeError, match='keys must be str'):
    native.save_native(tmp_path / 'd', {'w': {1: np.zeros(1)}})
