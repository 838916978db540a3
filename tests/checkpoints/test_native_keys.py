"""Native checkpoint arrays are keyed by their tree path; numbered files still load."""

import glob
import os

import numpy as np
import safetensors.numpy as st_numpy

from retrax.checkpoints import native

FIXTURE = os.path.join(os.path.dirname(__file__), '..', 'fixtures',
                       'native_numbered_keys')


def _keys(path):
  return sorted(st_numpy.load_file(glob.glob(os.path.join(
      path, 'arrays.*.safetensors'))[0]))


def test_keys_are_tree_paths(tmp_path):
  weights = ((np.ones(2),), (np.zeros(3), {'a/b': np.ones(1),
                                            'a': {'b': np.full(1, 2.0)}}))
  path = native.save_native(str(tmp_path / 'c'), {'weights': weights,
                                                  'rng': np.arange(2)})
  assert _keys(path) == ['rng', 'weights/0/0', 'weights/1/0',
                         'weights/1/1/a/b', 'weights/1/1/a/b#1']
  back = native.load_native(path).trees['weights']
  np.testing.assert_array_equal(back[1][1]['a/b'], [1.0])
  np.testing.assert_array_equal(back[1][1]['a']['b'], [2.0])


def test_checkpoint_with_numbered_keys_still_loads():
  # Written by the previous encoder (keys `weights/0`, `weights/1`, ...).
  assert _keys(FIXTURE) == ['state/0', 'weights/0', 'weights/1', 'weights/2']
  ckpt = native.load_native(FIXTURE)
  w = ckpt.trees['weights']
  np.testing.assert_array_equal(w[0][0], np.arange(6).reshape(2, 3))
  np.testing.assert_array_equal(w[1][0], [0.5, 0.5, 0.5])
  np.testing.assert_array_equal(w[1][1], [7, 8])
  assert w[1][1].dtype == np.int32
  np.testing.assert_array_equal(ckpt.trees['state'][1][0], [1.0])
  assert ckpt.metadata == {'step': 5}
