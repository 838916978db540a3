"""Activation layers (element-wise nonlinearities) with Trax's names and formulas."""

import math

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers.assert_shape import assert_shape
from retrax.layers.base import Fn

_SQRT2 = math.sqrt(2.0)  # float32(√2) equals jnp.sqrt(2.0), Trax's divisor.


@configurable('trax.layers')
@assert_shape('...->...')
def Relu():
  """ReLU: 0 if x <= 0 else x."""
  return Fn('Relu', lambda x: jnp.where(x <= 0, jnp.zeros_like(x), x))


@assert_shape('...->...')
def ParametricRelu(a=1.):
  """max(a·x, 0): ReLU with slope `a` for positive inputs."""
  return Fn('ParametricRelu', lambda x: jnp.maximum(a * x, jnp.zeros_like(x)))


@assert_shape('...->...')
def LeakyRelu(a=0.01):
  """x if x >= 0 else a·x."""
  return Fn('LeakyRelu', lambda x: jnp.where(x >= 0, x, a * x))


@assert_shape('...->...')
def Elu(a=1.):
  """x if x > 0 else a·(exp(x) - 1)."""
  return Fn('Elu', lambda x: jnp.where(x > 0, x, a * jnp.expm1(x)))


@assert_shape('...->...')
def Selu(alpha=1.6732632423543772848170429916717,
         lmbda=1.0507009873554804934193349852946):
  """lmbda·x if x > 0 else lmbda·alpha·(exp(x) - 1)."""
  return Fn('Selu', lambda x: lmbda * jnp.where(x > 0, x, alpha * jnp.expm1(x)))


@configurable('trax.layers')
@assert_shape('...->...')
def Gelu():
  """Exact GELU: x·Φ(x) = x·(1 + erf(x/√2))/2."""
  return Fn('Gelu',
            lambda x: x * 0.5 * (1.0 + fastmath.erf(x / _SQRT2)))


@configurable('trax.layers')
@assert_shape('...->...')
def FastGelu():
  """Tanh approximation of GELU: x·(1 + tanh(0.7978845608·x·(1 + 0.044715·x²)))/2."""
  return Fn('FastGelu', lambda x: 0.5 * x * (
      1 + jnp.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x))))


@configurable('trax.layers')
@assert_shape('...->...')
def Sigmoid():
  """1 / (1 + exp(-x))."""
  return Fn('Sigmoid', lambda x: fastmath.expit(x))


@configurable('trax.layers')
@assert_shape('...->...')
def Tanh():
  """tanh(x)."""
  return Fn('Tanh', lambda x: jnp.tanh(x))


@configurable('trax.layers')
@assert_shape('...->...')
def HardSigmoid():
  """max(0, min(1, 1 + x)) (Trax's formula: the ramp spans [-1, 0])."""
  return Fn('HardSigmoid', lambda x: jnp.maximum(0, jnp.minimum(1, (1 + x))))


@configurable('trax.layers')
@assert_shape('...->...')
def HardTanh():
  """max(-1, min(1, x))."""
  return Fn('HardTanh', lambda x: jnp.maximum(-1, jnp.minimum(1, x)))


@configurable('trax.layers')
@assert_shape('...->...')
def Softplus():
  """log(1 + exp(x))."""
  return Fn('Softplus', lambda x: jnp.logaddexp(x, 0.))


@configurable('trax.layers')
@assert_shape('...->...')
def Exp():
  """exp(x)."""
  return Fn('Exp', lambda x: jnp.exp(x))


@assert_shape('...->...')
def Log():
  """log(x)."""
  return Fn('Log', lambda x: jnp.log(x))


@assert_shape('...->...')
def Swish():
  """x·sigmoid(x)."""
  return Fn('Swish', lambda x: x * fastmath.expit(x))


@assert_shape('...a->...b')
def Glu():
  """Gated linear unit: splits the last axis into (a, b) and returns a·σ(b)."""
  def glu(x):
    if x.shape[-1] % 2:
      raise InputValueError(f'Glu splits the last axis in two halves; its size '
                            f'{x.shape[-1]} (shape {tuple(x.shape)}) is odd.')
    a, b = jnp.split(x, 2, -1)
    return a * fastmath.expit(b)
  return Fn('Glu', glu)


@configurable('trax.layers')
class ThresholdedLinearUnit(base.Layer):
  """max(x, τ) with one learned threshold τ (initialized to 0)."""

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.weights = jnp.zeros((), dtype=jnp.float32)

  def forward(self, inputs):
    return jnp.maximum(inputs, self.weights)
