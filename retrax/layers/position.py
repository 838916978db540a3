"""Positional encodings: learned (sin/cos-initialized), axial, sin-cos and fixed-base.

Each layer adds position information to `(batch, length, d)` activations.
In 'predict' mode a layer keeps the index of the next position in `state`
and each call encodes the next `length` positions. For the tables of
`PositionalEncoding` and `AxialPositionalEncoding`, going past their last
position raises a ValueError when the call runs eagerly; under `jax.jit`
(the index is traced) the read is clamped to the last rows instead, as in
Trax, and a step run through `jax.experimental.checkify.checkify(step,
errors=checkify.user_checks)` reports the overflow (`validation.
check_predict_position`).
"""

import concurrent.futures
import functools
import operator
import os

import numpy as np

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init
from retrax.layers import predict_state
from retrax import validation
from retrax.layers.assert_shape import assert_shape
from retrax.validation import ArgumentValueError

_MODES = ('train', 'eval', 'predict', 'viz')


def _check_args(owner, dropout, mode):
  validation.check_rate(owner, 'dropout', dropout)
  validation.check_choice(owner, 'mode', mode, _MODES)


def _check_predict_range(layer, index, length, max_len):
  """Predict mode must not read past `max_len` positions (`validation`)."""
  validation.check_predict_position(layer.name, index, length, max_len)


def _check_3d(layer, x):
  if len(x.shape) != 3:
    raise InputValueError(f'{layer.name} expects (batch, length, d_feature) '
                          f'activations; got shape {tuple(x.shape)}.')


def _broadcast_dropout(x, px, dropout, broadcast_dims, rng):
  """`x + px * keep / (1 - dropout)`, `keep` shared along `broadcast_dims`."""
  noise_shape = list(px.shape)
  for dim in broadcast_dims:
    noise_shape[dim] = 1
  keep_prob = 1.0 - dropout
  keep = fastmath.random.bernoulli(rng, keep_prob, tuple(noise_shape))
  return x + px * (keep.astype(x.dtype) / keep_prob)


# Rows per block of `sin_cos_table`: each block's float64 angles and their
# sin and cos take ~3 * 8 * rows * d / 2 bytes (100 MB at d_model 256).
_TABLE_BLOCK_ROWS = 1 << 16


def sin_cos_table(max_len, d_feature):
  """Trax's interleaved sin/cos table `(max_len, d_feature)` (float32).

  Column 2i holds `sin(p / 10000^(2i/d))`, column 2i+1 holds `cos` of the
  same angle, computed in float64 as Trax did. Long tables are computed in
  blocks of rows on a thread each (NumPy's ufuncs release the GIL): at
  1,048,576 positions of 256 one thread took ~10 s, the table of the
  Reformer's 1M-token model; every value is the same as in one pass.
  """
  pe = np.zeros((max_len, d_feature), dtype=np.float32)
  div_term = np.exp(np.arange(0, d_feature, 2) *
                    -(np.log(10000.0) / d_feature))

  def fill(start):
    rows = slice(start, min(start + _TABLE_BLOCK_ROWS, max_len))
    angles = np.arange(rows.start, rows.stop)[:, np.newaxis] * div_term
    pe[rows, 0::2] = np.sin(angles)
    pe[rows, 1::2] = np.cos(angles[:, :d_feature // 2])

  starts = range(0, max_len, _TABLE_BLOCK_ROWS)
  if len(starts) == 1:
    fill(0)
  else:
    with concurrent.futures.ThreadPoolExecutor(
        min(len(starts), os.cpu_count() or 1)) as pool:
      list(pool.map(fill, starts))
  return pe


class _PositionCounter(base.Layer):
  """A layer whose predict-mode state is the count of positions encoded so far."""

  def predict_state_layout(self, state):
    """One counter shared by all examples; `max_len` positions (if any) in all."""
    return predict_state.PredictStateLayout(0, state, self.max_len)


@configurable('trax.layers', denylist=('mode',))
@assert_shape('...d->...d')
class PositionalEncoding(_PositionCounter):
  """Adds a learned positional table, initialized with Trax's sin/cos values.

  The weights are the `(max_len, d)` table (or, with `d_feature` set, a
  `(max_len, d_feature)` table and a `(d_feature, d)` projection). In 'train'
  mode a `dropout` fraction of positions (shared along
  `dropout_broadcast_dims`) gets no encoding, and with
  `start_from_zero_prob < 1` the table is read from a random offset in
  `[0, max_offset_to_add)` with probability `1 - start_from_zero_prob`.
  """

  def __init__(self, max_len=2048, dropout=0.0, dropout_broadcast_dims=(-2,),
               use_bfloat16=False, start_from_zero_prob=1.0,
               max_offset_to_add=0, d_feature=None, mode='train'):
    super().__init__(mode=mode)
    _check_args('PositionalEncoding', dropout, mode)
    max_len = validation.check_int('PositionalEncoding', 'max_len', max_len, 1)
    self._max_len = max_len
    self._dropout = dropout if mode == 'train' else 0.0
    self._dropout_broadcast_dims = dropout_broadcast_dims
    self._use_bfloat16 = use_bfloat16
    self._start_from_zero_prob = start_from_zero_prob
    self._max_offset_to_add = max_offset_to_add
    self._d_feature = d_feature

  def forward(self, inputs):
    _check_3d(self, inputs)
    length = inputs.shape[1]
    if self._mode == 'predict':
      _check_predict_range(self, self.state, length, self._max_len)
      px = self._rows(self.state, length)
      self.state = self.state + length
      return inputs + px
    if length > self._max_len:
      raise InputValueError(f'{self.name} encodes {self._max_len} positions; got '
                            f'input length {length}.')
    if self._mode != 'train' or self._start_from_zero_prob >= 1.0:
      px = self._rows(0, length)
    else:
      rng1, rng2 = fastmath.random.split(self.rng, 2)
      start = fastmath.random.randint(rng1, (), 0, self._max_offset_to_add)
      start_from_zero = fastmath.random.uniform(rng2, (), jnp.float32, 0, 1)
      start = jnp.where(start_from_zero < self._start_from_zero_prob,
                        jnp.zeros((), dtype=jnp.int32), start)
      px = self._rows(start, length)
    if self._dropout == 0:
      return inputs + px
    return _broadcast_dropout(inputs, px, self._dropout,
                              self._dropout_broadcast_dims, self.rng)

  def _rows(self, start, length):
    """Table rows `[start, start + length)` as `(1, length, d)`."""
    weights = self.weights
    ff = None
    if self._d_feature is not None:
      weights, ff = weights
    if len(weights.shape) < 3:  # Old checkpoints have the leading 1 already.
      weights = weights[None, :, :]
    if isinstance(start, int):
      rows = weights[:, start:start + length, :]
    else:
      rows = fastmath.dynamic_slice_in_dim(weights, start, length, axis=1)
    return rows if ff is None else jnp.dot(rows, ff)

  def init_weights_and_state(self, input_signature):
    d_input = input_signature.shape[-1]
    d_feature = d_input if self._d_feature is None else self._d_feature
    pe = jnp.array(sin_cos_table(self._max_len, d_feature))
    if self._use_bfloat16:
      pe = pe.astype(jnp.bfloat16)
    if self._d_feature is not None:
      ff = init.GlorotUniformInitializer()((d_feature, d_input), self.rng)
      self.weights = pe, ff
    else:
      self.weights = pe
    if self._mode == 'predict':
      self.state = jnp.zeros((), dtype=jnp.int32)


class AxialPositionalEncoding(_PositionCounter):
  """Axial positional encoding: the concatenation of one learned embedding per axis.

  Positions `0 .. prod(shape) - 1` are laid out row-major on a grid of
  `shape`; axis `a` contributes a learned `d_embs[a]`-vector indexed by the
  position's coordinate on that axis, so `sum(d_embs)` must equal the
  activation depth. Inputs may be shorter than `prod(shape)` (the first
  positions are used).
  """

  def __init__(self, shape=(64, 64, 3), d_embs=(384, 384, 256),
               kernel_initializer=init.RandomNormalInitializer(1.0),
               dropout=0.0, dropout_broadcast_dims=(), mode='train'):
    super().__init__(mode=mode)
    _check_args('AxialPositionalEncoding', dropout, mode)
    shape, d_embs = tuple(shape), tuple(d_embs)
    if len(shape) != len(d_embs) or not shape:
      raise ArgumentValueError(
          'AxialPositionalEncoding needs one embedding depth per axis: got '
          f'shape={shape} and d_embs={d_embs}.')
    self._kernel_initializer = kernel_initializer
    self._shape = shape
    self._d_embs = d_embs
    self._max_len = functools.reduce(operator.mul, shape, 1)
    self._dropout = dropout if mode == 'train' else 0.0
    self._dropout_broadcast_dims = dropout_broadcast_dims

  def forward(self, inputs):
    _check_3d(self, inputs)
    batch_size, length = inputs.shape[0], inputs.shape[1]
    self._check_depth(inputs.shape[-1])
    if self._mode == 'predict':
      _check_predict_range(self, self.state, length, self._max_len)
      emb = self._flat_embedding(1)
      emb = fastmath.dynamic_slice_in_dim(emb, self.state, length, axis=1)
      self.state = self.state + length
      return inputs + emb
    if length > self._max_len:
      raise InputValueError(
          f'{self.name} with shape {self._shape} encodes {self._max_len} '
          f'positions; got input length {length}.')
    if self._dropout == 0:
      embs = [jnp.reshape(jnp.broadcast_to(w, (1,) + self._shape + w.shape[-1:]),
                          (1, self._max_len, w.shape[-1]))[:, :length]
              for w in self.weights]
      return inputs + jnp.concatenate(embs, -1)
    # Dropout noise has Trax's shape (batch,) + shape + (d,), whose axes
    # `dropout_broadcast_dims` refers to.
    emb = self._grid_embedding(batch_size)
    noise_shape = list(emb.shape)
    for dim in self._dropout_broadcast_dims:
      noise_shape[dim] = 1
    keep_prob = 1.0 - self._dropout
    keep = fastmath.random.bernoulli(self.rng, keep_prob, tuple(noise_shape))
    emb = emb * (keep.astype(inputs.dtype) / keep_prob)
    emb = jnp.reshape(emb, (batch_size, self._max_len, emb.shape[-1]))
    return inputs + emb[:, :length]

  def _grid_embedding(self, batch_size):
    embs = [jnp.broadcast_to(w, (batch_size,) + self._shape + w.shape[-1:])
            for w in self.weights]
    return jnp.concatenate(embs, -1)

  def _flat_embedding(self, batch_size):
    emb = self._grid_embedding(batch_size)
    return jnp.reshape(emb, (batch_size, self._max_len, emb.shape[-1]))

  def _check_depth(self, d_feature):
    if sum(self._d_embs) != d_feature:
      raise InputValueError(
          f'AxialPositionalEncoding: sum(d_embs) = sum({self._d_embs}) = '
          f'{sum(self._d_embs)} must equal the activation depth d_feature = '
          f'{d_feature}.')

  def init_weights_and_state(self, input_signature):
    self._check_depth(input_signature.shape[-1])
    rngs = fastmath.random.split(self.rng, len(self._d_embs))
    weights = []
    for ax, (ax_rng, d_emb) in enumerate(zip(rngs, self._d_embs)):
      ax_shape = [1] * len(self._shape)
      ax_shape[ax] = self._shape[ax]
      weights.append(self._kernel_initializer(
          (1,) + tuple(ax_shape) + (d_emb,), ax_rng))
    if self._mode == 'predict':
      self.state = jnp.zeros((), dtype=jnp.int32)
    self.weights = tuple(weights)


class SinCosPositionalEncoding(_PositionCounter):
  """Adds a fixed (weightless) sin/cos encoding: `[sin(p·f_i) ..., cos(p·f_i) ...]`.

  `f_i = 10000^(-2i/d)`; the sines fill the first half of the features and
  the cosines the second. In 'train' mode positions start at a random offset
  in `[0, add_offset)`, except one time in `start_from_zero_one_in`, when
  they start at 0; `dropout` drops the encoding at a fraction of positions.
  """

  def __init__(self, add_offset=2048, dropout=0.0, dropout_broadcast_dims=(-2,),
               start_from_zero_one_in=2, mode='train'):
    super().__init__(mode=mode)
    _check_args('SinCosPositionalEncoding', dropout, mode)
    self._add_offset = add_offset
    self._dropout = dropout if mode == 'train' else 0.0
    self._dropout_broadcast_dims = dropout_broadcast_dims
    self._start_from_zero_one_in = start_from_zero_one_in

  def _sincos(self, start, length, d_feature):
    """The `(1, length, d_feature)` encoding of positions `start ...`."""
    position = (jnp.arange(0, length)[:, None] + start).astype(jnp.float32)
    div_term = jnp.exp(jnp.arange(0, d_feature, 2, dtype=jnp.float32) *
                       -(jnp.log(10000.0) / d_feature))[None, :]
    pe = jnp.concatenate([jnp.sin(position * div_term),
                          jnp.cos(position * div_term)], axis=1)
    return pe[None, :, :]

  def forward(self, inputs):
    _check_3d(self, inputs)
    length, d_feature = inputs.shape[1], inputs.shape[2]
    if d_feature % 2:
      raise InputValueError(f'{self.name} needs an even depth; got {d_feature}.')
    if self._mode == 'predict':
      pe = self._sincos(self.state, length, d_feature)
      self.state = self.state + length
      return inputs + pe
    if self._mode != 'train':
      start = 0
    else:
      rng1, rng2 = fastmath.random.split(self.rng, 2)
      start = fastmath.random.randint(rng1, (), 0, self._add_offset)
      start_from_nonzero = fastmath.random.randint(
          rng2, (), 0, self._start_from_zero_one_in)
      start = start * jnp.minimum(1, start_from_nonzero)
    px = self._sincos(start, length, d_feature)
    if self._dropout == 0:
      return inputs + px
    return _broadcast_dropout(inputs, px, self._dropout,
                              self._dropout_broadcast_dims, self.rng)

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      self.state = jnp.zeros((), dtype=jnp.int32)


class FixedBasePositionalEncoding(_PositionCounter):
  """Encodes positions by their digits in several bases, with learned digit vectors.

  For each base `b` in `bases` and digit `i < n_digits`, digit value
  `(p // b^i) % b` scales a learned `(1, d // n_digits)` vector; the digits
  are concatenated and the bases summed. A learned `start_vec` is added at
  the first position. In 'train' mode each example starts at a random
  position (except one time in `start_from_zero_one_in`) and, one time in
  `base_dropout_one_in`, gets no base embeddings.
  """

  def __init__(self, bases=(11, 13, 14, 15), n_digits=8,
               start_from_zero_one_in=2, base_dropout_one_in=100,
               mode='train', initializer=init.RandomUniformInitializer(1e-4)):
    super().__init__(mode=mode)
    if mode not in _MODES:
      raise ArgumentValueError(f'mode must be one of {_MODES}; got {mode!r}.')
    self._bases = tuple(bases)
    self._n_digits = n_digits
    self._initializer = initializer
    self._start_from_zero_one_in = start_from_zero_one_in
    self._base_dropout_one_in = base_dropout_one_in

  def forward(self, x):
    _check_3d(self, x)
    base_weights, start_vec = self.weights
    batch_size, length = x.shape[0], x.shape[1]
    max_pos = min(self._bases)**self._n_digits
    if length >= max_pos:
      raise InputValueError(f'{self.name}: input length ({length}) must be below '
                            f'min(bases)**n_digits ({max_pos}).')
    rng1, rng2, rng3 = fastmath.random.split(self.rng, 3)
    positions = jnp.arange(0, length)[None, :]
    if self._mode == 'train':
      start_from_nonzero = jnp.minimum(1, fastmath.random.randint(
          rng1, (batch_size,), 0, self._start_from_zero_one_in))
      random_start = fastmath.random.randint(
          rng2, (batch_size,), 0, max_pos - length) * start_from_nonzero
      positions = positions + random_start[:, None]
    if self._mode == 'predict':
      positions = positions + self.state
    per_base = []
    for bn, base_ in enumerate(self._bases):
      digits = []
      cur = positions
      for i in range(self._n_digits):
        digits.append(jnp.mod(cur, base_).astype(jnp.float32)[:, :, None] *
                      jnp.expand_dims(base_weights[bn][i], 0))
        cur = cur // base_
      embeddings = jnp.concatenate(digits, axis=-1)
      if self._mode == 'train':
        # Trax draws this from the same key for every base.
        base_dropout = jnp.minimum(1, fastmath.random.randint(
            rng3, (batch_size,), 0, self._base_dropout_one_in))
        embeddings = embeddings * base_dropout.astype(jnp.float32)[:, None, None]
      per_base.append(embeddings)
    res = functools.reduce(operator.add, per_base)
    res0 = res[:, 0, :][:, None, :]
    start_pos = res0 + start_vec
    if self._mode == 'predict':
      start_pos = jnp.where(jnp.equal(self.state, 0), start_pos, res0)
      self.state = self.state + length
    return x + jnp.concatenate([start_pos, res[:, 1:, :]], axis=1)

  def init_weights_and_state(self, input_signature):
    d_feature = input_signature.shape[-1]
    if d_feature % self._n_digits != 0:
      raise InputValueError(f'{self.name}: d_feature ({d_feature}) must be a '
                            f'multiple of n_digits ({self._n_digits}).')
    d_weight = d_feature // self._n_digits
    rng1, rng2 = fastmath.random.split(self.rng, 2)
    base_weights = tuple(
        tuple(self._initializer((1, d_weight), rng)
              for rng in fastmath.random.split(rng1, self._n_digits))
        for _ in self._bases)
    start_vec = self._initializer((1, 1, d_feature), rng2)
    self.weights = (base_weights, start_vec)
    if self._mode == 'predict':
      self.state = jnp.zeros((), dtype=jnp.int32)
