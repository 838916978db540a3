"""Position-chunked half-residuals (`layers.position_chunks`): the same values and gradients.

A `ReversibleHalfResidual` whose `f` is position-wise runs over chunks of
positions once the sequence is long (`chunks.CHUNK_ELEMENTS`, made small
here); its forward, reverse and `reverse_and_grad` must equal the whole-array
path's, up to the order of the weight gradients' float sums.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax.layers import reversible as rv
from retrax.layers import position_chunks as chunks
from retrax.models.research import configurable_transformer as ct
from retrax.shapes import signature

D, D_FF = 8, 32


def _ff_half(dropout=0.0, shared_axes=(-2,), mode='train'):
  """The Reformer's feed-forward half-residual (LayerNorm ... Dropout)."""
  ff = ct.FeedForwardWithOptions(D, D_FF, dropout, list(shared_axes),
                                 tl.FastGelu, dropout, 0, 0, 0, True, mode)
  return rv.ReversibleHalfResidual(ff)


def _init(layer, shape):
  x = tuple(jax.random.normal(k, shape) for k in
            jax.random.split(jax.random.PRNGKey(0), 2))
  layer.init(signature(x), rng=jax.random.PRNGKey(1))
  return x


def _passes(layer, x):
  """forward, reverse and reverse_and_grad of `layer` at `x` (one rng)."""
  @jax.jit
  def passes(x, w, s, rng):
    y, new_s = layer.pure_fn(x, w, s, rng)
    ct_y = tuple(jnp.cos(3.0 * a) for a in y)
    back = layer.reverse(y, w, s, new_s, rng)
    x_rec, (ct_x, ct_w) = layer.reverse_and_grad(y, ct_y, w, s, new_s, rng)
    return y, back, x_rec, ct_x, ct_w
  return passes(x, layer.weights, layer.state, jax.random.PRNGKey(2))


@pytest.mark.parametrize('length', [40, 37])  # 37: chunks padded at the end
@pytest.mark.parametrize('dropout', [0.0, 0.4])
def test_chunked_half_residual_equals_whole(monkeypatch, length, dropout):
  layer = _ff_half(dropout)
  x = _init(layer, (2, length, D))
  assert chunks.n_chunks(layer.sublayers[0], x[1]) == 1
  whole = _passes(layer, x)
  # 2 examples x 4 positions x d_ff 32 per chunk: 10 chunks of 4 positions.
  monkeypatch.setattr(chunks, 'CHUNK_ELEMENTS', 2 * 4 * D_FF)
  assert chunks.n_chunks(layer.sublayers[0], x[1]) == -(-length // 4)
  jaxpr = str(jax.make_jaxpr(lambda x: layer.pure_fn(
      x, layer.weights, layer.state, jax.random.PRNGKey(2)))(x))
  assert 'scan' in jaxpr or 'while' in jaxpr
  chunked = _passes(layer, x)
  # Float32 sums over 2 x 40 rows of values up to ~10 in another order.
  for got, want in zip(jax.tree_util.tree_leaves(chunked),
                       jax.tree_util.tree_leaves(whole)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  # And the gradients are those of plain autodiff of acc + f(ctx).
  w, s, rng = layer.weights, layer.state, jax.random.PRNGKey(2)
  f = layer.sublayers[0]
  rngs = jax.random.split(rng, 1)

  def plain(x, w):  # Its gradient at y is ct_y = cos(3 y).
    y = x[0] + f.pure_fn(x[1], w[0], s[0], rngs[0])[0]
    return jnp.sum(jnp.sin(3.0 * y) + jnp.sin(3.0 * x[1])) / 3.0
  want_x, want_w = jax.grad(plain, (0, 1))(x, w)
  for got, want in zip(chunked[3], want_x):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
  for got, want in zip(jax.tree_util.tree_leaves(chunked[4]),
                       jax.tree_util.tree_leaves(want_w)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_what_is_chunked(monkeypatch):
  monkeypatch.setattr(chunks, 'CHUNK_ELEMENTS', 16)
  x = jnp.zeros((1, 64, D))
  assert chunks.n_chunks(_ff_half().sublayers[0], x) > 1
  # Dropout whose mask differs between positions would change: not chunked.
  assert chunks.n_chunks(_ff_half(0.1, shared_axes=()).sublayers[0], x) == 1
  assert chunks.n_chunks(_ff_half(0.1, shared_axes=(), mode='eval')
                         .sublayers[0], x) > 1
  # Layers that mix positions, integer inputs, and one-position inputs.
  assert chunks.n_chunks(tl.Serial(tl.Dense(D), tl.CausalConv(D)), x) == 1
  assert chunks.n_chunks(tl.Serial(tl.Dense(D)), jnp.zeros((1, 64), jnp.int32)) == 1
  assert chunks.n_chunks(tl.Serial(tl.Dense(D)), jnp.zeros((D,))) == 1
  monkeypatch.setattr(chunks, 'CHUNK_ELEMENTS', 2**22)
  assert chunks.n_chunks(_ff_half().sublayers[0], x) == 1  # short: whole


def test_reformer_feed_forward_is_chunked_at_long_lengths(monkeypatch):
  model = tl.Serial(tl.Dup(), rv.ReversibleSerial(
      [[_ff_half(), rv.ReversibleSwap()] for _ in range(2)]), tl.Concatenate())
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 64, D))
  model.init(signature(x), rng=jax.random.PRNGKey(1))

  def loss(w, x):
    return jnp.sum(jnp.sin(model.pure_fn(x, w, model.state,
                                         jax.random.PRNGKey(2))[0]))
  whole = jax.jit(jax.value_and_grad(loss, (0, 1)))(model.weights, x)
  monkeypatch.setattr(chunks, 'CHUNK_ELEMENTS', 8 * D_FF)
  chunked = jax.jit(jax.value_and_grad(loss, (0, 1)))(model.weights, x)
  for got, want in zip(jax.tree_util.tree_leaves(chunked),
                       jax.tree_util.tree_leaves(whole)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('length', [48, 37])  # 37: no divisor, padded map
def test_chunked_apply_adds_in_place(length):
  x = jax.random.normal(jax.random.PRNGKey(0), (2, length, D))
  acc = jax.random.normal(jax.random.PRNGKey(1), (2, length, 3))
  w = jax.random.normal(jax.random.PRNGKey(2), (D, 3))
  fn = lambda xc: jnp.tanh(xc @ w)
  assert chunks.divisor_chunks(length, 5) == (6 if length == 48 else None)
  jaxpr = str(jax.make_jaxpr(lambda x, a: chunks.chunked_apply(
      fn, x, 5, add_to=a))(x, acc))
  assert 'dynamic_update_slice' in jaxpr if length == 48 else 'scan' in jaxpr
  for add_to, want in ((None, fn(x)), (acc, acc + fn(x))):
    got = jax.jit(lambda x, a: chunks.chunked_apply(fn, x, 5, add_to=a))(
        x, add_to)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
