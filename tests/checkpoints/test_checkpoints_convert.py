"""Tests for converting between Trax and native checkpoints."""

import numpy as np
import pytest

from retrax.checkpoints import convert
from retrax.checkpoints import native
from retrax.checkpoints.trax_format import read_trax_checkpoint
from retrax.shapes import ShapeDtype


def _same(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.dtype == y.dtype and x.shape == y.shape
    assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize('model', ['reformerlm_lsh', 'reformerlm_copy_trainer'])
def test_trax_native_trax_round_trip(golden, tmp_path, model):
  src = golden / model / 'model.pkl.gz'
  out = convert.convert(src, tmp_path / 'native')
  assert native.is_native_checkpoint(out)
  back = convert.convert(out, tmp_path / 'model')
  assert back == str(tmp_path / 'model.pkl.gz')
  a, b = read_trax_checkpoint(src), read_trax_checkpoint(back)
  assert b['format'] == 'loop' and b['step'] == a['step']
  for key in ('flat_weights', 'flat_state', 'flat_eval_state'):
    _same(b[key], a[key])
  _same(b['slots'][0], a['slots'][0])
  assert b['history'] == a['history']
  assert b['input_signature'] == a['input_signature']


def test_native_training_checkpoint_slots_become_trax_slot_files(tmp_path):
  w = ((), (np.ones((2, 3), np.float32), np.zeros(3, np.float32)))
  momentum = ((), (np.full((2, 3), 0.5, np.float32), np.full(3, 2.0, np.float32)))
  native.save_native(tmp_path / 'n', {
      'weights': w, 'state': (np.array(0.1, np.float32),),
      'slots': [momentum], 'input_signature': ShapeDtype((1, 2))},
                     {'step': 9})
  pkl = convert.convert(tmp_path / 'n', tmp_path / 'out.pkl.gz', to='trax')
  ckpt = read_trax_checkpoint(pkl)
  _same(ckpt['flat_weights'], [w[1][0], w[1][1]])
  assert len(ckpt['slots']) == 1
  _same(ckpt['slots'][0], [momentum[1][0], momentum[1][1]])
  assert ckpt['step'] == 9
  _same(ckpt['flat_eval_state'], [np.array(0.1, np.float32)])


def test_native_without_slots(tmp_path):
  native.save_native(tmp_path / 'n', {'weights': [np.ones(2, np.float32)]},
                     {'step': 2})
  ckpt = read_trax_checkpoint(convert.convert(tmp_path / 'n',
                                              tmp_path / 'out', to='trax'))
  assert ckpt['slots'] == [] and ckpt['step'] == 2


def test_bad_requests(golden, tmp_path):
  with pytest.raises(ValueError, match='already a trax'):
    convert.convert(golden / 'reformerlm_copy' / 'model.pkl.gz', tmp_path / 'x',
                    to='trax')
  with pytest.raises(FileNotFoundError):
    convert.convert(tmp_path / 'missing', tmp_path / 'x')
