"""Test helpers for layers and models (Trax's `trax.layers.test_utils`).

`test_eval_equals_predict*` check that a model's 'predict' mode, fed the
sequence piece by piece, gives the outputs its 'eval' mode gives on the whole
sequence; `test_eval_is_deterministic` that 'eval' repeats itself;
`MockTransformerLM` is a stand-in language model for decoding tests.
"""

import copy
import functools
import os
import tempfile

import numpy as np

from retrax import fastmath
from retrax import shapes
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.layers import base
from retrax.layers import core
from retrax.validation import ArgumentValueError


def _as_list(outputs):
  return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def _twin_models(inp, model_fn, mode_a, mode_b):
  """Two models (modes `mode_a`, `mode_b`), the second with the first's weights."""
  model_a, model_b = model_fn(mode=mode_a), model_fn(mode=mode_b)
  signature = shapes.signature(inp)
  model_a.init(signature)
  model_b.init(signature)
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, 'weights.pkl.gz')
    model_a.save_to_file(path)
    model_b.init_from_file(path, weights_only=True, input_signature=signature)
  return model_a, model_b


def test_eval_is_deterministic(inp, model_fn, message=''):
  """Two 'eval' models with the same weights and rng give the same outputs (5 decimals)."""
  with fastmath.use_backend(fastmath.Backend.JAX):
    model_1, model_2 = _twin_models(inp, model_fn, 'eval', 'eval')
    rng = fastmath.random.get_prng(0)
    out_1 = _as_list(model_1(inp, rng=rng))
    out_2 = _as_list(model_2(inp, rng=rng))
    np.testing.assert_equal(len(out_1), len(out_2))
    for a, b in zip(out_1, out_2):
      np.testing.assert_array_almost_equal(
          a, b, decimal=5, err_msg=f'Non-deterministic.{message}')


def test_eval_equals_predict(inp, model_fn, seq_axis=1, seq_tensor=None,
                             init_tokens=3, message=''):
  """'predict' fed `init_tokens` positions, then one at a time, equals 'eval' on all.

  Args:
    inp: the input, an array or a tuple of arrays.
    model_fn: `model_fn(mode=...)` builds the model.
    seq_axis: the sequence axis.
    seq_tensor: with a tuple `inp`, the index of the array that is fed piece
      by piece (the others are fed whole each call).
    init_tokens: how many positions the first 'predict' call gets.
    message: appended to failure messages.
  """
  with fastmath.use_backend(fastmath.Backend.JAX):
    model_eval, model_predict = _twin_models(inp, model_fn, 'eval', 'predict')
    rng = fastmath.random.get_prng(0)
    out_eval = _as_list(model_eval(inp, rng=rng))
    seq = inp if seq_tensor is None else inp[seq_tensor]
    length = seq.shape[seq_axis]
    if length < init_tokens + 2:
      raise ArgumentValueError(f'test_eval_equals_predict needs a sequence of at least '
                               f'init_tokens + 2 = {init_tokens + 2} positions; got '
                               f'{length}.')
    pieces = [(0, init_tokens)] + [(i, i + 1)
                                   for i in range(init_tokens, length)]
    for start, end in pieces:
      window = np.arange(start, end)
      if seq_tensor is None:
        piece = inp.take(window, axis=seq_axis)
      else:
        piece = list(inp)
        piece[seq_tensor] = piece[seq_tensor].take(window, axis=seq_axis)
      out_predict = _as_list(model_predict(piece, rng=rng))
      np.testing.assert_equal(len(out_predict), len(out_eval))
      for got, want in zip(out_predict, out_eval):
        np.testing.assert_array_almost_equal(
            np.asarray(want).take(window, axis=seq_axis),
            np.asarray(got).take(np.arange(end - start), axis=seq_axis),
            decimal=5,
            err_msg=f'Error on element {(start, end)} out of {length}.'
                    f'{message}')


def test_eval_equals_predict_configs(inp, model_fn, configs, seq_axis=1,
                                     seq_tensor=None, message=''):
  """`test_eval_equals_predict` for `model_fn(**config)`, for each config in `configs`."""
  for config in configs:
    test_eval_equals_predict(inp, functools.partial(model_fn, **config),
                             seq_axis=seq_axis, seq_tensor=seq_tensor,
                             message=f' Config: {config}.{message}')


def test_eval_equals_predict_discrete(model_fn, vocab_size=10, length=5,
                                      batch_size=3):
  """A token model's 'predict' logits, one token a call, equal 'eval' on the growing buffer.

  `model_fn(mode=..., vocab_size=...)` builds the model; both modes are
  initialized with the same rng. The tokens fed are drawn with numpy's
  global generator.
  """
  with fastmath.use_backend(fastmath.Backend.JAX):
    model_eval = model_fn(mode='eval', vocab_size=vocab_size)
    model_predict = model_fn(mode='predict', vocab_size=vocab_size)
    rng = fastmath.random.get_prng(0)
    signature = shapes.ShapeDtype((batch_size, 1), np.int32)
    model_eval.init(signature, rng)
    model_predict.init(signature, rng)
    buf = np.zeros((batch_size, length), dtype=np.int32)
    token = np.zeros((batch_size, 1), dtype=np.int32)
    for index in range(length):
      logits_eval = model_eval(buf, rng=rng)
      logits_predict = model_predict(token, rng=rng)
      np.testing.assert_array_almost_equal(
          logits_eval[:, index, :], logits_predict[:, 0, :], decimal=5)
      token = np.random.randint(vocab_size, size=(batch_size, 1))
      buf[:, index] = token[:, 0]


class MockTransformerLM(base.Layer):
  """A perfectly trained, deterministic stand-in for `TransformerLM`, for decoding tests.

  `sequence_fn(prefix)` gives the next token for a 1-D array `prefix`. In
  'predict' mode each call appends its `(batch, n)` tokens to per-sequence
  buffers (the state) and returns logits `(batch, 1, vocab_size)` for the
  next token; other modes return logits for every position of the input,
  which is shifted right by a leading 0 as `TransformerLM` does. Logits are
  1000 at the chosen token, 0 elsewhere. Not for `tl.Accelerate`.
  """

  def __init__(self, sequence_fn, mode, vocab_size):
    super().__init__(mode=mode)
    self._sequence_fn = sequence_fn
    self._vocab_size = vocab_size
    self._buffers = None

  @property
  def vocab_size(self):
    """The size of the logits' last axis."""
    return self._vocab_size

  @property
  def state(self):
    """The prediction buffers (a copy): a list of token lists, or None."""
    return copy.deepcopy(self._buffers)

  @state.setter
  def state(self, state):
    self._buffers = copy.deepcopy(state)

  def _logits(self, symbols):
    symbols = np.asarray(symbols)
    if not np.issubdtype(symbols.dtype, np.integer):
      raise InputTypeError(f'MockTransformerLM: tokens must be integers; got '
                           f'{symbols.dtype}.')
    if symbols.size and (symbols.min() < 0 or
                         symbols.max() >= self._vocab_size):
      raise InputValueError(f'MockTransformerLM: tokens must be in [0, '
                            f'{self._vocab_size}); got {symbols.tolist()}.')
    return core.one_hot(symbols, self._vocab_size) * 1000.0

  def __call__(self, x, weights=None, state=None, rng=None):
    """`Layer.__call__`'s signature; the mock has no weights and no randomness."""
    del weights, rng
    if state is not None:
      self.state = state
    return self.forward(x)

  def forward(self, inputs):
    """Logits for `inputs`; in 'predict' mode the buffers grow by `inputs`."""
    inputs = np.asarray(inputs)
    if inputs.ndim != 2:
      raise InputValueError(f'MockTransformerLM takes (batch, length) tokens; got '
                            f'shape {inputs.shape}.')
    if self._buffers is None:
      self._buffers = [[] for _ in range(inputs.shape[0])]
    outputs = []
    for seq, buffer in zip(inputs, self._buffers):
      if self._mode == 'predict':
        buffer.extend(seq.tolist())
        outputs.append([self._sequence_fn(np.array(buffer))])
      else:
        shifted = np.concatenate(([0], seq))
        outputs.append([self._sequence_fn(shifted[:end])
                        for end in range(1, len(shifted))])
    return self._logits(np.array(outputs))

  def assert_prediction_buffers_equal(self, expected_buffers):
    """Raises AssertionError unless the buffers equal `expected_buffers`."""
    expected = np.asarray(expected_buffers)
    actual = (np.empty((expected.shape[0], 0)) if self._buffers is None
              else np.array(self._buffers))
    np.testing.assert_array_equal(actual, expected)
