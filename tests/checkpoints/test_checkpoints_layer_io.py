"""Tests for layer_io, with a stand-in object that has Trax's layer interface."""

import numpy as np
import pytest

from checkpoint_testlib import readme_reformerlm_copy_tree
from retrax.checkpoints import layer_io
from retrax.checkpoints import native
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.checkpoints.errors import TreeStructureError
from retrax.checkpoints.tree import tree_leaves
from retrax.shapes import ShapeDtype


def _as_signature(tree):
  if isinstance(tree, tuple):
    return tuple(_as_signature(t) for t in tree)
  return ShapeDtype(tree.shape, np.float32)


class StandInLayer:
  """Just the layer interface layer_io relies on."""

  def __init__(self, weights_sig, state_sig, n_in=1):
    self._sig = (weights_sig, state_sig)
    self.n_in = n_in
    self.weights = self.state = None
    self.init_calls, self.signature_calls = [], []

  def _zeros(self, tree):
    if isinstance(tree, tuple):
      return tuple(self._zeros(t) for t in tree)
    return np.full(tree.shape, -1.0, tree.dtype)

  def init(self, input_signature):
    self.init_calls.append(input_signature)
    self.weights, self.state = self._zeros(self._sig[0]), self._zeros(
        self._sig[1])

  def weights_and_state_signature(self, input_signature):
    self.signature_calls.append(input_signature)
    return self._sig


def _reformer_copy_layer():
  state_sig = ((ShapeDtype(()), (ShapeDtype(()),) * 4), ShapeDtype(()))
  return StandInLayer(_as_signature(readme_reformerlm_copy_tree()), state_sig)


def test_init_from_golden_loop_and_trainer(golden):
  for model in ('reformerlm_copy', 'reformerlm_copy_trainer'):
    layer = _reformer_copy_layer()
    path = golden / model / 'model.pkl.gz'
    weights, state = layer_io.init_layer_from_file(layer, path)
    flat = layer_io.read_flat_checkpoint(path)[0]
    assert len(tree_leaves(weights)) == len(flat) == 30
    assert all(a.tobytes() == b.tobytes()
               for a, b in zip(tree_leaves(weights), flat))
    assert weights[1].shape == (32, 32) and weights[3][1].shape == (64, 32)
    assert [float(s) for s in tree_leaves(state)] == [np.float32(0.1)] * 6
    # The trainer stored (inputs, targets, weights); the model gets inputs only.
    assert layer.signature_calls == [(ShapeDtype((16, 10), np.int32),)]
    assert layer.init_calls == []


def test_save_and_weights_only_reload(tmp_path):
  w_sig = (ShapeDtype((2, 3)), (), (ShapeDtype((3,)),))
  s_sig = (ShapeDtype((), np.int32),)
  layer = StandInLayer(w_sig, s_sig)
  layer.weights = (np.arange(6, dtype=np.float32).reshape(2, 3), (),
                   (np.ones(3, np.float32),))
  layer.state = (np.array(5, np.int32),)
  sig = ShapeDtype((1, 2), np.int32)
  layer_io.save_layer_to_file(layer, tmp_path / 'l.pkl.gz', input_signature=sig)

  fresh = StandInLayer(w_sig, s_sig)
  layer_io.init_layer_from_file(fresh, tmp_path / 'l.pkl.gz')
  np.testing.assert_array_equal(fresh.weights[0], layer.weights[0])
  assert fresh.weights[1] == () and int(fresh.state[0]) == 5

  predict = StandInLayer(w_sig, s_sig)
  layer_io.init_layer_from_file(predict, tmp_path / 'l.pkl.gz',
                                weights_only=True)
  assert predict.init_calls == [sig]
  np.testing.assert_array_equal(predict.weights[2][0], np.ones(3))
  assert int(predict.state[0]) == -1  # Fresh state from init, not the file's.

  layer_io.save_layer_to_file(layer, tmp_path / 'w.pkl.gz', weights_only=True,
                              input_signature=sig)
  with pytest.raises(CheckpointFormatError, match='weights_only=True'):
    layer_io.init_layer_from_file(StandInLayer(w_sig, s_sig),
                                  tmp_path / 'w.pkl.gz')


def test_mismatched_layer_is_reported_with_path(golden):
  w_sig = _as_signature(readme_reformerlm_copy_tree(d_ff=64))
  layer = StandInLayer(w_sig, ())
  with pytest.raises(TreeStructureError, match=r'weights\[5\]\[2\]\[0\]\[1\]\[0\]'):
    layer_io.init_layer_from_file(
        layer, golden / 'reformerlm_copy' / 'model.pkl.gz', weights_only=True)


def test_init_from_native_checkpoint(tmp_path):
  w_sig = (ShapeDtype((2,)), ShapeDtype((3,)))
  w = (np.array([1.0, 2.0], np.float32), np.zeros(3, np.float32))
  native.save_native(tmp_path / 'n', {
      'weights': w, 'state': (), 'input_signature': ShapeDtype((1, 2))})
  layer = StandInLayer(w_sig, ())
  layer_io.init_layer_from_file(layer, tmp_path / 'n')
  np.testing.assert_array_equal(layer.weights[0], w[0])
  assert layer.state == () and layer.signature_calls == [ShapeDtype((1, 2))]
