"""Building blocks shared by Transformer/Reformer variants (Trax 1.4.1 layout)."""

from retrax import layers as tl
from retrax.layers import validation


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
      raise ValueError(f'ff_sparsity {ff_sparsity!r} must hold 2 or 4 values: '
                       '(n_elements_in_block, d_lowrank[, temperature, '
                       'quant_prob]).')
  elif isinstance(ff_sparsity, int):
    n_elements_in_block, d_lowrank = ff_sparsity, d_ff // ff_sparsity
  else:
    raise ValueError(f'ff_sparsity must be an int, a sequence or a string; got '
                     f'{ff_sparsity!r}.')
  return n_elements_in_block, d_lowrank, temperature, quant_prob


def FeedForwardWithOptions(d_model, d_ff, dropout, dropout_shared_axes,  # pylint: disable=invalid-name
                           ff_activation, ff_dropout, ff_chunk_size, ff_use_sru,
                           ff_sparsity, center_layernorm, mode,
                           use_bfloat16=False, ff_sparsity_type='1inN'):
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
    ff_sparsity: If nonzero, `tl.SparseFF` (with `ff_sparsity_type='1inN'`)
      replaces the dense feed-forward: an int N (blocks of N, d_lowrank
      d_ff // N), or (N, d_lowrank[, temperature, quant_prob]), or the same
      as a space-separated string.
    center_layernorm: False for RMS normalization.
    mode: 'train', 'eval' or 'predict'.
    use_bfloat16: bfloat16 weights.
    ff_sparsity_type: Only '1inN' (Trax's 'Block' and 'Switch' experts are
      not implemented).

  Returns:
    A one-element list holding the block (vectors -> vectors).
  """
  sparse = bool(ff_sparsity)
  if sparse and ff_sparsity_type != '1inN':
    raise ValueError(f'ff_sparsity_type={ff_sparsity_type!r} (Trax\'s '
                     'BlockSparseFF / SwitchSparseFF) is not implemented in '
                     "retrax; use '1inN'.")
  if sparse:
    n_elements_in_block, d_lowrank, temperature, quant_prob = _parse_sparsity(
        ff_sparsity, d_ff)
    ff = tl.SparseFF(
        d_ff, n_elements_in_block=n_elements_in_block, d_lowrank=d_lowrank,
        temperature=temperature, quant_prob=quant_prob,
        use_bfloat16=use_bfloat16, mode=mode, dropout_rate=dropout,
        dropout_shared_axes=dropout_shared_axes, ff_chunk_size=ff_chunk_size)
    # SparseFF brings its own Dropout and chunking.
    res = [tl.LayerNorm(center=center_layernorm), ff]
  else:
    ff = _FeedForward(d_model, d_ff, dropout, ff_activation, ff_dropout,
                      use_bfloat16, mode)
    res = [tl.LayerNorm(center=center_layernorm), ff,
           tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)]
    if ff_chunk_size > 0:
      res = tl.BatchLeadingAxes(tl.Chunk(tl.Serial(res), ff_chunk_size))
  if ff_use_sru:
    if isinstance(ff_use_sru, (list, tuple)):
      sru_n_layers, sru_n_units = ff_use_sru
    else:
      sru_n_layers, sru_n_units = ff_use_sru, 32
    sru = [tl.SRU(sru_n_units, mode=mode) for _ in range(sru_n_layers)]
    block = ([tl.LayerNorm(center=center_layernorm), tl.Dense(sru_n_units)] +
             sru + [tl.Dense(d_model)])
    res = tl.Residual(block, shortcut=res)
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
  except validation.ArgumentError:
    raise
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
