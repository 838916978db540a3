"""RNN language models and LSTM seq2seq: structure, formulas, predict mode, training."""

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import optimizers
from retrax.models import rnn as rnn_models
from retrax.shapes import ShapeDtype
from retrax.shapes import signature
from retrax.supervised import training

try:
  from tests.layers import predict_utils
except ImportError:  # tests/ is not a package: import the sibling folder's module.
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  '..', 'layers'))
  import predict_utils

RNG = jax.random.PRNGKey(0)
VOCAB = 11


def tokens(batch=3, length=9, seed=0, low=1):
  return np.random.RandomState(seed).randint(
      low, VOCAB, size=(batch, length)).astype(np.int32)


def sigmoid(x):
  return 1 / (1 + np.exp(-x))


def lstm_cell(x, c, h, w, b):
  i, j, f, o = np.split(np.concatenate([x, h], -1) @ w + b, 4, -1)
  c = c * sigmoid(f) + sigmoid(i) * np.tanh(j)
  return c, np.tanh(c) * sigmoid(o)


def test_rnnlm_computes_two_stacked_lstms_over_shifted_embeddings():
  x = tokens()
  model = rnn_models.RNNLM(VOCAB, d_model=6, mode='eval')
  # Random weights in the tree init would make (no random draws in XLA).
  w_sig, s_sig = model.weights_and_state_signature(signature(x))
  rng = np.random.RandomState(0)
  weights = jax.tree_util.tree_map(
      lambda s: (0.5 * rng.randn(*s.shape)).astype(np.float32), w_sig)
  state = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), s_sig)
  leaves = [np.asarray(l, np.float64) for l in jax.tree_util.tree_leaves(
      weights)]
  assert [l.shape for l in leaves] == [(VOCAB, 6), (12, 24), (24,), (12, 24),
                                       (24,), (6, VOCAB), (VOCAB,)]
  emb, w1, b1, w2, b2, wo, bo = leaves
  shifted = np.pad(x, [(0, 0), (1, 0)])[:, :-1]
  c1 = h1 = c2 = h2 = np.zeros((3, 6))
  want = []
  for t in range(x.shape[1]):
    c1, h1 = lstm_cell(emb[shifted[:, t]], c1, h1, w1, b1)
    c2, h2 = lstm_cell(h1, c2, h2, w2, b2)
    want.append(h2 @ wo + bo)
  got = jax.jit(model.pure_fn)(x, weights, state, RNG)[0]
  np.testing.assert_allclose(got, np.stack(want, 1), rtol=1e-5, atol=1e-5)


def test_rnnlm_arguments_follow_trax():
  with pytest.raises(ValueError, match='must be set to 2; instead got 3'):
    rnn_models.RNNLM(VOCAB, n_layers=3)
  model = rnn_models.RNNLM(VOCAB, d_model=4, rnn_cell=tl.GRUCell,
                           rnn_cell_d_state_multiplier=1)
  weights = model.weights_and_state_signature(signature(tokens()))[0]
  shapes = [l.shape for l in jax.tree_util.tree_leaves(weights)]
  assert shapes == [(VOCAB, 4)] + [(8, 8), (8,), (8, 4), (4,)] * 2 + [
      (4, VOCAB), (VOCAB,)]


@pytest.mark.parametrize('make', [
    lambda mode: rnn_models.RNNLM(VOCAB, d_model=8, mode=mode),
    lambda mode: rnn_models.GRULM(VOCAB, d_model=8, n_layers=2, mode=mode),
], ids=['RNNLM', 'GRULM'])
def test_predict_mode_equals_eval_mode(make):
  x = tokens(length=8)
  worst = predict_utils.assert_eval_equals_predict(
      make, x, first_chunk=1, atol=1e-5,
      predict_inputs=predict_utils.shift_right(x))
  assert worst < 1e-5


def test_grulm_structure():
  model = rnn_models.GRULM(VOCAB, d_model=4, n_layers=2)
  weights = model.weights_and_state_signature(signature(tokens()))[0]
  shapes = [l.shape for l in jax.tree_util.tree_leaves(weights)]
  assert shapes == [(VOCAB, 4)] + [(8, 8), (8,), (8, 4), (4,)] * 2 + [
      (4, VOCAB), (VOCAB,)]
  assert 'GRU_4' in repr(model) and 'GRUCell' not in repr(model)


def _seq2seq(mode):
  return rnn_models.LSTMSeq2SeqAttn(VOCAB, VOCAB + 2, d_model=8,
                                    n_encoder_layers=1, n_decoder_layers=2,
                                    n_attention_heads=2, mode=mode)


def _seq2seq_data():
  source = tokens(length=7, seed=1)
  source[1, 4:] = 0  # Padding, masked out in attention.
  return source, tokens(length=6, seed=2)


def test_lstm_seq2seq_attn_layout():
  sig = signature(_seq2seq_data())
  model = _seq2seq('train')
  w_sig, s_sig = model.weights_and_state_signature(sig)
  out = fastmath.abstract_eval(model.pure_fn)(
      sig, w_sig, s_sig, ShapeDtype((2,), np.uint32))[0]
  assert [o.shape for o in out] == [(3, 6, VOCAB + 2), (3, 6)]
  shapes = [l.shape for l in jax.tree_util.tree_leaves(w_sig)]
  lstm = [(16, 32), (32,)]
  dense = [(8, 8), (8,)]
  assert shapes == ([(VOCAB, 8)] + lstm + [(VOCAB + 2, 8)] + lstm +
                    dense * 4 + lstm * 2 + [(8, VOCAB + 2), (VOCAB + 2,)])


@pytest.mark.slow
def test_lstm_seq2seq_attn_outputs_and_predict_mode():
  source, target = _seq2seq_data()
  model = _seq2seq('eval')
  weights, state = model.init(signature((source, target)))
  log_probs, out_target = jax.jit(model.pure_fn)((source, target), weights,
                                                  state, RNG)[0]
  np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
  assert np.array_equal(out_target, target)
  # Predict mode is fed the shifted targets: compare the log-probs only.
  worst = predict_utils.assert_eval_equals_predict(
      lambda mode: tl.Serial(_seq2seq(mode), tl.Select([0], n_in=2)),
      (source, target), seq_input=1, atol=1e-5,
      predict_inputs=(source, predict_utils.shift_right(target)))
  assert worst < 1e-5


def counting_text(seed, batch=8, length=16):
  """Sequences counting up modulo VOCAB - 1 from a random start (ids 1..)."""
  rng = np.random.RandomState(seed)
  while True:
    start = rng.randint(0, VOCAB - 1, size=(batch, 1))
    x = ((start + np.arange(length)) % (VOCAB - 1) + 1).astype(np.int32)
    yield x, x, np.ones((batch, length), np.float32)


def test_rnnlm_learns_to_count_through_loop():
  model = rnn_models.RNNLM(VOCAB, d_model=16, dropout=0.0)
  task = training.TrainTask(counting_text(0),
                            tl.CrossEntropyLossWithLogSoftmax(),
                            optimizers.Adam(0.02), n_steps_per_checkpoint=20)
  evals = training.EvalTask(counting_text(1), [tl.Accuracy()])
  loop = training.Loop(model, task, eval_tasks=evals, random_seed=0,
                       options=training.LoopOptions(progress_bar=False))
  loop.run(60)
  losses = [v for _, v in loop.history.get(
      'train', 'metrics/CrossEntropyLossWithLogSoftmax')]
  accuracy = [v for _, v in loop.history.get('eval', 'metrics/Accuracy')]
  assert losses[0] > 2.0 and losses[-1] < 0.3 * losses[0]
  # Every position after the first is predictable from its predecessor.
  assert accuracy[-1] > 0.85
