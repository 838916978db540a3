"""retrax.layers.test_utils and retrax.test_utils (Trax's test helpers)."""

import functools

import numpy as np
import pytest

from retrax import layers as tl
from retrax import test_utils
from retrax.layers import test_utils as ltu


def _causal_model(mode):
  return tl.Serial(tl.Dense(4), tl.CausalAttention(4, n_heads=2, mode=mode),
                   tl.Dense(3))


def _leaky_model(mode):
  """Predict mode differs from eval: position t sees position t+1 in eval."""
  del mode
  return tl.Serial(tl.Dense(2), tl.Fn('Peek', lambda x: x + jnp_roll(x)))


def jnp_roll(x):
  from retrax.fastmath import numpy as jnp
  return jnp.roll(x, -1, axis=1)


def test_eval_equals_predict_passes_for_causal_attention():
  x = np.random.RandomState(0).normal(size=(1, 5, 3)).astype(np.float32)
  ltu.test_eval_equals_predict(x, _causal_model)
  ltu.test_eval_equals_predict_configs(
      x, lambda mode, d: tl.Serial(tl.Dense(d), tl.CausalAttention(
          d, n_heads=1, mode=mode)), [{'d': 2}])


def test_eval_equals_predict_catches_a_model_that_looks_ahead():
  x = np.random.RandomState(0).normal(size=(1, 5, 3)).astype(np.float32)
  with pytest.raises(AssertionError, match='Error on element'):
    ltu.test_eval_equals_predict(x, _leaky_model)
  with pytest.raises(ValueError, match='at least init_tokens'):
    ltu.test_eval_equals_predict(x[:, :4], _causal_model)


def test_eval_is_deterministic_catches_dropout_that_ignores_mode():
  x = np.ones((2, 5, 3), np.float32)
  ltu.test_eval_is_deterministic(x, _causal_model)
  # Dropout draws from the fixed rng both models get: still deterministic.
  ltu.test_eval_is_deterministic(
      x, lambda mode: tl.Serial(tl.Dense(3), tl.Dropout(0.5, mode='train')))
  noisy = lambda mode: tl.Fn('Noise', lambda x: x + np.random.normal(
      size=x.shape))
  with pytest.raises(AssertionError, match='Non-deterministic'):
    ltu.test_eval_is_deterministic(x, noisy)


def _arith(prefix):
  return (prefix[-1] + 1) % 10


def test_mock_transformer_lm_predict_and_eval():
  lm = ltu.MockTransformerLM(_arith, mode='predict', vocab_size=10)
  logits = lm(np.array([[0], [5]]))
  assert logits.shape == (2, 1, 10)
  assert np.argmax(logits, -1).tolist() == [[1], [6]]
  assert float(logits.max()) == 1000.
  saved = lm.state
  assert np.argmax(lm(np.array([[1], [6]])), -1).tolist() == [[2], [7]]
  lm.assert_prediction_buffers_equal([[0, 1], [5, 6]])
  lm.state = saved  # rewind
  lm.assert_prediction_buffers_equal([[0], [5]])
  ev = ltu.MockTransformerLM(_arith, mode='eval', vocab_size=10)
  # Eval shifts right by a leading 0: outputs f([0]), f([0, 3]), f([0, 3, 4]).
  assert np.argmax(ev(np.array([[3, 4, 9]])), -1).tolist() == [[1, 4, 5]]
  with pytest.raises(ValueError, match=r'\(batch, length\)'):
    ev(np.array([1, 2]))
  with pytest.raises(ValueError, match=r'in \[0, 3\)'):
    ltu.MockTransformerLM(lambda p: 7, mode='eval', vocab_size=3)(
        np.array([[1]]))


def test_eval_equals_predict_discrete_with_the_mock():
  model_fn = functools.partial(ltu.MockTransformerLM, sequence_fn=_arith)
  ltu.test_eval_equals_predict_discrete(model_fn, vocab_size=10)
  def broken(mode, vocab_size):  # predict ignores the history
    fn = _arith if mode == 'eval' else (lambda p: 0)
    return ltu.MockTransformerLM(fn, mode=mode, vocab_size=vocab_size)
  with pytest.raises(AssertionError):
    ltu.test_eval_equals_predict_discrete(broken, vocab_size=10)


def test_ensure_flag_parses_absl_flags_once_needed():
  from absl import flags
  name = 'retrax_test_utils_flag'
  if name not in flags.FLAGS:
    flags.DEFINE_string(name, 'set', 'a flag for this test')
  assert test_utils.ensure_flag(name) == 'set'
  empty = 'retrax_test_utils_empty'
  if empty not in flags.FLAGS:
    flags.DEFINE_string(empty, '', 'an empty flag')
  with pytest.raises(AssertionError, match='not set'):
    test_utils.ensure_flag(empty)
