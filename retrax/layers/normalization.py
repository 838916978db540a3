"""Normalization layers: LayerNorm, BatchNorm, FilterResponseNorm."""

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax import fastmath
from retrax.fastmath import with_rank
from retrax.layers import base
from retrax.validation import ArgumentValueError


@configurable('trax.layers')
class LayerNorm(base.Layer):
  """Normalizes the last axis to zero mean and unit variance, then scales and shifts."""

  def __init__(self, center=True, epsilon=1e-6):
    super().__init__()
    self._center = center
    self._epsilon = epsilon

  def forward(self, x):
    if not isinstance(self.weights, (tuple, list)) or len(self.weights) != 2:
      raise InputValueError(f'{self.name} weights should be (scale, bias); got '
                            f'{base.signature(self.weights)}; call '
                            'layer.init(input_signature) first.')
    scale, bias = self.weights
    if x.shape[-1] != scale.shape[-1]:
      raise InputValueError(f'{self.name} expects inputs with last dimension '
                            f'{scale.shape[-1]} (its scale has shape '
                            f'{tuple(scale.shape)}); got inputs of shape '
                            f'{tuple(x.shape)}.')
    mean = jnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean if self._center else x
    variance = jnp.mean(centered * centered, axis=-1, keepdims=True)
    scaled = centered / jnp.sqrt(variance + self._epsilon) * with_rank(scale, x.ndim)
    return scaled + with_rank(bias, x.ndim) if self._center else scaled

  def init_weights_and_state(self, input_signature):
    # As in Trax, the bias exists (zeros, unused) even when center=False.
    features = input_signature.shape[-1]
    scale = jnp.ones(features, dtype=input_signature.dtype)
    bias = jnp.zeros(features, dtype=input_signature.dtype)
    self.weights = (scale, bias)


@configurable('trax.layers')
class BatchNorm(base.Layer):
  """Batch normalization with running statistics in state (momentum-smoothed).

  In 'train' mode normalizes with batch statistics over `axis` and updates
  the running mean/variance; otherwise uses the running statistics.
  """

  def __init__(self, axis=(0, 1, 2), epsilon=1e-5, center=True, scale=True,
               momentum=0.999, mode='train'):
    super().__init__(mode=mode)
    self._axis = (axis,) if isinstance(axis, int) else tuple(axis)
    self._epsilon = epsilon
    self._center = center
    self._scale = scale
    self._momentum = momentum

  def forward(self, x):
    if not isinstance(self.state, (tuple, list)) or len(self.state) != 3:
      raise InputValueError(f'{self.name} state should be (running_mean, '
                            f'running_var, n_batches); got '
                            f'{base.signature(self.state)}; call '
                            'layer.init(input_signature) first.')
    running_mean, running_var, n_batches = self.state
    axis = tuple(a % x.ndim for a in self._axis)
    if self._mode == 'train':
      n_batches = n_batches + 1
      mean = jnp.mean(x, axis, keepdims=True)
      # Trax's fast variance E[x²] - E[x]² (not clamped at 0).
      var = jnp.mean(x ** 2, axis, keepdims=True) - mean ** 2
      m = self._momentum
      def ema(running, batch):  # In the wider dtype, stored as the state's.
        wide_running, batch = fastmath.promoted(running, batch)
        return (m * wide_running + (1 - m) * batch).astype(running.dtype)
      running_mean, running_var = ema(running_mean, mean), ema(running_var, var)
      self.state = (running_mean, running_var, n_batches)
    else:
      mean, var = running_mean, running_var
    z = ((x - mean.astype(x.dtype)) /
         jnp.sqrt(var + self._epsilon).astype(x.dtype))
    beta, gamma = self.weights
    bcast = tuple(None if i in axis else slice(None) for i in range(x.ndim))
    if self._scale:  # Trax's dtypes: float32 weights promote bf16 inputs.
      gamma, z = fastmath.promoted(gamma[bcast], z)
      z = gamma * z
    if self._center:
      beta, z = fastmath.promoted(beta[bcast], z)
      z = z + beta
    if z.dtype != x.dtype:
      raise TypeError(f'The dtype of the output ({z.dtype}) of batch norm is '
                      f'not the same as the input ({x.dtype}). Batch norm '
                      'should not change the dtype.')
    return z

  def init_weights_and_state(self, input_signature):
    shape = input_signature.shape
    axis = tuple(a % len(shape) for a in self._axis)
    wshape = tuple(d for i, d in enumerate(shape) if i not in axis)
    beta = jnp.zeros(wshape, dtype='float32') if self._center else ()
    gamma = jnp.ones(wshape, dtype='float32') if self._scale else ()
    stats = tuple(1 if i in axis else d for i, d in enumerate(shape))
    self.weights = (beta, gamma)
    self.state = (jnp.zeros(stats, jnp.float32), jnp.ones(stats, jnp.float32),
                  jnp.zeros((), dtype=jnp.int32))


@configurable('trax.layers')
class FilterResponseNorm(base.Layer):
  """Filter Response Normalization (Singh & Krishnan 2019), without the TLU.

  `x / sqrt(mean(x², spatial axes) + eps) * gamma + beta`; with
  `learn_epsilon` a learned |eps_l| is added to eps.
  """

  def __init__(self, mode=None, learn_epsilon=False, init_epsilon=1e-6,
               init_learnt_epsilon=1e-4):
    super().__init__()
    del mode
    if init_epsilon <= 0 or init_learnt_epsilon <= 0:
      raise ArgumentValueError('FilterResponseNorm epsilons must be > 0; got '
                               f'init_epsilon={init_epsilon}, '
                               f'init_learnt_epsilon={init_learnt_epsilon}.')
    self._learn_epsilon = learn_epsilon
    self._init_epsilon = init_epsilon
    self._init_learnt_epsilon = init_learnt_epsilon

  def forward(self, inputs):
    gamma, beta, epsilon_l = self.weights
    epsilon = self._init_epsilon
    if len(epsilon_l):
      epsilon = epsilon + jnp.abs(epsilon_l[0])
    axis = tuple(range(1, inputs.ndim - 1))
    nu2 = jnp.mean(inputs ** 2, axis=axis, keepdims=True)
    normed = inputs / jnp.sqrt(nu2 + epsilon)
    return with_rank(gamma, normed.ndim) * normed + with_rank(beta, normed.ndim)

  def init_weights_and_state(self, input_signature):
    c = input_signature.shape[-1]
    eps_l = ((jnp.array(self._init_learnt_epsilon, jnp.float32),)
             if self._learn_epsilon else ())
    self.weights = (jnp.ones((c,), jnp.float32), jnp.zeros((c,), jnp.float32),
                    eps_l)
