"""Mixture-of-experts feed-forward blocks: `BlockSparseFF` and `SwitchSparseFF` (Trax 1.4.1).

Both split the `d_ff` hidden units of `Dense(d_ff), Relu, Dense(d_model)` into
`n_experts` contiguous blocks and run one block per position. A router
`m1 [d_model, n_experts]` gives `p = softmax(x·m1)`; the expert is
`argmax(log p + temperature · gumbel)` (temperature 0 outside 'train'). Then

    mid = relu((x·w1) * mask_expanded),  out = mid·w2 + b2

with `mask` the one-hot of the expert, and in training:
- BlockSparseFF: the one-hot with a straight-through gradient of `p`, or
  (on a random half of the steps) `p` itself;
- SwitchSparseFF (and in every mode): the one-hot times `p` (the router gets
  the gradient of its selected probability, as in the Switch Transformer).

Weights (Trax's order): `(m1, w1 [d_model, d_ff], w2 [d_ff, d_model], b2)`.
A single position (predict mode, batch 1) reads only the selected columns of
`w1` and rows of `w2`.
"""

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.validation import ArgumentValueError

_MODES = ('train', 'eval', 'predict', 'viz')


def _relu(x):
  return jnp.where(x <= 0, jnp.zeros_like(x), x)


class _ExpertFF(base.Layer):
  """Shared parts of the two routed feed-forward blocks."""

  def __init__(self, d_ff, n_experts, temperature, mode, kernel_initializer,
               bias_initializer):
    super().__init__(name=f'{type(self).__name__}_{d_ff}', mode=mode)
    if n_experts < 1 or d_ff % n_experts:
      raise ArgumentValueError(f'{type(self).__name__}: d_ff ({d_ff}) must be a '
                               f'positive multiple of n_experts ({n_experts}).')
    if mode not in _MODES:
      raise ArgumentValueError(f'{type(self).__name__}: mode must be one of {_MODES}; '
                               f'got {mode!r}.')
    self._d_ff = d_ff
    self._n_experts = n_experts
    self._temperature = temperature if mode == 'train' else 0.0
    self._block = d_ff // n_experts
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def _mask(self, probs, one_hot, rng):
    raise NotImplementedError

  def _route(self, x, m1):
    """`(probs, one-hot of the chosen experts, chosen experts)` for rows x."""
    logits = jnp.dot(x, m1)
    log_probs = logits - fastmath.logsumexp(logits, axis=-1, keepdims=True)
    rng1, _ = fastmath.random.split(self.rng, 2)
    u = fastmath.random.uniform(rng1, log_probs.shape, jnp.float32, 1e-6,
                                1.0 - 1e-6)
    gumbel = -jnp.log(-jnp.log(u))
    experts = jnp.argmax(log_probs + gumbel * self._temperature, axis=-1)
    one_hot = fastmath.stop_gradient(core.one_hot(experts, self._n_experts))
    return jnp.exp(log_probs), one_hot, experts

  def forward(self, x):
    m1, w1, w2, b2 = self.weights
    if x.shape[-1] != w1.shape[0]:
      raise InputValueError(f'{self.name} was initialized for inputs of depth '
                            f'{w1.shape[0]}; got input shape {tuple(x.shape)}.')
    x_shape = x.shape
    x = jnp.reshape(x, (-1, x_shape[-1]))
    probs, one_hot, experts = self._route(x, m1)
    mask = self._mask(probs, one_hot, fastmath.random.split(self.rng, 2)[1])
    if self._mode == 'predict' and x.shape[0] == 1:
      start = experts[0] * self._block
      w1_block = fastmath.dynamic_slice(w1, [0, start],
                                        [w1.shape[0], self._block])
      w2_block = fastmath.dynamic_slice(w2, [start, 0],
                                        [self._block, w2.shape[-1]])
      scale = jnp.sum(mask, axis=-1, keepdims=True)  # The selected entry.
      res = jnp.dot(_relu(jnp.dot(x, w1_block) * scale), w2_block)
    else:
      expanded = jnp.repeat(mask, self._block, axis=-1)   # [rows, d_ff]
      res = jnp.dot(_relu(jnp.dot(x, w1) * expanded), w2)
    return jnp.reshape(res + b2[None], x_shape)

  def init_weights_and_state(self, input_signature):
    d_model = input_signature.shape[-1]
    rng_m1, rng_w1, rng_w2, rng_b2 = fastmath.random.split(self.rng, 4)
    self.weights = (
        self._kernel_initializer((d_model, self._n_experts), rng_m1),
        self._kernel_initializer((d_model, self._d_ff), rng_w1),
        self._kernel_initializer((self._d_ff, d_model), rng_w2),
        self._bias_initializer((d_model,), rng_b2))


class BlockSparseFF(_ExpertFF):
  """Routed feed-forward trained with straight-through Gumbel-softmax (see module doc)."""

  def __init__(self, d_ff, n_experts=64, temperature=0.7, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(d_ff, n_experts, temperature, mode, kernel_initializer,
                     bias_initializer)

  def _mask(self, probs, one_hot, rng):
    if self._mode != 'train':
      return one_hot
    straight_through = one_hot + probs - fastmath.stop_gradient(probs)
    select = fastmath.random.uniform(rng, (), jnp.float32, -1.0, 1.0)
    return jnp.where(select > 0.0, straight_through, probs)


class SwitchSparseFF(_ExpertFF):
  """Routed feed-forward scaled by the router's probability, Switch-style (see module doc)."""

  def __init__(self, d_ff, n_experts=64, temperature=0.1, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(d_ff, n_experts, temperature, mode, kernel_initializer,
                     bias_initializer)

  def _mask(self, probs, one_hot, rng):
    del rng
    return one_hot * probs
