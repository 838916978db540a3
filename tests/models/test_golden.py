"""Models load checkpoints written by real Trax 1.4.1 and reproduce its outputs."""

import functools
import os

import jax
import numpy as np
import pytest

import retrax as trax
from retrax import layers as tl
from retrax import shapes
from retrax.checkpoints import trax_format

GOLDEN = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'golden')


def _reformer_copy(mode):
  return trax.models.ReformerLM(
      vocab_size=32, d_model=32, d_ff=128, n_layers=2, n_heads=2,
      d_attention_key=16, d_attention_value=16, max_len=64, mode=mode)


def _reformer_lsh(mode):
  return trax.models.ReformerLM(
      vocab_size=32, d_model=32, d_ff=64, n_layers=2, n_heads=2,
      d_attention_key=16, d_attention_value=16, max_len=64,
      attention_type=functools.partial(tl.LSHSelfAttention, n_hashes=2,
                                       chunk_len=8), mode=mode)


def _transformer_lm(mode):
  return trax.models.TransformerLM(vocab_size=32, d_model=32, d_ff=64,
                                   n_layers=2, n_heads=2, max_len=64, mode=mode)


CASES = [
    ('reformerlm_copy', _reformer_copy),
    ('reformerlm_copy_trainer', _reformer_copy),
    ('transformerlm', _transformer_lm),
    ('reformerlm_lsh', _reformer_lsh),
]



@pytest.mark.parametrize('name,make', CASES, ids=[c[0] for c in CASES])
def test_golden_logits_match_trax(name, make, threefry_not_partitionable):
  del threefry_not_partitionable
  io = np.load(os.path.join(GOLDEN, name, 'io.npz'))
  x = io['inputs']
  model = make('eval')
  model.init(shapes.signature(x))
  model.init_from_file(os.path.join(GOLDEN, name, 'model.pkl.gz'),
                       weights_only=False)
  logits, _ = jax.jit(model.pure_fn)(x, model.weights, model.state, model.rng)
  np.testing.assert_allclose(np.asarray(logits), io['logits'], rtol=1e-4,
                             atol=2e-5)
  log_probs = tl.log_softmax(logits)
  np.testing.assert_allclose(np.asarray(log_probs), io['log_probs'], rtol=1e-4,
                             atol=2e-5)


@pytest.mark.parametrize('name,make', CASES, ids=[c[0] for c in CASES])
def test_weight_tree_leaves_match_trax(name, make):
  """The flat weight/state leaves of our model have Trax's shapes, in Trax's order."""
  io = np.load(os.path.join(GOLDEN, name, 'io.npz'))
  ckpt = trax_format.read_trax_checkpoint(
      os.path.join(GOLDEN, name, 'model.pkl.gz'))
  model = make('eval')
  weights, state = model.init(shapes.signature(io['inputs']))
  # Trax's order (`fastmath.tree_leaves`): JAX sees a ReversibleSerial's
  # repeated blocks as stacked arrays, Trax-order code as per-layer leaves.
  ours_w = [np.shape(w) for w in trax.fastmath.tree_leaves(weights)]
  ours_s = [np.shape(s) for s in trax.fastmath.tree_leaves(state)]
  assert ours_w == [np.shape(w) for w in ckpt['flat_weights']]
  assert ours_s == [np.shape(s) for s in ckpt['flat_state']]


def test_reformer_printout_like_trax():
  """Printing ReformerLM shows Trax's structure (the RevNet lab's expected output)."""
  text = str(trax.models.ReformerLM(vocab_size=33000, n_layers=2, mode='train'))
  expected_start = ('Serial[\n  Serial[\n    ShiftRight(1)\n  ]\n'
                    '  Embedding_33000_512\n  Dropout\n  Serial[\n'
                    '    PositionalEncoding\n  ]\n  Dup_out2\n'
                    '  ReversibleSerial_in2_out2[\n')
  assert text.startswith(expected_start)
  assert text.count('ReversibleHalfResidualDecoderAttn_in2_out2[') == 2
  assert text.count('ReversibleSwap_in2_out2') == 4
  assert ('        Dense_2048\n        Dropout\n        Serial[\n'
          '          FastGelu\n        ]\n        Dense_512\n') in text
  assert text.endswith('  Concatenate_in2\n  LayerNorm\n  Dropout\n'
                       '  Serial[\n    Dense_33000\n  ]\n]')
