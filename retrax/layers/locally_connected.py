"""`LocallyConnected1d` (a convolution with separate weights per position) and `SummaryScalar`."""

from typing import Any

import numpy as np

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init
from retrax import validation
from retrax.validation import ArgumentValueError

_PADDINGS = ('VALID', 'SAME', 'WRAP')


class LocallyConnected1d(base.Layer):
  """Like a stride-1 1-D convolution, but each input position has its own kernel.

  Inputs `(..., L, D)`; weights `w` `(L, kernel_size, D, filters)`, where
  `w[l, k]` maps input position `l` seen through kernel slot `k`, and bias
  `(L_out, filters)`. Output `(..., L_out, filters)` with `L_out = L` for
  padding 'SAME' (zeros outside) and 'WRAP' (circular), `L - kernel_size + 1`
  for 'VALID'. With `c = (kernel_size - 1) // 2`, 'SAME'/'WRAP' compute
  `y[m] = sum_k x[m + k - c] @ w[m + k - c, k]` and 'VALID' computes
  `y[m] = sum_k x[m + K - 1 - k] @ w[m + K - 1 - k, k]` (Trax's slot order).
  `L` is fixed at `init`.
  """

  def __init__(self, filters, kernel_size,
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               use_bias=True, padding='VALID'):
    filters = validation.check_int('LocallyConnected1d', 'filters', filters, 1)
    kernel_size = validation.check_int('LocallyConnected1d', 'kernel_size',
                                       kernel_size, 1)
    if kernel_size % 2 != 1:
      raise ArgumentValueError('LocallyConnected1d: kernel_size must be odd; got '
                               f'{kernel_size}.')
    validation.check_choice('LocallyConnected1d', 'padding', padding, _PADDINGS)
    super().__init__(name=f'LocallyConnected1d_{filters}_{kernel_size}')
    self._filters = filters
    self._kernel_size = kernel_size
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._use_bias = use_bias
    self._padding = padding

  def _sources(self, length):
    """(input index [K, L_out], in-range mask [K, L_out]) for each kernel slot."""
    k = self._kernel_size
    slots = np.arange(k)[:, None]
    if self._padding == 'VALID':
      src = np.arange(length - k + 1)[None, :] + (k - 1) - slots
    else:
      src = np.arange(length)[None, :] + slots - (k - 1) // 2
    valid = (src >= 0) & (src < length)
    if self._padding == 'WRAP':
      return src % length, np.ones_like(valid)
    return np.clip(src, 0, length - 1), valid

  def forward(self, x):
    if self._use_bias:
      if not isinstance(self.weights, (tuple, list)) or len(self.weights) != 2:
        raise InputValueError(f'{self.name} weights should be a (w, b) tuple; got '
                              f'{base.signature(self.weights)}.')
      w, b = self.weights
    else:
      w, b = self.weights, None
    length = x.shape[-2]
    if length != w.shape[0]:
      raise InputValueError(f'{self.name} was initialized for length {w.shape[0]} '
                            f'(axis -2); got input shape {tuple(x.shape)}.')
    # per_slot[..., l, k, :]: input position l through kernel slot k.
    x, w = fastmath.promoted(x, w, ranks=False)  # Integer inputs, as Trax.
    per_slot = jnp.einsum('...lp,lkpd->...lkd', x, w)
    src, valid = self._sources(length)
    y: Any = 0.  # An array after the first kernel position.
    for k in range(self._kernel_size):
      part = jnp.take(per_slot[..., k, :], src[k], axis=-2)
      y = y + part * fastmath.with_rank(valid[k][:, None].astype(part.dtype),
                                        part.ndim)
    return y if b is None else y + fastmath.with_rank(b, y.ndim)

  def init_weights_and_state(self, input_signature):
    length, depth = input_signature.shape[-2], input_signature.shape[-1]
    length_out = (length - self._kernel_size + 1 if self._padding == 'VALID'
                  else length)
    if length_out < 1:
      raise InputValueError(f"{self.name} with padding 'VALID' needs length >= "
                            f'{self._kernel_size}; got input shape '
                            f'{tuple(input_signature.shape)}.')
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer(
        (length, self._kernel_size, depth, self._filters), rng_w,
        nonreceptive_dims=[0])
    if self._use_bias:
      self.weights = (w, self._bias_initializer((length_out, self._filters),
                                                rng_b))
    else:
      self.weights = w


class SummaryScalar(base.Layer):
  """Passes its input through and keeps `aggregation_fun(x)` (a scalar) as its state.

  The state is `{'summary_<name>': value}` (0. after `init`), for reporting
  as a metric; the layer's name is `summary_<name>`.
  """

  def __init__(self, name, aggregation_fun=jnp.mean):
    super().__init__(name=f'summary_{name}')
    self._aggregation_fun = aggregation_fun

  def forward(self, x):
    self.state = {self.name: self._aggregation_fun(x)}
    return x

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = {self.name: jnp.array(0.)}
