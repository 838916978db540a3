"""Every model in mode='predict', fed one token per step, reproduces mode='eval'.

For each model an eval-mode and a predict-mode instance share weights; the
predict model is fed the (shifted) sequence one token per jitted call, its
caches carried in `state`, and its logits at each step must equal the eval
model's logits at that position (the eval model on the whole sequence; it is
causal, which is checked on a few prefixes run exactly). The caches keep
fixed shapes, and `decoding.reorder_examples` moves every per-example cache
leaf with its example (beam search relies on it).
"""

import functools

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.supervised import decoding

try:
  from tests.layers import predict_utils
except ImportError:  # tests/ is not a package: import the sibling folder's module.
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  '..', 'layers'))
  import predict_utils

N_STEPS = 64
BATCH = 3
VOCAB = 16
RNG = jax.random.PRNGKey(0)

_SMALL = dict(d_model=16, d_ff=32, n_heads=2)
_REFORMER = dict(_SMALL, d_attention_key=8, d_attention_value=8, n_layers=1,
                 max_len=128)
_ENC_DEC = dict(_SMALL, n_encoder_layers=1, n_decoder_layers=1, max_len=128)

# name -> (model builder taking mode=, is an encoder-decoder)
MODELS = {
    'TransformerLM': (functools.partial(
        models.TransformerLM, VOCAB, n_layers=1, max_len=128, **_SMALL), False),
    # Chunked: the predict memory (16 positions) rolls every 8 tokens.
    'ReformerLM-SelfAttention': (functools.partial(
        models.ReformerLM, VOCAB, attention_type=functools.partial(
            tl.SelfAttention, chunk_len=8, n_chunks_before=1), **_REFORMER),
                                 False),
    'ReformerLM-CausalAttention': (functools.partial(
        models.ReformerLM, VOCAB, attention_type=tl.CausalAttention,
        **_REFORMER), False),
    # One chunk holds all n_hashes * 64 sorted positions and predict mode
    # attends to all earlier positions: both equal full shared-QK attention.
    'ReformerLM-LSHSelfAttention': (functools.partial(
        models.ReformerLM, VOCAB, attention_type=functools.partial(
            tl.LSHSelfAttention, n_hashes=2, chunk_len=2 * N_STEPS,
            predict_mem_len=2 * N_STEPS, predict_drop_len=N_STEPS), **_REFORMER),
        False),
    'Transformer': (functools.partial(models.Transformer, VOCAB, **_ENC_DEC),
                    True),
    'Reformer': (functools.partial(models.Reformer, VOCAB, **_ENC_DEC), True),
}


def _data(enc_dec):
  rng = np.random.RandomState(1)
  targets = rng.randint(1, VOCAB, size=(BATCH, N_STEPS)).astype(np.int32)
  if not enc_dec:
    return None, targets
  source = rng.randint(1, VOCAB, size=(BATCH, 11)).astype(np.int32)
  source[1, 7:] = 0  # Padding in one row exercises the encoder mask.
  return source, targets


def _model_input(source, tokens):
  return tokens if source is None else (source, tokens)


def _logits(out):
  return np.asarray(out[0] if isinstance(out, (tuple, list)) else out)


def _shapes(tree):
  return jax.tree_util.tree_map(np.shape, tree)


@pytest.mark.parametrize('name', sorted(MODELS))
def test_predict_equals_eval_and_caches_follow_their_examples(name):
  make, enc_dec = MODELS[name]
  source, targets = _data(enc_dec)
  full = _model_input(source, targets)
  model_eval, model_predict = make(mode='eval'), make(mode='predict')
  w_eval, s_eval = model_eval.init(shapes.signature(full))
  w_pred, s_pred = model_predict.init(
      shapes.signature(_model_input(source, targets[:, :1])))
  w_pred = predict_utils.transfer_weights(w_eval, w_pred)

  eval_fn = jax.jit(model_eval.pure_fn)
  want = _logits(eval_fn(full, w_eval, s_eval, RNG)[0])
  # Eval logits on a prefix do not depend on what follows it (the model is
  # causal): a prefix padded with other tokens gives the same logits.
  other = np.concatenate([targets[:, :24], (targets[:, 24:] + 5) % VOCAB], 1)
  got = _logits(eval_fn(_model_input(source, other), w_eval, s_eval, RNG)[0])
  np.testing.assert_allclose(got[:, :25], want[:, :25], atol=1e-5)
  assert np.max(np.abs(got[:, 25:] - want[:, 25:])) > 1e-2

  step = jax.jit(model_predict.pure_fn)
  fed = predict_utils.shift_right(targets)  # Start symbol 0, then the tokens.
  state, worst, cache_shapes = s_pred, 0.0, None
  for t in range(N_STEPS):
    out, state = step(_model_input(source, fed[:, t:t + 1]), w_pred, state, RNG)
    got = _logits(out)
    assert got.shape == (BATCH, 1, VOCAB)
    diff = float(np.max(np.abs(got[:, 0] - want[:, t])))
    if 'LSH' in name and t == 0:
      # Eval-mode LSH attention at position 0 sees only itself, through the
      # -1e5 self-penalty; float32 rounding of exp(logit - logsumexp) at that
      # magnitude scales its output by about 1.001 (as in Trax). Predict mode
      # is exact there.
      assert diff < 1e-2, diff
      continue
    worst = max(worst, diff)
    if cache_shapes is None:
      cache_shapes = _shapes(state)
    else:
      assert _shapes(state) == cache_shapes, 'predict-mode caches changed shape'
  assert worst <= 1e-4, f'{name}: predict differs from eval by {worst}'

  # Reordering the batch (with a repeated row) moves every per-example cache.
  rows = np.array([2, 0, 0])
  nxt = np.array([[3], [5], [7]], np.int32)
  ref, _ = step(_model_input(source, nxt), w_pred, state, RNG)
  moved = decoding.reorder_examples(model_predict, state, rows, inputs=source)
  got, _ = step(_model_input(None if source is None else source[rows],
                             nxt[rows]), w_pred, moved, RNG)
  np.testing.assert_allclose(_logits(got), _logits(ref)[rows], atol=1e-5)


def test_blog_stateful_loop_feeds_one_token_per_call():
  """The blog's loop: reset `model.state`, then `logits = model(token)` updates the state."""
  make, _ = MODELS['TransformerLM']
  tokens = np.array([[0, 5, 9]], np.int32)  # Start symbol 0 first.
  model_eval, model = make(mode='eval'), make(mode='predict')
  w_eval, s_eval = model_eval.init(shapes.signature(tokens))
  model.init(shapes.ShapeDtype((1, 1), np.int32))
  model.weights = predict_utils.transfer_weights(w_eval, model.weights)
  want = _logits(model_eval.pure_fn(np.roll(tokens, -1, axis=1), w_eval, s_eval,
                                    RNG)[0])
  initial_state = model.state
  for t in range(tokens.shape[1]):
    logits = model(tokens[:, t:t + 1])
    np.testing.assert_allclose(np.asarray(logits)[:, 0], want[:, t], atol=1e-4)
  model.state = initial_state  # Resetting the state restarts the sequence.
  np.testing.assert_allclose(np.asarray(model(tokens[:, :1]))[:, 0], want[:, 0],
                             atol=1e-4)
