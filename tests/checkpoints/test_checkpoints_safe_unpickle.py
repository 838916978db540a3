"""Tests for the restricted unpickler: golden files load, malicious ones never run."""

import collections
import gzip
import io
import os
import pathlib
import pickle

import numpy as np
import pytest

from checkpoint_testlib import ALL_MODELS
from checkpoint_testlib import ReferenceUnpickler
from retrax.checkpoints import records
from retrax.checkpoints.errors import CheckpointCorruptedError
from retrax.checkpoints.errors import UnsafeCheckpointError
from retrax.checkpoints.safe_unpickle import safe_load
from retrax.checkpoints.safe_unpickle import safe_loads
from retrax.checkpoints.trax_format import read_trax_checkpoint


def _assert_same(ours, ref, path='<root>'):
  """Deep equality: arrays bitwise with dtype, records by their fields."""
  if isinstance(ref, np.ndarray):
    assert type(ours) is np.ndarray, path
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, path
    assert ours.tobytes() == ref.tobytes(), path
  elif isinstance(ref, np.generic):
    assert type(ours) is type(ref) and ours.tobytes() == ref.tobytes(), path
  elif type(ref).__name__ == 'ShapeDtype':
    assert isinstance(ours, records.TraxShapeDtype), path
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, path
  elif type(ref).__name__ == 'History':
    assert isinstance(ours, records.TraxHistory), path
    _assert_same(ours._values, ref._values, path + '._values')
  elif isinstance(ref, dict):
    assert type(ours) is type(ref) and list(ours) == list(ref), path
    for k in ref:
      _assert_same(ours[k], ref[k], f'{path}[{k!r}]')
  elif isinstance(ref, (list, tuple)):
    assert type(ours) is type(ref) and len(ours) == len(ref), path
    for i, (a, b) in enumerate(zip(ours, ref)):
      _assert_same(a, b, f'{path}[{i}]')
  else:
    assert type(ours) is type(ref) and ours == ref, path


@pytest.mark.parametrize('model', ALL_MODELS)
def test_golden_pickles_match_unrestricted_reference(golden, fake_trax, model):
  data = gzip.decompress(pathlib.Path(golden / model / 'model.pkl.gz').read_bytes())
  ours = safe_loads(data)
  ref = ReferenceUnpickler(io.BytesIO(data)).load()
  _assert_same(ours, ref)


class _RunsCommand:
  """Pickles as a call of os.system: what a booby-trapped checkpoint holds."""

  def __init__(self, command):
    self.command = command

  def __reduce__(self):
    return (os.system, (self.command,))


class _WritesFile:
  """Pickles as a call of builtins.exec that writes a file."""

  def __init__(self, target):
    self.target = target

  def __reduce__(self):
    return (exec, (f'with open({self.target!r}, "w") as f: f.write("pwned")',))


def _evil_checkpoint(payload):
  # A Trax-looking dict with the payload hidden among the weights.
  return pickle.dumps({'flat_weights': [np.zeros(3), payload],
                       'flat_state': [], 'input_signature': None},
                      protocol=pickle.HIGHEST_PROTOCOL)


@pytest.mark.parametrize('make', [
    lambda p: _RunsCommand(f'touch {p}'),
    lambda p: _WritesFile(str(p)),
])
def test_malicious_pickle_is_refused_without_side_effect(tmp_path, make):
  marker = tmp_path / 'side_effect'
  data = _evil_checkpoint(make(marker))
  with pytest.raises(UnsafeCheckpointError) as e:
    safe_loads(data)
  assert 'refused global' in str(e.value)
  assert ('system' in str(e.value)) or ('exec' in str(e.value))
  assert not marker.exists()
  # The same through the file reader, gzipped like a real checkpoint.
  path = tmp_path / 'model.pkl.gz'
  with gzip.open(path, 'wb') as f:
    f.write(data)
  with pytest.raises(UnsafeCheckpointError):
    read_trax_checkpoint(path)
  assert not marker.exists()
  # Control: the stdlib unpickler would have run it.
  pickle.loads(data)
  assert marker.exists()


def test_admitted_names_cannot_be_steered():
  # An object array (its dtype) is refused even with only admitted globals.
  with pytest.raises(UnsafeCheckpointError, match='dtype'):
    safe_loads(pickle.dumps(np.array([1, 'a'], dtype=object)))
  # defaultdict may only default to builtin containers/numbers.
  bad = collections.defaultdict(np.dtype)
  with pytest.raises(UnsafeCheckpointError, match='defaultdict'):
    safe_loads(pickle.dumps(bad))
  # bytes(n) would allocate n bytes: refused.
  with pytest.raises(UnsafeCheckpointError, match='bytes'):
    safe_loads(b'\x80\x04cbuiltins\nbytes\nJ\x00\xe1\xf5\x05\x85R.')
  # numpy.ndarray may only appear as _reconstruct's argument, never be called.
  with pytest.raises(UnsafeCheckpointError, match='ndarray'):
    safe_loads(b'\x80\x04cnumpy\nndarray\nK\x03\x85R.')
  # BUILD on an admitted function (to rewrite its defaults) is refused.
  build_on_global = (b'\x80\x04\x8c\x05numpy\x8c\x05dtype\x93N}'
                     b'\x8c\x0c__defaults__)s\x86b.')
  with pytest.raises(UnsafeCheckpointError, match='BUILD'):
    safe_loads(build_on_global)


def test_plain_values_and_records_load():
  obj = {'a': (1, 2.5, 'x', b'y', None, True), 's': {1, 2},
         'od': collections.OrderedDict(k=[np.float32(1.5)]),
         'dd': collections.defaultdict(list, {'m': [(1, np.arange(3))]})}
  out = safe_loads(pickle.dumps(obj, protocol=5))
  assert out['a'] == obj['a'] and out['s'] == {1, 2}
  assert out['od'] == obj['od'] and type(out['od']) is collections.OrderedDict
  assert type(out['dd']) is collections.defaultdict
  np.testing.assert_array_equal(out['dd']['m'][0][1], np.arange(3))
  assert type(out['dd']['m'][0][1]) is np.ndarray


def test_truncated_pickle_is_reported_as_corrupted():
  data = pickle.dumps({'flat_weights': [np.arange(100.0)]})
  with pytest.raises(CheckpointCorruptedError, match='truncated'):
    safe_load(io.BytesIO(data[:len(data) // 2]))


# `pickle.dumps({'input_signature': trax.shapes.ShapeDtype((1, 8), np.int32)},
# protocol=5)` under Trax 1.4.1: Trax keeps the dtype as given, so the pickle
# names the scalar type `numpy.int32` (a global) rather than a dtype.
_TRAX_INT32_SIGNATURE = (
    b'\x80\x05\x95f\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x0finput_signature'
    b'\x94\x8c\x0btrax.shapes\x94\x8c\nShapeDtype\x94\x93\x94)\x81\x94N}\x94('
    b'\x8c\x05shape\x94K\x01K\x08\x86\x94\x8c\x05dtype\x94\x8c\x05numpy\x94'
    b'\x8c\x05int32\x94\x93\x94u\x86\x94bs.')


def _trax_signature(fake_trax, dtype):
  sig = fake_trax.ShapeDtype((1, 8))
  sig.dtype = dtype  # As Trax's ShapeDtype keeps it: the type, not a dtype.
  return sig


def test_shape_dtype_holding_a_numpy_scalar_type_loads(fake_trax):
  sig = _trax_signature(fake_trax, np.int32)
  data = pickle.dumps({'input_signature': sig}, protocol=5)
  assert data == _TRAX_INT32_SIGNATURE  # The stand-in pickles as Trax does.
  ours = safe_loads(data)['input_signature']
  assert isinstance(ours, records.TraxShapeDtype)
  assert ours.shape == (1, 8) and ours.dtype == np.int32
  for dtype in (np.float32, np.bool_, np.uint8, np.int64, np.float16,
                np.complex64):
    for protocol in (2, 4, 5):
      data = pickle.dumps(_trax_signature(fake_trax, dtype), protocol=protocol)
      assert safe_loads(data).dtype == np.dtype(dtype)


def test_layer_inits_from_a_file_whose_signature_holds_a_scalar_type(
    tmp_path, fake_trax):
  from retrax import fastmath
  from retrax import layers as tl
  model = tl.Serial(tl.Embedding(16, 4), tl.Dense(2))
  sig = _trax_signature(fake_trax, np.int32)
  model.init(records.convert_shape_dtypes(sig))
  path = tmp_path / 'model.pkl.gz'
  with gzip.open(path, 'wb') as f:
    pickle.dump({'flat_weights': [np.asarray(w) for w in fastmath.tree_flatten(
        model.weights)], 'flat_state': [], 'input_signature': sig}, f,
                protocol=5)
  loaded = tl.Serial(tl.Embedding(16, 4), tl.Dense(2))
  loaded.init_from_file(str(path))
  x = np.arange(8, dtype=np.int32).reshape(1, 8)
  np.testing.assert_array_equal(loaded(x), model(x))


@pytest.mark.parametrize('name', [b'object_', b'str_', b'void', b'load',
                                  b'ndarray.tofile', b'bool8'])
def test_other_numpy_globals_stay_refused(name):
  data = b'\x80\x04\x8c\x05numpy\x8c' + bytes([len(name)]) + name + b'\x93.'
  with pytest.raises(UnsafeCheckpointError, match='refused global'):
    safe_loads(data)


def test_admitted_scalar_types_cannot_be_steered():
  # Resolved as an inert dtype copy: calling it with arguments fails ...
  with pytest.raises(CheckpointCorruptedError, match='not callable'):
    safe_loads(b'\x80\x04\x8c\x05numpy\x8c\x05int32\x93K\x05\x85R.')
  # ... and a BUILD turning the copy into an object dtype is refused, with
  # numpy's own int32 dtype left untouched.
  object_state = np.dtype(object).__reduce__()[2]
  build = (b'\x80\x04\x8c\x05numpy\x8c\x05int32\x93' +
           pickle.dumps(object_state, protocol=4)[2:-1] + b'b.')
  with pytest.raises(UnsafeCheckpointError, match='object'):
    safe_loads(build)
  assert not np.dtype(np.int32).hasobject
