"""Tests of dense attention against a plain NumPy reference, finite differences and eval mode."""

import functools

import jax
from jax import test_util as jtu
import numpy as np
import pytest

from retrax.layers import attention as attn
from retrax.layers.attention import dense
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import position
from retrax.shapes import ShapeDtype

from tests.backend_tolerance import float32_tolerance
from tests.float64 import float64
from tests.layers import predict_utils

RNG = jax.random.PRNGKey(0)


_JITTED = {}


def fwd(layer, x, rng=RNG):
  """Runs `layer` on `x` under jit with its own weights and state."""
  if layer not in _JITTED:
    _JITTED[layer] = jax.jit(layer.pure_fn)
  return _JITTED[layer](x, layer.weights, layer.state, rng)[0]


# --- NumPy reference (float64) -----------------------------------------------


def np_attention(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d), masked to -1e9) v, per head."""
  dots = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
  if mask is not None:
    dots = np.where(mask, dots, -1e9)
  dots = dots - dots.max(axis=-1, keepdims=True)
  w = np.exp(dots)
  w /= w.sum(axis=-1, keepdims=True)
  return w @ v, w


def np_split(x, n_heads):
  b, l, d = x.shape
  return x.reshape(b, l, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def np_merge(x):
  b, h, l, dh = x.shape
  return x.transpose(0, 2, 1, 3).reshape(b, l, h * dh)


def np_multihead(xq, xk, xv, mask, dense_q, dense_k, dense_v, dense_o,
                 n_heads):
  """Multi-head attention; each `dense_*` is a (W, b) pair or None (no-op)."""
  def affine(x, wb):
    return x if wb is None else x @ np.float64(wb[0]) + np.float64(wb[1])
  q, k, v = (np_split(affine(x, wb), n_heads)
             for x, wb in ((xq, dense_q), (xk, dense_k), (xv, dense_v)))
  out, _ = np_attention(q, k, v, mask)
  return affine(np_merge(out), dense_o)


def causal(length):
  return np.tril(np.ones((length, length), bool))


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def close(got, want, atol=1e-5):
  np.testing.assert_allclose(np.asarray(got, np.float64), want,
                             **float32_tolerance(rtol=1e-5, atol=atol))


# --- per-head kernels --------------------------------------------------------


def test_dot_product_attention_matches_numpy_with_mask():
  q, k, v = randn(3, 5, 4, seed=1), randn(3, 7, 4, seed=2), randn(3, 7, 6, seed=3)
  mask = np.random.RandomState(4).rand(3, 5, 7) > 0.3
  mask[..., 0] = True  # every query sees at least one key
  out, weights = jax.jit(attn.dot_product_attention)(q, k, v, mask)
  want_out, want_w = np_attention(q, k, v, mask)
  close(out, want_out)
  close(weights, want_w)
  assert out.dtype == np.float32
  # Masked keys get (numerically) zero weight.
  assert np.all(np.asarray(weights)[~mask] < 1e-30)


def test_per_head_attention_is_trax_positional_signature():
  q = randn(2, 3, 4)
  per_head = jax.jit(dense._per_head_attention, static_argnums=(3, 4, 5, 6))
  out, _ = per_head(q, q, q, None, 0.0, 'eval', None)
  close(out, np_attention(q, q, q)[0])


def test_dot_product_attention_layer():
  q, k, v = randn(2, 4, 3, seed=1), randn(2, 4, 3, seed=2), randn(2, 4, 3, seed=3)
  mask = causal(4)[None]
  layer = attn.DotProductAttention(mode='eval')
  layer.init((ShapeDtype(q.shape),) * 3 + (ShapeDtype(mask.shape, bool),))
  close(fwd(layer, (q, k, v, mask)), np_attention(q, k, v, mask)[0])


def test_attention_dropout_train_uses_bernoulli_keep_mask():
  q, k, v = randn(2, 6, 4, seed=1), randn(2, 6, 4, seed=2), randn(2, 6, 5, seed=3)
  rate = 0.4
  layer = attn.DotProductAttention(dropout=rate, mode='train')
  sig = (ShapeDtype(q.shape), ShapeDtype(k.shape), ShapeDtype(v.shape),
         ShapeDtype((1, 6, 6), bool))
  layer.init(sig)
  mask = np.ones((1, 6, 6), bool)
  out = fwd(layer, (q, k, v, mask))
  keep = np.asarray(jax.random.bernoulli(RNG, 1.0 - rate, (2, 6, 6)))
  _, w = np_attention(q, k, v, mask)
  close(out, (w * keep / (1.0 - rate)) @ v)
  assert 0 < keep.sum() < keep.size
  # Eval mode ignores the dropout rate.
  layer_eval = attn.DotProductAttention(dropout=rate, mode='eval')
  layer_eval.init(sig)
  out_eval = fwd(layer_eval, (q, k, v, mask))
  close(out_eval, np_attention(q, k, v, mask)[0])


def test_attention_dropout_rate_is_respected_statistically():
  x = randn(4, 64, 8)
  attend = jax.jit(attn.dot_product_attention,
                   static_argnames=('dropout', 'mode'))
  _, w = attend(x, x, x, None, dropout=0.25, mode='train', rng=RNG)
  dropped = float(np.mean(np.asarray(w) == 0.0))
  assert abs(dropped - 0.25) < 0.02


# --- heads -------------------------------------------------------------------


def test_split_and_merge_heads_match_numpy_reshapes():
  x = randn(2, 5, 12)
  split = attn.SplitIntoHeads(3)
  split.init(ShapeDtype(x.shape))
  y = np.asarray(fwd(split, x))
  np.testing.assert_array_equal(y, np_split(x, 3).reshape(6, 5, 4))
  merge = attn.MergeHeads(3)
  merge.init(ShapeDtype(y.shape))
  np.testing.assert_array_equal(fwd(merge, y), x)
  split4 = attn.SplitIntoHeads(3, merged_batch_and_head=False)
  split4.init(ShapeDtype(x.shape))
  y4 = np.asarray(fwd(split4, x))
  np.testing.assert_array_equal(y4, np_split(x, 3))
  merge4 = attn.MergeHeads(3, merged_batch_and_head=False)
  merge4.init(ShapeDtype(y4.shape))
  np.testing.assert_array_equal(fwd(merge4, y4), x)


def test_split_into_heads_rejects_indivisible_depth():
  split = attn.SplitIntoHeads(3)
  with pytest.raises(base.LayerError, match='not a multiple'):
    split.init(ShapeDtype((2, 5, 8)))


# --- multi-head layers ---------------------------------------------------------


def _padding_mask(batch, length, n_pad):
  mask = np.ones((batch, 1, 1, length), bool)
  mask[0, ..., length - n_pad:] = False
  return mask


@pytest.mark.parametrize('n_heads', [1, 4])
def test_attention_matches_numpy(n_heads):
  x = randn(2, 6, 8)
  mask = _padding_mask(2, 6, 2)
  layer = attn.Attention(8, n_heads=n_heads, mode='eval')
  w, _ = layer.init((ShapeDtype(x.shape), ShapeDtype(mask.shape, bool)))
  y, mask_out = fwd(layer, (x, mask))
  (dq, dk, dv), _, do = w[1][1][1]  # Trax's tree: see the layout test.
  want = np_multihead(x, x, x, mask, dq, dk, dv, do, n_heads)
  close(y, want)
  np.testing.assert_array_equal(mask_out, mask)


def test_attention_qkv_with_different_query_and_key_lengths():
  xq, xkv = randn(2, 3, 8, seed=1), randn(2, 5, 8, seed=2)
  mask = _padding_mask(2, 5, 1)
  layer = attn.AttentionQKV(8, n_heads=2, mode='eval')
  sig = (ShapeDtype(xq.shape), ShapeDtype(xkv.shape), ShapeDtype(xkv.shape),
         ShapeDtype(mask.shape, bool))
  w, _ = layer.init(sig)
  y, _ = fwd(layer, (xq, xkv, xkv, mask))
  (dq, dk, dv), _, do = w[1]
  close(y, np_multihead(xq, xkv, xkv, mask, dq, dk, dv, do, 2))


def test_attention_qkv_noop_sparsity_drops_dense_layers():
  x = randn(2, 4, 6)
  mask = np.ones((2, 1, 1, 4), bool)
  layer = attn.AttentionQKV(6, n_heads=3, q_sparsity='noop',
                            result_sparsity='noop', mode='eval')
  sig = (ShapeDtype(x.shape),) * 3 + (ShapeDtype(mask.shape, bool),)
  w, _ = layer.init(sig)
  y, _ = fwd(layer, (x, x, x, mask))
  (dq, dk, dv), _, do = w[1]
  assert dq == () and do == ()
  close(y, np_multihead(x, x, x, mask, None, dk, dv, None, 3))
  with pytest.raises(ValueError, match='q_sparsity'):
    attn.AttentionQKV(6, q_sparsity=4)


def test_pure_attention_matches_numpy():
  q, k, v = randn(2, 3, 8, seed=1), randn(2, 4, 8, seed=2), randn(2, 4, 8, seed=3)
  mask = _padding_mask(2, 4, 1)
  layer = attn.PureAttention(n_heads=2, mode='eval')
  layer.init((ShapeDtype(q.shape), ShapeDtype(k.shape), ShapeDtype(v.shape),
              ShapeDtype(mask.shape, bool)))
  y, _ = fwd(layer, (q, k, v, mask))
  close(y, np_multihead(q, k, v, mask, None, None, None, None, 2))


@pytest.mark.parametrize('n_heads', [1, 2])
def test_causal_attention_matches_numpy(n_heads):
  x = randn(2, 7, 8)
  layer = attn.CausalAttention(8, n_heads=n_heads, mode='eval')
  w, _ = layer.init(ShapeDtype(x.shape))
  inner = w[1][1]  # Serial(Branch, DotProductCausalAttention, MergeHeads, Dense)
  branches = inner[0][1]
  dq, dk, dv = (b[0] for b in branches)
  want = np_multihead(x, x, x, causal(7), dq, dk, dv, inner[3], n_heads)
  close(fwd(layer, x), want)


def test_dot_product_causal_attention_matches_numpy():
  q, k, v = randn(6, 5, 4, seed=1), randn(6, 5, 4, seed=2), randn(6, 5, 4, seed=3)
  layer = attn.DotProductCausalAttention(mode='eval')
  layer.init((ShapeDtype(q.shape),) * 3)
  close(fwd(layer, (q, k, v)), np_attention(q, k, v, causal(5))[0])


def test_causal_attention_train_dropout_is_random_but_reproducible():
  x = randn(2, 6, 8)
  layer = attn.CausalAttention(8, n_heads=2, dropout=0.5, mode='train')
  w, s = layer.init(ShapeDtype(x.shape))
  fn = jax.jit(layer.pure_fn)
  y1, _ = fn(x, w, s, RNG)
  y2, _ = fn(x, w, s, RNG)
  y3, _ = fn(x, w, s, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(y1, y2)
  assert np.max(np.abs(np.asarray(y1) - np.asarray(y3))) > 1e-3
  layer_eval = attn.CausalAttention(8, n_heads=2, dropout=0.5, mode='eval')
  layer_eval.init(ShapeDtype(x.shape))
  y_eval, _ = jax.jit(layer_eval.pure_fn)(x, w, s, RNG)
  assert np.max(np.abs(np.asarray(y1) - np.asarray(y_eval))) > 1e-3


# --- gradients -----------------------------------------------------------------


def _check_layer_grads(layer, x):
  with float64():
    x = jax.tree_util.tree_map(np.float64, x)
    w, s = layer.init(jax.tree_util.tree_map(
        lambda a: ShapeDtype(a.shape, a.dtype), x))
    w = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), w)

    @jax.jit
    def f(x, w):
      y, _ = layer.pure_fn(x, w, s, RNG)
      return y
    jtu.check_grads(f, (x, w), order=1, modes=['rev'], atol=1e-6, rtol=1e-6)


def test_dot_product_attention_grads():
  with float64():
    q, k, v = (np.float64(randn(2, 4, 3, seed=i)) for i in range(3))
    f = jax.jit(lambda q, k, v: attn.dot_product_attention(
        q, k, v, causal(4))[0])
    jtu.check_grads(f, (q, k, v), order=2, modes=['rev'], atol=1e-6,
                    rtol=1e-6)


def test_causal_attention_grads():
  _check_layer_grads(attn.CausalAttention(4, n_heads=2, mode='eval'),
                     randn(2, 3, 4))


def test_attention_grads():
  x = randn(2, 3, 4)
  mask = np.ones((2, 1, 1, 3), bool)
  layer = attn.Attention(4, n_heads=2, mode='eval')
  with float64():
    w, s = layer.init((ShapeDtype(x.shape, np.float64),
                       ShapeDtype(mask.shape, bool)))
    w = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), w)

    @jax.jit
    def f(x, w):
      return layer.pure_fn((x, mask), w, s, RNG)[0][0]
    jtu.check_grads(f, (np.float64(x), w), order=1, modes=['rev'], atol=1e-6,
                    rtol=1e-6)


# --- predict mode ----------------------------------------------------------------


@pytest.mark.parametrize('n_heads,first_chunk', [(1, 1), (2, 3)])
def test_causal_attention_eval_equals_predict(n_heads, first_chunk):
  make = functools.partial(attn.CausalAttention, 8, n_heads=n_heads,
                           max_inference_length=12)
  predict_utils.assert_eval_equals_predict(make, randn(2, 10, 8), atol=1e-5,
                                           first_chunk=first_chunk)


@pytest.mark.parametrize('first_chunk', [1, 5])
def test_dot_product_causal_attention_eval_equals_predict(first_chunk):
  def make(mode):
    return cb.Serial(
        cb.Branch(core.Dense(4), core.Dense(4), core.Dense(4)),
        attn.DotProductCausalAttention(max_inference_length=11, mode=mode))
  predict_utils.assert_eval_equals_predict(make, randn(3, 11, 4), atol=1e-5,
                                           first_chunk=first_chunk)


def test_attention_qkv_cached_kv_eval_equals_predict():
  # Encoder-decoder attention: queries arrive one by one, keys and values
  # (the encoder output) are computed on the first call and cached.
  xq, xkv = randn(2, 6, 8, seed=1), randn(2, 4, 8, seed=2)
  mask = _padding_mask(2, 4, 1)
  make = functools.partial(attn.AttentionQKV, 8, n_heads=2,
                           cache_KV_in_predict=True)
  predict_utils.assert_eval_equals_predict(make, (xq, xkv, xkv, mask),
                                           atol=1e-5, seq_input=0)
  layer = make(mode='predict')
  w, _ = layer.init((ShapeDtype(xq.shape), ShapeDtype(xkv.shape),
                     ShapeDtype(xkv.shape), ShapeDtype(mask.shape, bool)))
  assert _shapes(w[1][0][1]) == (((8, 8), (8,)),)  # Cache(Dense)


def test_causal_attention_with_dconv_eval_equals_predict():
  make = functools.partial(attn.CausalAttention, 8, n_heads=2, use_dconv=True,
                           max_inference_length=9)
  predict_utils.assert_eval_equals_predict(make, randn(2, 9, 8), atol=1e-5,
                                           first_chunk=2)


def test_dconv_matches_numpy_convolution():
  x = randn(2, 5, 3)
  conv = dense._CausalDepthwiseConv()
  w, _ = conv.init(ShapeDtype(x.shape))
  w = np.asarray(w)
  want = np.zeros((2, 5, 3))
  for t in range(5):
    for i in range(3):
      if t - i >= 0:
        want[:, t] += w[i] * x[:, t - i]
  close(fwd(conv, x), want)


def test_token_lm_eval_equals_predict():
  def make(mode):
    return cb.Serial(
        attn.ShiftRight(mode=mode),
        core.Embedding(11, 8),
        position.PositionalEncoding(max_len=16, mode=mode),
        attn.CausalAttention(8, n_heads=2, max_inference_length=16, mode=mode),
        core.Dense(11))
  tokens = np.random.RandomState(0).randint(1, 11, size=(2, 9)).astype(np.int32)
  worst = predict_utils.assert_eval_equals_predict(
      make, tokens, atol=1e-5,
      predict_inputs=predict_utils.shift_right(tokens))
  assert worst < 1e-5


@pytest.mark.parametrize('first_chunk', [1, 130])
def test_causal_attention_eval_equals_predict_across_prefixes(first_chunk):
  """Decoding past the first cache prefixes (128 and 256 slots on CPU)."""
  make = functools.partial(attn.CausalAttention, 8, n_heads=2,
                           max_inference_length=300)
  predict_utils.assert_eval_equals_predict(make, randn(2, 270, 8), atol=1e-5,
                                           first_chunk=first_chunk)


def test_predict_cache_state_layout():
  layer = attn.CausalAttention(8, n_heads=2, max_inference_length=20,
                               mode='predict')
  _, state = layer.init(ShapeDtype((3, 1, 8)))
  ks, vs, idx = state[1][1][1]
  assert ks.shape == vs.shape == (6, 20, 4)
  assert idx.shape == () and idx.dtype == np.int32


def test_predict_past_max_inference_length_raises_eagerly():
  layer = attn.DotProductCausalAttention(max_inference_length=3,
                                         mode='predict')
  x = randn(2, 2, 4)
  layer.init((ShapeDtype(x.shape),) * 3)
  layer((x, x, x))
  with pytest.raises(base.LayerError, match='max_inference_length=3'):
    layer((x, x, x))


def test_predict_past_max_inference_length_under_jit_clamps_writes():
  layer = attn.DotProductCausalAttention(max_inference_length=3,
                                         mode='predict')
  x = randn(1, 1, 2)
  _, state = layer.init((ShapeDtype(x.shape),) * 3)
  step = jax.jit(layer.pure_fn)
  for i in range(5):
    xi = x + i
    y, state = step((xi, xi, xi), (), state, RNG)
  ks, _, idx = state
  assert int(idx) == 5
  np.testing.assert_allclose(ks[0, -1], (x + 4)[0, 0])  # last slot overwritten
  assert np.all(np.isfinite(y))


# --- errors and layout -----------------------------------------------------------


@pytest.mark.parametrize('make', [
    lambda: attn.Attention(10, n_heads=3),
    lambda: attn.AttentionQKV(10, n_heads=4),
    lambda: attn.CausalAttention(10, n_heads=3),
])
def test_indivisible_heads_fail_at_construction(make):
  with pytest.raises(ValueError, match=r'\(10\) is not a multiple'):
    make()


def test_pure_attention_indivisible_heads_fails_at_init():
  layer = attn.PureAttention(n_heads=3)
  sig = (ShapeDtype((2, 4, 8)),) * 3 + (ShapeDtype((2, 1, 1, 4), bool),)
  with pytest.raises(base.LayerError, match='heads'):
    layer.init(sig)


def test_bad_mode_and_dropout_rejected():
  with pytest.raises(ValueError, match='mode'):
    attn.DotProductCausalAttention(mode='decode')
  with pytest.raises(ValueError, match='dropout must be'):
    attn.Attention(8, dropout=1.0)


def _shapes(tree):
  return jax.tree_util.tree_map(lambda a: tuple(a.shape), tree)


def test_attention_weight_tree_matches_trax_layout():
  # Trax 1.4.1: Attention = Serial(AS, Serial(Select, AttentionQKV), AS) and
  # AttentionQKV = Serial(AS, Serial(Parallel(Dense x3), PureAttention,
  # Dense), AS); AS (AssertShape) has no weights.
  layer = attn.Attention(8, n_heads=2)
  w, s = layer.init((ShapeDtype((2, 5, 8)), ShapeDtype((2, 1, 1, 5), bool)))
  dense = ((8, 8), (8,))
  assert _shapes(w) == ((), ((), ((), ((dense, dense, dense), (), dense), ())),
                        ())
  assert not jax.tree_util.tree_leaves(s)


def test_causal_attention_weight_tree_matches_trax_layout():
  # Trax 1.4.1: CausalAttention = Serial(AS, ConfigurableAttention, AS);
  # ConfigurableAttention = Serial(AS, Serial(Branch, DPCA, MergeHeads,
  # Dense), AS); Branch = Serial(Select, Parallel(Serial(Dense, Split) x3));
  # Split/MergeHeads = Serial(AS, Fn, AS).
  layer = attn.CausalAttention(32, n_heads=2)
  w, _ = layer.init(ShapeDtype((2, 5, 32)))
  dense = ((32, 32), (32,))
  fn3 = ((), (), ())
  branch = ((), ((dense, fn3), (dense, fn3), (dense, fn3)))
  assert _shapes(w) == ((), ((), (branch, (), fn3, dense), ()), ())
  # Leaves in the order of Trax's flat checkpoint (golden transformerlm,
  # weights 4-11: the first decoder block's attention).
  flat = [tuple(a.shape) for a in jax.tree_util.tree_leaves(w)]
  assert flat == [(32, 32), (32,)] * 4


# --- the eval-vs-predict helper itself -------------------------------------------


def test_predict_helper_detects_a_predict_mode_mismatch():
  # ShiftRight shifts in eval mode but is the identity in predict mode, so
  # feeding predict mode the unshifted inputs must be caught.
  def make(mode):
    return cb.Serial(attn.ShiftRight(mode=mode), core.Dense(3))
  x = randn(1, 4, 3)
  with pytest.raises(AssertionError, match='predict mode differs'):
    predict_utils.assert_eval_equals_predict(make, x)
  predict_utils.assert_eval_equals_predict(
      make, x, predict_inputs=predict_utils.shift_right(x))


def test_predict_helper_eval_on_prefixes_and_partial_decode():
  make = functools.partial(attn.CausalAttention, 4, n_heads=2,
                           max_inference_length=8)
  worst = predict_utils.assert_eval_equals_predict(
      make, randn(2, 8, 4), n_steps=5, first_chunk=2, eval_on_prefixes=True)
  assert worst < 1e-5
