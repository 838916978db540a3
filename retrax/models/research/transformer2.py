"""Trax's `models.research.transformer2` layers that join and split encoder-decoder sequences.

`ConcatWithPadding` puts each example's decoder vectors right after its real
(non-padding) encoder positions, so one decoder stack can attend over both;
`StripFromConcatenateWithPadding` takes the decoder part back out. The
Terraformer uses them.

In `mode='predict'` only the first call concatenates (the prompt); later
calls pass the decoder vectors through. The state marks this as in Trax: an
int32 scalar before the first call, shape `(1,)` after it.
"""

import jax
import jax.numpy as jnp
from jax import lax

from retrax.layers import base
from retrax.layers import reversible


def concat_with_padding(vec_e, vec_d, mask_e):
  """`[B, L1, H], [B, L2, H], [B, L1] -> [B, L1 + L2, H]`.

  Row `b` holds `vec_e[b]`'s real positions (their count is
  `sum(mask_e[b])`, real positions first), then `vec_d[b]`, then zeros.
  """
  batch, len_e, depth = vec_e.shape
  len_d = vec_d.shape[1]
  if vec_d.shape != (batch, len_d, depth):
    raise ValueError(f'ConcatWithPadding: decoder vectors have shape '
                     f'{vec_d.shape}; expected {(batch, len_d, depth)}.')
  if tuple(mask_e.shape) != (batch, len_e):
    raise ValueError(f'ConcatWithPadding: the encoder mask has shape '
                     f'{tuple(mask_e.shape)}; expected {(batch, len_e)}.')

  def row(e, d, m):
    full = jnp.concatenate([e, jnp.zeros_like(d)], axis=0)
    start = jnp.sum(m.astype(bool), dtype=jnp.int32)
    return lax.dynamic_update_slice(full, d, (start, jnp.zeros((), jnp.int32)))
  return jax.vmap(row)(vec_e, vec_d, mask_e)


def strip_from_concatenate_with_padding(vec_ed, tok_e, tok_d):
  """`[B, L1 + L2, H]` -> the `[B, L2, H]` decoder part (after `tok_e`'s real tokens)."""
  batch, length, depth = vec_ed.shape
  len_e, len_d = tok_e.shape[1], tok_d.shape[1]
  if length != len_e + len_d:
    raise ValueError(
        f'StripFromConcatenateWithPadding: the vectors have length {length} '
        f'but encoder + decoder tokens have {len_e} + {len_d}.')
  if tuple(tok_e.shape) != (batch, len_e) or tuple(tok_d.shape) != (batch,
                                                                    len_d):
    raise ValueError(
        f'StripFromConcatenateWithPadding: token shapes {tuple(tok_e.shape)} '
        f'and {tuple(tok_d.shape)} do not match batch {batch}.')

  def row(ed, e):
    start = jnp.sum(e != 0, dtype=jnp.int32)
    return lax.dynamic_slice(ed, (start, jnp.zeros((), jnp.int32)),
                             (len_d, depth))
  return jax.vmap(row)(vec_ed, tok_e)


def _first_call(layer):
  """True unless a predict-mode layer already ran (state of shape (1,))."""
  return layer.mode != 'predict' or not jnp.shape(layer.state)


def _unpad_encoder(vecs_ed, toks_e):
  mask = (toks_e != 0).astype(vecs_ed.dtype)
  return vecs_ed[:, :toks_e.shape[1], :] * jnp.expand_dims(mask, -1)


class _ConcatBase(reversible.ReversibleLayer):

  def __init__(self, n_in, n_out, mode):
    super().__init__(n_in=n_in, n_out=n_out)
    self._mode = mode

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.zeros((), dtype=jnp.int32)

  def _check_reversible(self):
    if self._mode == 'predict':
      raise ValueError(f'{self.name} cannot be reversed in mode="predict".')


class StripFromConcatenateWithPadding(base.Layer):
  """`(vec_ed, tok_e, tok_d) -> vec_d`: the decoder part of a concatenation."""

  def __init__(self, mode='train'):
    super().__init__(n_in=3, n_out=1)
    self._mode = mode

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.zeros((), dtype=jnp.int32)

  def forward(self, inputs):
    vec_ed, tok_e, tok_d = inputs
    if _first_call(self):
      self.state = jnp.reshape(self.state, (1,))
      return strip_from_concatenate_with_padding(vec_ed, tok_e, tok_d)
    return vec_ed


class ConcatWithPadding(_ConcatBase):
  """`(vec_e, vec_d, mask_e, tok_e, tok_d) -> (vec_ed, tok_e, tok_d)`, reversible."""

  def __init__(self, mode='train'):
    super().__init__(5, 3, mode)

  def forward(self, inputs):
    vec_e, vec_d, mask_e, tok_e, tok_d = inputs
    if _first_call(self):
      self.state = jnp.reshape(self.state, (1,))
      return concat_with_padding(vec_e, vec_d, mask_e), tok_e, tok_d
    return vec_d, tok_e, tok_d

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    self._check_reversible()
    vecs_ed, toks_e, toks_d = output
    vecs_d = strip_from_concatenate_with_padding(vecs_ed, toks_e, toks_d)
    return (_unpad_encoder(vecs_ed, toks_e), vecs_d, toks_e != 0, toks_e,
            toks_d)


class ConcatWithPadding2(_ConcatBase):
  """`(vec_e1, vec_e2, vec_d, mask_e, tok_e, tok_d) -> (vec_ed1, vec_ed2, tok_e, tok_d)`.

  `ConcatWithPadding` on both halves of a reversible pair.
  """

  def __init__(self, mode='train'):
    super().__init__(6, 4, mode)

  def forward(self, inputs):
    vecs_e1, vecs_e2, vecs_d, mask_e, toks_e, toks_d = inputs
    if _first_call(self):
      self.state = jnp.reshape(self.state, (1,))
      return (concat_with_padding(vecs_e1, vecs_d, mask_e),
              concat_with_padding(vecs_e2, vecs_d, mask_e), toks_e, toks_d)
    return vecs_d, vecs_d, toks_e, toks_d

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    self._check_reversible()
    vecs_ed1, vecs_ed2, toks_e, toks_d = output
    vecs_d = strip_from_concatenate_with_padding(vecs_ed1, toks_e, toks_d)
    return (_unpad_encoder(vecs_ed1, toks_e), _unpad_encoder(vecs_ed2, toks_e),
            vecs_d, toks_e != 0, toks_e, toks_d)
