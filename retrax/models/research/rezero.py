"""ReZero Transformers (Bachlechner et al. 2020, arXiv:2003.04887).

Each residual branch is scaled by a learned scalar that starts at zero, so a
fresh model is the identity around every block. Layer trees equal Trax
1.4.1's `trax.models.research.rezero`, so Trax checkpoints load leaf for leaf.
"""

import numpy as np

from retrax import layers as tl
from retrax import validation
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _flatten(items):
  """`items` with nested lists/tuples flattened; `(None,)` means no layers."""
  if len(items) == 1 and items[0] is None:
    return []
  flat: list[tl.Layer] = []
  for item in items:
    if isinstance(item, (list, tuple)):
      flat.extend(_flatten(item) if item else [])
    else:
      flat.append(item)
  for obj in flat:
    if not isinstance(obj, tl.Layer):
      raise ArgumentValueError(
          f'ResidualZero: expected layers, got {obj!r} (type '
          f'{type(obj).__name__}) among {flat!r}')
  return flat


def _zeros(shape, rng):
  del rng
  return np.zeros(shape, dtype=np.float32)


def ResidualZero(*layers, shortcut=None):
  """`shortcut(x) + alpha * layers(x)`, `alpha` a learned scalar starting at 0.

  Args:
    *layers: layers applied in series on the residual branch.
    shortcut: layer applied to a copy of the inputs; None is the identity.
  """
  layers = _flatten(layers)
  if not layers:
    raise ArgumentValueError('ResidualZero: needs at least one layer for its branch')
  layer = layers[0] if len(layers) == 1 else tl.Serial(layers)
  return tl.Serial(
      tl.Branch(shortcut, tl.Serial(layer, tl.Weights(_zeros), tl.Multiply())),
      tl.Add(),
  )


def _dropout(dropout, dropout_shared_axes, mode):
  return tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)


def _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes, mode,
                      activation):
  return [tl.Dense(d_ff), activation(),
          _dropout(dropout, dropout_shared_axes, mode), tl.Dense(d_model)]


def _ff_residual(d_model, d_ff, dropout, dropout_shared_axes, mode,
                 ff_activation, dropout_layer=None):
  if dropout_layer is None:
    dropout_layer = _dropout(dropout, dropout_shared_axes, mode)
  return ResidualZero(
      tl.LayerNorm(),
      _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes, mode,
                        ff_activation),
      dropout_layer)


def _EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                  ff_activation):
  """(activations, mask) -> (activations, mask)."""
  shared_dropout = _dropout(dropout, dropout_shared_axes, mode)  # as Trax
  return [
      ResidualZero(tl.LayerNorm(),
                   tl.Attention(d_model, n_heads=n_heads, dropout=dropout,
                                mode=mode),
                   shared_dropout),
      _ff_residual(d_model, d_ff, dropout, dropout_shared_axes, mode,
                   ff_activation, shared_dropout),
  ]


def _DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                  ff_activation):
  """Causal self-attention and feed-forward, each a ReZero residual."""
  shared_dropout = _dropout(dropout, dropout_shared_axes, mode)  # as Trax
  return [
      ResidualZero(tl.LayerNorm(),
                   tl.CausalAttention(d_model, n_heads=n_heads,
                                      dropout=dropout, mode=mode),
                   shared_dropout),
      _ff_residual(d_model, d_ff, dropout, dropout_shared_axes, mode,
                   ff_activation, shared_dropout),
  ]


def _EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                         mode, ff_activation):
  """(dec, mask, enc) -> same: causal self-attention, encoder attention, FF."""
  return [
      ResidualZero(tl.LayerNorm(),
                   tl.CausalAttention(d_model, n_heads=n_heads, mode=mode),
                   _dropout(dropout, dropout_shared_axes, mode)),
      ResidualZero(tl.LayerNorm(),
                   tl.Select([0, 2, 2, 1, 2]),
                   tl.AttentionQKV(d_model, n_heads=n_heads, dropout=dropout,
                                   mode=mode, cache_KV_in_predict=True),
                   _dropout(dropout, dropout_shared_axes, mode)),
      _ff_residual(d_model, d_ff, dropout, dropout_shared_axes, mode,
                   ff_activation),
  ]


_MODES = ('train', 'eval', 'predict')


def _check(model, d_model, n_heads, mode):
  validation.check_choice(model, 'mode', mode, _MODES)
  validation.check_multiple(model, 'd_model', d_model, 'n_heads', n_heads)


@registry.register
def ReZeroTransformerEncoder(vocab_size, n_classes=10, d_model=512, d_ff=2048,
                             n_layers=6, n_heads=8, dropout=0.1,
                             dropout_shared_axes=None, max_len=2048,
                             mode='train', ff_activation=tl.Relu):
  """Tokens -> class activations: ReZero encoder, mean over positions, Dense."""
  _check('ReZeroTransformerEncoder', d_model, n_heads, mode)
  embedder = [tl.Embedding(vocab_size, d_model),
              _dropout(dropout, dropout_shared_axes, mode),
              tl.PositionalEncoding(max_len=max_len)]
  blocks = [_EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(
      tl.Branch(embedder, tl.PaddingMask()),
      blocks,
      tl.Select([0], n_in=2),
      tl.LayerNorm(),
      tl.Mean(axis=1),
      tl.Dense(n_classes),
  )


@registry.register
def ReZeroTransformerDecoder(vocab_size=None, d_model=512, d_ff=2048,
                             n_layers=6, n_heads=8, dropout=0.1,
                             dropout_shared_axes=None, max_len=2048,
                             mode='train', ff_activation=tl.Relu):
  """Tokens (or vectors if `vocab_size` is None) -> vectors; no shift right."""
  _check('ReZeroTransformerDecoder', d_model, n_heads, mode)
  embedder = [(tl.Embedding(vocab_size, d_model) if vocab_size is not None
               else tl.Dense(d_model)),
              _dropout(dropout, dropout_shared_axes, mode),
              tl.PositionalEncoding(max_len=max_len)]
  blocks = [_DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(embedder, blocks, tl.LayerNorm())


@registry.register
def ReZeroTransformerLM(vocab_size, d_model=512, d_ff=2048, n_layers=6,
                        n_heads=8, dropout=0.1, dropout_shared_axes=None,
                        max_len=2048, mode='train', ff_activation=tl.Relu):
  """Tokens -> next-token activations ('train', 'eval' or 'predict')."""
  _check('ReZeroTransformerLM', d_model, n_heads, mode)
  embedder = [tl.Embedding(vocab_size, d_model),
              _dropout(dropout, dropout_shared_axes, mode),
              tl.PositionalEncoding(max_len=max_len, mode=mode)]
  blocks = [_DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(tl.ShiftRight(mode=mode), embedder, blocks, tl.LayerNorm(),
                   tl.Dense(vocab_size))


@registry.register
def ReZeroTransformer(input_vocab_size, output_vocab_size=None, d_model=512,
                      d_ff=2048, n_encoder_layers=6, n_decoder_layers=6,
                      n_heads=8, dropout=0.1, dropout_shared_axes=None,
                      max_len=2048, mode='train', ff_activation=tl.Relu):
  """(source, target) -> (target activations, target): ReZero encoder-decoder."""
  _check('ReZeroTransformer', d_model, n_heads, mode)

  def embedder(vocab_size):
    return [tl.Embedding(vocab_size, d_model),
            _dropout(dropout, dropout_shared_axes, mode)]

  in_embedder = embedder(input_vocab_size)
  out_embedder = (in_embedder if output_vocab_size is None
                  else embedder(output_vocab_size))
  encoder_mode = 'eval' if mode == 'predict' else mode
  in_encoder = in_embedder + [
      tl.PositionalEncoding(max_len=max_len, mode=encoder_mode)]
  out_encoder = out_embedder + [
      tl.PositionalEncoding(max_len=max_len, mode=mode)]
  if output_vocab_size is None:
    output_vocab_size = input_vocab_size
  encoder: tl.Layer = tl.Serial(
      in_encoder,
      [_EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                     mode, ff_activation) for _ in range(n_encoder_layers)],
      tl.LayerNorm())
  if mode == 'predict':
    encoder = tl.Cache(encoder)
  decoder_blocks = [
      _EncoderDecoderBlock(d_model, d_ff, n_heads, dropout,
                           dropout_shared_axes, mode, ff_activation)
      for _ in range(n_decoder_layers)]
  return tl.Serial(
      tl.Select([0, 1, 1]),                 # tok_e tok_d tok_d
      tl.Branch([], tl.PaddingMask()),      # tok_e mask tok_d tok_d
      encoder,                              # vec_e mask tok_d tok_d
      tl.Select([2, 1, 0]),                 # tok_d mask vec_e tok_d
      tl.ShiftRight(mode=mode),
      out_encoder,                          # vec_d mask vec_e tok_d
      tl.Branch([], tl.EncoderDecoderMask()),
      decoder_blocks,
      tl.LayerNorm(),
      tl.Select([0], n_in=3),               # vec_d tok_d
      tl.Dense(output_vocab_size),
  )
