"""Shortening and upsampling of sequences (Hourglass), Trax's `resampling`.

Each resampling function takes `(shorten_factor, d_model, ...)` and returns a
layer mapping `[b, l, d]` to `[b, l / k, d]` (pooling) or `[b, l * k, d]`
(upsampling); extra arguments are accepted and ignored so that all of them
fit the same call in `models.research.hourglass`.
"""

import numbers
from typing import Union

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers.normalization import LayerNorm
from retrax.layers.pooling import AvgPool
from retrax.layers.research.rel_attention import RelativeAttentionLMLayer
from retrax.validation import ArgumentValueError


def _check_factor(name, shorten_factor):
  if not isinstance(shorten_factor, numbers.Integral) or shorten_factor < 1:
    raise ArgumentValueError(f'{name}: shorten_factor must be a positive int; got '
                             f'{shorten_factor!r}.')


def _check_divisible(name, length, shorten_factor):
  if length % shorten_factor:
    raise InputValueError(f'{name}: the sequence length ({length}) must be a '
                          f'multiple of shorten_factor ({shorten_factor}).')


@configurable('trax.layers')
def AveragePooling(shorten_factor, *args, **kwargs):
  """Means of consecutive blocks of `shorten_factor` positions."""
  del args, kwargs
  _check_factor('AveragePooling', shorten_factor)
  return AvgPool(pool_size=(shorten_factor,), strides=(shorten_factor,))


@configurable('trax.layers')
def LinearPooling(shorten_factor, d_model, *args, dropout=0.0, mode='train',
                  **kwargs):
  """Concatenates blocks of `shorten_factor` positions, then `Dense(d_model)` and dropout."""
  del args, kwargs
  _check_factor('LinearPooling', shorten_factor)

  def shorten(x):
    _check_divisible('LinearPooling', x.shape[1], shorten_factor)
    return jnp.reshape(x, (x.shape[0], x.shape[1] // shorten_factor, -1))

  return cb.Serial(core.Fn('Shorten', shorten, n_out=1),
                   core.Dense(d_model),
                   core.Dropout(rate=dropout, mode=mode))


@configurable('trax.layers')
def LinearUpsampling(shorten_factor, d_model, *args, dropout=0.0, mode='train',
                     **kwargs):
  """`Dense(shorten_factor * d_model)` and dropout; each position then split in `shorten_factor`."""
  del args, kwargs
  _check_factor('LinearUpsampling', shorten_factor)

  def prolong(x):
    return jnp.reshape(x, (x.shape[0], x.shape[1] * shorten_factor, -1))

  return cb.Serial(core.Dense(shorten_factor * d_model),
                   core.Dropout(rate=dropout, mode=mode),
                   core.Fn('ProlongBack', prolong, n_out=1))


@configurable('trax.layers')
def NaiveUpsampling(shorten_factor, d_model, *args, **kwargs):
  """Each position repeated `shorten_factor` times."""
  del d_model, args, kwargs
  _check_factor('NaiveUpsampling', shorten_factor)
  return core.Fn('Repeat', lambda x: jnp.repeat(x, shorten_factor, axis=1))


@configurable('trax.layers')
def NoUpsampling(shorten_factor, d_model, *args, **kwargs):
  """Zeros of the upsampled shape (the residual around the valley carries everything)."""
  del d_model, args, kwargs
  _check_factor('NoUpsampling', shorten_factor)
  return core.Fn('ReturnZero', lambda x: jnp.zeros(
      (x.shape[0], x.shape[1] * shorten_factor, x.shape[2]), dtype=x.dtype))


def FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes, mode,
                     activation):
  """`[Dense(d_ff), activation(), Dropout, Dense(d_model)]` (a list of layers)."""
  return [
      core.Dense(d_ff),
      activation(),
      core.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode),
      core.Dense(d_model),
  ]


@configurable('trax.layers')
def AttentionResampling(shorten_factor, d_model, is_upsampling, d_ff, n_heads,
                        dropout, dropout_shared_axes, mode, ff_activation,
                        context_bias_layer, location_bias_layer, total_pooling,
                        resampling_fn):
  """Resampling by attention: the resampled sequence attends to the original.

  `h -> LayerNorm -> h' = LayerNorm(resampling_fn(h))` (plus `h` after
  upsampling), then `h' + Dropout(RelativeAttention(h', h, h))` and a
  pre-norm residual feed-forward block. Returns a list of layers.
  """
  attention = RelativeAttentionLMLayer(
      d_model, context_bias_layer, location_bias_layer, total_pooling,
      n_heads=n_heads, dropout=dropout, mode=mode)
  feed_forward = FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes,
                                  mode, ff_activation)
  resampling = resampling_fn(shorten_factor, d_model, mode=mode)

  def dropout_layer():
    return core.Dropout(rate=dropout, shared_axes=dropout_shared_axes,
                        mode=mode)

  add_original: Union[cb.Serial, list] = (cb.Serial(cb.Select([0, 2, 1, 2]), cb.Add())
                  if is_upsampling else [])
  return [
      LayerNorm(),                                              # h
      cb.Branch(cb.Serial(resampling, LayerNorm()), None),      # h', h
      add_original,
      cb.Residual(cb.Select([0, 1, 1]), attention, dropout_layer()),
      cb.Residual(LayerNorm(), feed_forward, dropout_layer()),
  ]
