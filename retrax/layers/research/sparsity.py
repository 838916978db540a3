"""Trax's `layers.research.sparsity`: cheaper Dense layers and the attentions built on them.

- Dense replacements: `FactoredDense` (gate by `n_modules` learned vectors,
  project each to `d_out / n_modules`), `LocallyConnectedDense` (modules
  connected to `kernel_size` neighbouring modules), `LowRankDense`,
  `EinsumDense`, `MultiplicativeModularSparseDense`, `LocallyConvDense`
  (a Conv over modules, causal over length), and `SparseDenseWithOptions`
  choosing among them.
- Causal attentions with those layers for Q/K/V/output: `ModularCausalAttention`,
  `LowRankCausalAttention`, `MultiplicativeCausalAttention`,
  `MultiplicativeModularCausalAttention`, `ConvCausalAttention`,
  `MultiplicativeConvCausalAttention`.
- Reversible permutations of the last axis: `ReversibleReshapePermute`,
  `ReversibleRandomPermute`.

Weights have Trax 1.4.1's layout (each `tl.Weights` is one leaf, in order).
`SparseFF` (1-in-N) is `retrax.layers.sparsity.SparseFF`; `BlockSparseFF`,
`SwitchSparseFF` and the FAVOR attentions are in sibling modules, re-exported
here at Trax's path.
"""

import functools
import math
import random as pyrandom

import numpy as np
from jax import lax

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import attention
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import convolution
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.layers import predict_state
from retrax.layers import reversible
from retrax import validation
from retrax.layers.assert_shape import assert_shape
from retrax.layers.locally_connected import LocallyConnected1d
from retrax.layers.research.favor import CausalFavor as CausalFavor
from retrax.layers.research.favor import CausalFavorAttention as CausalFavorAttention
from retrax.layers.research.favor import Favor as Favor
from retrax.layers.research.favor import FavorAttention as FavorAttention
from retrax.layers.research.sparse_ff import BlockSparseFF as BlockSparseFF
from retrax.layers.research.sparse_ff import SwitchSparseFF as SwitchSparseFF
from retrax.layers.sparsity import SparseFF as SparseFF
from retrax.validation import ArgumentValueError


class _PermuteLastAxis(reversible.ReversibleLayer):
  """Fixed permutation of the last axis (subclasses give it)."""

  def _permutation(self, d):
    raise NotImplementedError

  def forward(self, x):
    return x[..., self._permutation(x.shape[-1])]

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    return output[..., np.argsort(self._permutation(output.shape[-1]))]


@assert_shape('...->...')
class ReversibleReshapePermute(_PermuteLastAxis):
  """Permutes a power-of-two last axis by a reshape `(d/m, m)` and a transpose.

  `m = 2^k`, `k` the largest integer `<= log2(d) // 2` that does not divide
  `log2(d)` (1 if none): the longest permutation cycle among such reshapes.
  """

  def _permutation(self, d):
    log_d = int(round(math.log2(d))) if d > 0 else -1
    if d < 1 or 2**log_d != d:
      raise InputValueError(f'{self.name} needs a power-of-two last axis; got {d}.')
    k = next((i for i in range(log_d // 2, 0, -1) if log_d % i), 1)
    m = 2**k
    return np.arange(d).reshape(-1, m).T.reshape(-1)


@assert_shape('...->...')
class ReversibleRandomPermute(_PermuteLastAxis):
  """A fixed pseudorandom permutation of the last axis (Python's `Random(42)` shuffle)."""

  def _permutation(self, d):
    permutation = list(range(d))
    pyrandom.Random(42).shuffle(permutation)
    return np.array(permutation)


@assert_shape('...a->...bc')
def SplitLastAxis(num_splits):
  """`(..., d) -> (..., num_splits, d // num_splits)`."""
  return core.Fn(f'SplitLastAxis_{num_splits}',
                 lambda x: jnp.reshape(x, x.shape[:-1] + (num_splits, -1)))


@assert_shape('...ab->...c')
def MergeLastTwoAxes():
  """`(..., a, b) -> (..., a * b)`."""
  return core.Fn('MergeLastTwoAxes',
                 lambda x: jnp.reshape(x, x.shape[:-2] + (-1,)))


@assert_shape('...a->...b')
def LocallyConnectedDense(n_modules, n_units, kernel_size=1,
                          kernel_initializer=init.GlorotUniformInitializer(),
                          bias_initializer=init.RandomNormalInitializer(1e-6),
                          use_bias=True):
  """Splits the last axis into `n_modules`, each giving `n_units` outputs.

  Each output reads the `kernel_size` modules around its own (wrapping).

  With `n_modules=1` this is `Dense(n_units)`.
  """
  if n_modules == 1:
    return core.Dense(n_units, kernel_initializer=kernel_initializer,
                      bias_initializer=bias_initializer, use_bias=use_bias)
  return cb.Serial(
      SplitLastAxis(n_modules),
      LocallyConnected1d(n_units, kernel_size,
                         kernel_initializer=kernel_initializer,
                         bias_initializer=bias_initializer,
                         use_bias=use_bias, padding='WRAP'),
      MergeLastTwoAxes())


def _causal_attention_with(make_layer, n_heads, dropout, max_inference_length,
                           mode, qkv_attention_type):
  return attention.ConfigurableAttention(
      make_layer(), make_layer(), make_layer(), make_layer(), n_heads=n_heads,
      qkv_attention_layer=_qkv_attention(
          qkv_attention_type, dropout=dropout,
          max_inference_length=max_inference_length, mode=mode,
          n_heads=n_heads))


def _qkv_attention(qkv_attention_type, **kwargs):
  """The per-head causal attention: `qkv_attention_type` (as `CausalAttention`
  takes it; default `DotProductCausalAttention`) built with `kwargs`."""
  return (qkv_attention_type or attention.DotProductCausalAttention)(**kwargs)


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def ModularCausalAttention(d_feature, n_heads=1, sparsity=None, dropout=0.0,
                           max_inference_length=2048, kernel_size=1,
                           mode='train', qkv_attention_type=None):
  """CausalAttention with `LocallyConnectedDense(sparsity, d / sparsity)` for Q, K, V and output.

  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s.
  """
  n_modules = n_heads if sparsity is None else sparsity
  validation.check_multiple('ModularCausalAttention', 'd_feature', d_feature,
                 'sparsity', n_modules)
  return _causal_attention_with(
      lambda: LocallyConnectedDense(n_modules, d_feature // n_modules,
                                    kernel_size=kernel_size),
      n_heads, dropout, max_inference_length, mode, qkv_attention_type)


class _RememberPad(base.Layer):
  """Pads axis 1 on the left with `n` items: zeros, or in 'predict' the last `n` seen.

  Predict-mode state (Trax's layout): `(last n items, {'init': ()})` after
  init, `(last n items, {'forward': ()})` after a call. With `portal_mask`
  (predict mode: Terraformer's source-mask portal, whose
  `one_example_mask(reader)` gives the mask of its one example),
  the first call's input ends in the source's padding (`ConcatWithPadding`
  moves it after the first target), so the items kept are the last `n`
  before it: the next target follows the last real position, as in eval.
  """

  def __init__(self, n_items_to_remember, mode, portal_mask=None):
    super().__init__(name='_RememberPad', mode=mode)
    self._n = n_items_to_remember
    self._portal_mask = portal_mask

  def predict_state_layout(self, state):
    """The last items, one row per example."""
    return predict_state.PredictStateLayout(predict_state.same_rows(state, 1))

  def forward(self, x):
    if self._n == 0:
      return x
    if self._mode == 'predict':
      x = jnp.concatenate([self.state[0].astype(x.dtype), x], axis=1)
      end = x.shape[1]
      if self._portal_mask is not None and 'init' in self.state[1]:
        real = self._portal_mask.one_example_mask(self.name)
        end -= jnp.sum(~real, dtype=jnp.int32)
      kept = lax.dynamic_slice_in_dim(x, end - self._n, self._n, axis=1)
      self.state = (kept, {'forward': ()})
      return x
    pad = [(0, 0)] * len(x.shape)
    pad[1] = (self._n, 0)
    return jnp.pad(x, pad)

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      shape = list(input_signature.shape)
      shape[1] = self._n
      self.state = (jnp.zeros(shape, dtype=jnp.float32), {'init': ()})


@assert_shape('...a->...b')
def LocallyConvDense(n_modules, n_units, mode, kernel_size=1,
                     length_kernel_size=1, portal_mask=None):
  """Like LocallyConnectedDense with weights shared over modules (a Conv).

  Causal over `length_kernel_size` positions.

  Input `(batch, length, d)`; the Conv kernel is `(length_kernel_size,
  kernel_size, d / n_modules, n_units)`, zero-padded across modules; the
  previous `length_kernel_size - 1` positions come from `_RememberPad`
  (which reads `portal_mask`, Terraformer's predict-mode source mask).
  """
  if n_modules == 1:
    return core.Dense(n_units)
  if kernel_size % 2 != 1:
    raise ArgumentValueError(f'LocallyConvDense: kernel_size must be odd; got '
                             f'{kernel_size}.')
  half = (kernel_size - 1) // 2
  pad_widths = [[0, 0], [0, 0], [half, half], [0, 0]]
  return cb.Serial(
      SplitLastAxis(n_modules),
      core.Fn('Pad', lambda x: jnp.pad(x, pad_width=pad_widths)),
      _RememberPad(length_kernel_size - 1, mode=mode, portal_mask=portal_mask),
      convolution.Conv(n_units, kernel_size=(length_kernel_size, kernel_size)),
      MergeLastTwoAxes())


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def ConvCausalAttention(d_feature, n_heads=1, sparsity=None, dropout=0.0,
                        max_inference_length=2048, kernel_size=1,
                        mode='train', qkv_attention_type=None):
  """CausalAttention with `LocallyConvDense(sparsity, d / sparsity)` for Q, K, V and output.

  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s.
  """
  n_modules = n_heads if sparsity is None else sparsity
  validation.check_multiple('ConvCausalAttention', 'd_feature', d_feature, 'sparsity',
                 n_modules)
  return _causal_attention_with(
      lambda: LocallyConvDense(n_modules, d_feature // n_modules, mode=mode,
                               kernel_size=kernel_size),
      n_heads, dropout, max_inference_length, mode, qkv_attention_type)


@assert_shape('...a->...b')
def LowRankDense(n_units, d_lowrank):
  """`Dense(d_lowrank)` then `Dense(n_units)`."""
  return cb.Serial(core.Dense(d_lowrank), core.Dense(n_units))


@assert_shape('...a->...b')
def EinsumDense(d_input, d_output, use_bias):
  """Dense with its kernel stored transposed, `(d_output, d_input)`, as in Trax."""
  layers = [
      core.Weights(init.GlorotUniformInitializer(), [d_output, d_input]),
      core.Fn('EinsumDense',
              lambda kernel, x: jnp.einsum('xd,...d->...x', kernel, x)),
  ]
  if use_bias:
    layers += [core.Weights(init.RandomNormalInitializer(1e-6), [d_output]),
               cb.Add()]
  return cb.Serial(layers)


def RandomLayer(layer_a, layer_b, prob_a):
  """Runs `layer_a` with probability `prob_a` (a fresh draw per call), else `layer_b`."""
  condition = cb.Serial(core.RandomUniform(),
                        core.Fn('SmallerThan', lambda x: x < prob_a))
  return cb.Cond(condition, layer_a, layer_b)


_SPARSITY_TYPES = (None, 'None', 'mult', 'lowrank', 'einsum', 'local',
                   'local3')


@assert_shape('...a->...b')
def SparseDenseWithOptions(n_units, d_input=None, sparsity_type=None,
                           sparsity=0, d_lowrank=None, prob_sparse=None,
                           mode=None, use_bias=True, use_bfloat16=False):
  """A Dense layer or one of its sparse replacements.

  `sparsity_type` None/'None' (or `sparsity=0`): Dense; 'mult': FactoredDense
  with `sparsity` modules; 'lowrank': LowRankDense(d_lowrank); 'einsum':
  EinsumDense; 'local'/'local3': LocallyConnectedDense with kernel 1/3. With
  `prob_sparse`, a RandomLayer picks the sparse layer with that probability
  in training and always outside 'train' (both layers' weights exist).
  """
  if prob_sparse is not None:
    if mode is not None and mode != 'train':
      prob_sparse = 1.0
    return RandomLayer(
        SparseDenseWithOptions(n_units, d_input, sparsity_type, sparsity,
                               d_lowrank, use_bias=use_bias,
                               use_bfloat16=use_bfloat16),
        core.Dense(n_units, use_bias=use_bias, use_bfloat16=use_bfloat16),
        prob_sparse)
  if sparsity_type not in _SPARSITY_TYPES:
    raise ArgumentValueError(f'SparseDenseWithOptions: unknown sparsity_type '
                             f'{sparsity_type!r}; use one of {_SPARSITY_TYPES}.')
  if sparsity_type in (None, 'None') or sparsity == 0:
    return core.Dense(n_units, use_bias=use_bias, use_bfloat16=use_bfloat16)
  if d_input is None and sparsity_type in ('mult', 'einsum'):
    raise ArgumentValueError(f"SparseDenseWithOptions: sparsity_type="
                             f"{sparsity_type!r} needs d_input.")
  if sparsity_type == 'mult':
    return FactoredDense(sparsity, d_input, n_units, use_bias=use_bias,
                         use_bfloat16=use_bfloat16)
  if use_bfloat16:
    raise ArgumentValueError(f'SparseDenseWithOptions: use_bfloat16 needs '
                             f"sparsity_type None or 'mult'; got {sparsity_type!r}.")
  if sparsity_type == 'einsum':
    return EinsumDense(d_input, n_units, use_bias=use_bias)
  if not use_bias:
    raise ArgumentValueError(f'SparseDenseWithOptions: use_bias=False is not '
                             f'available with sparsity_type={sparsity_type!r}.')
  if sparsity_type == 'lowrank':
    if not d_lowrank:
      raise ArgumentValueError("SparseDenseWithOptions: sparsity_type='lowrank' "
                               'needs d_lowrank.')
    return LowRankDense(n_units, d_lowrank)
  validation.check_multiple('SparseDenseWithOptions', 'n_units', n_units, 'sparsity',
                 sparsity)
  return LocallyConnectedDense(sparsity, n_units // sparsity,
                               kernel_size=3 if sparsity_type == 'local3' else 1)


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def LowRankCausalAttention(d_feature, n_heads=1, dropout=0.0,
                           max_inference_length=2048, lowrank=64,
                           mode='train', qkv_attention_type=None):
  """CausalAttention with `LowRankDense(d_feature, lowrank)` for Q, K, V and output.

  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s.
  """
  return _causal_attention_with(lambda: LowRankDense(d_feature, lowrank),
                                n_heads, dropout, max_inference_length, mode,
                                qkv_attention_type)


def _GateAndProject():
  # Stack: x, gating [n, d], projection [d, m] -> x gated by each module and projected.
  return core.Fn('_GateAndProject', lambda projection, gating, x: jnp.einsum(
      '...d,nd,dm->...nm', x, gating, projection))


@assert_shape('...a->...b')
def FactoredDense(n_modules, d_in, d_out, use_bias=True, use_bfloat16=False):
  """`y[..., i*m:(i+1)*m] = (x * g_i) @ P (+ b)`: `n_modules` gates `g_i` share one projection.

  Weights (in order): gates `(n_modules, d_in)` ~ N(0, 0.5²), projection
  `(d_in, d_out / n_modules)` Glorot-uniform, and with `use_bias` a bias
  `(d_out,)`. About `1 / n_modules` of a Dense layer's weights.
  """
  validation.check_multiple('FactoredDense', 'd_out', d_out, 'n_modules', n_modules)
  d_module = d_out // n_modules
  layers = [
      core.Weights(init.RandomNormalInitializer(stddev=0.5),
                   shape=[n_modules, d_in], use_bfloat16=use_bfloat16),
      core.Weights(init.GlorotUniformInitializer(), shape=[d_in, d_module],
                   use_bfloat16=use_bfloat16),
      _GateAndProject(),
      MergeLastTwoAxes(),
  ]
  if use_bias:
    layers += [core.Weights(init.RandomNormalInitializer(1e-6), shape=[d_out],
                            use_bfloat16=use_bfloat16),
               cb.Add()]
  return cb.Serial(layers)


@assert_shape('...a->...a')
def MultiplicativeModularSparseDense(sparsity, d_feature):
  """FactoredDense followed by a per-module `(d_module, d_module)` Dense, in one einsum.

  Weights: gates `(sparsity, d)`, shared kernel `(d, d / sparsity)`, module
  kernels `(sparsity, d / sparsity, d / sparsity)`, bias `(d,)`.
  """
  validation.check_multiple('MultiplicativeModularSparseDense', 'd_feature', d_feature,
                 'sparsity', sparsity)
  d_module = d_feature // sparsity
  return cb.Serial(
      core.Weights(init.RandomNormalInitializer(stddev=0.5),
                   shape=[sparsity, d_feature]),
      core.Weights(init.GlorotUniformInitializer(), [d_feature, d_module]),
      core.Weights(functools.partial(init.GlorotUniformInitializer(),
                                     nonreceptive_dims=[0]),
                   [sparsity, d_module, d_module]),
      core.Fn('SparseDenseEinsum',
              lambda kmod, kmult, multiplier, x: jnp.einsum(
                  'hxo,dx,hd,...d->...ho', kmod, kmult, multiplier, x)),
      MergeLastTwoAxes(),
      core.Weights(init.RandomNormalInitializer(1e-6), [d_feature]),
      cb.Add(),
  )


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def MultiplicativeCausalAttention(d_feature, n_heads=1, sparsity=None,
                                  dropout=0.0, max_inference_length=2048,
                                  mode='train', qkv_attention_type=None):
  """CausalAttention with `FactoredDense(sparsity, d, d)` for Q, K, V and output.

  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s.
  """
  sparsity = n_heads if sparsity is None else sparsity
  return _causal_attention_with(
      lambda: FactoredDense(sparsity, d_feature, d_feature), n_heads, dropout,
      max_inference_length, mode, qkv_attention_type)


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def MultiplicativeModularCausalAttention(
    d_feature, n_heads=1, sparsity=None, dropout=0.0, max_inference_length=2048,
    mode='train', qkv_attention_type=None):
  """CausalAttention with `MultiplicativeModularSparseDense` for Q, K, V and output.

  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s.
  """
  sparsity = n_heads if sparsity is None else sparsity
  return _causal_attention_with(
      lambda: MultiplicativeModularSparseDense(sparsity, d_feature), n_heads,
      dropout, max_inference_length, mode, qkv_attention_type)


def _v_concat_layers(v_concat_type, sparsity, d_module, d_feature):
  """Combines (shared QK activations, layer input) into V's input."""
  if v_concat_type == 'original':
    return [cb.Concatenate()]
  if v_concat_type == 'fixed':  # Interleave per module: [qk_i, x_i] for each i.
    split = lambda x: jnp.reshape(x, x.shape[:2] + (sparsity, d_module))
    return [cb.Parallel(core.Fn('Reshape1', split), core.Fn('Reshape2', split)),
            cb.Concatenate(),
            core.Fn('Reshape3', lambda x: jnp.reshape(
                x, x.shape[:2] + (2 * d_feature,)))]
  return [cb.Select([0], n_in=2)]


_OUTPUT_LAYER_TYPES = ('none', 'mult', 'conv', 'multconv')
_V_CONCAT_TYPES = ('original', 'fixed', 'none')


def _check_choice(name, value, choices):
  if value not in choices:
    raise ArgumentValueError(f'MultiplicativeConvCausalAttention: {name} must be one '
                             f'of {choices}; got {value!r}.')


@configurable('trax.layers', denylist=('mode',))
@assert_shape('bld->bld')
def MultiplicativeConvCausalAttention(
    d_feature, n_heads=1, sparsity=None, length_kernel_size=3, dropout=0.0,
    force_no_dropout=False, max_inference_length=2048, share_qk=False,
    output_layer_type='none', v_concat_type='none', mode='train',
    qkv_attention_type=None, portal_mask=None):
  """Causal attention whose Q, K, V come from one shared FactoredDense and per-module convolutions.

  `FactoredDense(sparsity, d, d)` feeds `LocallyConvDense` layers (kernel 3
  over modules, causal `length_kernel_size` over positions) for Q and K (one
  shared layer if `share_qk`), and one of kernel 1 for V, whose input is
  chosen by `v_concat_type`: 'none' (the shared activations), 'fixed' (those
  and the layer input, interleaved per module) or 'original' (concatenated).
  `output_layer_type` adds a FactoredDense ('mult'), a LocallyConvDense
  ('conv'), or both ('multconv') after the heads are merged.
  `qkv_attention_type`: the per-head attention, as `CausalAttention`'s;
  `portal_mask`: Terraformer's predict-mode source mask, for the causal
  convolutions' memory (`LocallyConvDense`).
  """
  _check_choice('output_layer_type', output_layer_type, _OUTPUT_LAYER_TYPES)
  _check_choice('v_concat_type', v_concat_type, _V_CONCAT_TYPES)
  dropout = 0.0 if force_no_dropout else dropout
  sparsity = n_heads if sparsity is None else sparsity
  validation.check_multiple('MultiplicativeConvCausalAttention', 'd_feature', d_feature,
                 'sparsity', sparsity)
  d_module = d_feature // sparsity

  def conv(kernel_size):
    return LocallyConvDense(sparsity, d_module, mode=mode,
                            kernel_size=kernel_size,
                            length_kernel_size=length_kernel_size,
                            portal_mask=portal_mask)

  output_layers = []
  if 'mult' in output_layer_type:
    output_layers.append(FactoredDense(sparsity, d_feature, d_feature))
  if 'conv' in output_layer_type:
    output_layers.append(conv(3))
  v_layer = [_v_concat_layers(v_concat_type, sparsity, d_module, d_feature),
             conv(1), attention.SplitIntoHeads(n_heads)]
  causal_attention = _qkv_attention(
      qkv_attention_type, dropout=dropout,
      max_inference_length=max_inference_length, mode=mode, n_heads=n_heads)
  if share_qk:
    return cb.Serial(
        cb.Select([0, 0]),                 # x x
        FactoredDense(sparsity, d_feature, d_feature),
        cb.Select([0, 0]),                 # qk qk x
        conv(3), attention.SplitIntoHeads(n_heads),
        cb.Select([0, 0]),                 # q k qk x
        cb.Parallel([], [], v_layer),      # q k v
        causal_attention,
        attention.MergeHeads(n_heads),
        output_layers)
  return cb.Serial(
      cb.Select([0, 0]),                   # x x
      FactoredDense(sparsity, d_feature, d_feature),
      cb.Select([0, 0, 0]),                # qk qk qk x
      cb.Parallel([conv(3), attention.SplitIntoHeads(n_heads)],
                  [conv(3), attention.SplitIntoHeads(n_heads)],
                  v_layer),                # q k v
      causal_attention,
      attention.MergeHeads(n_heads),
      output_layers)
