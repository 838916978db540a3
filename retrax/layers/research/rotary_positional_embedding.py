"""Rotary positional embedding (RoFormer, https://arxiv.org/abs/2104.09864), Trax's `Rotate`.

Channel pairs `(i, i + d/2)` of the vector at position p are rotated by the
angle `p · 10000^(-2i/d)`, so dot products of rotated queries and keys depend
on their relative position only. Inputs are `(batch, length, d)`, d even.
"""

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import core


def rotate(x):
  """Rotates `x [batch, length, d]` by its positions `0 .. length-1`."""
  if len(x.shape) != 3 or x.shape[-1] % 2:
    raise InputValueError(f'Rotate expects (batch, length, d) inputs with an even '
                          f'd; got shape {tuple(x.shape)}.')
  _, length, d = x.shape
  inv_freq = jnp.exp(jnp.arange(0, d, 2, dtype=jnp.float32) *
                     -(jnp.log(10000.0) / d))
  angles = jnp.arange(length, dtype=jnp.float32)[:, None] * inv_freq[None, :]
  angles = jnp.concatenate([angles, angles], axis=-1)        # [length, d]
  half = d // 2
  rotated_half = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = jnp.cos(angles)[None], jnp.sin(angles)[None]
  return x * cos + rotated_half * sin


@configurable('trax.layers')
def Rotate():
  """`x -> rotate(x)`: the rotary embedding as a weightless layer."""
  return core.Fn('Rotate', rotate)
