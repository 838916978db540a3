"""Residual Shuffle-Exchange networks (`models.research.rse`).

References: Trax 1.4.1's weights, outputs and gradients
(`fixtures/golden/rse/make_rse_goldens.py`) for the RSU, Benes blocks
(length 8, and 6, where the shuffles clip) and the whole model (eval, and
train with dropout); the shuffles' closed forms (perfect shuffle = bit
rotation, inverse of each other, identity after log2(L) applications).
"""

import os

import jax
import numpy as np
import pytest

from retrax import models
from retrax import shapes
from retrax.models.research import rse
from tests.layers.research import golden_leaves as gl

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'rse', 'goldens.npz')
CALL_SEED = 11

# Same constructor arguments as make_rse_goldens.py.
CASES = {
    'rsu': (lambda m: rse.ResidualSwitchUnit(6, dropout=0.0, mode=m,
                                              residual_weight=0.8), 'eval'),
    'benes': (lambda m: rse.BenesBlock(6, 0.0, m), 'eval'),
    'benes_len6': (lambda m: rse.BenesBlock(4, 0.0, m), 'eval'),
    'rse': (lambda m: models.ResidualShuffleExchange(
        vocab_size=7, d_model=6, input_dropout=0.0, dropout=0.0, mode=m,
        n_blocks=2), 'eval'),
    'rse_train': (lambda m: rse.ResidualShuffleExchange(
        vocab_size=7, d_model=6, input_dropout=0.1, dropout=0.2, mode=m,
        n_blocks=1), 'train'),
}
GRAD_CASES = ('rsu', 'benes', 'rse')


@pytest.fixture(scope='module')
def golden():
  with np.load(GOLDEN) as f:
    return dict(f)


@pytest.fixture(autouse=True)
def trax_random_bits():
  with jax.threefry_partitionable(False):
    yield


def _loaded(golden, name):
  make, mode = CASES[name]
  layer = make(mode)
  return (layer,) + gl.loaded(golden, name, layer)


@pytest.mark.parametrize('name', sorted(CASES))
def test_outputs_match_trax(golden, name):
  layer, _, arg, weights, state = _loaded(golden, name)
  y, _ = gl.call(layer, arg, weights, state, jax.random.PRNGKey(CALL_SEED))
  gl.close(y, golden[f'{name}/out0'])


@pytest.mark.parametrize('name', GRAD_CASES)
def test_gradients_match_trax(golden, name):
  layer, inputs, _, weights, state = _loaded(golden, name)
  gw, gx = gl.grads(layer, inputs, weights, state,
                    jax.random.PRNGKey(CALL_SEED))(golden[f'{name}/ct'])
  gl.close_trees(gw, gl.group(golden, name, 'gw'))
  gl.close_trees(gx, gl.group(golden, name, 'gx'))


@pytest.mark.parametrize('n', [6, 8, 16])
def test_shuffles_match_trax(golden, n):
  x = np.arange(n, dtype=np.float32).reshape((1, n, 1))
  np.testing.assert_array_equal(np.asarray(rse.ShuffleLayer()(x)),
                                golden[f'shuffle_{n}/out0'])
  np.testing.assert_array_equal(np.asarray(rse.ReverseShuffleLayer()(x)),
                                golden[f'reverse_shuffle_{n}/out0'])


@pytest.mark.parametrize('n_bits', [2, 3, 4])
def test_shuffles_are_bit_rotations_and_inverses(n_bits):
  n = 2**n_bits
  x = np.arange(n, dtype=np.float32).reshape((1, n, 1))
  rol = [((j << 1) & (n - 1)) | (j >> (n_bits - 1)) for j in range(n)]
  shuffled = np.asarray(rse.ShuffleLayer()(x))
  np.testing.assert_array_equal(shuffled[0, :, 0], rol)
  np.testing.assert_array_equal(np.asarray(rse.ReverseShuffleLayer()(shuffled)),
                                x)
  y = x
  for _ in range(n_bits):
    y = np.asarray(rse.ShuffleLayer()(y))
  np.testing.assert_array_equal(y, x)


def test_rsu_at_init_is_scaled_identity_plus_switch():
  """S starts at logit(residual_weight), so the shortcut is residual_weight * x."""
  layer = rse.ResidualSwitchUnit(4, dropout=0.0, mode='eval',
                                 residual_weight=0.7)
  x = np.random.RandomState(0).normal(size=(1, 4, 4)).astype(np.float32)
  weights, _ = layer.init(shapes.signature(x))
  scaling = [w for w in jax.tree_util.tree_leaves(weights) if w.shape == (8,)]
  np.testing.assert_allclose(1 / (1 + np.exp(-np.asarray(scaling[0]))), 0.7,
                             rtol=1e-6)


def test_bad_arguments_raise_clear_errors():
  with pytest.raises(ValueError, match=r'residual_weight must be in \(0, 1\)'):
    rse.ResidualSwitchUnit(4, residual_weight=1.0)
  layer = rse.ResidualSwitchUnit(4)
  with pytest.raises(Exception, match=r'length \(5\) must be even'):
    layer.init(shapes.ShapeDtype((1, 5, 4), np.float32))
  with pytest.raises(ValueError, match='n_blocks must be an int >= 0'):
    rse.ResidualShuffleExchange(7, 6, 0.0, 0.0, n_blocks=-1)
