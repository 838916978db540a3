"""Residual Shuffle-Exchange networks (https://arxiv.org/abs/2004.04662), Trax's `rse`.

A Benes block is log2(L) switch-and-shuffle steps, then log2(L) switch-and-
reverse-shuffle steps, each step's Residual Switch Unit (RSU) weights shared
along the steps (a `Scan`). The shuffles are bit rotations of the position
index, so the length should be a power of two (other lengths clip indices).
"""

import numpy as np

from retrax import fastmath
from retrax import layers as tl
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers.assert_shape import assert_shape
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _check_residual_weight(residual_weight):
  if not 0.0 < residual_weight < 1.0:
    raise ArgumentValueError(f'ResidualSwitchUnit: residual_weight must be in (0, 1); '
                             f'got {residual_weight}.')


@assert_shape('...->...')
class _ClippedScaling(tl.Layer):
  """`x * sigmoid(S)` with a learned vector S, initialized to `logit(residual_weight)`."""

  def __init__(self, residual_weight):
    super().__init__(n_in=1, n_out=1)
    _check_residual_weight(residual_weight)
    self._residual_weight = residual_weight

  def forward(self, x):
    return jnp.multiply(*fastmath.promoted(x, fastmath.expit(self.weights)))

  def init_weights_and_state(self, input_signature):
    logit = np.log(self._residual_weight / (1 - self._residual_weight))
    self.weights = (logit * np.ones(input_signature.shape[-1])).astype(
        np.float32)


def _pairs(x):
  if x.shape[1] % 2:
    raise InputValueError(f'ResidualSwitchUnit: the length ({x.shape[1]}) must be '
                          'even (positions are switched in pairs).')
  return jnp.reshape(x, (x.shape[0], x.shape[1] // 2, -1))


@assert_shape('bld->bld')
def ResidualSwitchUnit(d_model, dropout=0.1, mode='train', residual_weight=0.9):
  """RSU on pairs of neighbours `i = [i1, i2]`: `sigmoid(S) * i + h * W GELU(LayerNorm(Z i)) + B`.

  Z is `Dense(4 d_model)` without bias, W, B `Dense(2 d_model)`, S learned
  (`_ClippedScaling`), `h = sqrt(1 - residual_weight^2) / 4`; then dropout.
  Inputs are `[batch, length, d_model]` with an even length.
  """
  _check_residual_weight(residual_weight)
  scale = float(np.sqrt(1 - residual_weight**2))
  return tl.Serial(
      tl.Fn('Reshape2Pairs', _pairs, n_out=1),
      tl.Residual(
          tl.Dense(4 * d_model, use_bias=False),
          tl.LayerNorm(),
          tl.Gelu(),
          tl.Dense(2 * d_model),
          tl.Fn('Scaling', lambda x: x * scale * 0.25, n_out=1),
          shortcut=_ClippedScaling(residual_weight)),
      tl.Fn('UnPair',
            lambda x: jnp.reshape(x, (x.shape[0], x.shape[1] * 2, -1)),
            n_out=1),
      tl.Dropout(rate=dropout, mode=mode))


def _n_bits(seq_length):
  """Bits of the largest position index: `floor(log2(seq_length - 1)) + 1`."""
  if seq_length < 2:
    raise InputValueError(f'Shuffle layers need a length >= 2; got {seq_length}.')
  return int(np.int32(np.log(seq_length - 1) / np.log(2.0))) + 1


def _ror(x, n, p=1):
  """Rotates the n-bit values x right by p bits."""
  return np.right_shift(x, p) + np.left_shift(np.bitwise_and(x, (1 << p) - 1),
                                              n - p)


def _rol(x, n, p=1):
  """Rotates the n-bit values x left by p bits."""
  return np.bitwise_or(np.bitwise_and(np.left_shift(x, p), (1 << n) - 1),
                       np.right_shift(x, n - p))


def _shuffle_layer(inputs, shuffle_fn):
  """Takes positions along axis 1 at the rotated indices (clipped to the length)."""
  seq_length = inputs.shape[1]
  indices = shuffle_fn(np.arange(seq_length, dtype=np.int32),
                       _n_bits(seq_length))
  return jnp.take(inputs, indices, axis=1, mode='clip')


@assert_shape('bld->bld')
def ShuffleLayer():
  """Perfect shuffle: output position j takes input position rol(j)."""
  return tl.Fn('ShuffleLayer', lambda x: _shuffle_layer(x, _rol), n_out=1)


@assert_shape('bld->bld')
def ReverseShuffleLayer():
  """Inverse perfect shuffle: output position j takes input position ror(j)."""
  return tl.Fn('ReverseShuffleLayer', lambda x: _shuffle_layer(x, _ror),
               n_out=1)


@assert_shape('...,bld->...,bld')
def _ForwardStep(d_model, dropout, mode):
  """`(step, state) -> (step, shuffle(rsu(state)))`."""
  return tl.Parallel([], tl.Serial(ResidualSwitchUnit(d_model, dropout, mode),
                                   ShuffleLayer()))


@assert_shape('...,bld->...,bld')
def _BackwardStep(d_model, dropout, mode):
  """`(step, state) -> (step, reverse_shuffle(rsu(state)))`."""
  return tl.Parallel([], tl.Serial(ResidualSwitchUnit(d_model, dropout, mode),
                                   ReverseShuffleLayer()))


@assert_shape('bld->bld')
def BenesBlock(d_model, dropout, mode):
  """n_bits forward steps then n_bits backward steps, each group one shared RSU."""

  def bit_sequence(inputs):
    return jnp.arange(0, _n_bits(inputs.shape[1]))

  return tl.Serial(
      tl.Dup(),
      tl.Fn('BitSeq', bit_sequence, n_out=1),
      tl.Scan(_ForwardStep(d_model, dropout, mode)),
      tl.Scan(_BackwardStep(d_model, dropout, mode)),
      tl.Select([1]),
  )


@registry.register
@assert_shape('bl->blv')
def ResidualShuffleExchange(vocab_size, d_model, input_dropout, dropout,
                            mode='train', n_blocks=2):
  """Tokens `[b, l]` -> log-probabilities `[b, l, vocab_size]`.

  Embedding, input dropout, `n_blocks` Benes blocks, one more RSU, then
  `Dense(vocab_size)` and log-softmax.
  """
  if n_blocks < 0 or int(n_blocks) != n_blocks:
    raise ArgumentValueError(f'ResidualShuffleExchange: n_blocks must be an int >= 0; '
                             f'got {n_blocks!r}.')
  benes_blocks = [BenesBlock(d_model, dropout, mode) for _ in range(n_blocks)]
  return tl.Serial(
      tl.Embedding(vocab_size, d_model),
      tl.Dropout(rate=input_dropout, mode=mode),
      *benes_blocks,
      ResidualSwitchUnit(d_model, dropout, mode),
      tl.Dense(vocab_size),
      tl.LogSoftmax(),
  )

