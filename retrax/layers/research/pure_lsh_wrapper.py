"""Trax's `MixedLSHSelfAttention` and `PureLSHSelfAttentionWrapper`.

`PureLSHSelfAttentionWrapper` is multi-head attention built from plain
layers around a weightless attention core (`PureLSHSelfAttention` or
`MixedLSHSelfAttention`): `Serial(ProjectAndSplitHeads, core, MergeHeads,
Dense)`, so its weights are ordinary `Dense` (or sparse) weights in Trax's
layout. Its `forward_and_or_backward` (the hook reversible half-residuals
call) replays the core's stored LSH buckets and recomputes the core's
forward pass for the gradient, so no attention activations are stored.

Differences from Trax 1.4.1: `forward_and_or_backward` of both layers takes
retrax's `(inputs, weights, state, rng, ...)` (weights `()` for the mixed
layer) and returns `(output, new_state, inputs_grad, weights_grad)`; it also
runs without `output_grad` (a forward pass replaying the buckets);
`pure_lsh_implementation=None` means `PureLSHSelfAttention` (Trax fails).
"""

import jax
import jax.numpy as jnp

from retrax.configurable import configurable
from retrax.configurable import takes_argument
from retrax.layers import attention
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import predict_state
from retrax.layers.cotangents import cotangent_like
from retrax.layers.research import rotary_positional_embedding as rotary_pe
from retrax.layers.research import sparsity as sp
from retrax.layers.research.pure_lsh_attention import PureLSHSelfAttention
from retrax.layers.stack import split_rngs
from retrax.validation import ArgumentValueError

_WEIGHTS_FORMATS = ('heads', 'model', 'sparse')


def _qk_average():
  return core.Fn('QKAvg', lambda x, y: (x + y) / 2.0, n_out=1)


def _sparse_qkv(d_model, n_heads, num_weights, sparsity, length_kernel_size,
                mode, portal_mask):
  """Trax's sparse projections (as in `MultiplicativeConvCausalAttention`)."""
  d_module = d_model // sparsity

  def conv(kernel_size):
    return sp.LocallyConvDense(sparsity, d_module, mode=mode,
                               kernel_size=kernel_size,
                               length_kernel_size=length_kernel_size,
                               portal_mask=portal_mask)
  if num_weights == 3:
    return cb.Serial(
        cb.Select([0, 0]),
        sp.FactoredDense(sparsity, d_model, d_model),
        cb.Select([0, 0, 0]),
        cb.Parallel([conv(3), attention.SplitIntoHeads(n_heads)],
                    [conv(3), attention.SplitIntoHeads(n_heads)],
                    [cb.Select([0], n_in=2), conv(1),
                     attention.SplitIntoHeads(n_heads)]),
        _qk_average(),
    )
  return cb.Serial(
      cb.Select([0, 0]),
      sp.FactoredDense(sparsity, d_model, d_model),
      cb.Select([0, 0]),
      conv(3),
      attention.SplitIntoHeads(n_heads),
      cb.Parallel([], [cb.Select([0], n_in=2), conv(1),
                       attention.SplitIntoHeads(n_heads)]),
  )


def ProjectAndSplitHeads(d_model, n_heads, use_bias, num_weights=2,
                         sparsity=16, length_kernel_size=3,
                         weights_format='sparse', rotary_position_emb=False,
                         mode='train', portal_mask=None):
  """`x [B, L, d_model] -> (qk, v) [B * n_heads, L, d_model / n_heads]` (Trax's layer).

  `weights_format='model'`: `Dense(d_model)` projections, two (qk, v) or
  three (q, k, v; q and k averaged into qk, as for checkpoints of
  `tl.Attention`); 'sparse': Trax's factored/convolutional projections,
  whose causal convolutions read `portal_mask` (Terraformer's predict-mode
  source mask, see `sparsity.LocallyConvDense`).
  """
  name = 'ProjectAndSplitHeads'
  if weights_format not in _WEIGHTS_FORMATS:
    raise ArgumentValueError(f'{name}: weights_format must be one of '
                             f'{_WEIGHTS_FORMATS}; got {weights_format!r}.')
  if num_weights not in (2, 3):
    raise ArgumentValueError(f'{name}: num_weights must be 2 or 3; got {num_weights!r}.')
  if weights_format == 'heads':
    raise NotImplementedError(
        f"{name}: weights_format='heads' (LSHSelfAttention's per-head "
        "weights) is not implemented, as in Trax 1.4.1; use 'model' or "
        "'sparse'.")
  if weights_format == 'sparse':
    if d_model % sparsity:
      raise ArgumentValueError(f'{name}: sparsity ({sparsity}) must divide d_model '
                               f'({d_model}).')
    return _sparse_qkv(d_model, n_heads, num_weights, sparsity,
                       length_kernel_size, mode, portal_mask)
  rotate = rotary_pe.Rotate() if rotary_position_emb else []
  if num_weights == 3:
    return cb.Serial(
        cb.Branch(core.Dense(d_model, use_bias=use_bias),
                  core.Dense(d_model, use_bias=use_bias),
                  core.Dense(d_model, use_bias=use_bias)),
        cb.Parallel(rotary_pe.Rotate(), rotary_pe.Rotate(), None)
        if rotary_position_emb else [],
        _qk_average(),
        cb.Parallel(attention.SplitIntoHeads(n_heads),
                    attention.SplitIntoHeads(n_heads)),
    )
  return cb.Branch(
      [core.Dense(d_model, use_bias=use_bias), rotate,
       attention.SplitIntoHeads(n_heads)],
      [core.Dense(d_model, use_bias=use_bias),
       attention.SplitIntoHeads(n_heads)],
  )


def _heads_mask(mask, n_heads):
  """`[B, L]` -> `[B * n_heads, 1, L]` (each example's mask once per head)."""
  mask = jnp.reshape(mask, (mask.shape[0], 1, mask.shape[1]))
  return jnp.repeat(mask, n_heads, axis=0)


@configurable('trax.layers', denylist=('mode',))
class MixedLSHSelfAttention(base.Layer):
  """`PureLSHSelfAttention` above `std_length` positions, dot-product attention below.

  Inputs and outputs as `PureLSHSelfAttention`'s: `(qk, v[, mask])` of shape
  `[B * H, L, D]` -> `[B * H, L, D]`. `std_length=None` always uses LSH.
  Weights `()`; state `(lsh_state, std_state)` (Trax's layout).
  `force_no_dropout` sets both dropout rates to 0; `qkv_attention_type`
  (causal only) is the standard attention's class, as `CausalAttention`'s
  (default `DotProductCausalAttention`; Terraformer's predict mode passes
  one that reads the source mask); other keyword arguments go to
  `PureLSHSelfAttention`.
  """

  def __init__(self, n_heads=1, d_qk=64, d_v=64, causal=False, masked=False,
               std_length=None, mode='train', output_dropout=0.0,
               attention_dropout=0.0, force_no_dropout=False,
               qkv_attention_type=None, **pure_lsh_implementation_kwargs):
    if force_no_dropout:
      attention_dropout = output_dropout = 0.0
    self._lsha = PureLSHSelfAttention(
        n_heads=n_heads, d_qk=d_qk, d_v=d_v, causal=causal, masked=masked,
        mode=mode, output_dropout=output_dropout,
        attention_dropout=attention_dropout, **pure_lsh_implementation_kwargs)
    std: base.Layer
    if causal:
      preprocess = core.Fn('dup_shared_qk', lambda q, v: (q, q, v), n_out=3)
      # n_heads: its predict-mode cache holds n_heads rows per example.
      std = (qkv_attention_type or attention.DotProductCausalAttention)(
          dropout=attention_dropout, mode=mode, n_heads=n_heads)
    else:
      if qkv_attention_type is not None:
        raise ArgumentValueError(
            'MixedLSHSelfAttention: qkv_attention_type replaces the causal '
            'attention; with causal=False it has none to replace.')
      preprocess = core.Fn(
          'dup_shared_qk_and_make_mask',
          lambda q, v, m: (q, q, v, _heads_mask(m, n_heads)), n_out=4)
      std = attention.DotProductAttention(dropout=attention_dropout, mode=mode)
    self._stda = cb.Serial(preprocess, std)
    if self._stda.n_in != self._lsha.n_in:
      raise ArgumentValueError(
          f'MixedLSHSelfAttention: causal={causal} with masked={masked} is not '
          f'supported (the standard attention takes {self._stda.n_in} inputs, '
          f'LSH attention {self._lsha.n_in}).')
    if std_length is not None and (not isinstance(std_length, int) or
                                   std_length < 0):
      raise ArgumentValueError(f'MixedLSHSelfAttention: std_length must be None or an '
                               f'int >= 0; got {std_length!r}.')
    self._std_length = std_length
    super().__init__(n_in=self._lsha.n_in, n_out=1)

  def predict_state_layout(self, state):
    """The LSH and standard attentions' layouts side by side.

    The positions are the standard attention's cache (it runs on calls of
    up to `std_length` positions, so none without one).
    """
    lsh_state, std_state = state
    lsh_layout = predict_state.declared_layout(self._lsha, lsh_state)
    if lsh_layout is None:
      return None
    rows = (lsh_layout.rows, predict_state.declared_rows(self._stda, std_state))
    _, std = self._stda.sublayers
    std_layout = predict_state.declared_layout(std, std_state[1])
    if self._std_length is None or std_layout is None:
      return predict_state.PredictStateLayout(rows)
    return predict_state.PredictStateLayout(
        rows, std_layout.positions_used, std_layout.max_positions)

  def _use_lsh(self, inputs):
    length = inputs[0].shape[1]
    return self._std_length is None or length > self._std_length

  def init_weights_and_state(self, input_signature):
    states = []
    for layer in (self._lsha, self._stda):
      _, state = layer.init(input_signature, use_cache=False)
      states.append(state)
    self.state = tuple(states)
    self.weights = ()

  def forward(self, inputs):
    rng_lsh, rng_std = jax.random.split(self.rng, 2)
    if self._use_lsh(inputs):
      out, s = self._lsha.pure_fn(inputs, (), self.state[0], rng_lsh)
      self.state = (s, self.state[1])
    else:
      out, s = self._stda.pure_fn(inputs, ((), ()), self.state[1], rng_std)
      self.state = (self.state[0], s)
    return out

  def forward_and_or_backward(self, inputs, weights, state, rng,
                              output_grad=None, compute_output=True,
                              update_state=True):
    """Output and input gradient replaying the stored state (no new state).

    Returns `(output, None, inputs_grad, weights_grad)`; weights_grad `()`.
    """
    del weights, compute_output
    if update_state:
      raise ArgumentValueError('MixedLSHSelfAttention.forward_and_or_backward replays '
                               'the stored state; call it with update_state=False.')
    rng_lsh, rng_std = jax.random.split(rng, 2)
    if self._use_lsh(inputs):
      out, _, inputs_grad, _ = self._lsha.forward_and_or_backward(
          inputs, (), state[0], rng_lsh, output_grad=output_grad,
          compute_output=True, update_state=False)
      return out, None, inputs_grad, ()

    def std_fn(x):
      return self._stda.pure_fn(x, ((), ()), state[1], rng_std)[0]
    out, vjp_fn = jax.vjp(std_fn, inputs)
    inputs_grad = None
    if output_grad is not None:
      inputs_grad, = vjp_fn(output_grad.astype(out.dtype))
    return out, None, inputs_grad, ()


@configurable('trax.layers', denylist=('mode',))
class PureLSHSelfAttentionWrapper(cb.Serial):
  """Multi-head LSH self-attention: `x [B, L, n_heads * d_qk] (, mask) -> [B, L, n_heads * d_qk]`.

  `Serial(ProjectAndSplitHeads, pure_lsh_implementation(...), MergeHeads,
  Dense(d_model))` (no `Dense` with `weights_format='sparse'`), `d_model =
  n_heads * d_qk`. Other keyword arguments go to `pure_lsh_implementation`
  (default `PureLSHSelfAttention`).

  Terraformer's predict mode passes its source mask as `portal_mask` (for
  the sparse projections' causal convolutions) and the per-head causal
  attention that reads it as `qkv_attention_type`, which goes to
  implementations that take it (`MixedLSHSelfAttention`; LSH attention has
  no such attention, as in Trax).
  """

  def __init__(self, n_heads=1, d_qk=64, d_v=64, causal=False, masked=False,
               output_dropout=0.0, attention_dropout=0.0,
               pure_lsh_implementation=None, bias=True, mode='train',
               num_weights=3, sparsity=16, weights_format='model',
               rotary_position_emb=False, qkv_attention_type=None,
               portal_mask=None, **pure_lsh_implementation_kwargs):
    d_model = d_qk * n_heads
    qkv = ProjectAndSplitHeads(
        d_model, n_heads, bias, num_weights=num_weights, sparsity=sparsity,
        weights_format=weights_format, rotary_position_emb=rotary_position_emb,
        mode=mode, portal_mask=portal_mask)
    implementation = pure_lsh_implementation or PureLSHSelfAttention
    if (qkv_attention_type is not None and
        takes_argument(implementation, 'qkv_attention_type')):
      pure_lsh_implementation_kwargs['qkv_attention_type'] = qkv_attention_type
    attn = implementation(
        n_heads=n_heads, d_qk=d_qk, d_v=d_v, causal=causal, masked=masked,
        mode=mode, output_dropout=output_dropout,
        attention_dropout=attention_dropout, **pure_lsh_implementation_kwargs)
    layers = [qkv, attn, attention.MergeHeads(n_heads)]
    if weights_format != 'sparse':
      layers.append(core.Dense(d_model, use_bias=bias))
    self._masked = masked
    super().__init__(*layers)

  def forward_and_or_backward(self, inputs, weights, state, rng,
                              output_grad=None, compute_output=True,
                              update_state=True):
    """Output (and, with `output_grad`, gradients) replaying the core's state.

    Returns `(output, None, inputs_grad, weights_grad)`, the gradients None
    without `output_grad`. The projections and output layers are
    differentiated by `jax.vjp`; the attention core by its own recomputing
    pass.
    """
    del compute_output
    if update_state:
      raise ArgumentValueError('PureLSHSelfAttentionWrapper.forward_and_or_backward '
                               'replays the stored state; call it with '
                               'update_state=False.')
    qkv, attn = self.sublayers[0], self.sublayers[1]
    tail = self.sublayers[2:]
    rngs = split_rngs(rng, len(self.sublayers))
    x, rest = ((inputs[0], tuple(inputs[1:])) if self._masked
               else (inputs, ()))

    def qkv_fn(x_in, w):
      return tuple(qkv.pure_fn(x_in, w, state[0], rngs[0])[0])
    qkv_out, qkv_vjp = jax.vjp(qkv_fn, x, weights[0])
    attn_in = qkv_out + rest
    attn_out = attn.forward_and_or_backward(
        attn_in, weights[1], state[1], rngs[1], compute_output=True,
        update_state=False)[0]

    def tail_fn(o, ws):
      for layer, w, s, r in zip(tail, ws, state[2:], rngs[2:]):
        o = layer.pure_fn(o, w, s, r)[0]
      return o
    out, tail_vjp = jax.vjp(tail_fn, attn_out, tuple(weights[2:]))
    if output_grad is None:
      return out, None, None, None
    o_ct, tail_w_ct = tail_vjp(output_grad.astype(out.dtype))
    attn_in_ct, attn_w_ct = attn.forward_and_or_backward(
        attn_in, weights[1], state[1], rngs[1], output_grad=o_ct,
        compute_output=False, update_state=False)[2:]
    x_ct, qkv_w_ct = qkv_vjp(tuple(attn_in_ct[:2]))
    if self._masked:
      x_ct = (x_ct,) + tuple(cotangent_like(None, m) for m in rest)
      x_ct = list(x_ct) if isinstance(inputs, list) else x_ct
    return out, None, x_ct, (qkv_w_ct, attn_w_ct) + tuple(tail_w_ct)
