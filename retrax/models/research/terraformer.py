"""The Terraformer (Trax's `models.research.terraformer`): a reversible encoder-decoder.

The encoder is a reversible stack over the source; its output is joined to
the embedded targets (`ConcatWithPadding`: each example's decoder positions
follow its real source positions) and one reversible decoder stack of causal
attention runs over both, so the decoder attends to the source through its
self-attention. `ConfigurableTerraformer` builds the same layer tree as Trax
1.4.1, so a Trax checkpoint maps leaf for leaf.

In `mode='predict'` the first call takes the whole source and the first
target token(s); later calls take one target token each. The source's
padding mask reaches the decoder's SRU layers and causal attention through a
portal layer (`_PortalInput` keeps the last mask it saw), so that predict
mode equals eval mode on every prefix.
"""

import functools

from jax import lax

from retrax import layers as tl
from retrax.configurable import takes_argument
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import attention
from retrax.layers.attention import kv_cache
from retrax.layers import predict_state
from retrax import validation
from retrax.models import vocab_layers
from retrax.models.reformer import reformer
from retrax.models.research import configurable_transformer as ct
from retrax.models.research import transformer2 as t2
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _stage_sizes(d_model, d_ff, d_key, d_value, half_before_layer,
                 double_after_layer):
  """`(first, middle, last)` stage sizes `(d_model, d_ff, d_key, d_value)`."""
  middle = (d_model, d_ff, d_key, d_value)
  first = middle
  if half_before_layer:
    first = tuple(_half('half_before_layer', n) for n in middle)
  last = tuple(2 * n for n in middle) if double_after_layer else middle
  return first, middle, last


def _half(what, n):
  if n % 2:
    raise ArgumentValueError(f'ConfigurableTerraformer: {what} halves d_model, d_ff '
                             f'and the attention depths, which must be even; got {n}.')
  return n // 2


def _check_args(input_vocab_size, output_vocab_size, d_model, d_ff, n_heads,
                n_encoder_layers, n_decoder_layers, dropout, mode):
  name = 'ConfigurableTerraformer'
  validation.check_sizes(name, d_model=d_model, d_ff=d_ff, n_heads=n_heads)
  validation.check_counts(name, n_encoder_layers=n_encoder_layers,
                          n_decoder_layers=n_decoder_layers)
  validation.check_rates(name, dropout=dropout)
  validation.check_choice(name, 'mode', mode, ('train', 'eval', 'predict'))
  if input_vocab_size is None and output_vocab_size is None:
    raise ArgumentValueError(f'{name}: give input_vocab_size or output_vocab_size.')
  if (d_model // 2) % n_heads or d_model % 2:
    raise ArgumentValueError(f'{name}: n_heads ({n_heads}) must divide d_model/2 '
                             f'({d_model / 2}).')


def _portal_attention_types(attention_types, portal_mask):
  """The decoder's attention types, given the portal where they take it.

  In predict mode the layers Trax's Terraformer patched read `portal_mask`:
  the per-head causal attention (`qkv_attention_type`: `CausalAttention`,
  the sparse variants, `PureLSHSelfAttentionWrapper` for
  `MixedLSHSelfAttention`) is `PortalMaskedCausalAttention`, and the causal
  convolutions' memory takes `portal_mask` (`MultiplicativeConvCausalAttention`,
  the wrapper's sparse projections). Efficient attention (`SelfAttention`,
  LSH) keeps its own predict mode, as in Trax: it attends to the source's
  padding, so its predict mode differs from eval mode after a padded source.
  """
  if not isinstance(attention_types, (tuple, list)):
    attention_types = [attention_types]
  if portal_mask is None:
    return attention_types
  portal_args = dict(
      qkv_attention_type=functools.partial(PortalMaskedCausalAttention,
                                           portal_mask=portal_mask),
      portal_mask=portal_mask)
  return [_with_arguments(t, {name: value for name, value in portal_args.items()
                              if takes_argument(t, name)})
          for t in attention_types]


def _with_arguments(fn, kwargs):
  return functools.partial(fn, **kwargs) if kwargs else fn


class PortalMaskedCausalAttention(attention.DotProductCausalAttention):
  """Predict-mode causal attention that skips the source's padding (Trax's patch).

  The first predict call of a Terraformer attends over the source's real
  positions, the first target position(s) and the source's padding (moved
  after them by `ConcatWithPadding`); later positions are appended after all
  of these. This layer keeps which cache slots are real (state `(allowed
  [max_inference_length] bool, keys, values, index)`, Trax's layout) from
  the source mask `portal_mask` (a `_PortalInput`) holds, so that predict
  mode attends to what eval mode does. One example at a time, as in Trax.
  """

  def __init__(self, *args, portal_mask=None, **kwargs):
    super().__init__(*args, **kwargs)
    self._portal_mask = portal_mask

  def init_weights_and_state(self, input_signature):
    super().init_weights_and_state(input_signature)
    if self.mode == 'predict':
      allowed = jnp.zeros((self.max_len,), dtype=jnp.bool_)
      self.state = (allowed,) + tuple(self.state)

  def forward(self, inputs):
    if self.mode != 'predict':
      return super().forward(inputs)
    q, k, v = inputs
    allowed, keys, values, index = self.state
    if self._portal_mask is None:
      raise InputValueError(
          f'{self.name}: predict mode needs a portal_mask (made by '
          'Terraformer in predict mode, see `_portal_attention_types`).')
    source_mask = self._portal_mask.one_example_mask(self.name)
    allowed = lax.dynamic_update_slice(allowed, source_mask,
                                       (jnp.zeros((), jnp.int32),))
    first_target = jnp.sum(source_mask, dtype=jnp.int32)
    allowed = allowed.at[first_target].set(True).at[index].set(True)
    (keys, values, new_index), (ks, vs, start) = kv_cache.update_state(
        k, v, (keys, values, index), self.max_len)
    self.state = (allowed, keys, values, new_index)

    def masked_attention(q, k, v, mask):
      visible = allowed[:kv_cache.length(k)][None, None, :]
      return attention.dot_product_attention(q, k, v, mask & visible)
    return kv_cache.attend(q, ks, vs, start, masked_attention)

  def predict_state_layout(self, state):
    """As `DotProductCausalAttention`'s, with the slot mask shared (one example)."""
    if self.mode != 'predict':
      return None
    allowed, keys, values, index = state
    layout = super().predict_state_layout((keys, values, index))
    if layout is None:
      return None
    return layout._replace(rows=(0,) + tuple(layout.rows))


def _encoder(blocks, d_model, n_layers_forget, forget_dense,
             reversible_encoder, use_bfloat16, mode):
  """`vec_e mask_e ... -> vec_e mask_e ...` (two halves if reversible)."""
  layers = [tl.ReversibleSelect([0, 0]),
            _ReversibleSerialForget(blocks, d_model, n_layers_forget,
                                    forget_dense, block_period=1)]
  if not reversible_encoder:
    layers += [_XYAvg(), tl.Dense(d_model, use_bfloat16=use_bfloat16),
               tl.LayerNorm()]
  if mode == 'predict':
    return tl.Cache(tl.Serial(layers))
  return tl.Serial(layers)


def _decoder_blocks(attention_types, n_decoder_layers, sizes,
                    half_before_layer, double_after_layer, block_args):
  """The decoder blocks, with `ReversibleConcatenatePair` where widths double."""
  first, middle, last = sizes
  if n_decoder_layers % len(attention_types):
    raise ArgumentValueError(
        f'ConfigurableTerraformer: n_decoder_layers ({n_decoder_layers}) must '
        f'be a multiple of the number of decoder attention types '
        f'({len(attention_types)}).')
  blocks = []
  for i in range(n_decoder_layers):
    d_m, d_f, d_k, d_v = first
    if half_before_layer and i >= half_before_layer:
      d_m, d_f, d_k, d_v = middle
    if double_after_layer and i > double_after_layer:
      d_m, d_f, d_k, d_v = last
    blocks.append(reformer.DecoderBlock(
        d_m, d_f, d_k, d_v, attention_type=attention_types[
            i % len(attention_types)], **block_args))
    if ((half_before_layer and i == half_before_layer - 1) or
        (double_after_layer and i == double_after_layer)):
      blocks.append(tl.ReversibleConcatenatePair())
  return blocks


def _inputs(input_vocab_size, in_encoder):
  """`tok_e tok_d` (or `vec_e mask_e tok_d`) -> `vec_e mask_e tok_e tok_d`."""
  if input_vocab_size is not None:
    return tl.AssertFunction('bl,br->bld,bl,bl,br', tl.Serial(
        tl.Select([0, 0, 0, 1]),
        tl.Parallel(in_encoder, [tl.PaddingMask(), _RemoveAxes12()])))
  # Pre-embedded sources: the mask stands in for the source tokens where
  # only padding / not padding matters downstream.
  return tl.AssertFunction('blf,bl,br->bld,bl,bl,br', tl.Serial(
      tl.Select([0, 1, 1, 2]),
      tl.Parallel(in_encoder, [], _AsTokenIDs())))


def _enc_dec_concat(reversible_encoder, mode):
  if reversible_encoder:
    return [tl.ReversibleSelect([0, 1, 4, 2, 3]),  # v_e v_e v_d mask tok_e tok_d
            t2.ConcatWithPadding2(mode=mode)]      # v_ed v_ed tok_e tok_d
  return [tl.ReversibleSelect([0, 3, 1, 2]),       # v_e v_d mask tok_e tok_d
          t2.ConcatWithPadding(mode=mode),         # v_ed tok_e tok_d
          tl.ReversibleSelect([0, 0])]             # v_ed v_ed tok_e tok_d


@registry.register
def ConfigurableTerraformer(
    input_vocab_size, output_vocab_size=None, d_model=512, d_ff=2048,
    d_attention_key=None, d_attention_value=None, n_encoder_layers=6,
    n_decoder_layers=6, n_heads=8, dropout=0.1, max_len=2048,
    encoder_attention_type=tl.SelfAttention,
    encoder_decoder_attention_type=tl.SelfAttention, pos_type='fixed-base',
    pos_axial_shape=(), pos_d_axial_embs=None, pos_start_from_zero_prob=1.0,
    pos_max_offset_to_add=0, ff_activation=tl.Relu, ff_use_sru=0,
    ff_chunk_size=0, ff_dropout=None, ff_sparsity=0, loss_sparsity_type='mult',
    loss_sparsity=0, loss_d_lowrank=0, loss_sparsity_prob=None,
    attention_chunk_size=0, n_layers_forget=0, forget_dense=True,
    n_decoder_attention_layers=2, use_bfloat16=False, reversible_encoder=False,
    use_two_swaps_per_encoder_block=True, center_layernorm=True,
    half_before_layer=None, double_after_layer=None, mode='train'):
  """Terraformer encoder-decoder: `(source, target) -> (logits, target)`.

  `source` int `[B, L1]` (0 = padding; with `input_vocab_size=None`: source
  vectors `[B, L1, F]` and their mask `[B, L1]`), `target` int `[B, L2]`.
  Arguments and defaults as in Trax 1.4.1; `d_model` is each reversible
  half's width; `encoder_decoder_attention_type` may be a list (cycled).
  """
  _check_args(input_vocab_size, output_vocab_size, d_model, d_ff, n_heads,
              n_encoder_layers, n_decoder_layers, dropout, mode)
  portal_mask = _PortalInput() if mode == 'predict' else None
  sizes = _stage_sizes(d_model, d_ff, d_attention_key or d_model // n_heads,
                       d_attention_value or d_model // n_heads,
                       half_before_layer, double_after_layer)
  (d_model1, d_ff1), d_model2 = sizes[0][:2], sizes[2][0]
  output_arg = vocab_layers.output_arg(output_vocab_size)
  in_encoder, out_encoder, output_vocab_size = (
      ct.EmbeddingAndPositionalEncodings(
          input_vocab_size, d_model1, mode, dropout, [-2], max_len,
          output_vocab_size=output_vocab_size, pos_type=pos_type,
          pos_axial_shape=pos_axial_shape, pos_d_axial_embs=pos_d_axial_embs,
          pos_start_from_zero_prob=pos_start_from_zero_prob,
          pos_max_offset_to_add=pos_max_offset_to_add,
          use_bfloat16=use_bfloat16))
  block_args = dict(
      dropout=dropout, ff_activation=ff_activation, ff_dropout=ff_dropout,
      ff_use_sru=ff_use_sru, ff_chunk_size=ff_chunk_size,
      ff_sparsity=ff_sparsity, attention_chunk_size=attention_chunk_size,
      center_layernorm=center_layernorm, use_bfloat16=use_bfloat16, mode=mode)
  encoder = _encoder(
      [reformer.EncoderBlock(d_model1, d_ff1, n_heads, encoder_attention_type,
                             use_two_swaps_per_block=swaps, **block_args)
       for swaps in [use_two_swaps_per_encoder_block] * n_encoder_layers],
      d_model1, n_layers_forget, forget_dense, reversible_encoder,
      use_bfloat16, mode)
  # In predict mode the decoder's SRU cells and causal attention read the
  # source's padding mask through the portal.
  sru_scan_cell = (tl.ScanSRUCell if portal_mask is None else
                   functools.partial(tl.ScanSRUCell,
                                     monkey_patched_mask=portal_mask))
  decoder_types = _portal_attention_types(encoder_decoder_attention_type,
                                          portal_mask)
  decoder = _ReversibleSerialForget(_decoder_blocks(
      decoder_types, n_decoder_layers, sizes, half_before_layer,
      double_after_layer,
      dict(n_heads=n_heads, n_attention_layers=n_decoder_attention_layers,
           sru_scan_cell=sru_scan_cell, **block_args)),
      d_model2, n_layers_forget, forget_dense,
      # Widths that halve or double make the blocks differ.
      block_period=(None if half_before_layer or double_after_layer
                    else len(decoder_types)))
  loss = _loss_layer(output_arg, output_vocab_size, d_model2,
                     (loss_sparsity_type, loss_sparsity, loss_d_lowrank,
                      loss_sparsity_prob), use_bfloat16, mode)
  return _assemble(_inputs(input_vocab_size, in_encoder), portal_mask,
                   out_encoder, encoder, reversible_encoder, decoder, loss,
                   mode)


def _loss_layer(output_arg, vocab_size, d_model, sparsity_args, use_bfloat16,
                mode):
  """The logits layer, `SparseDenseWithOptions(vocab_size, d_model,
  *sparsity_args)`; `vocab_size` (argument `output_arg`) checked at init."""
  sparsity_type, sparsity, d_lowrank, prob_sparse = sparsity_args
  return vocab_layers.checked_at_init(
      'ConfigurableTerraformer', output_arg, vocab_size,
      lambda: tl.SparseDenseWithOptions(
          vocab_size, d_input=d_model, sparsity_type=sparsity_type,
          sparsity=sparsity, d_lowrank=d_lowrank, prob_sparse=prob_sparse,
          use_bfloat16=use_bfloat16, mode=mode), f'Dense_{vocab_size}',
      in_serial=True)  # SparseDenseWithOptions comes in a shape check.


def _assemble(inputs, portal_mask, out_encoder, encoder, reversible_encoder,
              decoder, loss, mode):
  """The model's top-level Serial (Trax's layer order)."""
  return tl.Serial(
      inputs,                                 # vec_e mask_e tok_e tok_d
      tl.Parallel([], portal_mask),
      tl.Select([0, 1, 2, 3, 3]),             # Decoder tokens kept for the loss.
      tl.Parallel([], [], [], [tl.ShiftRight(mode=mode), out_encoder]),
      encoder,                                # vec_e mask_e tok_e vec_d tok_d
      _enc_dec_concat(reversible_encoder, mode),
      decoder,                                # vec_ed1 vec_ed2 tok_e tok_d
      _XYAvg(),                               # vec_ed tok_e tok_d
      tl.LayerNorm(),
      tl.Select([0, 1, 2, 2]),                # vec_ed tok_e tok_d tok_d
      t2.StripFromConcatenateWithPadding(mode=mode),  # vec_d tok_d
      loss,                                   # logits tok_d
  )


def _RemoveAxes12():
  """`[B, 1, 1, L] -> [B, L]`."""
  return tl.Fn('RemoveAxes12', lambda x: jnp.squeeze(x, (1, 2)))


def _AsTokenIDs():
  """A mask as int32 token ids (0 where padding)."""
  return tl.Fn('AsTokenIDs', lambda x: x.astype(jnp.int32))


def _XYAvg():
  """The element-wise mean of two arrays."""
  return tl.Fn('XYAvg', lambda x, y: (x + y) / 2.0)


def _ReversibleSerialForget(layers, d_model, n_layers, forget_dense=True,
                            block_period=None):
  """`ReversibleSerial(layers)`, with a forget layer after every `n_layers`.

  The forget layer averages the two halves and (with `forget_dense`) maps
  them through `Dense(d_model)` before duplicating; it is not reversible, so
  the reversible parts around it store their outputs. `layers` are blocks;
  with `block_period` p, every p consecutive blocks are a copy of the first
  p (their attention types cycle), which each `ReversibleSerial` declares
  (`repeats`) where its blocks are whole copies.
  """
  if not n_layers or len(layers) <= n_layers + 1:
    return _ReversibleRepeats(layers, block_period)
  if forget_dense:
    forget = tl.Serial(_XYAvg(), tl.Dense(d_model), tl.Dup())
  else:
    forget = tl.Select([0, 1])
  return tl.Serial(
      _ReversibleRepeats(layers[:n_layers], block_period),
      forget,
      _ReversibleSerialForget(layers[n_layers:], d_model, n_layers,
                              forget_dense, block_period))


def _ReversibleRepeats(blocks, block_period):
  """`ReversibleSerial(blocks)`, declared copies of its first `block_period` blocks."""
  whole = block_period and blocks and len(blocks) % block_period == 0
  return tl.ReversibleSerial(
      blocks, repeats=len(blocks) // block_period if whole else None)


class _PortalInput(tl.Layer):
  """Passes its input through and keeps it (the source mask) for `_PortalOutput`."""

  def __init__(self):
    super().__init__(name='_PortalInput', n_in=1, n_out=1)
    self._portal_output = _PortalOutput(self)

  def forward(self, x):
    if isinstance(x, (list, tuple)):
      x = x[0]
    # Kept as float32 (the dtype of the initial state): readers test `!= 0`.
    self.state = (x.astype(jnp.float32),)
    return x

  def init_weights_and_state(self, input_signature):
    if isinstance(input_signature, (list, tuple)):
      input_signature = input_signature[0]
    self.state = (jnp.zeros(input_signature.shape, dtype=jnp.float32),)

  def predict_state_layout(self, state):
    """The kept mask has one row per example."""
    del state
    return predict_state.PredictStateLayout((1,))

  def get_value(self):
    """The last input seen (zeros before the first call)."""
    return self.state[0]

  def one_example_mask(self, reader):
    """The last input as a bool vector (True: a real source position).

    Layers that locate cache slots by it (`reader`, named in the error)
    decode one example at a time, as in Trax.
    """
    mask = self.get_value()
    if mask.shape[0] != 1:
      raise InputValueError(
          f'{reader}: Terraformer predict mode decodes one example at a '
          f'time (as in Trax); got a source mask of shape {mask.shape}.')
    return jnp.reshape(mask, (-1,)) != 0

  def get_layer(self):
    """A layer with no inputs that pushes `get_value()`."""
    return self._portal_output


class _PortalOutput(tl.Layer):
  """Pushes its `_PortalInput`'s last input."""

  def __init__(self, portal_input):
    super().__init__(name='_PortalOutput', n_in=0, n_out=1)
    self._portal_input = portal_input

  def forward(self, x):
    del x
    return self._portal_input.get_value()

  def get_value(self):
    return self._portal_input.get_value()
