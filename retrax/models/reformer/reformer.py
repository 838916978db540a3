"""Reformer models (Kitaev, Kaiser & Levskaya 2020): ReformerLM, Reformer, ReformerShortenLM.

Each builds the same layer tree as Trax 1.4.1, so Trax checkpoints map leaf for
leaf. The residual stream is split in two halves of width `d_model` that run
through reversible blocks; LSH attention is chosen with
`attention_type=tl.LSHSelfAttention`. Vocabulary sizes are checked at init,
where Trax first uses them (see `vocab_layers`).
"""

from retrax import layers as tl
from retrax.fastmath import numpy as jnp
from retrax import validation
from retrax.models import vocab_layers
from retrax.models.research import configurable_transformer as ct
from retrax.models import registry
from retrax.validation import ArgumentValueError

# Trax 1.2 exported the half-residual layer from this module (the RevNet lab imports it).
ReversibleHalfResidualV2 = tl.ReversibleHalfResidual


def DecoderBlock(d_model, d_ff, d_attention_key, d_attention_value, n_heads,
                 attention_type, dropout, ff_activation, ff_dropout, ff_use_sru,
                 ff_chunk_size, ff_sparsity, attention_chunk_size,
                 n_attention_layers=1, n_feedforward_layers=1,
                 center_layernorm=True, use_bfloat16=False, mode='train',
                 sru_scan_cell=tl.ScanSRUCell):
  """Reversible decoder block.

  [attention half-residual, swap] + [feed-forward half-residual, swap].
  `attention_type` is built by `ct.ApplyAttentionLayer`; `sru_scan_cell` is
  the recurrence of the `ff_use_sru` layers (`tl.SRU`'s `scan_cell`).
  """

  def attention_half():
    attn = ct.ApplyAttentionLayer(attention_type, d_model, n_heads,
                                  d_attention_key, d_attention_value, True,
                                  False, dropout, dropout,
                                  attention_chunk_size, mode)
    return [tl.ReversibleHalfResidual(tl.LayerNorm(center=center_layernorm),
                                      attention_layer=attn,
                                      name='ReversibleHalfResidualDecoderAttn'),
            tl.ReversibleSwap()]

  def feed_forward_half():
    ff = ct.FeedForwardWithOptions(d_model, d_ff, dropout, [-2], ff_activation,
                                   ff_dropout, ff_chunk_size, ff_use_sru,
                                   ff_sparsity, center_layernorm, mode,
                                   use_bfloat16, sru_scan_cell=sru_scan_cell)
    return [tl.ReversibleHalfResidual(ff, name='ReversibleHalfResidualDecoderFF'),
            tl.ReversibleSwap()]

  return ([attention_half() for _ in range(n_attention_layers)] +
          [feed_forward_half() for _ in range(n_feedforward_layers)])


def _attention_types(attention_type, n_layers):
  types = (list(attention_type) if isinstance(attention_type, (list, tuple))
           else [attention_type])
  if n_layers % len(types):
    raise ArgumentValueError(f'n_layers ({n_layers}) must be a multiple of the number '
                             f'of attention types ({len(types)}).')
  return [types[i % len(types)] for i in range(n_layers)]


def _repeats(n_layers, attention_type=None):
  """How many copies of one block `n_layers` blocks are (None for none).

  The blocks differ only by their attention type, cycled through a list of
  them (see `_attention_types`); declaring it lets `ReversibleSerial` hold
  their weights stacked and scan over them.
  """
  n_types = (len(attention_type) if isinstance(attention_type, (list, tuple))
             else 1)
  return n_layers // n_types or None


@registry.register
def ReformerLM(vocab_size, d_model=512, d_ff=2048, d_attention_key=64,
               d_attention_value=64, n_layers=6, n_heads=8, dropout=0.1,
               max_len=2048, attention_type=None, pos_type=None,
               pos_axial_shape=(), pos_d_axial_embs=None,
               pos_start_from_zero_prob=1.0, pos_max_offset_to_add=0,
               ff_activation=None, ff_use_sru=0, ff_chunk_size=0, ff_sparsity=0,
               loss_sparsity_type='mult', loss_sparsity=0, loss_d_lowrank=0,
               loss_sparsity_prob=None, attention_chunk_size=0, mode='train',
               *, shift_right=True):
  """Reversible Transformer language model (decoder only); outputs logits.

  Tokens `[batch, length]` are shifted right (unless `shift_right=False`),
  embedded and given positions,
  duplicated into the two halves of a reversible residual stream, run
  through `n_layers` reversible decoder blocks (attention half-residual,
  swap, feed-forward half-residual, swap), concatenated, normalized and
  projected to `vocab_size` logits. The layer tree is Trax 1.4.1's, leaf for
  leaf.

  Args:
    vocab_size: vocabulary size (checked when the model is initialized).
    d_model: depth of *each half* of the two-part residual stream.
    d_ff: depth of the feed-forward layer.
    d_attention_key: per-head depth of queries and keys.
    d_attention_value: per-head depth of values.
    n_layers: number of decoder blocks.
    n_heads: number of attention heads.
    dropout: dropout rate of embeddings, attention, feed-forward and output
      (0 outside training).
    max_len: maximum length for positional encodings (and predict caches).
    attention_type: attention class (default `tl.SelfAttention`), e.g.
      `tl.LSHSelfAttention` or a `functools.partial` of it, or a list whose
      types are cycled over the layers (`n_layers` must be a multiple of its
      length).
    pos_type: None (learned table), 'sin-cos', 'fixed-base', 'axial' or
      'no' (no positional encoding).
    pos_axial_shape: with `pos_type='axial'`, the factors of `max_len`
      (e.g. `(64, 64)` for 4096 positions); the empty default means none.
    pos_d_axial_embs: with axial encoding, the depth of each factor's table
      (summing to `d_model`).
    pos_start_from_zero_prob: in training, the probability that positions
      start at 0; otherwise they start at a random offset (Trax's
      augmentation for learned tables).
    pos_max_offset_to_add: the largest such random offset.
    ff_activation: activation layer class (default `tl.FastGelu`).
    ff_use_sru: if > 0, a residual branch `LayerNorm, Dense(n), SRU(n) x k,
      Dense(d_model)` is added to each feed-forward's output: an int k
      (n = 32) or a pair (k, n).
    ff_chunk_size: if > 0, the feed-forward runs in chunks of this many
      positions (bounded memory at long lengths).
    ff_sparsity: if nonzero, a sparse feed-forward (`tl.SparseFF`) replaces
      the dense one: an int N (blocks of N, low rank d_ff // N), or
      (N, d_lowrank[, temperature, quant_prob]), or that as a string.
    loss_sparsity_type: Trax's sparse output layer kind; retrax has no
      sparse output layer, so this is ignored (its default is accepted).
    loss_sparsity: must stay 0 (Trax's sparse output layer; not supported).
    loss_d_lowrank: must stay 0 (same).
    loss_sparsity_prob: must stay None (same).
    attention_chunk_size: if > 0, attention runs over batch chunks of this
      many examples.
    mode: 'train', 'eval' or 'predict' (decoding one token at a time).
    shift_right: True (Trax's convention): the model puts a 0 before the
      tokens and drops the last one, so position t's logits predict token t
      from tokens 0..t-1 and a batch's inputs are its targets. False
      (Hugging Face's `ReformerModelWithLMHead`, as `retrax convert` builds
      it): position t's logits predict token t+1 from tokens 0..t. The
      weights are the same either way, and so is predict mode, which never
      shifts.

  Raises:
    ValueError: a size, count or rate out of range (naming the argument),
      `n_layers` not a multiple of the attention types, or a sparse output
      layer asked for.
  """
  validation.check_sizes('ReformerLM', d_model=d_model, d_ff=d_ff,
                         d_attention_key=d_attention_key,
                         d_attention_value=d_attention_value,
                         n_heads=n_heads, max_len=max_len)
  validation.check_counts('ReformerLM', n_layers=n_layers)
  validation.check_rates('ReformerLM', dropout=dropout)
  validation.check_choice('ReformerLM', 'shift_right', shift_right,
                          (True, False))
  if loss_sparsity or loss_d_lowrank or loss_sparsity_prob is not None:
    raise ArgumentValueError('Sparse output layers (loss_sparsity, loss_d_lowrank, '
                             'loss_sparsity_prob) are not supported by retrax; leave '
                             'them at their defaults.')
  del loss_sparsity_type  # Only the sparse output layer reads it.
  attention_type = tl.SelfAttention if attention_type is None else attention_type
  ff_activation = tl.FastGelu if ff_activation is None else ff_activation
  positional_embedder = [
      vocab_layers.Embedding('ReformerLM', 'vocab_size', vocab_size, d_model),
      tl.Dropout(rate=dropout, shared_axes=[-2], mode=mode),
      ct.PositionalEncoder(mode, dropout, max_len, pos_type, pos_axial_shape,
                           pos_d_axial_embs, pos_start_from_zero_prob,
                           pos_max_offset_to_add),
  ]
  decoder_blocks = [
      DecoderBlock(d_model, d_ff, d_attention_key, d_attention_value, n_heads,
                   attention_type=attn, dropout=dropout,
                   ff_activation=ff_activation, ff_dropout=dropout,
                   ff_use_sru=ff_use_sru, ff_chunk_size=ff_chunk_size,
                   ff_sparsity=ff_sparsity,
                   attention_chunk_size=attention_chunk_size, mode=mode)
      for attn in _attention_types(attention_type, n_layers)]
  return tl.Serial(
      tl.ShiftRight(mode=mode) if shift_right else [],
      positional_embedder,
      tl.Dup(),
      tl.ReversibleSerial(decoder_blocks,
                          repeats=_repeats(n_layers, attention_type)),
      tl.Concatenate(),
      tl.LayerNorm(),
      tl.Dropout(rate=dropout, shared_axes=[-2], mode=mode),
      tl.AssertFunction('...a->...b', vocab_layers.Dense(
          'ReformerLM', 'vocab_size', vocab_size)),
  )


@registry.register
def ReformerShortenLM(vocab_size, shorten_factor=1, d_embedding=256,
                      d_model=512, d_ff=2048, d_attention_key=64,
                      d_attention_value=64, n_layers=6, n_heads=8, dropout=0.1,
                      max_len=2048, attention_type=None, pos_type=None,
                      pos_axial_shape=(), pos_d_axial_embs=None,
                      ff_activation=None, ff_use_sru=0, ff_chunk_size=0,
                      ff_sparsity=0, attention_chunk_size=0, mode='train'):
  """ReformerLM that groups `shorten_factor` positions into one inside the reversible stack."""
  if mode == 'predict':
    raise ArgumentValueError("ReformerShortenLM has no predict mode (as in Trax); use "
                             "mode='eval' or ReformerLM.")
  attention_type = tl.SelfAttention if attention_type is None else attention_type
  ff_activation = tl.FastGelu if ff_activation is None else ff_activation
  positional_embedder = [
      vocab_layers.Embedding('ReformerShortenLM', 'vocab_size', vocab_size,
                             d_embedding),
      tl.Dropout(rate=dropout, shared_axes=[-2], mode=mode),
      ct.PositionalEncoder(mode, dropout, max_len, pos_type, pos_axial_shape,
                           pos_d_axial_embs),
  ]
  decoder_blocks = [
      DecoderBlock(d_model, d_ff, d_attention_key, d_attention_value, n_heads,
                   attention_type=attn, dropout=dropout,
                   ff_activation=ff_activation, ff_dropout=dropout,
                   ff_use_sru=ff_use_sru, ff_chunk_size=ff_chunk_size,
                   ff_sparsity=ff_sparsity,
                   attention_chunk_size=attention_chunk_size, mode=mode)
      for attn in _attention_types(attention_type, n_layers)]
  return tl.Serial(
      tl.ShiftRight(),
      positional_embedder,
      tl.Dup(),
      tl.ShiftRight(n_positions=shorten_factor - 1),
      tl.Fn('Shorten', lambda x: jnp.reshape(
          x, (x.shape[0], x.shape[1] // shorten_factor, -1)), n_out=1),
      tl.Dense(d_model),
      tl.Dup(),
      tl.ReversibleSerial(decoder_blocks,
                          repeats=_repeats(n_layers, attention_type)),
      tl.Select([0], n_in=2),
      tl.LayerNorm(),
      tl.Dropout(rate=dropout, shared_axes=[-2], mode=mode),
      tl.Dense(shorten_factor * d_embedding),
      tl.Fn('ProlongBack', lambda x: jnp.reshape(
          x, (x.shape[0], x.shape[1] * shorten_factor, -1)), n_out=1),
      tl.Concatenate(),
      tl.CausalConv(d_embedding),
      tl.Relu(),
      tl.SRU(d_embedding),
      vocab_layers.Dense('ReformerShortenLM', 'vocab_size', vocab_size),
  )


def EncoderBlock(d_model, d_ff, n_heads, attention_type, dropout, ff_activation,
                 ff_dropout, ff_use_sru=0, ff_chunk_size=0, ff_sparsity=0,
                 attention_chunk_size=0, center_layernorm=True,
                 use_bfloat16=False, use_two_swaps_per_block=True,
                 mode='train'):
  """Reversible encoder block on (activations, mask) with masked self-attention."""
  if mode == 'predict':
    mode = 'eval'
  attention = ct.ApplyAttentionLayer(
      attention_type=attention_type, d_model=d_model, n_heads=n_heads,
      d_qk=d_model // n_heads, d_v=d_model // n_heads, masked=True,
      causal=False, attention_dropout=dropout, output_dropout=dropout,
      attention_chunk_size=attention_chunk_size, mode=mode)
  if attention.n_out == 2:
    attention = tl.Serial(tl.Parallel([], _InsertAxes12()), attention,
                          tl.Select([0], n_in=2))
  ff = ct.FeedForwardWithOptions(d_model, d_ff, dropout, [-2], ff_activation,
                                 ff_dropout, ff_chunk_size, ff_use_sru,
                                 ff_sparsity, center_layernorm, mode,
                                 use_bfloat16)
  layers = [
      tl.ReversibleHalfResidual(tl.LayerNorm(center=center_layernorm),
                                attention_layer=attention,
                                name='ReversibleHalfResidualEncoderAttn'),
      tl.ReversibleSwap(),
      tl.ReversibleHalfResidual(ff, name='ReversibleHalfResidualEncoderFF'),
  ]
  if use_two_swaps_per_block:
    layers.append(tl.ReversibleSwap())
  return layers


def EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, ff_activation,
                        ff_dropout, mode, ff_use_sru=0, ff_chunk_size=0,
                        ff_sparsity=0):
  """Reversible decoder block with causal self-attention and encoder-decoder attention."""
  d_head = d_model // n_heads
  enc_dec_attention = tl.EncDecAttention(
      n_heads=n_heads, d_qk=d_head, d_v=d_head, attention_dropout=dropout,
      output_dropout=dropout, mode=mode)
  causal_attention = tl.SelfAttention(
      n_heads=n_heads, d_qk=d_head, d_v=d_head, causal=True,
      attention_dropout=dropout, output_dropout=dropout, mode=mode)
  feed_forward = ct.FeedForwardWithOptions(
      d_model, d_ff, dropout, [-2], ff_activation, ff_dropout, ff_chunk_size,
      ff_use_sru, ff_sparsity, True, mode)
  return [
      tl.ReversibleHalfResidual(tl.LayerNorm(), attention_layer=causal_attention),
      tl.ReversibleSwap(),
      tl.ReversibleHalfResidual(tl.LayerNorm(), attention_layer=enc_dec_attention),
      tl.ReversibleSwap(),
      tl.ReversibleHalfResidual(feed_forward),
      tl.ReversibleSwap(),
  ]


@registry.register
def Reformer(input_vocab_size, output_vocab_size=None, d_model=512, d_ff=2048,
             n_encoder_layers=6, n_decoder_layers=6, n_heads=8, dropout=0.1,
             max_len=2048, ff_activation=None, ff_dropout=None, mode='train',
             pos_type=None, pos_axial_shape=None, pos_d_axial_embs=None,
             ff_use_sru=0, ff_chunk_size=0, ff_sparsity=0):
  """Reversible encoder-decoder Transformer: (source ids, target ids) -> target logits.

  In predict mode the encoder runs once (`tl.Cache`) and the decoder decodes
  one token per call.
  """
  validation.check_sizes('Reformer', d_model=d_model, d_ff=d_ff,
                         n_heads=n_heads, max_len=max_len)
  validation.check_counts('Reformer', n_encoder_layers=n_encoder_layers,
                          n_decoder_layers=n_decoder_layers)
  validation.check_rates('Reformer', dropout=dropout, ff_dropout=ff_dropout)
  ff_activation = tl.Relu if ff_activation is None else ff_activation
  output_arg = vocab_layers.output_arg(output_vocab_size)
  in_encoder, out_encoder, output_vocab_size = (
      ct.EmbeddingAndPositionalEncodings(
          input_vocab_size, d_model, mode, dropout, [-2], max_len,
          output_vocab_size=output_vocab_size, pos_type=pos_type,
          pos_axial_shape=pos_axial_shape, pos_d_axial_embs=pos_d_axial_embs))
  encoder_blocks = [
      EncoderBlock(d_model, d_ff, n_heads, tl.SelfAttention, dropout,
                   ff_activation, ff_dropout, mode=mode, ff_use_sru=ff_use_sru,
                   ff_chunk_size=ff_chunk_size, ff_sparsity=ff_sparsity)
      for _ in range(n_encoder_layers)]
  encoder: tl.Layer = tl.Serial([
      in_encoder, tl.Dup(),
      tl.ReversibleSerial(encoder_blocks, repeats=_repeats(n_encoder_layers)),
      _XYAvg(), tl.LayerNorm()])
  if mode == 'predict':
    encoder = tl.Cache(encoder)
  encoder_decoder_blocks = [
      EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, ff_activation,
                          ff_dropout, mode, ff_use_sru=ff_use_sru,
                          ff_chunk_size=ff_chunk_size, ff_sparsity=ff_sparsity)
      for _ in range(n_decoder_layers)]
  return tl.Serial(
      tl.Select([0, 1, 1]),                                    # tok_e tok_d tok_d
      tl.Branch([], [tl.PaddingMask(), _RemoveAxes12()]),      # tok_e mask tok_d .....
      encoder,                                                 # vec_e mask tok_d .....
      tl.Select([2, 0, 1]),                                    # tok_d vec_e mask .....
      tl.ShiftRight(mode=mode),
      out_encoder,                                             # vec_d vec_e mask .....
      tl.Dup(),
      tl.ReversibleSerial(encoder_decoder_blocks,
                          repeats=_repeats(n_decoder_layers)),
      _XYAvg(),
      tl.LayerNorm(),
      tl.Select([0], n_in=3),                                  # vec_d .....
      vocab_layers.Dense('Reformer', output_arg, output_vocab_size),
  )


def _InsertAxes12():
  return tl.Fn('InsertAxes12',
               lambda x: jnp.reshape(x, (x.shape[0], 1, 1, x.shape[1])))


def _RemoveAxes12():
  return tl.Fn('RemoveAxes12', lambda x: jnp.squeeze(x, (1, 2)))


def _XYAvg():
  return tl.Fn('XYAvg', lambda x, y: (x + y) / 2.0)
