"""NeuralGPU against outputs of real Trax 1.4.1 (fixture in tests/fixtures/golden/models)."""
import os

import jax
import numpy as np
import pytest

from retrax import shapes
from retrax.models import neural_gpu

_GOLDEN = os.path.join(os.path.dirname(__file__), os.pardir, 'fixtures',
                       'golden', 'models')


def _golden():
  return np.load(os.path.join(_GOLDEN, 'neural_gpu.npz'))


def test_trax_checkpoint_gives_trax_logits():
  g = _golden()
  model = neural_gpu.NeuralGPU(d_feature=6, steps=3, vocab_size=5, mode='eval')
  model.init(shapes.signature(g['x']))
  model.init_from_file(os.path.join(_GOLDEN, 'neural_gpu.pkl.gz'),
                       weights_only=True)
  # The model's dropout ignores mode (as in Trax); the golden is without it:
  # a Dropout state {name: rate} overrides the rate.
  for layer in model.walk():
    if layer.name == 'Dropout':
      layer.state = {'Dropout': 0.0}
  np.testing.assert_allclose(np.asarray(model(g['x'])), g['logits'],
                             rtol=1e-5, atol=1e-5)


def test_cell_weights_are_shared_across_steps():
  x = np.zeros((1, 2, 3), np.int32)
  one = neural_gpu.NeuralGPU(d_feature=6, steps=1, vocab_size=5)
  four = neural_gpu.NeuralGPU(d_feature=6, steps=4, vocab_size=5)
  one.init(shapes.signature(x))
  four.init(shapes.signature(x))
  # Embedding, 3 convolutions (weights and bias each), Dense: 9 arrays.
  assert len(jax.tree_util.tree_leaves(one.weights)) == 9
  assert len(jax.tree_util.tree_leaves(four.weights)) == 9


def test_diagonal_gate_and_saturation_cost():
  g = _golden()
  np.testing.assert_array_equal(
      np.asarray(neural_gpu.DiagonalGate()(g['gate_x'])), g['gate_y'])
  np.testing.assert_allclose(np.asarray(neural_gpu.SaturationCost(
      np.linspace(-2, 2, 9, dtype=np.float32))), g['sat'], atol=1e-7)


def test_diagonal_gate_needs_depth_divisible_by_3():
  with pytest.raises(Exception, match='divisible by 3'):
    neural_gpu.DiagonalGate()(np.zeros((1, 1, 2, 4), np.float32))
