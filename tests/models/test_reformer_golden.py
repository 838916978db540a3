"""The encoder-decoder Reformer reproduces Trax 1.4.1 from a Trax-written checkpoint.

`fixtures/golden/reformer_encdec/` was written by real Trax (`make_golden.py`
there): the checkpoint of an eval-mode `Reformer` (its `save_to_file`) and
Trax's outputs on fixed source/target ids whose sources end in padding.
"""

import os

import numpy as np
import pytest

from retrax import models
from retrax import shapes

GOLDEN = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'golden',
                      'reformer_encdec')


def _close(actual, desired):
  # 1e-5 of the array's scale: the decoder's reversible halves reach ~200 with
  # these (x3) weights, where float32 rounding alone is ~1e-5 absolute.
  desired = np.asarray(desired)
  np.testing.assert_allclose(np.asarray(actual), desired, rtol=0,
                             atol=1e-5 * np.abs(desired).max())


def _make(mode, dropout=0.1):
  return models.Reformer(input_vocab_size=20, d_model=16, d_ff=32,
                         n_encoder_layers=2, n_decoder_layers=2, n_heads=2,
                         max_len=32, dropout=dropout, mode=mode)


@pytest.fixture(scope='module')
def io():
  return np.load(os.path.join(GOLDEN, 'io.npz'))


def _load(model, io, **kwargs):
  sig = shapes.signature((io['source'], io['target']))
  model.init(sig)
  model.init_from_file(os.path.join(GOLDEN, 'model.pkl.gz'), **kwargs)
  return model


def test_eval_logits_and_activations_match_trax(io):
  model = _load(_make('eval'), io, weights_only=False)
  stack = (io['source'], io['target'])
  for i, layer in enumerate(model.sublayers):
    inputs = stack[:layer.n_in] if layer.n_in > 1 else stack[0]
    out = layer(inputs)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    stack = out + tuple(stack[layer.n_in:])
    if i == 2:
      _close(stack[0], io['enc_out'])
    if i == 7:  # After the decoder's ReversibleSerial.
      _close(stack[0], io['dec_rev_out0'])
      _close(stack[1], io['dec_rev_out1'])
  logits, targets = model((io['source'], io['target']))
  _close(logits, io['logits_eval'])
  np.testing.assert_array_equal(np.asarray(targets), io['target'])


def test_train_mode_without_dropout_matches_trax(io):
  model = _make('train', dropout=0.0)
  sig = shapes.signature((io['source'], io['target']))
  model.init_from_file(os.path.join(GOLDEN, 'model.pkl.gz'),
                       weights_only=True, input_signature=sig)
  logits, _ = model((io['source'], io['target']))
  _close(logits, io['logits_train'])


def test_predict_mode_matches_trax_eval(io):
  """Predict mode fed [0, target[:-1]] one token a call gives Trax's eval logits.

  (Trax 1.4.1 itself cannot build this model in predict mode.)
  """
  model = _make('predict')
  sig = shapes.signature((io['source'], io['target'][:, :1]))
  model.init_from_file(os.path.join(GOLDEN, 'model.pkl.gz'),
                       weights_only=True, input_signature=sig)
  target = io['target']
  fed = np.concatenate([np.zeros_like(target[:, :1]), target[:, :-1]], axis=1)
  steps = [np.asarray(model((io['source'], fed[:, t:t + 1]))[0])[:, 0]
           for t in range(fed.shape[1])]
  np.testing.assert_allclose(np.stack(steps, axis=1), io['logits_eval'],
                             rtol=1e-4, atol=1e-4)
