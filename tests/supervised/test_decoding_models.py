"""Every predict-mode model family decodes through the compiled decoder, compiled once.

For each family (Transformer and Reformer language models and
encoder-decoders, the configurable Transformers, Terraformer, the RNN
language models and LSTMSeq2SeqAttn), greedy `autoregressive_sample` at
batch 2 must give the tokens of the plain loop the decoder replaces: the
predict-mode model called once per token (its `pure_fn`, jitted on its own),
fed the start symbol, the prefix, then the argmax of its logits in numpy.
(That predict mode equals eval mode is tested per model in tests/models.)
Decoding again, from the initial state or from the state decoding left,
must compile nothing.
"""

import functools

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax.shapes import ShapeDtype
from retrax.supervised import decoding
from test_decoding_programs import counting_compiles  # (conftest's sys.path)

VOCAB = 16
N_TOKENS = 5
_SMALL = dict(d_model=16, d_ff=32, n_heads=2, max_len=64)
_ENC_DEC = dict(n_encoder_layers=1, n_decoder_layers=1, **_SMALL)
_SELF = functools.partial(tl.SelfAttention, predict_mem_len=64,
                          predict_drop_len=64)
_TERRA_LEN = 16  # Terraformer's predict mode pads the source to max_len.

# name: (constructor of a predict-mode model, source: None (a language
# model, fed a 2-token prefix), 'short' or 'padded' to max_len).
FAMILIES = {
    'TransformerLM': (functools.partial(
        models.TransformerLM, VOCAB, n_layers=1, **_SMALL), None),
    'ReformerLM': (functools.partial(
        models.ReformerLM, VOCAB, n_layers=2, d_attention_key=8,
        d_attention_value=8, attention_type=_SELF, **_SMALL), None),
    'ConfigurableTransformerLM': (functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, **_SMALL), None),
    'ConfigurableTransformer': (functools.partial(
        models.ConfigurableTransformer, VOCAB, **_ENC_DEC), 'short'),
    'ConfigurableTerraformer': (functools.partial(
        models.ConfigurableTerraformer, VOCAB, d_attention_key=8,
        d_attention_value=8, encoder_attention_type=_SELF,
        encoder_decoder_attention_type=_SELF,
        **{**_ENC_DEC, 'max_len': _TERRA_LEN}), 'padded'),
    'RNNLM': (functools.partial(models.RNNLM, VOCAB, d_model=16), None),
    'GRULM': (functools.partial(models.GRULM, VOCAB, d_model=16, n_layers=2),
              None),
    'LSTMSeq2SeqAttn': (functools.partial(
        models.LSTMSeq2SeqAttn, VOCAB, VOCAB, d_model=16, n_encoder_layers=1,
        n_decoder_layers=1, n_attention_heads=2), 'short'),
}
# (Transformer, Transformer2 and Reformer: test_decoding_programs.py.)


def _inputs(source_kind):
  """`inputs` of `autoregressive_sample`: an LM's prefix or a source."""
  rng = np.random.RandomState(3)
  if source_kind is None:
    return rng.randint(1, VOCAB, (2, 2)).astype(np.int32)
  source = rng.randint(1, VOCAB, (2, 6)).astype(np.int32)
  if source_kind == 'padded':
    source = np.pad(source, ((0, 0), (0, _TERRA_LEN - 6)))
  return source


def _stepwise_greedy(model, state, inputs, is_lm, n):
  """The loop the decoder replaces: one jitted predict call per fed token."""
  fn = jax.jit(model.pure_fn)
  fed = [np.zeros((2, 1), np.int32)]  # The start symbol,
  if is_lm:
    fed += [inputs[:, i:i + 1] for i in range(inputs.shape[1])]  # the prefix.
  out = []
  while len(out) < n:
    tok = fed.pop(0) if fed else out[-1]
    y, state = fn(tok if is_lm else (inputs, tok), model.weights, state,
                  model.rng)
    logits = np.asarray(y[0] if isinstance(y, (tuple, list)) else y)
    if not fed:
      out.append(np.argmax(logits[:, -1], -1).astype(np.int32)[:, None])
  return np.concatenate(out, axis=1)


@pytest.mark.parametrize('name', sorted(FAMILIES))
def test_compiled_decoder_matches_stepwise_predict_and_compiles_once(name):
  make, source_kind = FAMILIES[name]
  inputs = _inputs(source_kind)
  is_lm = source_kind is None
  model = make(mode='predict')
  tokens = ShapeDtype((2, 1), np.int32)
  model.init(tokens if is_lm else (ShapeDtype(inputs.shape, np.int32), tokens),
             rng=jax.random.PRNGKey(1))
  initial_state = model.state
  want = _stepwise_greedy(model, initial_state, inputs, is_lm, N_TOKENS)

  kwargs = dict(inputs=inputs, batch_size=2, temperature=0.0, eos_id=None,
                max_length=N_TOKENS)
  got = decoding.autoregressive_sample(model, **kwargs)
  np.testing.assert_array_equal(got, want)
  with counting_compiles() as compiles:
    decoding.autoregressive_sample(model, **kwargs)  # Continues the state.
    model.state = initial_state
    again = decoding.autoregressive_sample(model, **kwargs)
  assert not compiles, compiles
  np.testing.assert_array_equal(again, want)
