"""Long-sequence memory policies of the efficient attention: the same values and gradients.

Hashing in chunks of rows (`ops.HASH_CHUNK_ELEMENTS`), attention in
rematerialized blocks of chunks with any window (`ops.BLOCK_MIN_LOGITS`),
`forward_and_or_backward(subtract_from=...)`, and the reversible layer's
two-pass attention backward (`residual.TWO_PASS_MIN_ELEMENTS`), each
against the plain computation at a size where the policy is forced on.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax.layers.attention import ops
from retrax.layers.reversible import residual
from retrax.shapes import signature


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


@pytest.mark.parametrize('n_buckets', [8, [4, 6]])
def test_hash_vecs_in_chunks_of_rows_equals_whole(monkeypatch, n_buckets):
  vecs = _normal(0, (37, 5))  # 37 rows: the last chunk is padded
  whole = ops.hash_vecs(vecs, n_buckets, 3, jax.random.PRNGKey(1))
  monkeypatch.setattr(ops, 'HASH_CHUNK_ELEMENTS', 3 * 10 * 8)
  jaxpr = str(jax.make_jaxpr(
      lambda v: ops.hash_vecs(v, n_buckets, 3, jax.random.PRNGKey(1))[0])(vecs))
  assert 'scan' in jaxpr or 'while' in jaxpr
  chunked = ops.hash_vecs(vecs, n_buckets, 3, jax.random.PRNGKey(1))
  np.testing.assert_array_equal(chunked[0], whole[0])
  assert chunked[1] == whole[1]


@pytest.mark.parametrize('shared', [True, False])
def test_attend_in_blocks_with_a_wide_window_equals_whole(monkeypatch, shared):
  # 13 chunks of 4, blocks of 3 (a remainder of 1), 2 chunks before and 1
  # after: the blocks' neighbours wrap around the ends.
  q, k, v = _normal(0, (52, 4)), _normal(1, (52, 4)), _normal(2, (52, 3))
  info = jax.random.permutation(jax.random.PRNGKey(3), 52)
  mask_fn = functools.partial(ops.mask_self_attention, causal=False,
                              exclude_self=shared)

  def loss(q, k, v):
    out, lse = ops.attend(q, None if shared else k, v, q_chunk_len=4,
                          kv_chunk_len=None if shared else 4,
                          n_chunks_before=2, n_chunks_after=1,
                          mask_fn=mask_fn, q_info=info,
                          kv_info=None if shared else info)
    return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(lse)), (out, lse)

  grad = jax.value_and_grad(loss, (0, 1, 2), has_aux=True)
  whole = jax.jit(grad)(q, k, v)
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', 3)
  monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 0)
  blocked = jax.jit(grad)(q, k, v)
  for got, want in zip(jax.tree_util.tree_leaves(blocked),
                       jax.tree_util.tree_leaves(whole)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _lsh(batch=1, length=32, d_model=8):
  layer = tl.LSHSelfAttention(n_heads=2, d_qk=4, d_v=4, causal=True,
                              chunk_len=8, n_hashes=2, mode='train')
  x = _normal(0, (batch, length, d_model))
  layer.init(signature(x), rng=jax.random.PRNGKey(1))
  return layer, x


@pytest.mark.parametrize('batch', [1, 2])
def test_subtract_from_is_the_difference_with_the_same_gradients(batch):
  layer, x = _lsh(batch)
  _, new_state = layer.pure_fn(x, layer.weights, layer.state,
                               jax.random.PRNGKey(2))
  base, ct = _normal(3, x.shape), _normal(4, x.shape)
  args = (x, layer.weights, new_state, jax.random.PRNGKey(2))
  kwargs = dict(output_grad=ct, update_state=False)

  @jax.jit
  def both(args, base):
    plain = layer.forward_and_or_backward(*args, **kwargs)
    return plain, layer.forward_and_or_backward(*args, subtract_from=base,
                                                **kwargs)
  (out, _, x_ct, w_ct), (diff, _, x_ct2, w_ct2) = both(args, base)
  np.testing.assert_allclose(diff, base - out, rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree_util.tree_leaves((x_ct2, w_ct2)),
                       jax.tree_util.tree_leaves((x_ct, w_ct))):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match='subtract_from'):
    layer.forward_and_or_backward(*args, subtract_from=base[..., :4],
                                  **kwargs)


def test_two_pass_attention_backward_equals_one_pass(monkeypatch):
  layer, x = _lsh()
  rhr = tl.ReversibleHalfResidual(tl.LayerNorm(), attention_layer=layer)
  xs = (_normal(5, x.shape), x)
  rhr.init(signature(xs), rng=jax.random.PRNGKey(6))
  y, new_state = rhr.pure_fn(xs, rhr.weights, rhr.state, jax.random.PRNGKey(7))
  ct = (_normal(8, x.shape), _normal(9, x.shape))

  def backward(y, ct):
    return rhr.reverse_and_grad(y, ct, rhr.weights, rhr.state, new_state,
                                jax.random.PRNGKey(7))
  one = jax.jit(backward)(y, ct)
  monkeypatch.setattr(residual, 'TWO_PASS_MIN_ELEMENTS', 0)
  two = jax.jit(backward)(y, ct)
  for got, want in zip(jax.tree_util.tree_leaves(two),
                       jax.tree_util.tree_leaves(one)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(two[0][0], xs[0], rtol=1e-5, atol=1e-5)
