"""HourglassLM, a hierarchical Transformer language model (https://arxiv.org/abs/2110.13711).

Token-level decoder blocks, then a "valley": the sequence is shifted right by
`k - 1`, shortened k times, run through decoder blocks at the short length
(recursively shortened again for deeper hierarchies), upsampled back and
added to the token-level residual, then token-level decoder blocks again.
Attention is causal relative attention by default; its two biases are shared
by every layer. Trax's HourglassLM has no predict mode; neither has this one.
"""

from retrax import configurable
from retrax import layers as tl
from retrax.layers.research.rel_attention import RelativeAttentionWrapper
from retrax.layers.research.rel_attention import get_rel_att_inputs
from retrax.layers.research.resampling import AttentionResampling
from retrax.layers.research.resampling import AveragePooling
from retrax.layers.research.resampling import FeedForwardBlock
from retrax.layers.research.resampling import LinearUpsampling
from retrax.models.research.configurable_transformer import ApplyAttentionLayer
from retrax.models import registry
from retrax.validation import ArgumentValueError


def _RelativeDecoderBlock(attention_type, d_model, d_ff, n_heads, dropout,
                          dropout_shared_axes, mode, ff_activation,
                          context_bias_layer, location_bias_layer,
                          total_pooling):
  """Pre-norm residual causal attention and feed-forward blocks (a list)."""
  # A gin reference (`@RelativeAttentionWrapper`) is gin's configured
  # function; `public_object` gives retrax's back.
  if configurable.public_object(attention_type) is RelativeAttentionWrapper:
    attention = RelativeAttentionWrapper(
        d_model, n_heads, dropout, mode=mode,
        context_bias_layer=context_bias_layer,
        location_bias_layer=location_bias_layer, total_pooling=total_pooling)
  else:
    attention = ApplyAttentionLayer(
        attention_type, d_model, n_heads, d_model // n_heads,
        d_model // n_heads, causal=True, masked=False,
        attention_dropout=dropout, output_dropout=dropout,
        attention_chunk_size=0, mode=mode)
  feed_forward = FeedForwardBlock(d_model, d_ff, dropout, dropout_shared_axes,
                                  mode, ff_activation)

  def dropout_layer():
    return tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode)

  return [
      tl.Residual(tl.LayerNorm(), attention, dropout_layer()),
      tl.Residual(tl.LayerNorm(), feed_forward, dropout_layer()),
  ]


def parse_hierarchy(hierarchy_str):
  """`'n1@f1 n2@f2 ... n1@f1'` -> (layers per level, shorten factor per level).

  `f` is the total shortening at a level, so each level's own factor is
  `f_i / f_(i-1)`; the levels must read the same both ways.
  """
  levels = hierarchy_str.split(' ')
  if levels != levels[::-1]:
    raise ArgumentValueError(f'HourglassLM: hierarchy {hierarchy_str!r} is not a '
                             'palindrome.')
  try:
    pairs = [level.split('@') for level in levels[:1 + len(levels) // 2]]
    n_layers = [int(n) for n, _ in pairs]
    total_factors = [int(f) for _, f in pairs]
  except ValueError as e:
    raise ArgumentValueError(f'HourglassLM: hierarchy {hierarchy_str!r}: each level '
                             'must read N_LAYERS@TOTAL_SHORTENING, e.g. 2@3.') from e
  shorten_factors = []
  for current, previous in zip(total_factors, [1] + total_factors[:-1]):
    if current % previous:
      raise ArgumentValueError(f'HourglassLM: hierarchy {hierarchy_str!r}: level '
                               f'shortening {current} is not divisible by the '
                               f'previous level\'s {previous}.')
    shorten_factors.append(current // previous)
  return n_layers, shorten_factors


_parse_hierarchy = parse_hierarchy  # Trax's name (its tests call it).


def _decoder_blocks(n_layers, total_pooling, attention_type, common):
  """`n_layers` decoder blocks and a final LayerNorm (a list)."""
  blocks = [_RelativeDecoderBlock(attention_type, total_pooling=total_pooling,
                                  **common) for _ in range(n_layers)]
  return blocks + [tl.LayerNorm()]


def _valley(factors, n_layers, total_pooling, common, fns):
  """`x -> x + LayerNorm(up(blocks(down(shift_right(x, k - 1)))))`, recursively per level."""
  factor, inner_pooling = factors[0], total_pooling * factors[0]
  blocks = _decoder_blocks(n_layers[0], inner_pooling, fns['middle'], common)
  if len(factors) > 1:
    middle = [blocks,
              *_valley(factors[1:], n_layers[1:], inner_pooling, common, fns),
              _decoder_blocks(n_layers[0], inner_pooling, fns['middle'],
                              common)]
  else:
    middle = [blocks]
  down = fns['down'](factor, is_upsampling=False, total_pooling=total_pooling,
                     resampling_fn=fns['attention_down'], **common)
  up = fns['up'](factor, is_upsampling=True, total_pooling=total_pooling,
                 resampling_fn=fns['attention_up'], **common)
  return [tl.Dup(), tl.ShiftRight(factor - 1, mode=common['mode']), down,
          *middle, up, tl.LayerNorm(), tl.Add()]


@registry.register
def HourglassLM(vocab_size, d_model=512, d_ff=2048, vanilla_layers=(1, 1),
                hierarchy='6@3', n_heads=8, dropout=0.1,
                dropout_shared_axes=None, mode='train',
                ff_activation=tl.FastGelu,
                vanilla_attn_type=RelativeAttentionWrapper,
                middle_attn_type=RelativeAttentionWrapper,
                downsampling_fn=AttentionResampling,
                upsampling_fn=AttentionResampling,
                attention_downsampling_fn=AveragePooling,
                attention_upsampling_fn=LinearUpsampling):
  """Hourglass language model: tokens `[b, l]` -> logits `[b, l, vocab_size]`.

  `vanilla_layers` = (decoder blocks before, after) the valley at token
  level; `hierarchy` as in `parse_hierarchy` (e.g. `'2@3 2@6 2@3'`: 2 blocks
  at 3x shortening, 2 at 6x, 2 at 3x); `vanilla_attn_type` /
  `middle_attn_type` the attention of token-level / shortened blocks;
  `downsampling_fn` / `upsampling_fn` build the resampling steps
  (`AttentionResampling` uses `attention_downsampling_fn` /
  `attention_upsampling_fn` for its queries). The sequence length must be a
  multiple of the total shortening. `mode` is 'train' or 'eval'.
  """
  if mode == 'predict':
    raise ArgumentValueError('HourglassLM: mode=\'predict\' is not supported (nor in '
                             'Trax 1.4.1); use \'train\' or \'eval\'.')
  n_layers_per_level, shorten_factors = parse_hierarchy(hierarchy)
  if any(f < 2 for f in shorten_factors):
    raise ArgumentValueError(f'HourglassLM: hierarchy {hierarchy!r}: every level must '
                             f'shorten (factor >= 2); got factors {shorten_factors}.')
  if d_model % n_heads:
    raise ArgumentValueError(f'HourglassLM: d_model ({d_model}) must be a multiple of '
                             f'n_heads ({n_heads}).')
  context_bias_layer, location_bias_layer = get_rel_att_inputs(d_model, n_heads)
  common = dict(d_model=d_model, d_ff=d_ff, n_heads=n_heads, dropout=dropout,
                dropout_shared_axes=dropout_shared_axes, mode=mode,
                ff_activation=ff_activation,
                context_bias_layer=context_bias_layer,
                location_bias_layer=location_bias_layer)
  fns = dict(down=downsampling_fn, up=upsampling_fn,
             attention_down=attention_downsampling_fn,
             attention_up=attention_upsampling_fn, middle=middle_attn_type)
  n_pre, n_post = vanilla_layers
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      tl.Embedding(vocab_size, d_model),
      tl.Dropout(rate=dropout, shared_axes=dropout_shared_axes, mode=mode),
      _decoder_blocks(n_pre, 1, vanilla_attn_type, common),
      _valley(shorten_factors, n_layers_per_level, 1, common, fns),
      _decoder_blocks(n_post, 1, vanilla_attn_type, common),
      tl.Dense(vocab_size),
  )
