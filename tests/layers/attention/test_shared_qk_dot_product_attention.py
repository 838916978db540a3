"""SharedQKDotProductAttention: Trax 1.2's shared-QK full attention (keys = queries)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax.layers.attention import efficient as ea
from tests.backend_tolerance import float32_tolerance

import efficient_attention_refs as refs


def _weights(n_heads, d_model, d_qk, d_v, seed=0):
  rng = np.random.RandomState(seed)
  shapes = [(d_model, d_qk), (d_model, d_v), (d_v, d_model)]
  # Scaled up so that the logits are far from uniform.
  return tuple((3 * rng.normal(size=(n_heads,) + s) / np.sqrt(s[0])).astype(
      np.float32) for s in shapes)


def numpy_reference(x, weights, causal):
  """Trax 1.2's DotProductCausalAttention with keys duplicated from queries."""
  w_q, w_v, w_o = (np.asarray(w, np.float64) for w in weights)
  x = np.asarray(x, np.float64)
  length = x.shape[1]
  out = np.zeros_like(x)
  for h in range(w_q.shape[0]):
    q, v = x @ w_q[h], x @ w_v[h]
    dots = q @ np.swapaxes(q, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
      dots = np.where(np.tril(np.ones((length, length), bool)), dots, -1e9)
    p = np.exp(dots - dots.max(-1, keepdims=True))
    out += (p / p.sum(-1, keepdims=True)) @ v @ w_o[h]
  return out


@pytest.mark.parametrize('causal', [True, False])
def test_matches_numpy_reference(causal):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 9, 6))
  weights = _weights(2, 6, 4, 3)
  layer = tl.SharedQKDotProductAttention(n_heads=2, d_qk=4, d_v=3,
                                         causal=causal, mode='eval')
  got, _ = jax.jit(layer.pure_fn)(x, weights, (), jax.random.PRNGKey(0))
  np.testing.assert_allclose(got, numpy_reference(x, weights, causal),
                             **float32_tolerance(rtol=1e-5, atol=1e-5))


def test_differs_from_normalised_shared_qk_and_attends_to_itself():
  # The same weights under SelfAttention(share_qk=True), whose keys are
  # normalised and whose own key is masked, give another function; position 0
  # (causal) can only attend to itself here.
  x = jax.random.normal(jax.random.PRNGKey(1), (1, 8, 6))
  weights = _weights(2, 6, 4, 3)
  kwargs = dict(n_heads=2, d_qk=4, d_v=3, causal=True, mode='eval')
  plain, _ = tl.SharedQKDotProductAttention(**kwargs).pure_fn(
      x, weights, (), jax.random.PRNGKey(0))
  normed, _ = tl.SelfAttention(share_qk=True, **kwargs).pure_fn(
      x, weights, (), jax.random.PRNGKey(0))
  assert np.max(np.abs(plain - normed)) > 1e-2
  w_q, w_v, w_o = weights
  first = sum(x[0, 0] @ w_v[h] @ w_o[h] for h in range(2))
  np.testing.assert_allclose(plain[0, 0], first, rtol=1e-5, atol=1e-5)


def test_weights_are_those_of_lsh_attention():
  x = jnp.zeros((1, 16, 8))
  kwargs = dict(n_heads=2, d_qk=4, d_v=4, causal=True)
  plain = tl.SharedQKDotProductAttention(**kwargs)
  lsh = tl.LSHSelfAttention(chunk_len=4, **kwargs)
  plain.init(jax.ShapeDtypeStruct(x.shape, x.dtype))
  lsh.init(jax.ShapeDtypeStruct(x.shape, x.dtype))
  shapes = lambda w: jax.tree_util.tree_map(jnp.shape, w)
  assert shapes(plain.weights) == shapes(lsh.weights)


@pytest.mark.parametrize('chunk_len', [None, 4])
def test_eval_equals_predict(chunk_len):
  x = jax.random.normal(jax.random.PRNGKey(2), (2, 10, 6))
  weights = _weights(2, 6, 4, 3)
  kwargs = dict(n_heads=2, d_qk=4, d_v=3, causal=True, chunk_len=chunk_len,
                n_chunks_before=1 if chunk_len else 0)
  want, _ = jax.jit(tl.SharedQKDotProductAttention(mode='eval', **kwargs)
                    .pure_fn)(x, weights, (), jax.random.PRNGKey(0))
  got = refs.predict_outputs(
      tl.SharedQKDotProductAttention(mode='predict', **kwargs), x, weights,
      jax.random.PRNGKey(0))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_separate_keys_are_refused():
  with pytest.raises(ValueError, match='share_qk=False'):
    ea.SharedQKDotProductAttention(share_qk=False)
