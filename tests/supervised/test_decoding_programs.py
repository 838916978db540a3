"""Decoding compiles its programs once: encoder-decoders, repeated calls, prompt lengths.

An encoder-decoder's first predict step changes the state's structure (its
`tl.Cache` layers store the encoder's outputs), so decoding runs that step in
a program of its own and the loop's program sees the structure a decoded
state keeps. Decoding again, with `model.state` reset or left as decoding
left it (positions continue, the encoder is not rerun: Trax's behaviour),
must compile nothing, and give the tokens of greedy decoding by the
eval-mode model rerun on the growing sequence (the independent reference).
Compilations are counted through `jax.monitoring`'s backend-compile and
persistent-cache-hit events.
"""

import contextlib
import functools

import jax
import numpy as np
import pytest

from retrax import models
from retrax.shapes import ShapeDtype
from retrax.supervised import decoding

try:
  from tests.layers import predict_utils
except ImportError:  # tests/ is not a package: import the sibling folder's module.
  import os
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                  '..', 'layers'))
  import predict_utils

VOCAB = 32
LENGTH = 16  # Decoder positions of the eval-mode reference.
_ENC_DEC = dict(d_model=16, d_ff=32, n_heads=2, n_encoder_layers=1,
                n_decoder_layers=1, max_len=64)
MODELS = {
    'Transformer': functools.partial(models.Transformer, VOCAB, **_ENC_DEC),
    'Reformer': functools.partial(models.Reformer, VOCAB, **_ENC_DEC),  # slow
    # Its flags change shape () -> (1,) on the first step.
    'Transformer2': functools.partial(models.Transformer2, VOCAB, **_ENC_DEC),
}
# No padding: Transformer2 concatenates the source's real tokens with the
# targets, and its predict mode (as Trax's) assumes an unpadded source.
SOURCE = np.array([[3, 5, 7, 2, 9, 11], [4, 4, 9, 30, 6, 1]], np.int32)


@contextlib.contextmanager
def counting_compiles():
  """Yields a list that gets one entry per XLA compilation in the block.

  A compilation served by the persistent compilation cache (the test
  session's, conftest.py) skips the backend: its cache hit counts instead.
  """
  names = []

  def listener(name, *args, **kwargs):
    del args, kwargs
    if 'backend_compile' in name or name.endswith('/cache_hits'):
      names.append(name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  jax.monitoring.register_event_listener(listener)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
    jax.monitoring.unregister_event_listener(listener)


@functools.cache
def _pair(name, source=SOURCE.tobytes()):
  """`(predict-mode model, its initial state, greedy reference)`, random weights.

  `reference(row, fed, n)`: the next `n` greedy tokens of row `row` after
  the decoder was fed `fed` after the start symbol 0, by the eval model.
  Cached: the tests share the models' compiled programs.
  """
  source = np.frombuffer(source, np.int32).reshape(SOURCE.shape)
  make = MODELS[name]
  model_eval, model = make(mode='eval'), make(mode='predict')
  batch = source.shape[0]
  weights, state = model_eval.init(
      (ShapeDtype(source.shape, np.int32), ShapeDtype((batch, LENGTH),
                                                       np.int32)))
  model.init((ShapeDtype(source.shape, np.int32), ShapeDtype((batch, 1),
                                                              np.int32)))
  model.weights = predict_utils.transfer_weights(weights, model.weights)
  eval_fn = jax.jit(model_eval.pure_fn)

  def reference(row, fed, n):
    fed, new = list(fed), []
    for _ in range(n):
      targets = np.array([fed + [0] * (LENGTH - len(fed))], np.int32)
      logits = eval_fn((source[row:row + 1], targets), weights, state,
                       model_eval.rng)[0][0]
      new.append(int(np.argmax(np.asarray(logits)[0, len(fed)])))
      fed.append(new[-1])
    return new
  return model, model.state, reference


@pytest.mark.parametrize('name', [
    'Transformer', 'Transformer2',
    pytest.param('Reformer', marks=pytest.mark.slow)])
def test_encoder_decoder_decodes_like_eval_and_compiles_once(name):
  model, initial_state, reference = _pair(name)
  model.state = initial_state
  kwargs = dict(inputs=SOURCE, batch_size=2, temperature=0.0, eos_id=None,
                max_length=5)
  first = decoding.autoregressive_sample(model, **kwargs)
  for row in range(2):
    assert list(first[row]) == reference(row, [], 5)

  with counting_compiles() as compiles:
    # Left as decoding left it: positions continue after the start symbol
    # fed again; the encoder's cached outputs are reused.
    more = decoding.autoregressive_sample(model, **kwargs)
    model.state = initial_state
    again = decoding.autoregressive_sample(model, **kwargs)
  assert not compiles
  for row in range(2):
    assert list(more[row]) == reference(row, list(first[row, :4]) + [0], 5)
  np.testing.assert_array_equal(again, first)

  model.state = initial_state
  stream = decoding.autoregressive_sample_stream(
      model, inputs=SOURCE, batch_size=2, temperature=0.0)
  np.testing.assert_array_equal(
      np.stack([next(stream) for _ in range(5)], axis=1), first)
  with counting_compiles() as compiles:
    stream = decoding.autoregressive_sample_stream(
        model, inputs=SOURCE, batch_size=2, temperature=0.0)
    streamed = np.stack([next(stream) for _ in range(5)], axis=1)
  assert not compiles
  np.testing.assert_array_equal(streamed, more)


def test_first_step_on_its_own_runs_op_by_op_too():
  model, initial_state, reference = _pair('Transformer')
  model.state = initial_state
  got = decoding.autoregressive_sample(model, inputs=SOURCE, batch_size=2,
                                       temperature=0.0, eos_id=None,
                                       max_length=2, accelerate=False)
  for row in range(2):
    assert list(got[row]) == reference(row, [], 2)


def test_beam_search_on_a_decoded_state_compiles_once():
  """Beam search from a state left by sampling (caches filled), twice."""
  model, initial_state, reference = _pair('Transformer')
  model.state = initial_state
  decoding.autoregressive_sample(model, inputs=SOURCE, batch_size=2,
                                 temperature=0.0, eos_id=None, max_length=2)
  kwargs = dict(inputs=SOURCE, batch_size=2, n_beams=1, length_penalty=0.0,
                eos_id=None, max_length=3)
  best, _ = decoding.beam_search(model, **kwargs)[0]
  with counting_compiles() as compiles:
    again, _ = decoding.beam_search(model, **kwargs)[0]
  assert not compiles
  np.testing.assert_array_equal(again, best)
  for row in range(2):  # One beam is greedy, after the 2 positions fed.
    fed = reference(row, [], 1) + [0]
    assert list(best[row]) == reference(row, fed, 3)


def test_prompts_of_similar_lengths_share_a_program():
  """The prefix is padded to a power of two; its length is an argument."""
  make = functools.partial(models.TransformerLM, VOCAB, d_model=16, d_ff=32,
                           n_layers=1, n_heads=2, max_len=64)
  model_eval, model = make(mode='eval'), make(mode='predict')
  weights, state = model_eval.init(ShapeDtype((1, LENGTH), np.int32))
  model.init(ShapeDtype((1, 1), np.int32))
  model.weights = predict_utils.transfer_weights(weights, model.weights)
  initial_state = model.state
  eval_fn = jax.jit(model_eval.pure_fn)

  def reference(fed, n):  # Greedy by the eval model; 0 starts the sequence.
    fed, new = list(fed), []
    for _ in range(n):
      logits = eval_fn(np.array([fed + [0] * (LENGTH - len(fed))], np.int32),
                       weights, state, model_eval.rng)[0]
      new.append(int(np.argmax(np.asarray(logits)[0, len(fed)])))
      fed.append(new[-1])
    return new

  kwargs = dict(temperature=0.0, eos_id=None, max_length=4)
  inputs = np.array([[5, 9, 2, 7, 1, 8]], np.int32)
  got = decoding.autoregressive_sample(model, inputs=inputs[:, :4], **kwargs)
  assert list(got[0]) == reference(inputs[0, :4], 4)
  with counting_compiles() as compiles:  # Start + 4..6 tokens: 8 slots.
    for n in (5, 6):
      model.state = initial_state
      got = decoding.autoregressive_sample(model, inputs=inputs[:, :n],
                                           **kwargs)
      assert list(got[0]) == reference(inputs[0, :n], 4)
  assert not compiles


def test_varied_max_lengths_share_one_program_per_power_of_two():
  """max_length is a traced bound: 5, 6, 7 and 8 run one compiled loop.

  Each length's tokens are still the greedy reference's, and a length in a
  new power-of-two bucket (3 -> 4) compiles once more.
  """
  model, initial_state, reference = _pair('Transformer')
  kwargs = dict(inputs=SOURCE, batch_size=2, temperature=0.0, eos_id=None)
  model.state = initial_state
  decoding.autoregressive_sample(model, max_length=8, **kwargs)  # compiles
  want = {n: [reference(row, [], n) for row in range(2)] for n in (5, 6, 7)}
  got = {}
  with counting_compiles() as compiles:
    for n in (5, 7, 6):
      model.state = initial_state
      got[n] = decoding.autoregressive_sample(model, max_length=n, **kwargs)
  assert not compiles
  for n, tokens in got.items():
    assert tokens.shape == (2, n)
    assert [list(row) for row in tokens] == want[n]
  keys = [k for k in decoding.decoder_for(model).compiled if k[0] == 'sample']
  assert 8 in {k[-1] for k in keys}


def _small_reformer(attention_type, mode, length):
  """A 4-layer d_model-64 ReformerLM, initialised for `(1, length)` tokens."""
  model = models.ReformerLM(64, d_model=64, d_ff=256, d_attention_key=16,
                            d_attention_value=16, n_layers=4, n_heads=4,
                            max_len=64, attention_type=attention_type,
                            mode=mode)
  model.init(ShapeDtype((1, length), np.int32))
  return model


def _record_compiled_programs(monkeypatch):
  """A list that gets each decoding program as `Decoder.call` compiles it."""
  from retrax.supervised.decoding import decoder as decoder_lib
  compiled = []
  call = decoder_lib.Decoder.call

  def compiling_call(program, accelerate, *args):
    compiled.append(program[0].lower(*args).compile())
    return call(program, accelerate, *args)
  monkeypatch.setattr(decoder_lib.Decoder, 'call', staticmethod(compiling_call))
  return compiled


def _temps_and_weights(program, model):
  """`(the program's temporary bytes, the model's weight bytes)`."""
  weight_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.weights))
  return program.memory_analysis().temp_size_in_bytes, weight_bytes


def test_a_reversible_stacks_program_copies_no_weights_per_position(monkeypatch):
  """A predict-mode stack holds each layer's own weights, which the programs
  take: given the stack, the loop over positions sliced each block's rows
  and XLA:CPU copied them at every position (a 6-layer d_model-512
  ReformerLM decoded 2.3x slower); the compiled program's temporaries then
  held the blocks' weights (808 KB here, 72 KB without)."""
  if jax.default_backend() != 'cpu':
    pytest.skip("a claim about XLA:CPU's plan")
  from retrax import layers as tl
  model = _small_reformer(tl.CausalAttention, 'predict', 1)
  compiled = _record_compiled_programs(monkeypatch)
  decoding.autoregressive_sample(model, batch_size=1, max_length=16,
                                 eos_id=None, temperature=1.0, rng=0)
  temp_bytes, weight_bytes = _temps_and_weights(compiled[-1], model)
  assert temp_bytes < 0.25 * weight_bytes, (temp_bytes, weight_bytes)


def test_eval_mode_decoding_takes_a_reversible_stack_as_held(monkeypatch):
  """`eval_mode=True` reruns a train-layout model, whose blocks scan over
  their stacked weights: given Trax's per-layer tree, each step's program
  restacked every block's weights (temporaries 1.01 MB for 0.86 MB of
  weights here, 0.22 MB given the stack)."""
  if jax.default_backend() != 'cpu':
    pytest.skip("a claim about XLA:CPU's plan")
  from retrax import layers as tl
  model = _small_reformer(tl.SelfAttention, 'eval', 16)
  compiled = _record_compiled_programs(monkeypatch)
  stream = decoding.autoregressive_sample_stream(
      model, batch_size=1, temperature=1.0, eval_mode=True,
      eval_min_length=16, rng=0)
  next(stream)
  temp_bytes, weight_bytes = _temps_and_weights(compiled[-1], model)
  assert temp_bytes < 0.5 * weight_bytes, (temp_bytes, weight_bytes)
