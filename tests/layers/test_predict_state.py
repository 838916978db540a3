"""The predict-state contract (`retrax.layers.predict_state`) and the decoder object.

Reference: the layout found by tracing a model at batch sizes 1 and 2 and
comparing its state's shapes (decoding's fallback for undeclared layers); the
layers' declarations must agree with it for every built-in model, before and
after the first step, and name the same position counters as the fallback's
"last integer scalar" rule.
"""

import functools
import gc
import weakref

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax.layers import predict_state
from retrax.shapes import ShapeDtype
from retrax.supervised import decoding
from retrax.supervised.decoding import decoder as decoder_lib
from retrax.supervised.decoding import inspection
from retrax.supervised.decoding import state_layout

VOCAB = 11
_SMALL = dict(d_model=8, d_ff=16, n_heads=2)
_REFORMER = dict(_SMALL, d_attention_key=4, d_attention_value=4, n_layers=1,
                 max_len=32)

MODELS = {
    'TransformerLM': functools.partial(models.TransformerLM, VOCAB, n_layers=1,
                                       max_len=32, **_SMALL),
    'ReformerLM-LSH': functools.partial(
        models.ReformerLM, VOCAB, attention_type=functools.partial(
            tl.LSHSelfAttention, n_hashes=2, chunk_len=8, predict_mem_len=16,
            predict_drop_len=8), **_REFORMER),
    'ReformerLM-SelfAttention': functools.partial(
        models.ReformerLM, VOCAB, attention_type=functools.partial(
            tl.SelfAttention, chunk_len=4, n_chunks_before=1), **_REFORMER),
    'Transformer': functools.partial(
        models.Transformer, VOCAB, n_encoder_layers=1, n_decoder_layers=1,
        max_len=32, **_SMALL),
    'RNNLM': functools.partial(models.RNNLM, VOCAB, d_model=8, n_layers=2),
    'ConfigurableTransformerLM-infinite': functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, max_len=32,
        pos_type='infinite', **_SMALL),
    'ConfigurableTransformerLM-time-bin': functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, max_len=32,
        pos_type='time-bin', pos_time_bin_length=4, **_SMALL),
    'ConfigurableTransformerLM-CausalFavor': functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, max_len=32,
        attention_type=tl.CausalFavor, **_SMALL),
    'ConfigurableTransformerLM-ConvCausal': functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, max_len=32,
        attention_type=functools.partial(tl.ConvCausalAttention, sparsity=2,
                                         kernel_size=3), **_SMALL),
    'ConfigurableTransformerLM-MultiplicativeConv': functools.partial(
        models.ConfigurableTransformerLM, VOCAB, n_layers=1, max_len=32,
        attention_type=functools.partial(tl.MultiplicativeConvCausalAttention,
                                         sparsity=2, length_kernel_size=3),
        **_SMALL),
}


def _built(name, batch=1):
  model = MODELS[name](mode='predict')
  tokens = ShapeDtype((batch, 1), np.int32)
  enc = None
  if model.n_in > 1:
    enc = np.ones((batch, 5), np.int32)
    model.init((ShapeDtype(enc.shape, np.int32), tokens))
  else:
    model.init(tokens)
  return model, enc


@pytest.mark.parametrize('name', sorted(MODELS))
def test_declared_layout_equals_traced_layout(name):
  model, enc = _built(name)
  at_1 = state_layout.abstract_step(model, 1, enc, decoder_lib.apply)
  at_2 = state_layout.abstract_step(model, 2, enc, decoder_lib.apply)
  traced = state_layout.traced(at_1, at_2)
  for state, want in zip(at_1[:2], traced):  # Before and after a step.
    got = state_layout.declared(model, state)
    assert state_layout.is_complete(got), (name, got)
    assert jax.tree_util.tree_structure(got) == (
        jax.tree_util.tree_structure(want))
    assert jax.tree_util.tree_leaves(got) == jax.tree_util.tree_leaves(want)
  # Per-head caches are declared as such (rows per example > 1).
  if name != 'RNNLM':
    assert max(jax.tree_util.tree_leaves(state_layout.declared(
        model, model.state))) == 2


def _fallback_positions(layer):
  """The fallback rule: the last integer scalar of a max_len layer's state."""
  ints = [x for x in jax.tree_util.tree_leaves(layer.state)
          if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer)]
  return int(ints[-1]), layer.max_len


def test_declared_positions_are_the_fallback_counters():
  model, _ = _built('TransformerLM')
  model(np.array([[3]], np.int32))
  model(np.array([[4]], np.int32))
  declared = []
  for layer in model.walk():
    layout = predict_state.declared_layout(layer, layer.state)
    if layout is not None and layout.max_positions is not None:
      declared.append((layer.name, int(layout.positions_used),
                       layout.max_positions))
      assert (int(layout.positions_used),
              layout.max_positions) == _fallback_positions(layer)
  names = sorted(n for n, _, _ in declared)
  assert names == ['DotProductCausalAttention', 'PositionalEncoding']
  # Positional table of max_len 32; attention cache of 2048 (its default).
  assert {(used, limit) for _, used, limit in declared} == {(2, 32), (2, 2048)}
  assert inspection.position_budget(model)[0] == 30


def test_attention_without_n_heads_is_undeclared_and_decodes_by_tracing():
  def lm(mode, n_heads):
    return tl.Serial(
        tl.Embedding(VOCAB, 8), tl.PositionalEncoding(max_len=16, mode=mode),
        tl.ConfigurableAttention(
            tl.Dense(8), tl.Dense(8), tl.Dense(8), tl.Dense(8), n_heads=2,
            qkv_attention_layer=tl.DotProductCausalAttention(
                max_inference_length=16, mode=mode, n_heads=n_heads)),
        tl.Dense(VOCAB))
  declared_lm, user_lm = lm('predict', 2), lm('predict', None)
  declared_lm.init(ShapeDtype((1, 1), np.int32))
  user_lm.init(ShapeDtype((1, 1), np.int32))
  user_lm.weights = declared_lm.weights
  assert state_layout.is_complete(
      state_layout.declared(declared_lm, declared_lm.state))
  assert not state_layout.is_complete(
      state_layout.declared(user_lm, user_lm.state))
  kwargs = dict(batch_size=2, inputs=np.array([[1, 2], [3, 4]]),
                temperature=0.0, eos_id=None, max_length=5)
  want = decoding.autoregressive_sample(declared_lm, **kwargs)
  np.testing.assert_array_equal(
      decoding.autoregressive_sample(user_lm, **kwargs), want)
  # The fallback still finds the position limit (16 - 3 prefix - 4 fed).
  with pytest.raises(ValueError, match='16 positions'):
    decoding.autoregressive_sample(user_lm, max_length=20,
                                   **{k: v for k, v in kwargs.items()
                                      if k != 'max_length'})


def test_bad_declaration_is_a_clear_error():
  model, _ = _built('TransformerLM')
  layout = jax.tree_util.tree_map(lambda _: 3, model.state)
  with pytest.raises(ValueError, match='rows per example'):
    state_layout.batch_sizes(model.state, layout)


def test_decoder_holds_the_programs_and_dies_with_the_model():
  model, _ = _built('TransformerLM')
  initial = model.state
  kwargs = dict(temperature=0.0, eos_id=None, max_length=3)
  first = decoding.autoregressive_sample(model, **kwargs)
  decoder = decoding.decoder_for(model)
  assert decoder is decoding.decoder_for(model)
  assert decoder.model is model
  compiled = decoder.compiled
  assert len(compiled) == 1 and compiled[0][0] == 'sample'
  model.state = initial
  np.testing.assert_array_equal(
      decoding.autoregressive_sample(model, **kwargs), first)
  assert decoder.compiled == compiled
  # A separate Decoder compiles its own.
  assert decoding.Decoder(model) is not decoder
  ref = weakref.ref(model)
  del model
  gc.collect()
  assert ref() is None
  with pytest.raises(RuntimeError, match='no longer exists'):
    _ = decoder.model
