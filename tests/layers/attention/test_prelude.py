"""`forward_and_or_backward(prelude=..., input_grad_init=...)`: the LayerNorm inside the loop.

With a `groups.Prelude` the attention runs it (and its heads' input
projections) chunk by chunk of positions inside its loop over heads, and
adds the input's cotangent onto `input_grad_init`. Each case is checked
against the layer applied, all heads projected at once (the default path
at these sizes), to the LayerNorm's output, differentiated by `jax.vjp`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax.errors import InputValueError
from retrax.layers import position_chunks
from retrax.layers.attention import efficient_base
from retrax.layers.attention import groups
from retrax.shapes import signature
from retrax.validation import ArgumentValueError

D_MODEL = 8


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _layer(kind, n_parallel_heads, dropout=0.0):
  kwargs = dict(n_heads=2, d_qk=4, d_v=4, causal=True, chunk_len=8,
                mode='train', n_parallel_heads=n_parallel_heads,
                attention_dropout=dropout, output_dropout=dropout)
  if kind == 'lsh':
    return tl.LSHSelfAttention(n_hashes=2, **kwargs)
  if kind == 'lsh_masked':
    return tl.LSHSelfAttention(n_hashes=2, masked=True, **kwargs)
  return tl.SelfAttention(n_chunks_before=1, **kwargs)  # q, k, v projected


def _case(kind, batch, n_parallel_heads, length=32, dropout=0.0):
  layer = _layer(kind, n_parallel_heads, dropout)
  norm = tl.LayerNorm()
  x = _normal(0, (batch, length, D_MODEL))
  norm.init(signature(x), rng=jax.random.PRNGKey(1))
  # Not the identity: a LayerNorm whose scale and bias are random.
  norm_w = (1.0 + 0.3 * _normal(2, (D_MODEL,)), 0.2 * _normal(3, (D_MODEL,)))
  inputs = x
  if kind == 'lsh_masked':
    mask = jnp.arange(length)[None, :] < jnp.array([[length - 5]] * batch)
    inputs = (x, mask)
    layer.init(signature((x, mask)), rng=jax.random.PRNGKey(4))
  else:
    layer.init(signature(x), rng=jax.random.PRNGKey(4))

  def norm_fn(x, w):
    return norm.pure_fn(x, w, norm.state, jax.random.PRNGKey(5))[0]
  return layer, inputs, norm_fn, norm_w


def _with_first(inputs, x):
  return (x,) + tuple(inputs[1:]) if isinstance(inputs, tuple) else x


@pytest.mark.parametrize(
    'kind,batch,n_parallel_heads,chunk_elements,dropout', [
        ('lsh', 1, None, None, 0.0),
        ('lsh', 2, None, 4 * D_MODEL, 0.0),     # 16 chunks of 2 positions
        ('lsh', 2, 2, 12 * D_MODEL, 0.0),       # groups of 2 heads; 8 chunks
        ('lsh_masked', 2, 4, 8 * D_MODEL, 0.0),  # 2 examples x 2 heads
        ('self', 2, None, 8 * D_MODEL, 0.0),
        # Attention and output dropout: each group drops its heads' sum.
        ('lsh', 2, 2, 12 * D_MODEL, 0.4),
        ('self', 2, None, 8 * D_MODEL, 0.4),
    ])
def test_prelude_equals_the_layer_after_it(monkeypatch, kind, batch,
                                           n_parallel_heads, chunk_elements,
                                           dropout):
  layer, inputs, norm_fn, norm_w = _case(kind, batch, n_parallel_heads,
                                         dropout=dropout)
  x = inputs[0] if isinstance(inputs, tuple) else inputs
  rng = jax.random.PRNGKey(6)
  _, state = layer.pure_fn(_with_first(inputs, norm_fn(x, norm_w)),
                           layer.weights, layer.state, rng)
  ct, init = _normal(7, x.shape), _normal(8, x.shape)

  def plain(x, norm_w, w):  # Hashes as the call that made `state`.
    out, _ = layer.pure_fn(_with_first(inputs, norm_fn(x, norm_w)), w,
                           layer.state, rng)
    return out
  assert not layer.folds_prelude(x.shape)  # projected at once here
  want, vjp_fn = jax.vjp(plain, x, norm_w, layer.weights)
  want_x_ct, want_norm_ct, want_w_ct = vjp_fn(ct)

  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  if chunk_elements:
    monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', chunk_elements)
  assert layer.folds_prelude(x.shape)
  n_chunks = efficient_base.prelude_chunks(x.shape)
  assert (n_chunks > 1) == (chunk_elements is not None), n_chunks

  @jax.jit
  def folded(inputs, norm_w, w, init):
    return layer.forward_and_or_backward(
        inputs, w, state, rng, output_grad=ct, update_state=False,
        prelude=groups.Prelude(norm_fn, norm_w), input_grad_init=init)
  out, _, in_ct, (norm_ct, w_ct) = folded(inputs, norm_w, layer.weights, init)
  got_x_ct = in_ct[0] if isinstance(in_ct, tuple) else in_ct
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_x_ct, init + want_x_ct, rtol=1e-5,
                             atol=1e-5)
  for got, want_ct in zip(jax.tree_util.tree_leaves((norm_ct, w_ct)),
                          jax.tree_util.tree_leaves((want_norm_ct,
                                                     want_w_ct))):
    np.testing.assert_allclose(got, want_ct, rtol=1e-5, atol=1e-5)

  # Forward only, and subtracted from a buffer (the reversible rebuild).
  base = _normal(9, x.shape)
  diff, _, _, _ = jax.jit(lambda i, b: layer.forward_and_or_backward(
      i, layer.weights, state, rng, update_state=False, subtract_from=b,
      prelude=groups.Prelude(norm_fn, norm_w)))(inputs, base)
  np.testing.assert_allclose(diff, base - want, rtol=1e-5, atol=1e-5)
  # A new state, as the layer makes it from the LayerNorm's output.
  _, new_state, _, _ = jax.jit(lambda i: layer.forward_and_or_backward(
      i, layer.weights, layer.state, rng,
      prelude=groups.Prelude(norm_fn, norm_w)))(inputs)
  for got, want_s in zip(jax.tree_util.tree_leaves(new_state),
                         jax.tree_util.tree_leaves(state)):
    np.testing.assert_array_equal(got, want_s)


def test_output_projection_transpose_runs_at_full_precision(monkeypatch):
  # `groups.TRANSPOSE_PRECISION`: the two products that take the stream's
  # cotangent (the output projection's transpose and its weights'
  # cotangent) name full precision, so a TPU makes no bfloat16 copy of it
  # for XLA to hoist out of the loop over groups; the rest keep the default.
  layer, inputs, norm_fn, norm_w = _case('lsh', 1, None)
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 4 * D_MODEL)
  rng = jax.random.PRNGKey(6)
  _, state = layer.pure_fn(_with_first(inputs, norm_fn(inputs, norm_w)),
                           layer.weights, layer.state, rng)

  def dot_precisions(grad):
    # Traced at the default precision: on a TPU the tests set 'highest' for
    # every matmul (the root conftest), which every dot would then name.
    with jax.default_matmul_precision('default'):
      jaxpr = str(jax.make_jaxpr(lambda x: layer.forward_and_or_backward(
          x, layer.weights, state, rng, update_state=False,
          output_grad=x if grad else None,
          prelude=groups.Prelude(norm_fn, norm_w),
          input_grad_init=jnp.zeros_like(x) if grad else None))(inputs))
    return jaxpr.count('dot_general'), jaxpr.count('Precision.HIGHEST')
  n_dots, n_highest = dot_precisions(grad=True)
  # Two products, each traced as its vjp's forward (unused) and transpose;
  # each dot names the precision of both operands.
  assert n_highest == 2 * 2 * 2 and n_dots > n_highest // 2
  assert dot_precisions(grad=False)[1] == 0


def test_prelude_errors(monkeypatch):
  layer, x, norm_fn, norm_w = _case('lsh', 1, None)
  state = layer.state
  rng = jax.random.PRNGKey(6)
  prelude = groups.Prelude(norm_fn, norm_w)
  with pytest.raises(ArgumentValueError, match='folds_prelude'):
    layer.forward_and_or_backward(x, layer.weights, state, rng,
                                  prelude=prelude)
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 0)
  wider = groups.Prelude(lambda x, w: jnp.concatenate([x, x], -1), ())
  with pytest.raises(InputValueError, match="keep its input's shape"):
    layer.forward_and_or_backward(x, layer.weights, state, rng,
                                  prelude=wider)
  with pytest.raises(InputValueError, match='input_grad_init needs'):
    layer.forward_and_or_backward(x, layer.weights, state, rng,
                                  input_grad_init=x)
  with pytest.raises(InputValueError, match='input_grad_init needs'):
    layer.forward_and_or_backward(x, layer.weights, state, rng,
                                  output_grad=x, input_grad_init=x[..., :4])


def test_prelude_chunks_divide_the_length(monkeypatch):
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 4 * D_MODEL)
  assert efficient_base.prelude_chunks((1, 32, D_MODEL)) == 8
  assert efficient_base.prelude_chunks((1, 36, D_MODEL)) == 9
  assert efficient_base.prelude_chunks((1, 38, D_MODEL)) == 19  # 10..20
  assert efficient_base.prelude_chunks((1, 37, D_MODEL)) == 1  # prime: whole
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 2 ** 22)
  assert efficient_base.prelude_chunks((1, 32, D_MODEL)) == 1
