"""ConfigurableTransformer{,LM,Encoder}.

Trax goldens, Trax's weight layout, predict mode, options.
"""

import os

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import shapes
from retrax.checkpoints import trax_format
from retrax.models.research import configurable_transformer as ct

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'research')
SEED = 17  # make_configurable_goldens.py

# The constructor calls of make_configurable_goldens.py (run under Trax).
CASES = {
    'ct_lm': lambda mode: ct.ConfigurableTransformerLM(
        vocab_size=32, d_model=16, d_ff=32, n_layers=2, n_heads=2,
        max_len=32, mode=mode),
    'ct_lm_options': lambda mode: ct.ConfigurableTransformerLM(
        vocab_size=32, d_model=16, d_ff=32, n_layers=2, n_heads=2,
        max_len=32, pos_type='fixed-base', loss_sparsity=2, ff_use_sru=(1, 8),
        attention_type=tl.MultiplicativeCausalAttention, mode=mode),
    'ct_encdec': lambda mode: ct.ConfigurableTransformer(
        input_vocab_size=32, output_vocab_size=24, d_model=16, d_ff=32,
        n_encoder_layers=2, n_decoder_layers=2, n_heads=2, max_len=32,
        mode=mode),
    'ct_encoder': lambda mode: ct.ConfigurableTransformerEncoder(
        vocab_size=32, n_classes=5, d_model=16, d_ff=32, n_layers=2,
        n_heads=2, max_len=32, mode=mode),
}



def _golden(name):
  io = np.load(os.path.join(GOLDEN, name + '.npz'))
  inputs = tuple(io[f'input{i}'] for i in range(2) if f'input{i}' in io)
  return (inputs if len(inputs) > 1 else inputs[0]), io['outputs']


def _first(out):
  return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize('name', sorted(CASES))
def test_trax_checkpoint_gives_trax_outputs(name):
  x, want = _golden(name)
  model = CASES[name]('eval')
  model.init(shapes.signature(x))
  model.init_from_file(os.path.join(GOLDEN, name + '.pkl.gz'),
                       weights_only=False,
                       input_signature=shapes.signature(x))
  got, _ = jax.jit(model.pure_fn)(x, model.weights, model.state, model.rng)
  np.testing.assert_allclose(np.asarray(_first(got)), want, atol=1e-5,
                             rtol=1e-5)


@pytest.mark.parametrize('name', sorted(CASES))
def test_weight_and_state_leaves_are_trax_leaves(name):
  x, _ = _golden(name)
  ckpt = trax_format.read_trax_checkpoint(
      os.path.join(GOLDEN, name + '.pkl.gz'))
  weights, state = CASES[name]('eval').init(shapes.signature(x))
  assert ([np.shape(w) for w in jax.tree_util.tree_leaves(weights)] ==
          [np.shape(w) for w in ckpt['flat_weights']])
  assert ([np.shape(s) for s in jax.tree_util.tree_leaves(state)] ==
          [np.shape(s) for s in ckpt['flat_state']])


@pytest.mark.parametrize('name', sorted(CASES))
def test_seeded_init_equals_trax_init(name, threefry_not_partitionable):
  """The same seed gives Trax's initial weights, leaf for leaf."""
  del threefry_not_partitionable
  x, _ = _golden(name)
  ckpt = trax_format.read_trax_checkpoint(
      os.path.join(GOLDEN, name + '.pkl.gz'))
  weights, _ = CASES[name]('eval').init(shapes.signature(x),
                                        rng=fastmath.random.get_prng(SEED))
  for i, (ours, theirs) in enumerate(zip(jax.tree_util.tree_leaves(weights),
                                         ckpt['flat_weights'])):
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-6,
                               err_msg=f'weight leaf {i}')


def test_axial_shape_string_is_ignored_as_in_trax():
  """Trax's test passes pos_type names as pos_axial_shape: a learned table results."""
  layer = ct.PositionalEncoder('eval', dropout=0.0, max_len=8,
                               pos_axial_shape='infinite',
                               pos_d_axial_embs=(4, 4))
  weights, _ = layer.init(shapes.ShapeDtype((1, 8, 8)))
  assert [w.shape for w in jax.tree_util.tree_leaves(weights)] == [(8, 8)]
