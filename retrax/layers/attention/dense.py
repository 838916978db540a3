"""Dense (dot-product) attention layers, as in Trax's `trax.layers.attention`.

Multi-head attention computes, per head, `softmax(Q K^T / sqrt(d_head)) V`
with masked-out positions set to -1e9 before the softmax, and optional
dropout of the attention weights in 'train' mode.

Modes: 'train' (dropout active), 'eval' (no dropout), 'predict' (causal
attention decodes incrementally with a key/value cache in `state`) and
'viz' (like 'eval'; attention weights are left in `state`).

The weight trees equal Trax 1.4.1's, including the `Serial(AssertShape, layer,
AssertShape)` wrapping that Trax's `@assert_shape` adds to layer-making
functions.
"""

import math
import numpy as np

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.fastmath import precision
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.layers.attention import kv_cache
from retrax.layers import predict_state
from retrax import validation
from retrax.layers.assert_shape import assert_shape
from retrax.layers.base import Fn
from retrax.validation import ArgumentValueError


_MODES = ('train', 'eval', 'predict', 'viz')
_MASK_VALUE = -1e9


def _check_mode(owner, mode):
  validation.check_choice(owner, 'mode', mode, _MODES)


def _check_dropout(owner, dropout):
  if dropout is not None:
    validation.check_rate(owner, 'dropout', dropout)


def _check_heads(owner, d_feature, n_heads):
  d_feature = validation.check_int(owner, 'd_feature', d_feature, 1)
  n_heads = validation.check_int(owner, 'n_heads', n_heads, 1)
  if d_feature % n_heads != 0:
    raise validation.ArgumentValueError(
        f'{owner}: dimensionality of feature embedding d_feature '
        f'({d_feature}) is not a multiple of the requested number of attention '
        f'heads n_heads ({n_heads}).')


# inputs are (batch, length, depth) and a (batch, 1, 1, length) mask.
@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld,b11l->bld,b11l')
def Attention(d_feature, n_heads=1, dropout=0.0, mode='train'):
  """Multi-head self-attention: `(x, mask) -> (y, mask)`.

  Q, K and V are three `Dense(d_feature)` maps of `x`; the mask (True where a
  position may be attended to) is returned unchanged.

  Args:
    d_feature: Depth of the input and output activations.
    n_heads: Number of heads; each works on `d_feature // n_heads` features.
    dropout: Rate of attention-weight dropout (applied in 'train' mode only).
    mode: One of 'train', 'eval', 'predict' or 'viz'.
  """
  return cb.Serial(
      cb.Select([0, 0, 0]),
      AttentionQKV(d_feature, n_heads=n_heads, dropout=dropout, mode=mode),
  )


@assert_shape('bSq,blk,blv,b1xl->bSd,b1xl')
def AttentionQKV(d_feature, n_heads=1, dropout=0.0, mode='train',
                 cache_KV_in_predict=False, q_sparsity=None,
                 result_sparsity=None):
  """Multi-head attention from separate sources: `(AQ, AK, AV, mask) -> (y, mask)`.

  Used e.g. for encoder-decoder attention (queries from the decoder, keys
  and values from the encoder).

  Args:
    d_feature: Depth of the activations (and of Q, K, V).
    n_heads: Number of heads; each works on `d_feature // n_heads` features.
    dropout: Rate of attention-weight dropout (applied in 'train' mode only).
    mode: One of 'train', 'eval', 'predict' or 'viz'.
    cache_KV_in_predict: In 'predict' mode, compute K and V once (first call)
      and reuse them (`Cache` layers), as for a fixed encoder output.
    q_sparsity: None (a `Dense` layer for queries) or 'noop' (no layer).
    result_sparsity: None (a `Dense` output layer) or 'noop' (no layer).
  """
  _check_heads('AttentionQKV', d_feature, n_heads)
  _check_dropout('AttentionQKV', dropout)
  _check_mode('AttentionQKV', mode)

  def SparsifiableDense(layer_sparsity, arg_name):
    if layer_sparsity is None:
      return core.Dense(d_feature)
    if layer_sparsity == 'noop':
      return cb.Serial()
    raise ArgumentValueError(
        f'{arg_name} must be None or \'noop\'; got {layer_sparsity!r} (the '
        'sparse FactoredDense variant of Trax research code is not supported).')

  def CacheableDense():
    if cache_KV_in_predict and mode == 'predict':
      return cb.Cache(core.Dense(d_feature))
    return core.Dense(d_feature)

  return cb.Serial(
      cb.Parallel(SparsifiableDense(q_sparsity, 'q_sparsity'),
                  CacheableDense(),
                  CacheableDense()),
      PureAttention(n_heads=n_heads, dropout=dropout, mode=mode),
      SparsifiableDense(result_sparsity, 'result_sparsity'),
  )


# 'k' is the number of keys/values, 'l' the number of queries.
@assert_shape('blq,bkq,bkd,b1xk->bld,b1xk')
class PureAttention(base.Layer):
  """Weightless multi-head attention: `(Q, K, V, mask) -> (activations, mask)`.

  Splits Q, K, V (depth `d_feature`) into `n_heads` heads, attends per head
  and merges the heads back.
  """

  def __init__(self, n_heads=1, dropout=0.0, mode='train'):
    super().__init__(n_in=4, n_out=2, mode=mode)
    _check_dropout('PureAttention', dropout)
    _check_mode('PureAttention', mode)
    self._n_heads = n_heads
    self._dropout = dropout

  def forward(self, inputs):
    q, k, v, mask = inputs
    _check_heads(self.name, q.shape[-1], self._n_heads)
    split = lambda x: _split_into_heads(x, self._n_heads, False)
    per_head, dots = _per_head_attention(
        split(q), split(k), split(v), mask, dropout=self._dropout,
        mode=self._mode, rng=self.rng)
    if self._mode == 'viz':
      self.state = dots
    return _merge_heads(per_head, self._n_heads, False), mask

  def init_weights_and_state(self, input_signature):
    _check_heads(self.name, input_signature[0].shape[-1], self._n_heads)


def dot_product_attention(queries, keys, values, mask=None, dropout=0.0,
                          mode='eval', rng=None):
  """Scaled dot-product attention on per-head arrays `(..., length, depth)`.

  Args:
    queries: `(..., n_queries, d)`.
    keys: `(..., n_keys, d)`, or a tuple of such arrays that split the key
      axis into segments (the predict-mode cache on CPU: `kv_cache`).
    values: `(..., n_keys, d_v)`, split as the keys.
    mask: None, or booleans broadcastable to `(..., n_queries, n_keys)`:
      True where a query may attend to a key.
    dropout: Rate at which attention weights are zeroed in 'train' mode (the
      kept ones are scaled by `1 / (1 - dropout)`).
    mode: 'train' applies dropout; other modes do not.
    rng: PRNG key for dropout.

  Returns:
    `(activations, weights)`: `(..., n_queries, d_v)` results and the
    `(..., n_queries, n_keys)` attention weights, in float32 (float64 for
    float64 inputs).
  """
  if dropout is not None and dropout >= 1.0:
    raise ArgumentValueError(f'dot_product_attention: dropout must be < 1; got '
                             f'{dropout}.')
  d_feature = queries.shape[-1]
  keys = keys if isinstance(keys, tuple) else (keys,)
  values = values if isinstance(values, tuple) else (values,)
  dots = [precision.matmul(queries, jnp.swapaxes(k, -1, -2)) for k in keys]
  dots = (dots[0] if len(dots) == 1 else jnp.concatenate(dots, axis=-1)
          ) / math.sqrt(d_feature)
  if mask is not None:
    dots = jnp.where(mask, dots, jnp.full_like(dots, _MASK_VALUE))
  weights = jnp.exp(dots - fastmath.logsumexp(dots, axis=-1, keepdims=True))
  if dropout is not None and dropout > 0.0 and mode == 'train':
    if rng is None:
      raise ArgumentValueError('Attention dropout in train mode needs an rng key.')
    keep = fastmath.random.bernoulli(rng, 1.0 - dropout, weights.shape)
    weights = jnp.where(keep, weights / (1.0 - dropout),
                        jnp.zeros_like(weights))
  if len(values) == 1:
    activations = precision.matmul(weights, values[0])
  else:  # One matmul per segment, straight from its buffer.
    bounds = np.cumsum([0] + [v.shape[-2] for v in values])
    activations = sum(precision.matmul(weights[..., lo:hi], v)
                      for v, lo, hi in zip(values, bounds, bounds[1:]))
  # float32 at least (float64 stays float64), without implicit promotion.
  out_dtype = (activations.dtype if jnp.finfo(activations.dtype).bits >= 32
               else jnp.float32)
  return activations.astype(out_dtype), weights.astype(out_dtype)


def _per_head_attention(queries, keys, values, mask, dropout, mode, rng):
  """Trax's name for `dot_product_attention` (all arguments positional)."""
  return dot_product_attention(queries, keys, values, mask, dropout, mode, rng)


class DotProductAttention(base.Layer):
  """Per-head scaled dot-product attention: `(Q, K, V, mask) -> activations`.

  Q, K, V are already split into heads; see `dot_product_attention`.
  """

  def __init__(self, dropout=0.0, mode='train'):
    super().__init__(n_in=4, n_out=1, mode=mode)
    _check_dropout('DotProductAttention', dropout)
    _check_mode('DotProductAttention', mode)
    self._dropout = dropout

  def forward(self, inputs):
    q, k, v, mask = inputs
    activations, weights = dot_product_attention(
        q, k, v, mask, dropout=self._dropout, mode=self._mode, rng=self.rng)
    if self._mode == 'viz':
      self.state = weights
    return activations


def _split_into_heads(x, n_heads, merged_batch_and_head):
  """(b, l, d) -> (b * n_heads, l, d // n_heads), or (b, n_heads, l, d // n_heads)."""
  if len(x.shape) != 3:
    raise InputValueError('SplitIntoHeads expects a 3-D array (batch, length, '
                          f'd_feature); got shape {tuple(x.shape)}.')
  batch_size, seq_len, d_feature = x.shape
  if d_feature % n_heads != 0:
    raise InputValueError(
        f'Feature embedding dimensionality ({d_feature}) is not a multiple'
        f' of the requested number of attention heads ({n_heads}).')
  x = x.reshape((batch_size, seq_len, n_heads, d_feature // n_heads))
  x = x.transpose((0, 2, 1, 3))
  if merged_batch_and_head:
    x = x.reshape((batch_size * n_heads, seq_len, d_feature // n_heads))
  return x


def _merge_heads(x, n_heads, merged_batch_and_head):
  """Inverse of `_split_into_heads`: back to (b, l, n_heads * d_head)."""
  if merged_batch_and_head:
    dim_0, seq_len, d_head = x.shape
    if dim_0 % n_heads != 0:
      raise InputValueError(
          f"Array's leading dimension ({dim_0}) is not a multiple of the"
          f' number of attention heads ({n_heads}).')
    batch_size = dim_0 // n_heads
    x = x.reshape((batch_size, n_heads, seq_len, d_head))
  else:
    batch_size, _, seq_len, d_head = x.shape
  x = x.transpose((0, 2, 1, 3))
  return x.reshape((batch_size, seq_len, n_heads * d_head))


@assert_shape('bld->...lh')
def SplitIntoHeads(n_heads, merged_batch_and_head=True):
  """(batch, length, d) -> (batch * n_heads, length, d // n_heads).

  With `merged_batch_and_head=False` the result is
  (batch, n_heads, length, d // n_heads).
  """
  return Fn('SplitIntoHeads',
            lambda x: _split_into_heads(x, n_heads, merged_batch_and_head))


@assert_shape('...lh->bld')
def MergeHeads(n_heads, merged_batch_and_head=True):
  """(batch * n_heads, length, d_head) -> (batch, length, n_heads * d_head)."""
  return Fn('MergeHeads',
            lambda x: _merge_heads(x, n_heads, merged_batch_and_head))


@assert_shape('bld->bld')
def ConfigurableAttention(q_layer, k_layer, v_layer, final_layer,
                          qkv_attention_layer, n_heads=1):
  """Multi-head self-attention with configurable parts.

  Maps `x` through `q_layer`, `k_layer`, `v_layer`, splits each into heads,
  runs `qkv_attention_layer` on `(q, k, v)` (e.g. `DotProductCausalAttention`),
  merges the heads and applies `final_layer`.
  """
  return cb.Serial(
      cb.Branch(
          [q_layer, SplitIntoHeads(n_heads)],
          [k_layer, SplitIntoHeads(n_heads)],
          [v_layer, SplitIntoHeads(n_heads)],
      ),
      qkv_attention_layer,
      MergeHeads(n_heads),
      final_layer,
  )


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def CausalAttention(d_feature, n_heads=1, dropout=0.0,
                    max_inference_length=2048, use_dconv=False, mode='train',
                    qkv_attention_type=None):
  """Multi-head self-attention in which position i attends to positions <= i.

  Args:
    d_feature: Depth of the input and output activations.
    n_heads: Number of heads; each works on `d_feature // n_heads` features.
    dropout: Rate of attention-weight dropout (applied in 'train' mode only).
    max_inference_length: Key/value cache length in 'predict' mode.
    use_dconv: If True, Q, K and V each pass through a causal depthwise
      convolution (kernel 3) after their `Dense` layer.
    mode: One of 'train', 'eval', 'predict' or 'viz'.
    qkv_attention_type: The per-head attention layer class, called with
      `dropout, max_inference_length, mode, n_heads` (default
      `DotProductCausalAttention`; Terraformer's predict mode passes one
      that also reads the source's padding mask).
  """
  _check_heads('CausalAttention', d_feature, n_heads)
  _check_dropout('CausalAttention', dropout)

  def QKVLayer():
    if use_dconv:
      return cb.Serial(core.Dense(d_feature), _CausalDepthwiseConv(mode=mode))
    return core.Dense(d_feature)

  return ConfigurableAttention(
      QKVLayer(), QKVLayer(), QKVLayer(), core.Dense(d_feature),
      n_heads=n_heads,
      qkv_attention_layer=(qkv_attention_type or DotProductCausalAttention)(
          dropout=dropout, max_inference_length=max_inference_length,
          mode=mode, n_heads=n_heads))


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld,bld,bld->bld')
class DotProductCausalAttention(base.Layer):
  """Per-head causal attention: `(Q, K, V) -> activations`, position i sees keys <= i.

  In 'predict' mode the layer decodes incrementally: each call takes the next
  `n` positions (usually 1), appends their keys and values to fixed-size
  buffers of `max_inference_length` positions held in `state = (keys,
  values, index)` (Trax's layout; on CPU, caches over 128 slots are tuples
  of segments, see `kv_cache`) and attends to every filled position (the
  rest of the buffers is masked out).

  Going past `max_inference_length` positions raises a ValueError when the
  call runs eagerly (the index is concrete). Under `jax.jit` it cannot raise:
  as in Trax, writes are then clamped to the last buffer slots, which
  overwrites cached keys and values, and outputs are no longer meaningful.

  `n_heads` (optional, not in Trax) is how many heads share an example's
  rows of `(Q, K, V)` (`batch * n_heads` rows): with it the layer declares
  its predict-mode state to decoding (`predict_state`); without it decoding
  traces the model to find the cache layout.
  """

  def __init__(self, dropout=0.0, max_inference_length=2048, mode='train',
               n_heads=None):
    super().__init__(n_in=3, n_out=1, mode=mode)
    _check_dropout('DotProductCausalAttention', dropout)
    _check_mode('DotProductCausalAttention', mode)
    max_inference_length = validation.check_int(
        'DotProductCausalAttention', 'max_inference_length',
        max_inference_length, 1)
    self._dropout = dropout
    self._max_len = max_inference_length
    self._n_heads = validation.check_int('DotProductCausalAttention',
                                         'n_heads', n_heads, 1,
                                         allow_none=True)

  def predict_state_layout(self, state):
    """Keys and values hold `n_heads` rows per example; the index counts positions."""
    if self._mode != 'predict' or self._n_heads is None:
      return None
    keys, values, index = state
    rows = predict_state.same_rows((keys, values), self._n_heads)
    return predict_state.PredictStateLayout(rows + (0,), index, self._max_len)

  def forward(self, inputs):
    q, k, v = inputs
    if self._mode == 'predict':
      self.state, (k, v, start) = kv_cache.update_state(
          k, v, self.state, self._max_len)
      return kv_cache.attend(q, k, v, start, dot_product_attention)
    mask = _causal_mask(q.shape[-2])
    activations, weights = dot_product_attention(
        q, k, v, mask, dropout=self._dropout, mode=self._mode, rng=self.rng)
    if self._mode == 'viz':
      self.state = weights
    return activations

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      self.state = kv_cache.init_state(input_signature, self._max_len)


def _causal_mask(length):
  """(1, length, length) booleans, True on and below the diagonal."""
  return jnp.tril(jnp.ones((1, length, length), dtype=np.bool_), k=0)


class _CausalDepthwiseConv(base.Layer):
  """Causal depthwise convolution over axis 1: `y[t] = sum_i w[i] * x[t - i]`.

  Trax's `CausalDepthwiseConv` (weights `(kernel_size, d)`); in 'predict' mode
  the last `kernel_size - 1` inputs are kept in state so that incremental
  decoding equals the full computation.
  """

  def __init__(self, kernel_size=3,
               kernel_initializer=init.GlorotUniformInitializer(),
               use_bfloat16=False, mode='train'):
    super().__init__(name='CausalDepthwiseConv', mode=mode)
    self._kernel_size = kernel_size
    self._kernel_initializer = kernel_initializer
    self._use_bfloat16 = use_bfloat16

  def predict_state_layout(self, state):
    """The last inputs, one row per example."""
    return predict_state.PredictStateLayout(predict_state.same_rows(state, 1))

  def forward(self, x):
    n_prev = self._kernel_size - 1
    if self._mode == 'predict':
      full = jnp.concatenate([self.state.astype(x.dtype), x], axis=1)
      self.state = full[:, full.shape[1] - n_prev:]
    else:
      full = jnp.pad(x, [(0, 0), (n_prev, 0), (0, 0)])
    n = x.shape[1]
    w = self.weights
    res = full[:, n_prev:n_prev + n] * w[0][None, None, :]
    for i in range(1, self._kernel_size):
      res += full[:, n_prev - i:n_prev - i + n] * w[i][None, None, :]
    return res

  def init_weights_and_state(self, input_signature):
    rng_w, _ = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer(
        (self._kernel_size, input_signature.shape[-1]), rng_w)
    self.weights = w.astype(jnp.bfloat16) if self._use_bfloat16 else w
    if self._mode == 'predict':
      self.state = jnp.zeros(
          (input_signature.shape[0], self._kernel_size - 1,
           input_signature.shape[-1]), input_signature.dtype)
