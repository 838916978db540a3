"""Trax 1.4.1's configurable Transformers and the blocks Reformer variants share.

`ConfigurableTransformerEncoder`, `ConfigurableTransformerLM` and
`ConfigurableTransformer` are Trax's `models.Transformer*` with every block
option exposed (attention type and chunking, sparse or chunked or SRU
feed-forward, positional-encoding type, sparse output layer); with default
arguments their layer and weight trees are Trax's, leaf for leaf.
"""

import inspect
from typing import Union

from retrax import layers as tl
from retrax.layers.research import sparsity as research_sparsity
from retrax import validation
from retrax.models import vocab_layers
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _FeedForward(d_model, d_ff, dropout, activation, act_dropout, use_bfloat16,
                 mode):
  """Dense(d_ff), Dropout, activation, Dense(d_model)."""
  if act_dropout is None:
    act_dropout = dropout
  return [
      tl.Dense(d_ff, use_bfloat16=use_bfloat16),
      tl.Dropout(rate=act_dropout, shared_axes=[-2], mode=mode),
      activation(),
      tl.Dense(d_model, use_bfloat16=use_bfloat16),
  ]


def _parse_sparsity(ff_sparsity, d_ff):
  """Reads `ff_sparsity` as Trax does.

  Returns:
    (n_elements_in_block, d_lowrank, temperature, quant_prob).
  """
  temperature, quant_prob = 0.1, 0.3
  if isinstance(ff_sparsity, str):  # Trax's form for yaml sweeps: 'N d_lowrank'.
    ff_sparsity = [float(x) if '.' in x else int(x)
                   for x in ff_sparsity.split()]
  if isinstance(ff_sparsity, (list, tuple)):
    if len(ff_sparsity) == 2:
      n_elements_in_block, d_lowrank = ff_sparsity
    elif len(ff_sparsity) == 4:
      n_elements_in_block, d_lowrank, temperature, quant_prob = ff_sparsity
    else:
      raise ArgumentValueError(f'ff_sparsity {ff_sparsity!r} must hold 2 or 4 values: '
                               '(n_elements_in_block, d_lowrank[, temperature, '
                               'quant_prob]).')
  elif isinstance(ff_sparsity, int):
    n_elements_in_block, d_lowrank = ff_sparsity, d_ff // ff_sparsity
  else:
    raise ArgumentValueError(f'ff_sparsity must be an int, a sequence or a string; got '
                             f'{ff_sparsity!r}.')
  return n_elements_in_block, d_lowrank, temperature, quant_prob


def _dense_or_expert_ff(d_model, d_ff, dropout, ff_activation, ff_dropout,
                        ff_sparsity, use_bfloat16, mode, ff_sparsity_type):
  """The dense feed-forward (`ff_sparsity` 0), else a Block/Switch mixture of experts."""
  if not ff_sparsity:
    return _FeedForward(d_model, d_ff, dropout, ff_activation, ff_dropout,
                        use_bfloat16, mode)
  if not isinstance(ff_sparsity, int):
    raise ArgumentValueError(f'ff_sparsity_type={ff_sparsity_type!r} needs an int '
                             f'ff_sparsity (the number of experts); got '
                             f'{ff_sparsity!r}.')
  if ff_sparsity_type == 'Block':
    return tl.BlockSparseFF(d_ff, n_experts=ff_sparsity, mode=mode)
  return tl.SwitchSparseFF(d_ff, n_experts=ff_sparsity, mode=mode)


def FeedForwardWithOptions(d_model, d_ff, dropout, dropout_shared_axes,
                           ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                           ff_sparsity, center_layernorm, mode,
                           use_bfloat16=False, ff_sparsity_type='1inN',
                           sru_scan_cell=tl.ScanSRUCell):
  """LayerNorm + feed-forward + Dropout, with Trax 1.4.1's options.

  Args:
    d_model, d_ff: Model and feed-forward depths.
    dropout, dropout_shared_axes: Dropout after the block.
    ff_activation: Activation layer class of the dense feed-forward.
    ff_dropout: Dropout after the first Dense (defaults to `dropout`).
    ff_chunk_size: If > 0, the block runs over chunks of this many positions.
    ff_use_sru: If > 0, a residual branch `LayerNorm, Dense(n), SRU(n) x k,
      Dense(d_model)` is added to the block's output; an int k (n = 32) or a
      pair (k, n).
    ff_sparsity: If nonzero, a sparse block replaces the dense feed-forward:
      with `ff_sparsity_type='1inN'`, `tl.SparseFF` from an int N (blocks of
      N, d_lowrank d_ff // N), or (N, d_lowrank[, temperature, quant_prob]),
      or the same as a space-separated string; with 'Block' or 'Switch',
      `tl.BlockSparseFF` / `tl.SwitchSparseFF` with `n_experts=ff_sparsity`.
    center_layernorm: False for RMS normalization.
    mode: 'train', 'eval' or 'predict'.
    use_bfloat16: bfloat16 weights.
    ff_sparsity_type: '1inN', 'Block' or 'Switch'.
    sru_scan_cell: The SRU layers' recurrence (`tl.SRU`'s `scan_cell`).

  Returns:
    A one-element list holding the block (vectors -> vectors).
  """
  if ff_sparsity_type not in ('1inN', 'Block', 'Switch'):
    raise ArgumentValueError(f"ff_sparsity_type must be '1inN', 'Block' or 'Switch'; "
                             f'got {ff_sparsity_type!r}.')
  if ff_sparsity and ff_sparsity_type == '1inN':
    n_elements_in_block, d_lowrank, temperature, quant_prob = _parse_sparsity(
        ff_sparsity, d_ff)
    ff = tl.SparseFF(
        d_ff, n_elements_in_block=n_elements_in_block, d_lowrank=d_lowrank,
        temperature=temperature, quant_prob=quant_prob,
        use_bfloat16=use_bfloat16, mode=mode, dropout_rate=dropout,
        dropout_shared_axes=dropout_shared_axes, ff_chunk_size=ff_chunk_size)
    # SparseFF brings its own Dropout and chunking.
    res: Union[tl.Layer, list[tl.Layer]] = [tl.LayerNorm(center=center_layernorm), ff]
  else:
    ff = _dense_or_expert_ff(d_model, d_ff, dropout, ff_activation, ff_dropout,
                             ff_sparsity, use_bfloat16, mode, ff_sparsity_type)
    res = [tl.LayerNorm(center=center_layernorm), ff,
           tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)]
    if ff_chunk_size > 0:
      res = tl.BatchLeadingAxes(tl.Chunk(tl.Serial(res), ff_chunk_size))
  if ff_use_sru:
    res = tl.Residual(_sru_block(ff_use_sru, d_model, center_layernorm, mode,
                                 sru_scan_cell), shortcut=res)
  return [res]


def _sru_block(ff_use_sru, d_model, center_layernorm, mode, scan_cell):
  """`LayerNorm, Dense(n), SRU(n) x k, Dense(d_model)`; `ff_use_sru` is k or (k, n)."""
  if isinstance(ff_use_sru, (list, tuple)):
    sru_n_layers, sru_n_units = ff_use_sru
  else:
    sru_n_layers, sru_n_units = ff_use_sru, 32
  sru = [tl.SRU(sru_n_units, mode=mode, scan_cell=scan_cell)
         for _ in range(sru_n_layers)]
  return ([tl.LayerNorm(center=center_layernorm), tl.Dense(sru_n_units)] +
          sru + [tl.Dense(d_model)])


def ApplyAttentionLayer(attention_type, d_model, n_heads, d_qk, d_v, causal,
                        masked, attention_dropout, output_dropout,
                        attention_chunk_size, mode):
  """Builds `attention_type` with the efficient-attention or dense-attention signature.

  Efficient attention (`SelfAttention`, `LSHSelfAttention`, any callable
  taking `d_qk` or `**kwargs`) gets heads, sizes, causality and dropouts by
  keyword; dense attention (`Attention`, `CausalAttention`) takes
  `d_feature` first instead.
  """
  if _takes_efficient_arguments(attention_type):
    attention = attention_type(
        n_heads=n_heads, d_qk=d_qk, d_v=d_v, causal=causal, masked=masked,
        output_dropout=output_dropout, attention_dropout=attention_dropout,
        mode=mode)
  else:
    attention = attention_type(d_model, n_heads=n_heads,
                               dropout=attention_dropout, mode=mode)
  return tl.Chunk(attention, attention_chunk_size)


def _takes_efficient_arguments(attention_type):
  try:
    params = inspect.signature(attention_type).parameters.values()
  except (TypeError, ValueError):  # No readable signature (a builtin).
    return True
  return any(p.name == 'd_qk' or p.kind is p.VAR_KEYWORD for p in params)


@tl.assert_shape('...d->...d')
def PositionalEncoder(mode, dropout=None, max_len=None, pos_type=None,
                      pos_axial_shape=None, pos_d_axial_embs=None,
                      pos_start_from_zero_prob=1.0, pos_max_offset_to_add=0,
                      use_bfloat16=False, pos_time_bin_length=None):
  """The positional-encoding layer for `pos_type`.

  `None` is a learned table (PositionalEncoding), 'sin-cos', 'fixed-base',
  'infinite' (InfinitePositionalEncoding without random phase),
  'infinite-affine' (with it), 'time-bin' (TimeBinPositionalEncoding, whose
  bin length Trax took from gin: here `pos_time_bin_length`), 'no', or
  'axial'. Unlike Trax (which silently ignored them), axial arguments with
  `pos_type=None` select axial encoding; unlike Trax, the infinite and
  time-bin encodings get `mode` (so 'predict' continues the positions).
  """
  if not pos_type and pos_axial_shape and isinstance(pos_axial_shape,
                                                    (tuple, list)):
    pos_type = 'axial'
  if not pos_type:
    return tl.PositionalEncoding(
        max_len=max_len, dropout=dropout, use_bfloat16=use_bfloat16,
        start_from_zero_prob=pos_start_from_zero_prob,
        max_offset_to_add=pos_max_offset_to_add, mode=mode)
  if pos_type == 'sin-cos':
    return tl.SinCosPositionalEncoding(mode=mode)
  if pos_type == 'fixed-base':
    return tl.FixedBasePositionalEncoding(mode=mode)
  if pos_type in ('infinite', 'infinite-affine'):
    return tl.InfinitePositionalEncoding(affine=pos_type == 'infinite-affine',
                                         mode=mode)
  if pos_type == 'time-bin':
    if pos_time_bin_length is None:
      raise ArgumentValueError("pos_type='time-bin' needs pos_time_bin_length (the "
                               'bin length of TimeBinPositionalEncoding).')
    return tl.TimeBinPositionalEncoding(pos_time_bin_length, mode=mode)
  if pos_type == 'no':
    return tl.Serial()
  if pos_type in ('axial', 'axial-pos'):
    if not pos_axial_shape or pos_d_axial_embs is None:
      raise ArgumentValueError("pos_type='axial' needs pos_axial_shape and "
                               'pos_d_axial_embs.')
    return tl.AxialPositionalEncoding(
        shape=pos_axial_shape, d_embs=pos_d_axial_embs,
        dropout_broadcast_dims=tuple(range(1, len(pos_axial_shape) + 1)),
        dropout=dropout, mode=mode)
  raise ArgumentValueError(f"Unknown pos_type {pos_type!r}; use None, 'sin-cos', "
                           "'fixed-base', 'infinite', 'infinite-affine', 'time-bin', "
                           "'axial' or 'no'.")


def EmbeddingAndPositionalEncodings(input_vocab_size, d_model, mode,
                                    embedding_dropout, dropout_shared_axes,
                                    max_len, output_vocab_size=None,
                                    pos_type=None, pos_axial_shape=None,
                                    pos_d_axial_embs=None,
                                    pos_start_from_zero_prob=1.0,
                                    pos_max_offset_to_add=0,
                                    use_bfloat16=False,
                                    pos_time_bin_length=None):
  """Input and output embedders (embedding, dropout, positions) for encoder-decoders."""

  def embedder(vocab_size, embedding_mode, arg):
    if vocab_size is not None:  # Checked at init, as in Trax (vocab_layers).
      embedding = vocab_layers.Embedding(
          'EmbeddingAndPositionalEncodings', arg, vocab_size, d_model,
          use_bfloat16=use_bfloat16)
    else:
      embedding = tl.Dense(d_model, use_bfloat16=use_bfloat16)
    return [embedding, tl.Dropout(rate=embedding_dropout,
                                  shared_axes=dropout_shared_axes,
                                  mode=embedding_mode)]

  def positions(pos_mode):
    return PositionalEncoder(
        pos_mode, dropout=embedding_dropout, max_len=max_len,
        pos_type=pos_type, pos_axial_shape=pos_axial_shape,
        pos_d_axial_embs=pos_d_axial_embs,
        pos_start_from_zero_prob=pos_start_from_zero_prob,
        pos_max_offset_to_add=pos_max_offset_to_add, use_bfloat16=use_bfloat16,
        pos_time_bin_length=pos_time_bin_length)

  encoder_mode = 'eval' if mode == 'predict' else mode
  in_embedder = embedder(input_vocab_size, encoder_mode, 'input_vocab_size')
  in_encoder = in_embedder + [positions(encoder_mode)]
  if not (input_vocab_size or output_vocab_size):
    raise ArgumentValueError('Give input_vocab_size or output_vocab_size.')
  out_embedder = (in_embedder if output_vocab_size is None
                  else embedder(output_vocab_size, mode, 'output_vocab_size'))
  out_encoder = out_embedder + [positions(mode)]
  if output_vocab_size is None:
    output_vocab_size = input_vocab_size
  in_spec = '...a->...b' if input_vocab_size is None else '...->...d'
  in_encoder = tl.AssertFunction(in_spec, in_encoder)
  out_encoder = tl.AssertFunction('...->...d', out_encoder)
  return in_encoder, out_encoder, output_vocab_size


def _residual_attention(attention, dropout, dropout_shared_axes, mode):
  return tl.Residual(
      tl.LayerNorm(), attention,
      tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode))


def _residual_ff(d_model, d_ff, dropout, dropout_shared_axes, mode,
                 ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                 ff_sparsity, ff_sparsity_type):
  return tl.Residual(FeedForwardWithOptions(
      d_model, d_ff, dropout, dropout_shared_axes, ff_activation, ff_dropout,
      ff_chunk_size, ff_use_sru, ff_sparsity, True, mode, False,
      ff_sparsity_type))


def _attention_ff_block(causal, d_model, d_ff, n_heads, dropout,
                        dropout_shared_axes, mode, ff_args, attention_chunk_size,
                        attention_type, n_attention_layers,
                        n_feedforward_layers):
  """Attention residuals (causal, or masked by the padding mask), then feed-forward residuals."""
  attentions = [_residual_attention(
      ApplyAttentionLayer(attention_type, d_model, n_heads, d_model // n_heads,
                          d_model // n_heads, causal=causal, masked=not causal,
                          attention_dropout=dropout, output_dropout=dropout,
                          attention_chunk_size=attention_chunk_size,
                          mode=mode),
      dropout, dropout_shared_axes, mode) for _ in range(n_attention_layers)]
  feed_forwards = [_residual_ff(d_model, d_ff, dropout, dropout_shared_axes,
                                mode, *ff_args)
                   for _ in range(n_feedforward_layers)]
  return attentions + feed_forwards


def EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                 ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                 ff_sparsity, ff_sparsity_type, attention_chunk_size,
                 attention_type, n_attention_layers=1, n_feedforward_layers=1):
  """`(vectors, mask) -> (vectors, mask)`: masked attention and feed-forward residuals."""
  return _attention_ff_block(
      False, d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
      (ff_activation, ff_dropout, ff_chunk_size, ff_use_sru, ff_sparsity,
       ff_sparsity_type), attention_chunk_size, attention_type,
      n_attention_layers, n_feedforward_layers)


def DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                 ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                 ff_sparsity, ff_sparsity_type, attention_chunk_size,
                 attention_type, n_attention_layers=1, n_feedforward_layers=1):
  """`vectors -> vectors`: causal attention and feed-forward residuals."""
  return _attention_ff_block(
      True, d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
      (ff_activation, ff_dropout, ff_chunk_size, ff_use_sru, ff_sparsity,
       ff_sparsity_type), attention_chunk_size, attention_type,
      n_attention_layers, n_feedforward_layers)


def EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                        mode, ff_activation, ff_dropout, ff_chunk_size,
                        ff_use_sru, ff_sparsity, ff_sparsity_type,
                        attention_chunk_size, attention_type,
                        enc_dec_attention_sparsity=0):
  """`(dec, mask, enc) -> (dec, mask, enc)`: causal, encoder-decoder and feed-forward residuals.

  `enc_dec_attention_sparsity`: 0 (dense), an int (that sparsity for the
  queries, no output Dense) or a pair `(q_sparsity, result_sparsity)`.
  """
  if isinstance(enc_dec_attention_sparsity, tuple):
    q_sparsity, result_sparsity = enc_dec_attention_sparsity
  elif enc_dec_attention_sparsity > 0:
    q_sparsity, result_sparsity = enc_dec_attention_sparsity, 'noop'
  else:
    q_sparsity = result_sparsity = None
  attention_qkv = tl.AttentionQKV(
      d_model, n_heads=n_heads, dropout=dropout, mode=mode,
      cache_KV_in_predict=True, q_sparsity=q_sparsity,
      result_sparsity=result_sparsity)
  causal_attention = ApplyAttentionLayer(
      attention_type, d_model, n_heads, d_model // n_heads, d_model // n_heads,
      causal=True, masked=True, attention_dropout=dropout,
      output_dropout=dropout, attention_chunk_size=attention_chunk_size,
      mode=mode)
  feed_forward = FeedForwardWithOptions(
      d_model, d_ff, dropout, dropout_shared_axes, ff_activation, ff_dropout,
      ff_chunk_size, ff_use_sru, ff_sparsity, True, mode, False,
      ff_sparsity_type)
  return [
      _residual_attention(causal_attention, dropout, dropout_shared_axes,
                          mode),
      tl.Residual(tl.LayerNorm(), tl.Select([0, 2, 2, 1, 2]), attention_qkv,
                  tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes,
                             mode=mode)),
      tl.Residual(feed_forward),
  ]


def _check_heads(model, d_model, n_heads):
  validation.check_multiple(model, 'd_model', d_model, 'n_heads', n_heads)


@registry.register
def ConfigurableTransformerEncoder(vocab_size, n_classes=10, d_model=512,
                                   d_ff=2048, n_layers=6, n_heads=8,
                                   max_len=2048, dropout=0.1,
                                   dropout_shared_axes=None, mode='train',
                                   ff_activation=tl.Relu, ff_dropout=0.1,
                                   ff_chunk_size=0, ff_use_sru=0,
                                   ff_sparsity=0, ff_sparsity_type='1inN',
                                   attention_chunk_size=0,
                                   attention_type=tl.Attention, pos_type=None,
                                   pos_axial_shape=None, pos_d_axial_embs=None,
                                   pos_time_bin_length=None):
  """Tokens `(batch, length)` -> class logits `(batch, n_classes)` (Trax's layout).

  Embedding, dropout, positions; `n_layers` EncoderBlocks (padding-masked
  attention, feed-forward); LayerNorm, mean over positions, Dense. The
  arguments are Trax's (see FeedForwardWithOptions and PositionalEncoder).
  """
  _check_heads('ConfigurableTransformerEncoder', d_model, n_heads)
  positional_encoder = tl.AssertFunction('...->...d', [
      vocab_layers.Embedding('ConfigurableTransformerEncoder', 'vocab_size',
                             vocab_size, d_model),
      tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode),
      PositionalEncoder(mode, dropout, max_len, pos_type, pos_axial_shape,
                        pos_d_axial_embs,
                        pos_time_bin_length=pos_time_bin_length)])
  encoder_blocks = [
      EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                   ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                   ff_sparsity, ff_sparsity_type, attention_chunk_size,
                   attention_type) for _ in range(n_layers)]
  return tl.Serial(
      tl.Branch(positional_encoder, tl.PaddingMask()),  # vecs masks
      encoder_blocks,                                   # vecs masks
      tl.Select([0], n_in=2),                           # vecs
      tl.LayerNorm(),
      tl.Mean(axis=1),
      tl.Dense(n_classes),
  )


@registry.register
def ConfigurableTransformerLM(vocab_size, d_model=512, d_ff=2048, n_layers=6,
                              n_heads=8, max_len=2048, dropout=0.1,
                              dropout_shared_axes=None, mode='train',
                              ff_activation=tl.Relu, ff_dropout=0.1,
                              ff_chunk_size=0, ff_use_sru=0, ff_sparsity=0,
                              ff_sparsity_type='1inN',
                              loss_sparsity_type='mult', loss_sparsity=0,
                              loss_d_lowrank=0, loss_sparsity_prob=None,
                              attention_chunk_size=0,
                              attention_type=tl.CausalAttention,
                              pos_type=None, pos_axial_shape=None,
                              pos_d_axial_embs=None,
                              pos_start_from_zero_prob=1.0,
                              pos_max_offset_to_add=0,
                              pos_time_bin_length=None):
  """Tokens `(batch, length)` -> logits `(batch, length, vocab_size)` (Trax's layout).

  ShiftRight, embedding, dropout, positions; `n_layers` DecoderBlocks;
  LayerNorm; the output layer `SparseDenseWithOptions(vocab_size,
  sparsity_type=loss_sparsity_type, sparsity=loss_sparsity, d_lowrank=
  loss_d_lowrank, prob_sparse=loss_sparsity_prob)` (a Dense when
  `loss_sparsity=0`). Predict mode decodes one or more tokens per call.
  """
  _check_heads('ConfigurableTransformerLM', d_model, n_heads)
  positional_encoder = [
      vocab_layers.Embedding('ConfigurableTransformerLM', 'vocab_size',
                             vocab_size, d_model),
      tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode),
      PositionalEncoder(mode, dropout, max_len, pos_type, pos_axial_shape,
                        pos_d_axial_embs, pos_start_from_zero_prob,
                        pos_max_offset_to_add,
                        pos_time_bin_length=pos_time_bin_length)]
  decoder_blocks = [
      DecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                   ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                   ff_sparsity, ff_sparsity_type, attention_chunk_size,
                   attention_type) for _ in range(n_layers)]
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      positional_encoder,
      decoder_blocks,
      tl.LayerNorm(),
      _output_layer('ConfigurableTransformerLM', 'vocab_size', vocab_size,
                    d_model, mode, loss_sparsity_type, loss_sparsity,
                    loss_d_lowrank, loss_sparsity_prob),
  )


def _output_layer(owner, arg, vocab_size, d_model, mode, sparsity_type,
                  sparsity, d_lowrank, prob_sparse):
  """The logits layer: `SparseDenseWithOptions` (a Dense for the defaults);
  `vocab_size` (argument `arg` of model `owner`) checked at init."""
  return vocab_layers.checked_at_init(
      owner, arg, vocab_size,
      lambda: research_sparsity.SparseDenseWithOptions(
          vocab_size, d_input=d_model, sparsity_type=sparsity_type,
          sparsity=sparsity, d_lowrank=d_lowrank, prob_sparse=prob_sparse,
          mode=mode), f'Dense_{vocab_size}',
      in_serial=True)  # SparseDenseWithOptions comes in a shape check.


@registry.register
def ConfigurableTransformer(input_vocab_size, output_vocab_size=None,
                            d_model=512, d_ff=2048, n_encoder_layers=6,
                            n_decoder_layers=6, n_heads=8, max_len=2048,
                            dropout=0.1, dropout_shared_axes=None,
                            mode='train', ff_activation=tl.Relu,
                            ff_dropout=0.1, ff_chunk_size=0, ff_use_sru=0,
                            ff_sparsity=0, ff_sparsity_type='1inN',
                            loss_sparsity_type='mult', loss_sparsity=0,
                            loss_d_lowrank=0, loss_sparsity_prob=None,
                            attention_chunk_size=0,
                            encoder_attention_type=tl.Attention,
                            encoder_decoder_attention_type=tl.CausalAttention,
                            pos_type=None, pos_axial_shape=None,
                            pos_d_axial_embs=None,
                            enc_dec_attention_sparsity=0,
                            pos_time_bin_length=None):
  """`(source, target)` tokens -> `(logits, target)` (Trax's encoder-decoder layout).

  The encoder (EncoderBlocks, LayerNorm; cached in predict mode) reads the
  source; the decoder (EncoderDecoderBlocks: causal self-attention, attention
  to the encoder, feed-forward) the right-shifted target; the output layer
  is `SparseDenseWithOptions` as in ConfigurableTransformerLM.
  """
  _check_heads('ConfigurableTransformer', d_model, n_heads)
  output_arg = vocab_layers.output_arg(output_vocab_size)
  in_encoder, out_encoder, output_vocab_size = EmbeddingAndPositionalEncodings(
      input_vocab_size, d_model, mode, dropout, dropout_shared_axes, max_len,
      output_vocab_size=output_vocab_size, pos_type=pos_type,
      pos_axial_shape=pos_axial_shape, pos_d_axial_embs=pos_d_axial_embs,
      pos_time_bin_length=pos_time_bin_length)
  encoder_blocks = [
      EncoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes, mode,
                   ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                   ff_sparsity, ff_sparsity_type, attention_chunk_size,
                   encoder_attention_type) for _ in range(n_encoder_layers)]
  encoder: tl.Layer = tl.Serial(in_encoder, encoder_blocks, tl.LayerNorm())
  if mode == 'predict':
    encoder = tl.Cache(encoder)
  encoder_decoder_blocks = [
      EncoderDecoderBlock(d_model, d_ff, n_heads, dropout, dropout_shared_axes,
                          mode, ff_activation, ff_dropout, ff_chunk_size,
                          ff_use_sru, ff_sparsity, ff_sparsity_type,
                          attention_chunk_size, encoder_decoder_attention_type,
                          enc_dec_attention_sparsity)
      for _ in range(n_decoder_layers)]
  return tl.Serial(
      tl.Select([0, 1, 1]),                 # tok_e tok_d tok_d
      tl.Branch([], tl.PaddingMask()),      # tok_e mask tok_d tok_d
      encoder,                              # vec_e mask tok_d tok_d
      tl.Select([2, 1, 0]),                 # tok_d mask vec_e tok_d
      tl.ShiftRight(mode=mode),
      out_encoder,                          # vec_d mask vec_e tok_d
      tl.Branch([], tl.EncoderDecoderMask()),  # vec_d mask vec_e tok_d
      encoder_decoder_blocks,
      tl.LayerNorm(),
      tl.Select([0], n_in=3),               # vec_d tok_d
      _output_layer('ConfigurableTransformer', output_arg, output_vocab_size,
                    d_model, mode, loss_sparsity_type, loss_sparsity,
                    loss_d_lowrank, loss_sparsity_prob),
  )
