"""A predict-mode efficient attention initialized for a larger batch decodes a smaller one.

Trax sizes the predict state by the initialization signature (for
`init_from_file` without a signature: the file's training batch) and then
decodes batch-1 inputs with it; the outputs are those of a layer initialized
for batch 1. Here the reference is that batch-1 layer, with the same weights.
"""

import functools

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes

D_MODEL, N_HEADS, STEPS = 8, 2, 12


def _attention(batch, use_reference_code=False):
  layer = tl.SelfAttention(n_heads=N_HEADS, d_qk=4, d_v=4, causal=True,
                           mode='predict', predict_mem_len=8,
                           predict_drop_len=4,
                           use_reference_code=use_reference_code)
  layer.init(shapes.ShapeDtype((batch, 1, D_MODEL), np.float32),
             rng=jax.random.PRNGKey(1))
  return layer


@pytest.mark.parametrize('use_reference_code', [False, True])
def test_batch1_on_batch4_state_equals_batch1_layer(use_reference_code):
  big = _attention(4, use_reference_code)
  small = _attention(1, use_reference_code)
  np.testing.assert_array_equal(np.asarray(big.weights[0]),
                                np.asarray(small.weights[0]))
  shapes_before = [np.shape(x) for x in jax.tree_util.tree_leaves(big.state)]
  xs = np.random.RandomState(0).randn(STEPS, 1, 1, D_MODEL).astype(np.float32)
  for x in xs:  # 12 steps: the 8-position memory drops its oldest 4 twice.
    np.testing.assert_allclose(np.asarray(big(x)), np.asarray(small(x)),
                               rtol=1e-5, atol=1e-6)
  # The state keeps its batch-4 shapes; example 0's memory is the small one's.
  assert [np.shape(x) for x in jax.tree_util.tree_leaves(big.state)] == (
      shapes_before)
  np.testing.assert_allclose(np.asarray(big.state[1][0][:1]),
                             np.asarray(small.state[1][0]), atol=1e-6)
  assert not np.asarray(big.state[1][0][1:]).any()  # Other rows untouched.


def test_batch_larger_than_state_is_a_clear_error():
  # A one-example state serves any batch (copied per example); a state of
  # two examples cannot serve three.
  layer = _attention(2)
  with pytest.raises(Exception, match=r'holds 2 example\(s\) but the input has '
                     r'batch size 3'):
    layer(np.zeros((3, 1, D_MODEL), np.float32))


def test_reformer_lm_predict_from_training_batch_state():
  """ReformerLM in predict mode, initialized for batch 4, decodes batch 1 like eval."""
  kwargs = dict(vocab_size=16, d_model=16, d_ff=32, n_layers=2, n_heads=2,
                d_attention_key=8, d_attention_value=8, max_len=32,
                pos_axial_shape=None)
  attention = functools.partial(tl.SelfAttention, predict_mem_len=16,
                                predict_drop_len=16)
  predict = models.ReformerLM(attention_type=attention, mode='predict',
                              **kwargs)
  predict.init(shapes.ShapeDtype((4, 1), np.int32), rng=jax.random.PRNGKey(2))
  evaluate = models.ReformerLM(mode='eval', **kwargs)
  evaluate.init(shapes.ShapeDtype((1, 10), np.int32))
  evaluate.weights = predict.weights
  tokens = np.array([[0, 5, 3, 9, 1, 0, 5, 3, 9, 1]], np.int32)
  expected = np.asarray(evaluate(tokens))
  # Predict mode has no ShiftRight: feed the start symbol, then tokens[:-1].
  fed = np.concatenate([[0], tokens[0, :-1]])
  got = np.stack([np.asarray(predict(np.array([[t]], np.int32)))[0, 0]
                  for t in fed])
  np.testing.assert_allclose(got, expected[0], rtol=1e-4, atol=1e-5)
