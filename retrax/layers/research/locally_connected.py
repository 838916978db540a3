"""`LocallyConnected1d`: a 1-D convolution whose weights differ per position (Trax's layout)."""

from retrax import fastmath
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init

_PADDINGS = ('VALID', 'SAME', 'WRAP')


def _shift(x, shift, wrap):
  """`out[l] = x[l + shift]` along axis -3; wrapped or zero-filled."""
  if wrap:
    return jnp.roll(x, -shift, axis=-3)
  length = x.shape[-3]
  pad = [(0, 0)] * len(x.shape)
  pad[-3] = (max(0, -shift), max(0, shift))
  padded = jnp.pad(x, pad)
  start = max(0, shift)
  return padded[..., start:start + length, :, :]


class LocallyConnected1d(base.Layer):
  """`(..., L, p) -> (..., L', filters)`, a separate `(kernel_size, p, filters)` kernel per input position.

  With `h = (kernel_size - 1) // 2` and `r[l, i] = x[l] @ w[l, i]`:
  'WRAP' (cyclic) and 'SAME' (zeros outside) give `y[l] = Σ_i r[l + i - h, i]`;
  'VALID' gives `y[l] = Σ_i r[l + kernel_size - 1 - i, i]` for
  `l < L - kernel_size + 1` (Trax's index order). Weights: `w (L,
  kernel_size, p, filters)` and, with `use_bias`, `b (L', filters)`.
  """

  def __init__(self, filters, kernel_size,
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6),
               use_bias=True, padding='VALID'):
    super().__init__(name=f'LocallyConnected1d_{filters}_{kernel_size}')
    if kernel_size < 1 or kernel_size % 2 != 1:
      raise ValueError(f'LocallyConnected1d: kernel_size must be a positive '
                       f'odd int; got {kernel_size}.')
    if padding not in _PADDINGS:
      raise ValueError(f'LocallyConnected1d: padding must be one of '
                       f'{_PADDINGS}; got {padding!r}.')
    self._filters = filters
    self._kernel_size = kernel_size
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._use_bias = use_bias
    self._padding = padding

  def forward(self, x):
    w, b = self.weights if self._use_bias else (self.weights, None)
    if tuple(x.shape[-2:]) != tuple(w.shape[0:1] + w.shape[2:3]):
      raise ValueError(
          f'{self.name} was initialized for (..., {w.shape[0]}, {w.shape[2]}) '
          f'inputs; got shape {tuple(x.shape)}.')
    r = jnp.einsum('...lp,lkpd->...lkd', x, w)
    k, h = self._kernel_size, (self._kernel_size - 1) // 2
    if self._padding == 'VALID':
      out_len = x.shape[-2] - k + 1
      y = sum(r[..., k - 1 - i:k - 1 - i + out_len, i, :] for i in range(k))
    else:
      wrap = self._padding == 'WRAP'
      y = sum(_shift(r[..., i:i + 1, :], i - h, wrap)[..., 0, :]
              for i in range(k))
    return y + b if self._use_bias else y

  def init_weights_and_state(self, input_signature):
    length, depth = input_signature.shape[-2], input_signature.shape[-1]
    out_len = (length - self._kernel_size + 1 if self._padding == 'VALID'
               else length)
    if out_len < 1:
      raise ValueError(f'{self.name}: {length} positions are fewer than '
                       f'kernel_size {self._kernel_size} with VALID padding.')
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer((length, self._kernel_size, depth,
                                  self._filters), rng_w, nonreceptive_dims=[0])
    if self._use_bias:
      self.weights = (w, self._bias_initializer((out_len, self._filters),
                                                rng_b))
    else:
      self.weights = w
