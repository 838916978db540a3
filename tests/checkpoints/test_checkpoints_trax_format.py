"""Tests for reading and writing Trax's checkpoint layouts."""

import gzip
import io
import pathlib
import pickle
import warnings

import ml_dtypes
import numpy as np
import pytest

from checkpoint_testlib import LOOP_MODELS
from checkpoint_testlib import pickle_globals
from checkpoint_testlib import readme_reformerlm_copy_tree
from checkpoint_testlib import ReferenceUnpickler
from retrax.checkpoints import trax_format
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.records import TraxShapeDtype
from retrax.checkpoints.tree import tree_leaves
from retrax.shapes import ShapeDtype

KEYS = {'format', 'step', 'flat_weights', 'flat_state', 'flat_eval_state',
        'slots', 'history', 'input_signature', 'opt_params',
        'version_timestamp'}


def _read(golden, model):
  return trax_format.read_trax_checkpoint(golden / model / 'model.pkl.gz')


def _same_arrays(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert type(x) is type(y) is np.ndarray
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


def _readme_shapes(model):
  if model == 'reformerlm_copy':
    tree = readme_reformerlm_copy_tree()
  elif model == 'reformerlm_lsh':
    tree = readme_reformerlm_copy_tree(d_ff=64, lsh=True)
  else:
    return None
  return [leaf.shape for leaf in tree_leaves(tree)]


@pytest.mark.parametrize('model', LOOP_MODELS)
def test_golden_loop_checkpoint(golden, golden_config, model):
  ckpt = _read(golden, model)
  assert set(ckpt) == KEYS and ckpt['format'] == 'loop'
  assert ckpt['step'] == golden_config[model]['train_steps']
  assert ckpt['version_timestamp'] == 'Mar-10-2021'
  weights = ckpt['flat_weights']
  assert all(w.dtype == np.float32 for w in weights)
  expected = _readme_shapes(model)
  if expected is not None:
    assert [w.shape for w in weights] == expected
  # Adam slots: m and v per weight, in weight order.
  assert len(ckpt['slots']) == 1
  assert [m.shape for m in ckpt['slots'][0]] == [
      w.shape for w in weights for _ in range(2)]
  # Every Dropout's state is its rate (0.1 in config.json) as 0-d float32.
  rates = [s for s in ckpt['flat_state'] if s.shape == ()]
  assert rates and all(s.dtype == np.float32 and s == np.float32(0.1)
                       for s in rates)
  sig = ckpt['input_signature']
  assert len(sig) == 1 and isinstance(sig[0], TraxShapeDtype)
  assert sig[0].dtype == np.int32 and len(sig[0].shape) == 2
  assert set(ckpt['history']) == {'train', 'eval'}


def test_golden_lsh_state_shapes(golden, golden_config):
  """README: buckets int32 (n_heads*batch, n_hashes*len), rng uint32 (.., 2)."""
  ckpt = _read(golden, 'reformerlm_lsh')
  batch, length = golden_config['reformerlm_lsh']['input_shape']
  n_heads, n_hashes = 2, 2
  lsh = [(s.shape, s.dtype) for s in ckpt['flat_state'] if s.shape != ()]
  assert lsh == [((n_heads * batch, n_hashes * length), np.int32),
                 ((n_heads * batch, 2), np.uint32)] * 2
  assert len(ckpt['flat_eval_state']) == len(ckpt['flat_state'])


def test_trainer_and_loop_give_the_same_kinds_of_data(golden):
  loop = _read(golden, 'reformerlm_copy')
  trainer = _read(golden, 'reformerlm_copy_trainer')
  assert trainer['format'] == 'trainer' and trainer['step'] == 100
  assert set(trainer) == set(loop) == KEYS
  for key in ('flat_weights', 'flat_state', 'flat_eval_state'):
    assert [(a.shape, a.dtype) for a in trainer[key]] == [
        (a.shape, a.dtype) for a in loop[key]]
    assert all(type(a) is np.ndarray for a in trainer[key] + loop[key])
  assert len(trainer['slots']) == len(loop['slots']) == 1
  assert [a.shape for a in trainer['slots'][0]] == [
      a.shape for a in loop['slots'][0]]
  for ckpt in (loop, trainer):
    for metrics in ckpt['history'].values():
      for entries in metrics.values():
        assert all(type(s) is int and type(v) is float for s, v in entries)
  assert trainer['history']['eval']['metrics/accuracy'] == [(100, 0.046875)]
  assert set(trainer['opt_params']) == {'b1', 'b2', 'eps', 'learning_rate',
                                        'weight_decay_rate'}
  assert [s.shape for s in trainer['input_signature']] == [(16, 10)] * 3


def test_signature_conversion_hook(golden):
  ckpt = trax_format.read_trax_checkpoint(
      golden / 'reformerlm_copy' / 'model.pkl.gz',
      shape_dtype_factory=ShapeDtype)
  assert ckpt['input_signature'] == (ShapeDtype((16, 10), np.int32),)


def _write_like(ckpt, base):
  return trax_format.write_trax_loop_checkpoint(
      base, ckpt['step'], ckpt['flat_weights'], ckpt['flat_state'],
      ckpt['flat_eval_state'], ckpt['history'], ckpt['slots'],
      ckpt['input_signature'])


@pytest.mark.parametrize('model', LOOP_MODELS)
def test_loop_write_read_round_trip(golden, tmp_path, model):
  ckpt = _read(golden, model)
  pkl = _write_like(ckpt, tmp_path / 'model')
  assert pkl == str(tmp_path / 'model.pkl.gz')
  back = trax_format.read_trax_checkpoint(pkl)
  for key in ('flat_weights', 'flat_state', 'flat_eval_state'):
    _same_arrays(back[key], ckpt[key])
  _same_arrays(back['slots'][0], ckpt['slots'][0])
  assert back['history'] == ckpt['history']
  assert back['step'] == ckpt['step'] and back['format'] == 'loop'
  assert back['input_signature'] == ckpt['input_signature']
  # The npy records are byte-identical to the ones Trax wrote.
  for kind in ('weights', 'opt_slots0'):
    ours = gzip.decompress(pathlib.Path(tmp_path / f'model.{kind}.npy.gz').read_bytes())
    theirs = gzip.decompress(pathlib.Path(golden / model / f'model.{kind}.npy.gz').read_bytes())
    assert ours == theirs


def test_written_loop_checkpoint_reads_like_trax_reads_it(golden, tmp_path,
                                                          fake_trax):
  """Trax's own reading steps (stdlib pickle, np.load loop) on our files."""
  ckpt = _read(golden, 'reformerlm_copy')
  pkl = _write_like(ckpt, tmp_path / 'model')
  data = gzip.decompress(pathlib.Path(pkl).read_bytes())
  assert pickle_globals(data) <= {
      ('numpy.core.multiarray', '_reconstruct'), ('numpy', 'ndarray'),
      ('numpy', 'dtype'), ('numpy.core.multiarray', 'scalar'),
      ('collections', 'defaultdict'), ('builtins', 'list'),
      ('trax.shapes', 'ShapeDtype')}
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    d = ReferenceUnpickler(io.BytesIO(data)).load()
  assert d['flat_weights'] == 2 and d['slots_per_task'] == 2
  assert d['version_timestamp'] == 'Mar-10-2021' and d['step'] == 300
  assert type(d['input_signature'][0]) is fake_trax.ShapeDtype
  assert d['input_signature'][0].shape == (16, 10)
  _same_arrays(d['flat_state'], ckpt['flat_state'])
  weights = []
  with gzip.open(tmp_path / 'model.weights.npy.gz') as f:
    while True:
      try:
        weights.append(np.load(f, allow_pickle=False))
      except Exception:
        break
  _same_arrays(weights, ckpt['flat_weights'])
  acc = d['history']['_values']['eval']['metrics/WeightedCategoryAccuracy']
  assert acc == [(1, 0.046875)]


def test_loop_bfloat16_weights_are_bit_cast(tmp_path):
  w = [np.array([1.0, -2.5, 0.007], ml_dtypes.bfloat16), np.ones(2, np.float32)]
  state = [np.array([3.0], ml_dtypes.bfloat16)]
  sig = ShapeDtype((2, 3), np.int32)
  pkl = trax_format.write_trax_loop_checkpoint(
      tmp_path / 'ckpt', 5, w, state, state, {}, [w + w], sig)
  raw = trax_format.read_trax_checkpoint(pkl)
  assert raw['flat_weights'][0].dtype == np.uint16
  assert raw['flat_weights'][0].tobytes() == w[0].tobytes()
  assert raw['flat_state'][0].dtype == ml_dtypes.bfloat16  # Pickled as is.
  restored = trax_format.read_trax_checkpoint(pkl, restore_bfloat16=True)
  _same_arrays(restored['flat_weights'], w)
  _same_arrays(restored['slots'][0], w + w)
  assert restored['input_signature'] == TraxShapeDtype((2, 3), np.int32)


def test_layer_file_round_trip(tmp_path):
  w = [np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros(3, np.float32)]
  s = [np.array(0.1, np.float32)]
  sig = (ShapeDtype((1, 4), np.int32),)
  trax_format.write_trax_layer_file(tmp_path / 'l.pkl.gz', w, s, sig)
  back = trax_format.read_trax_checkpoint(tmp_path / 'l.pkl.gz')
  assert back['format'] == 'layer' and back['step'] is None
  _same_arrays(back['flat_weights'], w)
  _same_arrays(back['flat_state'], s)
  assert back['slots'] == [] and back['history'] == {}
  assert back['input_signature'] == (TraxShapeDtype((1, 4), np.int32),)
  trax_format.write_trax_layer_file(tmp_path / 'w.pkl.gz', w)
  back = trax_format.read_trax_checkpoint(tmp_path / 'w.pkl.gz')
  assert back['flat_state'] is None and back['input_signature'] is None


def test_legacy_1_2_plain_pickle(tmp_path, fake_trax):
  """A Trax 1.2.x `model.pkl`: plain pickle, nested trees, History object."""
  emb, w, b = np.ones((4, 2), np.float32), np.ones((2, 2)), np.zeros(2)
  weights = ((), emb, ((), (w, b)), ())
  slots = ((), (emb * 0, emb * 0), ((), ((w * 0, w * 0), (b * 0, b * 0))), ())
  history = fake_trax.History()
  history._values = {'eval': {'metrics/accuracy': [(10, np.float32(0.5))]}}
  d = {'step': 10, 'weights': weights, 'loss_weights': (), 'slots': slots,
       'opt_params': {'learning_rate': np.float32(0.1)}, 'history': history,
       'state': ((), (np.array(0.1, np.float32),)), 'loss_state': (),
       'version_timestamp': 'Jan-13-2020'}
  path = tmp_path / 'model.pkl'
  path.write_bytes(pickle.dumps(d, protocol=3))
  ckpt = trax_format.read_trax_checkpoint(path)
  assert ckpt['format'] == 'legacy_pkl' and ckpt['step'] == 10
  _same_arrays(ckpt['flat_weights'], [emb, w, b])
  _same_arrays(ckpt['flat_state'], [np.array(0.1, np.float32)])
  assert [a.shape for a in ckpt['slots'][0]] == [(4, 2)] * 2 + [(2, 2)] * 2 + [
      (2,)] * 2
  assert ckpt['history'] == {'eval': {'metrics/accuracy': [(10, 0.5)]}}


def test_older_loop_with_inline_weights_and_slots(tmp_path, fake_trax):
  w = [np.ones(3, np.float32)]
  d = {'step': 4, 'flat_weights': w, 'flat_state': [],
       'slots_per_task': [[(w[0] * 2, w[0] * 3)]],
       'history': {'_values': {}},
       'input_signature': (fake_trax.ShapeDtype((2, 3), np.int32),)}
  path = tmp_path / 'model.pkl.gz'
  with gzip.open(path, 'wb') as f:
    pickle.dump(d, f)
  ckpt = trax_format.read_trax_checkpoint(path)
  assert ckpt['format'] == 'loop'
  _same_arrays(ckpt['slots'][0], [w[0] * 2, w[0] * 3])
  _same_arrays(ckpt['flat_eval_state'], [])


def test_bad_files(tmp_path):
  path = tmp_path / 'x.pkl.gz'
  with gzip.open(path, 'wb') as f:
    pickle.dump({'something': 1}, f)
  with pytest.raises(CheckpointFormatError, match='not a Trax checkpoint'):
    trax_format.read_trax_checkpoint(path)
  with gzip.open(path, 'wb') as f:
    pickle.dump([1, 2], f)
  with pytest.raises(CheckpointFormatError, match='dict'):
    trax_format.read_trax_checkpoint(path)
  with gzip.open(path, 'wb') as f:
    pickle.dump({'flat_weights': 2, 'step': 1, 'flat_state': []}, f)
  with pytest.raises(FileNotFoundError, match='npy'):
    trax_format.read_trax_checkpoint(path)
