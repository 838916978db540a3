"""Adam against a NumPy re-implementation of Trax's rule."""

import glob
import gzip
import pathlib

import numpy as np
import pytest

from retrax import optimizers


def adam_init(w):
  return (np.zeros_like(w), np.zeros_like(w))


def adam_update(step, g, w, slots, p):
  m, v = slots
  m = (1 - p['b1']) * g + p['b1'] * m
  v = (1 - p['b2']) * g * g + p['b2'] * v
  m_hat = m / (1 - p['b1']**(step + 1))
  v_hat = v / (1 - p['b2']**(step + 1))
  w = (1 - p['weight_decay_rate']) * w - p['learning_rate'] * m_hat / (
      np.sqrt(v_hat) + p['eps'])
  return w, (m, v)


def test_defaults_are_trax_defaults():
  params = optimizers.Adam().opt_params
  assert {k: float(v) for k, v in params.items()} == pytest.approx(
      dict(learning_rate=1e-4, weight_decay_rate=1e-5, b1=0.9, b2=0.999,
           eps=1e-5))
  assert optimizers.Adam().clip_grad_norm is None


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=0.01),
    dict(learning_rate=0.05, weight_decay_rate=0.05, clip_grad_norm=1.0),
    dict(learning_rate=0.02, b1=0.5, b2=0.9, eps=1e-3),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  check_optimizer(optimizers.Adam(**kwargs), adam_init, adam_update,
                  tree_case)


def test_later_steps_use_their_bias_correction(tree_case, check_optimizer):
  check_optimizer(optimizers.Adam(0.01), adam_init, adam_update, tree_case,
                  steps=(10, 11, 12, 13))


def test_slots_are_m_and_v_per_weight_array(tree_case):
  slots, _ = optimizers.Adam().tree_init(tree_case.weights)
  w = tree_case.weights
  leaves = [w[0], w[3][0], w[3][1][0], w[3][2], w[4]]
  assert isinstance(slots, tuple) and len(slots) == len(leaves)
  for slot, w in zip(slots, leaves):
    assert isinstance(slot, tuple) and len(slot) == 2
    assert all(s.shape == np.shape(w) and not np.any(s) for s in slot)


def _read_npy_records(path):
  arrays = []
  with gzip.open(path, 'rb') as f:
    while True:
      try:
        arrays.append(np.load(f, allow_pickle=False))
      except (EOFError, ValueError):
        return arrays


_GOLDEN_DIR = pathlib.Path(__file__).parents[1] / 'fixtures' / 'golden'
_GOLDEN = sorted(glob.glob(str(_GOLDEN_DIR / '*' / 'model.opt_slots0.npy.gz')))


@pytest.mark.skipif(not _GOLDEN, reason='Trax golden checkpoints not present')
@pytest.mark.parametrize('slots_path', _GOLDEN,
                         ids=[pathlib.Path(p).parent.name for p in _GOLDEN])
def test_slot_layout_maps_onto_trax_adam_checkpoint(slots_path):
  weights = _read_npy_records(slots_path.replace('opt_slots0', 'weights'))
  trax_slots = _read_npy_records(slots_path)
  # A weight tree in Trax's shape: leaves interleaved with weightless layers.
  tree = tuple((w, ()) for w in weights) + ({'__marker_for_cached_weights_':
                                              ()},)
  slots, _ = optimizers.Adam().tree_init(tree)
  ours = [s for slot in slots for s in slot]
  assert [s.shape for s in ours] == [s.shape for s in trax_slots]
  # Trax's second moments are non-negative, first moments take both signs.
  assert all(np.all(v >= 0) for v in trax_slots[1::2])
  assert any(np.any(m < 0) for m in trax_slots[0::2])
