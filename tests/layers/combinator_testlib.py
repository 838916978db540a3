"""Small layers and helpers shared by the combinator tests."""

import jax
import jax.numpy as jnp
import numpy as np

from retrax.layers import base


def as_list(outputs):
  if isinstance(outputs, (list, tuple)):
    return [as_list(y) for y in outputs]
  return np.asarray(outputs).tolist()


def DivideBy(val):
  return base.Fn('DivideBy', lambda x: x / val)


def ReturnConst(val):
  return base.Fn('ReturnConst', lambda: val)


def SmallerThan(val):
  return base.Fn('SmallerThan', lambda x: x < val)


def jcall(layer, x, rng=None):
  """layer(x) through a jitted pure_fn (one compile instead of op-by-op)."""
  rng = layer.rng if rng is None else rng
  return jax.jit(layer.pure_fn)(x, layer.weights, layer.state, rng)[0]


class Counter(base.Layer):
  """Adds its call count (state) to the input and increments it."""

  def init_weights_and_state(self, input_signature):
    self.state = jnp.zeros((), jnp.int32)

  def forward(self, x):
    self.state = self.state + 1
    return x + self.state
