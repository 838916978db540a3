"""Core layers: Dense, Embedding, Dropout, Weights, shape and reduction layers."""

import jax
import numpy as np

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init
from retrax import validation
from retrax.layers.assert_shape import assert_shape
from retrax.layers.base import Fn
# Trax defines these in `trax.layers.core`.
from retrax.layers.locally_connected import LocallyConnected1d as LocallyConnected1d
from retrax.layers.locally_connected import SummaryScalar as SummaryScalar


@assert_shape('...a->...b')
class Dense(base.Layer):
  """Affine map `y = x·W + b` over the last axis (or linear `x·W` with `use_bias=False`).

  Shapes: `x` [..., d_in], `W` [d_in, n_units], `b` [n_units],
  `y` [..., n_units]. Weights are `(W, b)`, or `W` alone without bias.
  Integer or boolean inputs are promoted as `jnp.dot` does (int32 with
  float32 weights gives float32), as in Trax.
  """

  def __init__(self, n_units, kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               use_bias=True, use_bfloat16=False):
    n_units = validation.check_int('Dense', 'n_units', n_units, 1)
    super().__init__(name=f'Dense_{n_units}')
    self._n_units = n_units
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._use_bias = use_bias
    self._use_bfloat16 = use_bfloat16

  @property
  def n_units(self):
    """The output depth (columns of `W`)."""
    return self._n_units

  def forward(self, x):
    if self._use_bias:
      if not isinstance(self.weights, (tuple, list)) or len(self.weights) != 2:
        raise InputValueError(
            f'{self.name} weights should be a (w, b) tuple; got '
            f'{base.signature(self.weights)}' + _NOT_INITIALIZED_HINT)
      w, b = self.weights
    else:
      w, b = self.weights, None
      if not hasattr(w, 'shape') or len(w.shape) != 2:
        raise InputValueError(f'{self.name} weights should be one matrix w; got '
                              f'{base.signature(w)}' + _NOT_INITIALIZED_HINT)
    _check_features(self, x, w.shape[0], 'W', w.shape)
    x, w = fastmath.promoted(x, w, ranks=False)  # float32 weights, float64/bf16 inputs.
    y = precision.dot(x, w)
    if b is None:
      return y
    y, b = fastmath.promoted(y, b)
    return y + b

  def init_weights_and_state(self, input_signature):
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer((input_signature.shape[-1], self._n_units), rng_w)
    dtype = jnp.bfloat16 if self._use_bfloat16 else None
    if dtype is not None:
      w = w.astype(dtype)
    if self._use_bias:
      b = self._bias_initializer((self._n_units,), rng_b)
      self.weights = (w, b.astype(dtype) if dtype is not None else b)
    else:
      self.weights = w


@assert_shape('...->...d')
class Embedding(base.Layer):
  """Maps integer token ids to learned `d_feature`-vectors.

  Ids are clipped to [0, vocab_size): negative ids map to row 0 and ids
  >= vocab_size to the last row (as in Trax). Shapes: ids [...] int,
  weights [vocab_size, d_feature], output [..., d_feature].
  """

  def __init__(self, vocab_size, d_feature, use_bfloat16=False,
               kernel_initializer=init.ScaledInitializer(
                   out_dim=-1, in_dim=-2, scale=1., mode='fan_out',
                   distribution='uniform')):
    vocab_size = validation.check_int('Embedding', 'vocab_size', vocab_size, 1)
    d_feature = validation.check_int('Embedding', 'd_feature', d_feature, 1)
    super().__init__(name=f'Embedding_{vocab_size}_{d_feature}')
    self._vocab_size = vocab_size
    self._d_feature = d_feature
    self._use_bfloat16 = use_bfloat16
    self._kernel_initializer = kernel_initializer

  @property
  def vocab_size(self):
    """How many token ids the table embeds (rows of the weights)."""
    return self._vocab_size

  def forward(self, x):
    _check_int(self, x)
    if not hasattr(self.weights, 'shape'):
      raise InputValueError(f'{self.name} has no embedding table; got weights '
                            f'{base.signature(self.weights)}' + _NOT_INITIALIZED_HINT)
    embedded = jnp.take(self.weights, x, axis=0, mode='clip')
    if self._use_bfloat16:
      embedded = embedded.astype(jnp.float32)
    return embedded

  def init_weights_and_state(self, input_signature):
    if input_signature is not None:  # Trax allows init(None) here.
      _check_int(self, input_signature)
    w = self._kernel_initializer((self._vocab_size, self._d_feature), self.rng)
    self.weights = w.astype(jnp.bfloat16) if self._use_bfloat16 else w


@assert_shape('...->...')
class Dropout(base.Layer):
  """Zeroes a `rate` fraction of values in training and scales the rest by 1/(1-rate).

  `shared_axes` lists axes along which one mask value is shared (broadcast).
  A no-op unless `mode='train'`. The state holds the rate as a 0-d float32
  (as in Trax); a state dict `{name: rate}` overrides the rate.
  """

  def __init__(self, rate=0.0, shared_axes=None, mode='train'):
    super().__init__(mode=mode)
    validation.check_rate('Dropout', 'rate', rate)
    self._initial_rate = rate
    self._shared_axes = [] if shared_axes is None else list(shared_axes)

  def same_mask_along(self, axis, ndim):
    """True if every slice along `axis` of an `ndim`-axis input gets the same mask.

    So it does when the layer is off (not training, or a rate of 0 not
    overridden by a state dict) or `axis` is one of its `shared_axes`.
    """
    if self._mode != 'train':
      return True
    if isinstance(self.state, dict):
      return False  # The rate is the state's, known only when run.
    rate = self._initial_rate
    if isinstance(rate, float) and rate == 0.0:
      return True
    return axis % ndim in {a % ndim for a in self._shared_axes}

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.array(self._initial_rate, dtype=jnp.float32)

  def forward(self, x):
    if self._mode != 'train':
      return x
    rate = self._initial_rate
    if isinstance(self.state, dict) and self._name in self.state:
      rate = self.state[self._name]
    if isinstance(rate, float) and rate == 0.0:
      return x
    mask_shape = list(x.shape)
    for axis in self._shared_axes:
      mask_shape[axis] = 1
    keep_prob = 1.0 - rate
    keep = fastmath.random.bernoulli(self.rng, keep_prob, tuple(mask_shape))
    return x * (keep.astype(x.dtype) / keep_prob)


class Weights(base.Layer):
  """Takes no input and returns a learned tensor of `shape`."""

  def __init__(self, initializer, shape=(), use_bfloat16=False):
    super().__init__(name=f'Weights_{shape}', n_in=0, n_out=1)
    self._shape = tuple(shape)
    self._initializer = initializer
    self._use_bfloat16 = use_bfloat16

  def forward(self, x):
    del x
    return self.weights

  def init_weights_and_state(self, input_signature):
    del input_signature
    w = self._initializer(self._shape, self.rng)
    self.weights = w.astype(jnp.bfloat16) if self._use_bfloat16 else w


class RandomUniform(base.Layer):
  """Takes no input and returns uniform random values of `shape` in [min_val, max_val)."""

  def __init__(self, min_val=0.0, max_val=1.0, shape=(), dtype=np.float32,
               sync=False):
    super().__init__(n_in=0, n_out=1)
    self._min_val, self._max_val = min_val, max_val
    self._shape, self._dtype, self._sync = tuple(shape), dtype, sync

  def forward(self, xs):
    del xs
    return fastmath.random.uniform(self.rng, self._shape, self._dtype,
                                   self._min_val, self._max_val)


def Flatten(n_axes_to_keep=1):
  """Collapses all axes after the first `n_axes_to_keep` into one."""
  def f(x):
    if len(x.shape) <= n_axes_to_keep:
      raise InputValueError(f'Input rank ({len(x.shape)}) must exceed the number of'
                            f' axes to keep ({n_axes_to_keep}) after flattening.')
    return jnp.reshape(x, tuple(x.shape[:n_axes_to_keep]) + (-1,))
  return Fn(f'Flatten_keep{n_axes_to_keep}', f)


def log_softmax(x, axis=-1):
  """Log-probabilities `x - logsumexp(x)` along `axis`."""
  return x - fastmath.logsumexp(x, axis=axis, keepdims=True)


@configurable('trax.layers')
def LogSoftmax(axis=-1):
  """Layer computing `log_softmax` along `axis`."""
  return Fn('LogSoftmax', lambda x: log_softmax(x, axis=axis))


def LogSumExp(axis=-1):
  """Layer computing log(sum(exp(x))) along `axis`, keeping that axis (size 1)."""
  return Fn('LogSumExp',
            lambda x: fastmath.logsumexp(x, axis=axis, keepdims=True))


@configurable('trax.layers')
def Softmax(axis=-1):
  """Layer computing softmax along `axis` (as exp of `log_softmax`)."""
  return Fn('Softmax', lambda x: jnp.exp(log_softmax(x, axis=axis)))


def ToFloat():
  """Layer casting its input to float32."""
  return Fn('ToFloat', lambda x: x.astype(np.float32))


def Mean(axis=-1, keepdims=False):
  """Layer computing the mean along `axis`."""
  return Fn('Mean', lambda x: jnp.mean(x, axis=axis, keepdims=keepdims))


def Min(axis=-1, keepdims=False):
  """Layer computing the minimum along `axis`."""
  return Fn('Min', lambda x: jnp.min(x, axis, keepdims=keepdims))


def Max(axis=-1, keepdims=False):
  """Layer computing the maximum along `axis`."""
  return Fn('Max', lambda x: jnp.max(x, axis, keepdims=keepdims))


def Sum(axis=None, keepdims=False):
  """Layer computing the sum along `axis` (all elements if None)."""
  return Fn('Sum', lambda x: jnp.sum(x, axis=axis, keepdims=keepdims))


def ThresholdToBinary(threshold=.5):
  """Layer mapping `x > threshold` to int32 1 and everything else to 0."""
  return Fn('ThresholdToBinary',
            lambda x: (x > threshold).astype(jnp.int32))


def ArgMax(axis=-1):
  """Layer computing the index of the maximum along `axis`."""
  return Fn('ArgMax', lambda x: jnp.argmax(x, axis=axis))


@assert_shape('...->...')
def Negate():
  """Layer computing `-x`."""
  return Fn('Negate', lambda x: -x)


@assert_shape('...->...')
def StopGradient():
  """Identity layer whose gradient is zero."""
  return Fn('StopGradient', lambda x: fastmath.stop_gradient(x))


def PrintShape(n_in=1, msg=''):
  """Prints the shapes and dtypes of `n_in` inputs and returns them unchanged."""
  def fwd(xs):
    def fmt(x):
      return f'{x.shape}[{x.dtype}]'
    shapes = ', '.join(fmt(x) for x in xs) if n_in > 1 else fmt(xs)
    print(f'PrintShape: {msg}: [{shapes}]')
    return xs
  return base.PureLayer(fwd, n_in=n_in, n_out=n_in, name=f'PrintShape_{n_in}')


def one_hot(x, n_categories, dtype=jnp.float32):
  """One-hot array with a new last axis of size `n_categories`."""
  x = jnp.asarray(x)
  categories = jnp.arange(n_categories, dtype=x.dtype)
  categories = categories.reshape((1,) * x.ndim + (n_categories,))
  return jnp.array(x[..., jnp.newaxis] == categories, dtype)


def logsoftmax_sample(log_probs, temperature=1.0):
  """Samples ids from log-probabilities with the Gumbel trick (numpy RNG, as Trax)."""
  u = np.random.uniform(low=1e-6, high=1.0 - 1e-6, size=log_probs.shape)
  g = -np.log(-np.log(u))
  return np.argmax(np.asarray(log_probs) + g * temperature, axis=-1)


def log_gaussian_pdf(x, mu, sigma):
  """log N(x | mu, sigma) for a full covariance matrix."""
  a = mu.shape[-1] * jnp.log(2 * jnp.pi)
  _, b = jnp.linalg.slogdet(sigma)
  y = jnp.linalg.solve(sigma, (x - mu)[..., None])
  c = jnp.squeeze(jnp.matmul(jnp.expand_dims(x - mu, -2), y), (-1, -2))
  return -0.5 * (a + b + c)


def log_gaussian_diag_pdf(x, mu, diag_sigma):
  """log N(x | mu, diag(diag_sigma))."""
  a = mu.shape[-1] * jnp.log(2 * jnp.pi)
  b = jnp.sum(jnp.log(diag_sigma), axis=-1)
  c = jnp.sum((x - mu) ** 2 / diag_sigma, axis=-1)
  return -0.5 * (a + b + c)


_NOT_INITIALIZED_HINT = ('; was the layer initialized? Call '
                         'layer.init(input_signature) before using it.')


def _check_int(layer, sig):
  if not hasattr(sig, 'dtype') or not jax.numpy.issubdtype(sig.dtype,
                                                        jax.numpy.integer):
    raise InputTypeError(f'{layer.name} expects integer token ids; got '
                         f'{base.signature(sig)}. Cast ids with x.astype(np.int32).')


def _check_features(layer, x, n, weight_name, weight_shape):
  if not x.shape or x.shape[-1] != n:
    raise InputValueError(
        f'{layer.name} expects inputs with last dimension {n} (its weight '
        f'{weight_name} has shape {tuple(weight_shape)}); got inputs of shape '
        f'{tuple(x.shape)}.')


@assert_shape('...d->...d')
def ShiftRight(n_positions=1, mode='train'):
  """Shifts sequences (axis 1) right by `n_positions`, padding with 0; identity in predict mode."""
  def f(x):
    if mode == 'predict':
      return x
    pad = [(0, 0)] * x.ndim
    pad[1] = (n_positions, 0)
    return jnp.pad(x, pad, mode='constant')[:, :-n_positions]
  return Fn(f'ShiftRight({n_positions})', f)


@assert_shape('bs->b11l')
def PaddingMask(pad=0):
  """Maps (batch, length) ids to a (batch, 1, 1, length) mask: True where `x != pad`."""
  def f(x):
    if len(x.shape) != 2:
      raise InputValueError('Input to PaddingMask must be a 2-D array with shape '
                            f'(batch_size, sequence_length); got shape {x.shape}.')
    return (x != pad).reshape((x.shape[0], 1, 1, x.shape[1]))
  return Fn(f'PaddingMask({pad})', f)


def EncoderDecoderMask():
  """(decoder_input, encoder padding mask) -> (batch, 1, decoder_len, encoder_len) mask."""
  def f(decoder_input, mask):
    if len(decoder_input.shape) != 3:
      raise InputValueError('Decoder input to EncoderDecoderMask must be a 3-D array'
                            ' with shape (batch_size, decoder_sequence_length, '
                            f'd_model); got shape {decoder_input.shape}.')
    mask = mask.reshape((mask.shape[0], 1, 1, mask.shape[-1]))
    # Explicit broadcast and cast (what `mask + zeros(float32)` promoted to).
    shape = (mask.shape[0], 1, decoder_input.shape[1], mask.shape[-1])
    dtype = jnp.float64 if mask.dtype == jnp.float64 else jnp.float32
    return jnp.broadcast_to(mask, shape).astype(dtype)
  return Fn('EncoderDecoderMask', f)

