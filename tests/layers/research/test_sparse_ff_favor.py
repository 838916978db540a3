"""BlockSparseFF / SwitchSparseFF and FAVOR attention against numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.research import favor
from retrax.layers.research import sparse_ff
from tests.backend_tolerance import float32_tolerance
from tests.layers import predict_utils

RNG = jax.random.PRNGKey(0)


def _randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _moe_ref(x, m1, w1, w2, b2, n_experts, scale_by_prob):
  """Each row goes through the block of its argmax expert only."""
  x2 = x.reshape(-1, x.shape[-1])
  logits = x2 @ m1
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  expert = probs.argmax(-1)
  block = w1.shape[1] // n_experts
  out = np.zeros_like(x2)
  for i, e in enumerate(expert):
    cols = slice(e * block, (e + 1) * block)
    mid = x2[i] @ w1[:, cols]
    if scale_by_prob:
      mid = mid * probs[i, e]
    out[i] = np.maximum(mid, 0) @ w2[cols] + b2
  return out.reshape(x.shape)


@pytest.mark.parametrize('cls,scale', [(sparse_ff.BlockSparseFF, False),
                                       (sparse_ff.SwitchSparseFF, True)])
def test_routed_ff_eval_matches_numpy(cls, scale):
  x = _randn(2, 5, 6)
  layer = cls(16, n_experts=4, mode='eval')
  weights, state = layer.init(shapes.signature(x), rng=RNG)
  assert [w.shape for w in weights] == [(6, 4), (6, 16), (16, 6), (6,)]
  y, _ = layer.pure_fn(x, weights, state, RNG)
  want = _moe_ref(x, *[np.asarray(w) for w in weights], n_experts=4,
                  scale_by_prob=scale)
  np.testing.assert_allclose(y, want,
                             **float32_tolerance(rtol=1e-5, atol=1e-5))


@pytest.mark.parametrize('cls', [sparse_ff.BlockSparseFF,
                                 sparse_ff.SwitchSparseFF])
def test_routed_ff_predict_single_position_equals_eval(cls):
  x = _randn(1, 6, 6)
  make = lambda mode: cls(16, n_experts=4, mode=mode)
  predict_utils.assert_eval_equals_predict(make, x, atol=1e-5)


def test_switch_router_gets_gradient_block_straight_through():
  x = _randn(3, 4, 6)
  for cls in (sparse_ff.SwitchSparseFF, sparse_ff.BlockSparseFF):
    layer = cls(8, n_experts=2, mode='train')
    weights, state = layer.init(shapes.signature(x), rng=RNG)
    grads = []
    for seed in range(4):  # BlockSparseFF uses the soft mask half the time.
      rng = jax.random.PRNGKey(seed)
      loss = lambda w, rng=rng, layer=layer, state=state: jnp.sum(
          layer.pure_fn(x, w, state, rng)[0]**2)
      grads.append(jax.grad(loss)(weights)[0])
    assert max(float(jnp.abs(g).max()) for g in grads) > 0


def test_routed_ff_errors():
  with pytest.raises(ValueError, match='multiple of n_experts'):
    sparse_ff.BlockSparseFF(10, n_experts=4)
  layer = sparse_ff.SwitchSparseFF(8, n_experts=2)
  layer.init(shapes.ShapeDtype((1, 2, 4)))
  with pytest.raises(tl.LayerError, match='depth 4'):
    layer(np.zeros((1, 2, 5), np.float32))


def _favor_ref(q, k, v, mask, n_heads, causal, stabilizer=0.001):
  qp = np.maximum(q, 0) + stabilizer
  kp = np.maximum(k, 0) + stabilizer
  if mask is not None:
    kp = kp * np.repeat(mask.reshape(-1, 1, k.shape[1]), n_heads,
                        axis=0).reshape(k.shape[0], k.shape[1], 1)
  scores = np.einsum('blm,bsm->bls', qp, kp)
  if causal:
    scores = scores * np.tril(np.ones(scores.shape[1:]))
  return np.einsum('bls,bsd->bld', scores, v) / scores.sum(-1, keepdims=True)


def test_favor_attention_matches_numpy():
  q, k, v = (_randn(4, 5, 3, seed=s) for s in range(3))
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool).reshape(2, 1, 1, 5)
  layer = favor.FavorAttention(d_feature=6, n_heads=2)
  out, mask_out = layer((q, k, v, mask))
  np.testing.assert_allclose(out, _favor_ref(q, k, v, mask, 2, False),
                             rtol=1e-4, atol=1e-5)
  assert mask_out is mask


def test_favor_softmax_features_approximate_softmax_attention():
  q, k = _randn(1, 6, 4, seed=1) * .3, _randn(1, 6, 4, seed=2) * .3
  v = _randn(1, 6, 4, seed=3)
  mask = np.ones((1, 1, 1, 6), bool)
  layer = favor.FavorAttention(d_feature=4, n_heads=1, n_random_features=4096,
                               use_approximate_softmax=True,
                               scale_by_norm=True)
  out, _ = layer((q, k, v, mask))
  logits = q[0] @ k[0].T
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(out[0], probs @ v[0], atol=0.1)


def test_orthogonal_feature_matrix_blocks_are_orthogonal():
  m = np.asarray(favor.orthogonal_feature_matrix(RNG, 10, 4,
                                                 scale_by_norm=False))
  assert m.shape == (10, 4)
  for start in (0, 4):
    block = m[start:start + 4] / 2.0  # rows scaled by sqrt(4)
    np.testing.assert_allclose(block @ block.T, np.eye(4), atol=1e-5)


def test_causal_favor_matches_numpy_and_its_gradient():
  q, k, v = (_randn(4, 6, 3, seed=s) for s in range(3))
  layer = favor.CausalFavorAttention()
  np.testing.assert_allclose(layer((q, k, v)),
                             _favor_ref(q, k, v, None, 2, True),
                             rtol=1e-4, atol=1e-5)

  def naive(q, k, v):
    qp, kp = jax.nn.relu(q) + 0.001, jax.nn.relu(k) + 0.001
    s = jnp.einsum('blm,bsm->bls', qp, kp) * jnp.tril(jnp.ones((1, 6, 6)))
    return jnp.einsum('bls,bsd->bld', s, v) / s.sum(-1, keepdims=True)

  ct = _randn(4, 6, 3, seed=9)
  ours = jax.grad(lambda *a: jnp.sum(layer.pure_fn(a, (), (), RNG)[0] * ct),
                  argnums=(0, 1, 2))(q, k, v)
  want = jax.grad(lambda *a: jnp.sum(naive(*a) * ct), argnums=(0, 1, 2))(
      q, k, v)
  for got, exp in zip(ours, want):
    np.testing.assert_allclose(got, exp, rtol=1e-4, atol=1e-5)


def test_causal_favor_predict_equals_eval():
  x = _randn(2, 7, 8)
  make = lambda mode: favor.CausalFavor(8, n_heads=2, mode=mode)
  predict_utils.assert_eval_equals_predict(make, x, atol=1e-5, first_chunk=3)


def test_favor_layers_shapes():
  x = _randn(2, 5, 8)
  mask = np.ones((2, 1, 1, 5), bool)
  layer = favor.Favor(8, n_heads=2)
  layer.init(shapes.signature((x, mask)))
  y, _ = layer((x, mask))
  assert y.shape == x.shape
  with pytest.raises(ValueError, match='multiple of n_heads'):
    favor.FavorAttention(d_feature=6, n_heads=4)
