"""Building blocks shared by Transformer/Reformer variants (Trax 1.4.1 layout)."""

from retrax import layers as tl


def _unsupported(name, value):
  raise ValueError(f'{name}={value!r} is not supported by retrax (sparse and '
                   f'SRU feed-forward variants are not implemented); use the '
                   f'default {name}=0.')


def _FeedForward(d_model, d_ff, dropout, activation, act_dropout, use_bfloat16,  # pylint: disable=invalid-name
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


def FeedForwardWithOptions(d_model, d_ff, dropout, dropout_shared_axes,  # pylint: disable=invalid-name
                           ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                           ff_sparsity, center_layernorm, mode,
                           use_bfloat16=False, ff_sparsity_type='1inN'):
  """LayerNorm + feed-forward + Dropout, chunked along the batch*length axes if `ff_chunk_size`."""
  del ff_sparsity_type
  if ff_sparsity:
    _unsupported('ff_sparsity', ff_sparsity)
  if ff_use_sru:
    _unsupported('ff_use_sru', ff_use_sru)
  ff = _FeedForward(d_model, d_ff, dropout, ff_activation, ff_dropout,
                    use_bfloat16, mode)
  res = [tl.LayerNorm(center=center_layernorm), ff,
         tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)]
  if ff_chunk_size > 0:
    res = tl.BatchLeadingAxes(tl.Chunk(tl.Serial(res), ff_chunk_size))
  return [res]


def ApplyAttentionLayer(attention_type, d_model, n_heads, d_qk, d_v, causal,  # pylint: disable=invalid-name
                        masked, attention_dropout, output_dropout,
                        attention_chunk_size, mode):
  """Builds `attention_type` with the efficient-attention or dense-attention signature."""
  try:
    attention = attention_type(
        n_heads=n_heads, d_qk=d_qk, d_v=d_v, causal=causal, masked=masked,
        output_dropout=output_dropout, attention_dropout=attention_dropout,
        mode=mode)
  except TypeError:  # Dense attention layers take d_feature instead.
    attention = attention_type(d_model, n_heads=n_heads,
                               dropout=attention_dropout, mode=mode)
  return tl.Chunk(attention, attention_chunk_size)


@tl.assert_shape('...d->...d')
def PositionalEncoder(mode, dropout=None, max_len=None, pos_type=None,  # pylint: disable=invalid-name
                      pos_axial_shape=None, pos_d_axial_embs=None,
                      pos_start_from_zero_prob=1.0, pos_max_offset_to_add=0,
                      use_bfloat16=False):
  """The positional-encoding layer for `pos_type`.

  `None` is a learned table (PositionalEncoding), 'sin-cos', 'fixed-base',
  'no', or 'axial'. Unlike Trax (which silently ignored them), axial
  arguments with `pos_type=None` select axial encoding.
  """
  if not pos_type and pos_axial_shape:
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
  if pos_type == 'no':
    return tl.Serial()
  if pos_type in ('axial', 'axial-pos'):
    if not pos_axial_shape or pos_d_axial_embs is None:
      raise ValueError("pos_type='axial' needs pos_axial_shape and "
                       'pos_d_axial_embs.')
    return tl.AxialPositionalEncoding(
        shape=pos_axial_shape, d_embs=pos_d_axial_embs,
        dropout_broadcast_dims=tuple(range(1, len(pos_axial_shape) + 1)),
        dropout=dropout, mode=mode)
  raise ValueError(f"Unknown pos_type {pos_type!r}; use None, 'sin-cos', "
                   "'fixed-base', 'axial' or 'no'.")


def EmbeddingAndPositionalEncodings(input_vocab_size, d_model, mode,  # pylint: disable=invalid-name
                                    embedding_dropout, dropout_shared_axes,
                                    max_len, output_vocab_size=None,
                                    pos_type=None, pos_axial_shape=None,
                                    pos_d_axial_embs=None,
                                    pos_start_from_zero_prob=1.0,
                                    pos_max_offset_to_add=0,
                                    use_bfloat16=False):
  """Input and output embedders (embedding, dropout, positions) for encoder-decoders."""

  def embedder(vocab_size, embedding_mode):
    if vocab_size is not None:
      embedding = tl.Embedding(vocab_size, d_model, use_bfloat16=use_bfloat16)
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
        pos_max_offset_to_add=pos_max_offset_to_add, use_bfloat16=use_bfloat16)

  encoder_mode = 'eval' if mode == 'predict' else mode
  in_embedder = embedder(input_vocab_size, encoder_mode)
  in_encoder = in_embedder + [positions(encoder_mode)]
  if not (input_vocab_size or output_vocab_size):
    raise ValueError('Give input_vocab_size or output_vocab_size.')
  out_embedder = (in_embedder if output_vocab_size is None
                  else embedder(output_vocab_size, mode))
  out_encoder = out_embedder + [positions(mode)]
  if output_vocab_size is None:
    output_vocab_size = input_vocab_size
  in_spec = '...a->...b' if input_vocab_size is None else '...->...d'
  in_encoder = tl.AssertFunction(in_spec, in_encoder)
  out_encoder = tl.AssertFunction('...->...d', out_encoder)
  return in_encoder, out_encoder, output_vocab_size
