"""Trax's `models.research.transformer2`: Transformer2 and its concat/strip layers.

`Transformer2` is an encoder-decoder without encoder-decoder attention: the
decoder's causal self-attention runs over the encoder output followed by the
shifted target.

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

from retrax import layers as tl
from retrax.errors import InputValueError
from retrax.layers import base
from retrax.layers import predict_state
from retrax.layers import reversible
from retrax import validation
from retrax.models import vocab_layers
from retrax.models.research import configurable_transformer as ct
from retrax.models import registry
from retrax.validation import ArgumentValueError


def concat_with_padding(vec_e, vec_d, mask_e):
  """`[B, L1, H], [B, L2, H], [B, L1] -> [B, L1 + L2, H]`.

  Row `b` holds `vec_e[b]`'s real positions (their count is
  `sum(mask_e[b])`, real positions first), then `vec_d[b]`, then zeros.
  """
  batch, len_e, depth = vec_e.shape
  len_d = vec_d.shape[1]
  if vec_d.shape != (batch, len_d, depth):
    raise InputValueError(f'ConcatWithPadding: decoder vectors have shape '
                          f'{vec_d.shape}; expected {(batch, len_d, depth)}.')
  if tuple(mask_e.shape) != (batch, len_e):
    raise InputValueError(f'ConcatWithPadding: the encoder mask has shape '
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
    raise InputValueError(
        f'StripFromConcatenateWithPadding: the vectors have length {length} '
        f'but encoder + decoder tokens have {len_e} + {len_d}.')
  if tuple(tok_e.shape) != (batch, len_e) or tuple(tok_d.shape) != (batch,
                                                                    len_d):
    raise InputValueError(
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


def _flag_layout(layer, state):
  """The first-call flag (shape () then (1,)) is shared by all examples.

  Declared, so decoding need not trace the model to find that out.
  """
  del layer
  return predict_state.PredictStateLayout(predict_state.same_rows(state, 0))


def _unpad_encoder(vecs_ed, toks_e):
  mask = (toks_e != 0).astype(vecs_ed.dtype)
  return vecs_ed[:, :toks_e.shape[1], :] * jnp.expand_dims(mask, -1)


class _ConcatBase(reversible.ReversibleLayer):

  def __init__(self, n_in, n_out, mode):
    super().__init__(n_in=n_in, n_out=n_out, mode=mode)

  def init_weights_and_state(self, input_signature):
    del input_signature
    self.state = jnp.zeros((), dtype=jnp.int32)

  predict_state_layout = _flag_layout

  def _check_reversible(self):
    if self._mode == 'predict':
      raise ArgumentValueError(f'{self.name} cannot be reversed in mode="predict".')


class StripFromConcatenateWithPadding(base.Layer):
  """`(vec_ed, tok_e, tok_d) -> vec_d`: the decoder part of a concatenation."""

  def __init__(self, mode='train'):
    super().__init__(n_in=3, n_out=1, mode=mode)

  predict_state_layout = _flag_layout

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


def _check_transformer2_args(mode, d_model, n_heads):
  validation.check_choice('Transformer2', 'mode', mode,
                          ('train', 'eval', 'predict'))
  validation.check_multiple('Transformer2', 'd_model', d_model, 'n_heads',
                            n_heads)


@registry.register
def Transformer2(input_vocab_size, output_vocab_size=None, d_model=512,
                 d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, n_heads=8,
                 dropout=0.1, dropout_shared_axes=None, max_len=2048,
                 mode='train', ff_activation=tl.Relu, ff_dropout=0.1,
                 ff_chunk_size=0, ff_use_sru=0, ff_sparsity=0,
                 ff_sparsity_type='1inN', attention_chunk_size=0,
                 encoder_attention_type=tl.Attention,
                 n_encoder_attention_layers=1,
                 decoder_attention_type=tl.CausalAttention,
                 n_decoder_attention_layers=2, pos_type=None,
                 pos_axial_shape=None, pos_d_axial_embs=None):
  """`(source, target) -> (target activations, target)`.

  The encoder output (its real positions) and the shifted, embedded target
  are concatenated (`ConcatWithPadding`); causal decoder blocks run over the
  concatenation and the target part is taken back out before the output
  Dense. Arguments as `ConfigurableTransformer`'s; `decoder_attention_type`
  is the decoder's (causal) self-attention.
  """
  _check_transformer2_args(mode, d_model, n_heads)
  output_arg = vocab_layers.output_arg(output_vocab_size)
  in_encoder, out_encoder, output_vocab_size = (
      ct.EmbeddingAndPositionalEncodings(
          input_vocab_size, d_model, mode, dropout, dropout_shared_axes,
          max_len, output_vocab_size=output_vocab_size, pos_type=pos_type,
          pos_axial_shape=pos_axial_shape, pos_d_axial_embs=pos_d_axial_embs))
  ff_args = (ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
             ff_sparsity, ff_sparsity_type, attention_chunk_size)
  encoder: tl.Layer = tl.Serial(
      in_encoder,
      [ct.EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                       mode, *ff_args, encoder_attention_type,
                       n_encoder_attention_layers)
       for _ in range(n_encoder_layers)],
      tl.LayerNorm())
  if mode == 'predict':
    encoder = tl.Cache(encoder)
  decoder_blocks = [
      ct.DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                      mode, *ff_args, decoder_attention_type,
                      n_decoder_attention_layers)
      for _ in range(n_decoder_layers)]
  return tl.Serial(
      tl.Select([0, 0, 1, 1]),           # tok_e tok_e tok_d tok_d
      tl.Branch([], tl.PaddingMask()),   # tok_e mask tok_e tok_d tok_d
      encoder,                           # vec_e mask tok_e tok_d tok_d
      tl.Select([2, 0, 2], n_in=3),      # tok_e vec_e tok_e tok_d tok_d
      tl.Fn('EncoderMask', lambda x: x != 0, n_out=1),  # mask_e vec_e ...
      tl.Select([3, 1, 0, 2]),           # tok_d vec_e mask_e tok_e tok_d
      tl.ShiftRight(mode=mode),
      out_encoder,                       # vec_d vec_e mask_e tok_e tok_d
      tl.Select([1, 0]),                 # vec_e vec_d mask_e tok_e tok_d
      ConcatWithPadding(mode=mode),      # vec_ed tok_e tok_d
      decoder_blocks,
      tl.LayerNorm(),
      tl.Select([0, 1, 2, 2]),           # vec_ed tok_e tok_d tok_d
      StripFromConcatenateWithPadding(mode=mode),  # vec_d tok_d
      # Checked at init, as in Trax (vocab_layers).
      vocab_layers.Dense('Transformer2', output_arg, output_vocab_size),
  )
