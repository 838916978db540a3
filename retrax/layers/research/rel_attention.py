"""Relative (Transformer-XL style) attention for Funnel/Hourglass models, Trax's `rel_attention`.

Scores are `(q + u)·k + shift((q + v)·W_r r) / sqrt(d_head)`: a content term
with a learned context bias `u` and a location term against sinusoidal
embeddings `r` of relative distances, with a learned location bias `v`
(https://arxiv.org/abs/1901.02860). Queries and keys may have different
lengths when one is a pooled (funnel) version of the other: the distances
are then spaced by the pooling factor (https://arxiv.org/abs/2006.03236).
The two biases are `Weights` layers shared by every relative attention layer
of a model (`get_rel_att_inputs`).

Trax's relative attention keeps no key/value cache, so it has no predict mode
(Trax's HourglassLM refuses 'predict' too); retrax refuses `mode='predict'`.
"""

import math

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.layers.assert_shape import assert_shape
from retrax.layers.attention import MergeHeads
from retrax.layers.attention import SplitIntoHeads
from retrax.validation import ArgumentValueError


def _check_mode(layer, mode):
  if mode == 'predict':
    raise ArgumentValueError(
        f'{layer}: mode=\'predict\' is not supported: relative attention (as '
        'in Trax 1.4.1) keeps no key/value cache; use mode \'train\' or '
        '\'eval\' on the whole prefix.')


def _check_bias_layers(layer, context_bias_layer, location_bias_layer,
                       total_pooling):
  missing = [name for name, value in (
      ('context_bias_layer', context_bias_layer),
      ('location_bias_layer', location_bias_layer),
      ('total_pooling', total_pooling)) if value is None]
  if missing:
    raise ArgumentValueError(
        f'{layer} needs {", ".join(missing)}: the shared bias layers come from '
        'get_rel_att_inputs(d_model, n_heads) and total_pooling is the '
        'product of the pooling factors before this layer (1 if none).')


@configurable('trax.layers')
def RelativeAttentionWrapper(d_feature, n_heads=1, dropout=0.0,
                             max_inference_length=2048, mode='train',
                             context_bias_layer=None, location_bias_layer=None,
                             total_pooling=None):
  """Causal relative self-attention `x -> y` with the attention layers' signature.

  `max_inference_length` is accepted and unused, as in Trax.
  """
  del max_inference_length
  _check_mode('RelativeAttentionWrapper', mode)
  _check_bias_layers('RelativeAttentionWrapper', context_bias_layer,
                     location_bias_layer, total_pooling)
  attention = RelativeAttentionLMLayer(
      d_feature, context_bias_layer, location_bias_layer, total_pooling,
      n_heads=n_heads, dropout=dropout, mode=mode)
  return cb.Serial(cb.Select([0, 0, 0]), attention)


def get_rel_att_inputs(d_model, n_heads):
  """The (context bias, location bias) `Weights` layers, each `(1, n_heads, 1, d_head)`.

  One pair is shared by all the relative attention layers of a model.
  """
  if d_model % n_heads or d_model % 2:
    raise ArgumentValueError(
        f'get_rel_att_inputs: d_model ({d_model}) must be even and a '
        f'multiple of n_heads ({n_heads}).')
  shape = (1, n_heads, 1, d_model // n_heads)
  context_bias_layer = core.Weights(init.RandomNormalInitializer(1e-6), shape)
  location_bias_layer = core.Weights(init.RandomNormalInitializer(1e-6), shape)
  return context_bias_layer, location_bias_layer


@configurable('trax.layers')
@assert_shape('bSq,blk,blv,b1xl->bSd,b1xl')
def RelativeAttentionLayer(d_feature, context_bias_layer, location_bias_layer,
                           total_kv_pooling, separate_cls, n_heads=1,
                           dropout=0.0, mode='train'):
  """`(q, k, v, mask) -> (activations, mask)`: projections, relative attention, output Dense.

  `total_kv_pooling` is the product of the pooling factors applied to the
  keys/values before this layer; it scales the relative distances.
  """
  _check_mode('RelativeAttentionLayer', mode)
  _check_bias_layers('RelativeAttentionLayer', context_bias_layer,
                     location_bias_layer, total_kv_pooling)
  if d_feature % n_heads:
    raise ArgumentValueError(
        f'RelativeAttentionLayer: d_feature ({d_feature}) must be a multiple '
        f'of n_heads ({n_heads}).')
  return cb.Serial(
      cb.Branch(PositionalEmbeddings(d_feature, separate_cls, total_kv_pooling),
                cb.Select([0]), cb.Select([1])),
      cb.Parallel(core.Dense(d_feature), core.Dense(d_feature),
                  core.Dense(d_feature), core.Dense(d_feature)),
      context_bias_layer,
      location_bias_layer,
      RelativeAttention(separate_cls=separate_cls, n_heads=n_heads,
                        dropout=dropout, mode=mode),
      core.Dense(d_feature),
  )


@configurable('trax.layers')
@assert_shape('bSq,blk,blv->bSd')
def RelativeAttentionLMLayer(d_feature, context_bias_layer, location_bias_layer,
                             total_kv_pooling, separate_cls=False, n_heads=1,
                             dropout=0.0, mode='train'):
  """`(q, k, v) -> activations`: `RelativeAttentionLayer` under a causal (funnel) mask."""
  attention = RelativeAttentionLayer(
      d_feature, context_bias_layer, location_bias_layer, total_kv_pooling,
      separate_cls, n_heads=n_heads, dropout=dropout, mode=mode)
  return cb.Serial(CreateAttentionMaskLayer(), attention,
                   cb.Select([0], n_in=2))


class RelativeAttention(base.Layer):
  """`(location_bias, context_bias, pos_emb, q, k, v, mask) -> (activations, mask)`.

  Splits q, k, v and the projected position embeddings into `n_heads` heads,
  attends (`DotProductAttention`), merges the heads; the mask passes through.
  In 'train' mode, `dropout` drops attention weights.
  """

  def __init__(self, separate_cls, n_heads=1, dropout=0.0, mode='train'):
    super().__init__(n_in=7, n_out=2, mode=mode)
    _check_mode('RelativeAttention', mode)
    if not 0.0 <= dropout < 1.0:
      raise ArgumentValueError(
          f'RelativeAttention: dropout must be in [0, 1); got {dropout}.')
    self._separate_cls = separate_cls
    self._n_heads = n_heads
    self._dropout = dropout

  def forward(self, inputs):
    location_bias, context_bias, pos_emb, q, k, v, mask = inputs
    d_feature, n_heads = q.shape[-1], self._n_heads
    if d_feature % n_heads:
      raise InputValueError(
          f'RelativeAttention: the feature depth ({d_feature}) is not a '
          f'multiple of n_heads ({n_heads}).')
    split = SplitIntoHeads(n_heads, merged_batch_and_head=False)
    per_head, _ = DotProductAttention(
        split.forward(q), split.forward(k), split.forward(v),
        pos_emb.reshape((-1, n_heads, d_feature // n_heads)),
        context_bias, location_bias, mask, separate_cls=self._separate_cls,
        dropout=self._dropout, mode=self._mode,
        rng=self.rng if self._mode == 'train' and self._dropout else None)
    merged = MergeHeads(n_heads, merged_batch_and_head=False).forward(per_head)
    return merged, mask


def DotProductAttention(queries, keys, values, pos_emb, context_bias,
                        location_bias, mask, separate_cls, dropout, mode, rng):
  """Relative attention on per-head arrays; returns (outputs, attention weights).

  queries `[b, n, q, d]`, keys/values `[b, n, k, d]`, pos_emb `[P, n, d]`
  (one row per relative distance), biases `[1, n, 1, d]`, mask broadcastable
  to `[b, n, q, k]` (True = attend) or None. With `separate_cls` the location
  term of the first query and first key is zeroed.
  """
  d_feature = queries.shape[-1]
  funnel_factor, is_upsampling = calc_funnel_ratio(keys.shape[-2],
                                                   queries.shape[-2])
  content = jnp.einsum('bnid,bnjd->bnij', queries + context_bias, keys)
  location = jnp.einsum('bnid,jnd->bnij', queries + location_bias, pos_emb)
  location = fast_matrix_shift(location, funnel_factor, is_upsampling)
  if separate_cls:
    location = location.at[:, :, :, 0].set(0).at[:, :, 0, :].set(0)
  dots = (content + location) / math.sqrt(d_feature)
  if mask is not None:
    dots = jnp.where(mask, dots, jnp.full_like(dots, -1e9))
  dots = jnp.exp(dots - fastmath.logsumexp(dots, axis=-1, keepdims=True))
  if dropout >= 1.0:
    raise ArgumentValueError(f'DotProductAttention: dropout must be < 1; got {dropout}.')
  if dropout and mode == 'train':
    keep = fastmath.random.bernoulli(rng, 1.0 - dropout, dots.shape)
    dots = jnp.where(keep, dots / (1.0 - dropout), jnp.zeros_like(dots))
  out = jnp.matmul(dots, values)
  return out.astype(jnp.float32), dots.astype(jnp.float32)


def PositionalEmbeddings(d_feature, separate_cls, total_kv_pooling):
  """`(queries, keys) -> [P, d_feature]` sinusoidal embeddings of the relative distances.

  Equal lengths: distances `(-(k-1) .. 0) * total_kv_pooling`. Pooled keys:
  `(-(k-1) .. k-1) * total_kv_pooling`; pooled queries (upsampling):
  `-(q-1) .. q-1`. Each distance `p` maps to `[sin(p f), cos(p f)]`,
  `f = 10000^(-2i/d_feature)`.
  """
  if separate_cls:
    raise ArgumentValueError('PositionalEmbeddings: separate_cls=True is not '
                             'supported (Trax 1.4.1 requires it False).')

  def positions_vectors(queries, keys):
    keys_len, queries_len = keys.shape[-2], queries.shape[-2]
    funnel_factor, is_upsampling = calc_funnel_ratio(keys_len, queries_len)
    if funnel_factor == 1:
      positions = (jnp.arange(keys_len) - (keys_len - 1)) * total_kv_pooling
    elif is_upsampling:
      positions = jnp.arange(-queries_len + 1, queries_len, 1.0)
    else:
      positions = jnp.arange(-keys_len + 1, keys_len, 1.0) * total_kv_pooling
    return positions.astype(jnp.float32)

  def sinusoidal_embeddings(positions):
    inv_freq = 1 / (10000**(jnp.arange(0.0, d_feature, 2.0) / d_feature))
    angles = jnp.einsum('i,j->ij', positions, inv_freq.astype(jnp.float32))
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=1)

  return cb.Serial(
      cb.Fn('Generate positions vectors', positions_vectors, n_out=1),
      cb.Fn('Transform to sinusoidal encodings', sinusoidal_embeddings,
            n_out=1))


def calc_funnel_ratio(keys_len, queries_len):
  """`(factor, is_upsampling)`: how many times longer the queries (or keys) are."""
  longer, shorter = max(keys_len, queries_len), min(keys_len, queries_len)
  if longer % shorter:
    raise InputValueError(
        f'Relative attention: the longer of queries ({queries_len}) and keys '
        f'({keys_len}) must be a multiple of the shorter.')
  return longer // shorter, queries_len > keys_len


def fast_matrix_shift(x, funnel_factor=1, is_upsampling=False):
  """Aligns location scores `x [b, n, q, P]` (one column per distance) to keys.

  Equal lengths (`P = k = q`, column c = distance `c - (q - 1)`): entry
  (i, j), j <= i, becomes column `j + q - 1 - i` (distance `j - i`); entries
  j > i are filler, masked by causal attention. Pooled keys / queries
  (`P = 2 * longer_len - 1`): entry (i, j) takes the column of the distance
  between query i and key j at the funnel spacing.
  """
  batch, heads = x.shape[0], x.shape[1]
  if funnel_factor == 1 and not is_upsampling:
    queries_len, keys_len = x.shape[2], x.shape[3]
    padded = jnp.concatenate(
        [jnp.zeros((batch, heads, queries_len, 1), x.dtype), x], axis=3)
    padded = padded.reshape(batch, heads, keys_len + 1, queries_len)
    return padded[:, :, 1:, :]
  step, shift = (funnel_factor, 1) if is_upsampling else (1, funnel_factor)
  queries_len, keys_len = x.shape[2], (x.shape[3] + 1) // 2
  padded = jnp.concatenate(
      [jnp.zeros((batch, heads, queries_len, shift), x.dtype), x], axis=3)
  padded = padded.reshape(batch, heads, 2 * keys_len - 1 + shift, queries_len)
  padded = padded[:, :, shift:, :].reshape(batch, heads, queries_len,
                                           2 * keys_len - 1)
  return padded[:, :, :, shift - 1:shift - 1 + keys_len:step]


_fast_matrix_shift = fast_matrix_shift  # Trax's name (its tests call it).


@assert_shape('bqd,bkd,bvd->bqd,bkd,bvd,b1qk')
def CreateAttentionMaskLayer():
  """`(q, k, v) -> (q, k, v, mask)`: the causal mask `[b, 1, q, k]` for (pooled) lengths.

  Equal lengths: lower triangular. Pooled keys (factor f): query i sees the
  keys of blocks `<= i`, each block's mask repeated f times along keys.
  Pooled queries: each row of the keys' triangle repeated f times.
  """

  def calculate_mask(queries, keys):
    batch = queries.shape[0]
    keys_len, queries_len = keys.shape[-2], queries.shape[-2]
    funnel_factor, is_upsampling = calc_funnel_ratio(keys_len, queries_len)
    if funnel_factor == 1:
      mask = jnp.tril(jnp.ones((queries_len, queries_len), dtype=jnp.bool_))
    elif is_upsampling:
      mask = jnp.tril(jnp.ones((keys_len, keys_len), dtype=jnp.bool_))
      mask = jnp.repeat(mask, funnel_factor, axis=-2)
    else:
      mask = jnp.tril(jnp.ones((queries_len, queries_len), dtype=jnp.bool_))
      mask = jnp.repeat(mask, funnel_factor, axis=-1)
    return jnp.repeat(mask[None, None, :, :], batch, axis=0)

  return cb.Branch(cb.Select([0]), cb.Select([1]), cb.Select([2]),
                   cb.Fn('create attention mask layer', calculate_mask,
                         n_out=1))


@assert_shape('...d->...d')
def ShiftRightCls(cls_id):
  """Shifts tokens right by one along axis 1, inserting `cls_id` first (as BERT's [CLS])."""

  def shift_right(x):
    pad_widths = [(0, 0)] * len(x.shape)
    pad_widths[1] = (1, 0)
    padded = jnp.pad(x, pad_widths, mode='constant',
                     constant_values=x.dtype.type(cls_id))
    return padded[:, :-1]

  return cb.Fn('ShiftRightCls()', shift_right)
