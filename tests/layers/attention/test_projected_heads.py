"""All heads projected at once (`groups.run_projected`) against the per-unit loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.attention import efficient_base
from retrax.layers.attention import lsh


def _pass(layer, inputs, weights, state, projected, monkeypatch, **kwargs):
  """`forward_and_or_backward` with all heads projected at once or per unit."""
  monkeypatch.setattr(efficient_base, 'projected_max_bytes',
                      lambda: 1 << 30 if projected else 0)
  assert (layer._projected_stages(jnp.shape(
      inputs[0] if isinstance(inputs, tuple) else inputs)) is not None) == (
          projected)
  return jax.jit(lambda i, w, s: layer.forward_and_or_backward(
      i, w, s, jax.random.PRNGKey(3), **kwargs))(inputs, weights, state)


def _assert_close(got, want):
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    if jnp.issubdtype(w.dtype, jnp.inexact):
      # The heads are summed in another order: float32 rounding (the keys'
      # bias gets a gradient of zero up to that rounding, ~1e-7).
      np.testing.assert_allclose(
          g, w, rtol=1e-5, atol=2e-6 * max(float(jnp.max(jnp.abs(w))), 1.0))
    else:
      np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize('kind,masked,bias,n_parallel_heads,batch,dropout', [
    ('lsh', False, False, None, 1, 0.0),
    ('lsh', True, True, 2, 2, 0.0),  # a mask per example, biases, unit pairs
    ('local', True, False, 2, 2, 0.0),  # queries, keys and values
    ('shared', False, True, None, 1, 0.0),  # queries and values
    # Output dropout on the heads' sum (every unit's mask is the same) and
    # attention dropout in the cores, as each unit drops them.
    ('lsh', True, False, 2, 2, 0.4),
    ('local', False, True, None, 1, 0.4),
    # LSH's queries and values projected side by side (`lsh.JOINT_PROJECTION`,
    # a TPU's default), against the loop's separate projections.
    ('lsh_joint', True, True, 2, 2, 0.0),
    ('lsh_joint', False, False, None, 1, 0.4),
])
def test_projected_pass_equals_per_unit_loop(kind, masked, bias,
                                             n_parallel_heads, batch, dropout,
                                             monkeypatch):
  monkeypatch.setattr(lsh, 'JOINT_PROJECTION', kind == 'lsh_joint')
  common = dict(n_heads=4, d_qk=8, d_v=8, chunk_len=8, causal=True,
                masked=masked, bias=bias, mode='train',
                n_parallel_heads=n_parallel_heads, attention_dropout=dropout,
                output_dropout=dropout)
  if kind in ('lsh', 'lsh_joint'):
    layer = tl.LSHSelfAttention(n_hashes=2, **common)
  else:  # Chunked local attention, one chunk back.
    layer = tl.SelfAttention(share_qk=kind == 'shared', n_chunks_before=1,
                             **common)
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, 32, 16))
  inputs = x
  if masked:
    inputs = (x, jnp.ones((batch, 32), bool).at[-1, 25:].set(False))
  weights, state = layer.init(shapes.signature(inputs))
  # Biases start at zero; make them count.
  weights = jax.tree_util.tree_map(
      lambda w: w + 0.1 * jax.random.normal(jax.random.PRNGKey(7), w.shape),
      weights)
  base = jax.random.normal(jax.random.PRNGKey(1), x.shape)
  ct = jax.random.normal(jax.random.PRNGKey(2), x.shape)
  runs = {}
  for projected in (True, False):
    forward = _pass(layer, inputs, weights, state, projected, monkeypatch)
    # A reversible layer's backward: base - attention, and gradients.
    backward = _pass(layer, inputs, weights, forward[1], projected,
                     monkeypatch, output_grad=ct, update_state=False,
                     subtract_from=base)
    runs[projected] = (forward, backward)
  _assert_close(runs[True], runs[False])
  forward, backward = runs[True]
  # Output dropout zeroes whole columns (features) of every position.
  dropped = np.all(np.asarray(forward[0]) == 0, axis=(0, 1))
  assert dropped.any() == (dropout > 0) and not dropped.all()
  assert forward[2] is None and forward[3] is None
  # The backward pass recomputes the attention in another compiled program,
  # whose float32 sums XLA may order differently (1.8e-6 off at 0.67 seen
  # under JAX 0.10.1): the same tolerance as between the two paths.
  _assert_close(backward[0], base - forward[0])
  if masked:  # The mask's cotangent is float0 zeros, as before.
    assert backward[2][1].dtype == jax.dtypes.float0


@pytest.mark.parametrize('joint', [False, True])
def test_gradients_match_finite_differences(monkeypatch, joint):
  """The projected pass's custom backward against central differences, with
  LSH's queries and values projected apart and side by side."""
  monkeypatch.setattr(efficient_base, 'projected_max_bytes', lambda: 1 << 30)
  monkeypatch.setattr(lsh, 'JOINT_PROJECTION', joint)
  # One chunk of all 16 positions and no neighbours: every query sees every
  # earlier key whatever the buckets, so a perturbation that moves a
  # position to another bucket does not make the loss jump.
  layer = tl.LSHSelfAttention(n_heads=2, d_qk=4, d_v=4, n_hashes=2,
                              chunk_len=16, n_chunks_before=0, causal=True,
                              mode='train')
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 8), jnp.float32)
  # Fixed weights: float32 central differences of this loss (~10) at eps
  # 1e-3 carry ~5e-3 of rounding, 0.3% of a directional derivative near 2
  # that some layer-seeded weights gave.
  weights, state = layer.init(shapes.signature(x), rng=jax.random.PRNGKey(4))
  _, state = layer.pure_fn(x, weights, state, jax.random.PRNGKey(3))

  @jax.jit
  def loss(w, x):
    y, _ = layer.pure_fn(x, w, state, jax.random.PRNGKey(3))
    return jnp.sum(jnp.sin(y))
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(weights, x)
  direction = jax.random.normal(jax.random.PRNGKey(5), x.shape)
  eps = 1e-3
  numeric = (loss(weights, x + eps * direction) -
             loss(weights, x - eps * direction)) / (2 * eps)
  np.testing.assert_allclose(jnp.vdot(grads[1], direction), numeric,
                             rtol=2e-3)
  w_dir = jax.tree_util.tree_map(
      lambda w: jax.random.normal(jax.random.PRNGKey(6), w.shape), weights)
  shifted = lambda s: jax.tree_util.tree_map(lambda w, d: w + s * d, weights,
                                             w_dir)
  numeric = (loss(shifted(eps), x) - loss(shifted(-eps), x)) / (2 * eps)
  analytic = sum(jnp.vdot(g, d) for g, d in zip(
      jax.tree_util.tree_leaves(grads[0]), jax.tree_util.tree_leaves(w_dir)))
  np.testing.assert_allclose(analytic, numeric, rtol=2e-3)


class _OwnForward(tl.LSHSelfAttention):
  def forward_unbatched(self, x, mask=None, **kwargs):
    out, state = super().forward_unbatched(x, mask, **kwargs)
    return 2 * out, state


def test_per_unit_loop_where_heads_cannot_be_projected_at_once():
  shape = (1, 64, 16)
  plain = dict(n_heads=2, d_qk=8, d_v=8, chunk_len=8, mode='train')
  assert tl.LSHSelfAttention(**plain)._projected_stages(shape) is not None
  # Output dropout (one mask for all units) applies to the heads' sum.
  assert tl.LSHSelfAttention(output_dropout=0.1, **plain)._projected_stages(
      shape) is not None
  # SelfAttention with d_model at most half the head depths multiplies its
  # weights first (its keys are the input itself): per unit.
  wide_heads = tl.SelfAttention(n_heads=2, d_qk=64, d_v=64, mode='train')
  assert wide_heads._projected_stages((1, 64, 16)) is None
  assert wide_heads._projected_stages((1, 64, 256)) is not None
  # A subclass's own per-unit function is what runs.
  assert _OwnForward(**plain)._projected_stages(shape) is None
  layer = _OwnForward(**plain)
  x = jax.random.normal(jax.random.PRNGKey(0), shape)
  weights, state = layer.init(shapes.signature(x))
  doubled, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(0))
  single, _ = tl.LSHSelfAttention(**plain).pure_fn(x, weights, state,
                                                   jax.random.PRNGKey(0))
  np.testing.assert_allclose(doubled, 2 * single, rtol=1e-5, atol=1e-6)
  # Longer than the budget: the per-unit loop's smaller working set.
  long = (1, efficient_base.projected_max_bytes() // (4 * 2 * 16) + 1, 16)
  assert tl.LSHSelfAttention(**plain)._projected_stages(long) is None
  assert lsh.LSHSelfAttention(**dict(plain, mode='predict', causal=True))._projected_stages(
      shape) is None


def test_all_heads_at_once_up_to_a_backends_budget(monkeypatch):
  """1 GiB of projections on accelerators, 256 MiB on a CPU (speed-neutral
  there, so memory decides)."""
  paper = tl.LSHSelfAttention(n_heads=16, d_qk=64, d_v=64, mode='train')
  at = lambda n: paper._projected_stages((1, n, 1024)) is not None
  for backend, longest in (('tpu', 131072), ('gpu', 131072), ('cpu', 32768)):
    monkeypatch.setattr(jax, 'default_backend', lambda b=backend: b)
    assert at(longest) and not at(2 * longest), backend


def test_queries_and_values_side_by_side_on_a_tpu_only(monkeypatch):
  # `lsh.JOINT_PROJECTION`'s default (None): one `[.., d_qk + d_v]`
  # projection per head on a TPU, two elsewhere.
  assert lsh.JOINT_PROJECTION is None
  layer = tl.LSHSelfAttention(n_heads=2, d_qk=4, d_v=3, n_hashes=2,
                              chunk_len=8)
  x = jnp.ones((1, 16, 8))
  weights, _ = layer.init(shapes.signature(x))
  for backend, widths in [('tpu', [7]), ('cpu', [4, 3])]:
    monkeypatch.setattr(jax, 'default_backend', lambda b=backend: b)
    units = layer._unit_stages(x.shape).project((x,), weights)  # pylint: disable=protected-access
    assert [u.shape[-1] for u in units] == widths
