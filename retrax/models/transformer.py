"""Transformer models (Vaswani et al. 2017): encoder, decoder, language model, encoder-decoder.

Layer trees equal Trax 1.4.1's, so Trax checkpoints load leaf for leaf.
Vocabulary sizes are checked at init, where Trax first uses them (see
`vocab_layers`): a model built with a wrong one still prints.
"""

from retrax import layers as tl
from retrax import validation
from retrax.models import vocab_layers
from retrax.models import registry


def _dropout(dropout, dropout_shared_axes, mode):
  return tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)


def _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes, mode,
                      activation):
  return [tl.Dense(d_ff), activation(),
          _dropout(dropout, dropout_shared_axes, mode), tl.Dense(d_model)]


def _EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                  ff_activation):
  """(activations, mask) -> (activations, mask): attention and feed-forward residuals."""
  return [
      tl.Residual(tl.LayerNorm(),
                  tl.Attention(d_model, n_heads=n_heads, dropout=dropout,
                               mode=mode),
                  _dropout(dropout, dropout_shared_axes, mode)),
      tl.Residual(tl.LayerNorm(),
                  _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes,
                                    mode, ff_activation),
                  _dropout(dropout, dropout_shared_axes, mode)),
  ]


def _DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                  ff_activation):
  """Causal attention and feed-forward residuals."""
  return [
      tl.Residual(tl.LayerNorm(),
                  tl.CausalAttention(d_model, n_heads=n_heads, dropout=dropout,
                                     mode=mode),
                  _dropout(dropout, dropout_shared_axes, mode)),
      tl.Residual(tl.LayerNorm(),
                  _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes,
                                    mode, ff_activation),
                  _dropout(dropout, dropout_shared_axes, mode)),
  ]


# Public name of the decoder block for other models built from it (LayerDrop).
DecoderBlock = _DecoderBlock


def _EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                         mode, ff_activation):
  """(dec, mask, enc) -> same: causal self-attention, attention to the encoder, feed-forward."""
  return [
      tl.Residual(tl.LayerNorm(),
                  tl.CausalAttention(d_model, n_heads=n_heads, mode=mode),
                  _dropout(dropout, dropout_shared_axes, mode)),
      tl.Residual(tl.LayerNorm(),
                  tl.Select([0, 2, 2, 1, 2]),
                  tl.AttentionQKV(d_model, n_heads=n_heads, dropout=dropout,
                                  mode=mode, cache_KV_in_predict=True),
                  _dropout(dropout, dropout_shared_axes, mode)),
      tl.Residual(tl.LayerNorm(),
                  _FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes,
                                    mode, ff_activation),
                  _dropout(dropout, dropout_shared_axes, mode)),
  ]


@registry.register
def TransformerEncoder(vocab_size, n_classes=10, d_model=512, d_ff=2048,
                       n_layers=6, n_heads=8, max_len=2048, dropout=0.1,
                       dropout_shared_axes=None, mode='train',
                       ff_activation=None):
  """Token ids (0 = padding) -> `n_classes` raw activations (mean over positions)."""
  validation.check_sizes('TransformerEncoder', n_classes=n_classes,
                         d_model=d_model, d_ff=d_ff, n_heads=n_heads,
                         max_len=max_len)
  validation.check_counts('TransformerEncoder', n_layers=n_layers)
  validation.check_rates('TransformerEncoder', dropout=dropout)
  ff_activation = tl.Relu if ff_activation is None else ff_activation
  blocks = [_EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(
      tl.Branch([], tl.PaddingMask()),
      vocab_layers.Embedding('TransformerEncoder', 'vocab_size', vocab_size,
                             d_model),
      _dropout(dropout, dropout_shared_axes, mode),
      tl.PositionalEncoding(max_len=max_len),
      blocks,
      tl.Select([0], n_in=2),
      tl.LayerNorm(),
      tl.Mean(axis=1),
      tl.Dense(n_classes),
  )


@registry.register
def TransformerDecoder(vocab_size=None, d_model=512, d_ff=2048, n_layers=6,
                       n_heads=8, max_len=2048, dropout=0.1,
                       dropout_shared_axes=None, mode='train',
                       ff_activation=None):
  """Causal decoder (no shift): ids (or vectors if `vocab_size` is None) -> d_model vectors."""
  validation.check_sizes('TransformerDecoder', d_model=d_model, d_ff=d_ff,
                         n_heads=n_heads, max_len=max_len)
  validation.check_counts('TransformerDecoder', n_layers=n_layers)
  validation.check_rates('TransformerDecoder', dropout=dropout)
  ff_activation = tl.Relu if ff_activation is None else ff_activation
  embed = (vocab_layers.Embedding('TransformerDecoder', 'vocab_size',
                                  vocab_size, d_model)
           if vocab_size is not None else tl.Dense(d_model))
  blocks = [_DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(
      embed,
      _dropout(dropout, dropout_shared_axes, mode),
      tl.PositionalEncoding(max_len=max_len),
      blocks,
      tl.LayerNorm(),
  )


@registry.register
def TransformerLM(vocab_size, d_model=512, d_ff=2048, n_layers=6, n_heads=8,
                  max_len=2048, dropout=0.1, dropout_shared_axes=None,
                  mode='train', ff_activation=None):
  """Autoregressive language model: ids -> logits over `vocab_size` (input shifted right)."""
  validation.check_sizes('TransformerLM', d_model=d_model, d_ff=d_ff,
                         n_heads=n_heads, max_len=max_len)
  validation.check_counts('TransformerLM', n_layers=n_layers)
  validation.check_rates('TransformerLM', dropout=dropout)
  ff_activation = tl.Relu if ff_activation is None else ff_activation
  blocks = [_DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation) for _ in range(n_layers)]
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      vocab_layers.Embedding('TransformerLM', 'vocab_size', vocab_size,
                             d_model),
      _dropout(dropout, dropout_shared_axes, mode),
      tl.PositionalEncoding(max_len=max_len, mode=mode),
      blocks,
      tl.LayerNorm(),
      vocab_layers.Dense('TransformerLM', 'vocab_size', vocab_size),
  )


@registry.register
def Transformer(input_vocab_size, output_vocab_size=None, d_model=512,
                d_ff=2048, n_encoder_layers=6, n_decoder_layers=6, n_heads=8,
                max_len=2048, dropout=0.1, dropout_shared_axes=None,
                mode='train', ff_activation=None):
  """Encoder-decoder: (source ids, target ids) -> target logits; encoder cached in predict mode."""
  validation.check_sizes('Transformer', d_model=d_model, d_ff=d_ff,
                         n_heads=n_heads, max_len=max_len)
  validation.check_counts('Transformer', n_encoder_layers=n_encoder_layers,
                          n_decoder_layers=n_decoder_layers)
  validation.check_rates('Transformer', dropout=dropout)
  ff_activation = tl.Relu if ff_activation is None else ff_activation
  encoder_mode = 'eval' if mode == 'predict' else mode
  in_embedder = vocab_layers.Embedding('Transformer', 'input_vocab_size',
                                       input_vocab_size, d_model)
  output_arg = 'output_vocab_size'
  if output_vocab_size is None:
    out_embedder = in_embedder
    output_arg, output_vocab_size = 'input_vocab_size', input_vocab_size
  else:
    out_embedder = vocab_layers.Embedding('Transformer', output_arg,
                                          output_vocab_size, d_model)
  encoder: tl.Layer = tl.Serial(
      in_embedder,
      _dropout(dropout, dropout_shared_axes, mode),
      tl.PositionalEncoding(max_len=max_len, mode=encoder_mode),
      [_EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                     mode, ff_activation) for _ in range(n_encoder_layers)],
      tl.LayerNorm(),
  )
  if mode == 'predict':
    encoder = tl.Cache(encoder)
  blocks = [_EncoderDecoderBlock(d_model, d_ff, n_heads, dropout,
                                 dropout_shared_axes, mode, ff_activation)
            for _ in range(n_decoder_layers)]
  return tl.Serial(
      tl.Select([0, 1, 1]),                 # tok_e tok_d tok_d
      tl.Branch([], tl.PaddingMask()),      # tok_e mask_e tok_e tok_d tok_d
      encoder,                              # vec_e mask_e tok_d ...
      tl.Select([2, 1, 0]),                 # tok_d mask_e vec_e ...
      tl.ShiftRight(mode=mode),
      out_embedder,
      _dropout(dropout, dropout_shared_axes, mode),
      tl.PositionalEncoding(max_len=max_len, mode=mode),
      tl.Branch([], tl.EncoderDecoderMask()),  # vec_d masks vec_e ...
      blocks,
      tl.LayerNorm(),
      tl.Select([0], n_in=3),
      vocab_layers.Dense('Transformer', output_arg, output_vocab_size),
  )
