"""PureLSHSelfAttention, its wrapper, MixedLSHSelfAttention and LSHFF.

References: outputs, states and gradients written by real Trax 1.4.1
(`fixtures/golden/terraformer/make_terraformer_goldens.py`), the projected
LSHSelfAttention (same buckets), plain softmax attention in numpy, and
autodiff of the reference (per-row Python loop) code.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.research import efficient_attention as ea
from tests.backend_tolerance import float32_tolerance

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'terraformer', 'layers.npz')
SEED, CALL_SEED, PROMPT = 3, 11, 4

# Same constructor arguments as make_terraformer_goldens.py.
CASES = {
    'pure_causal': lambda mode: ea.PureLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, causal=True, chunk_len=8, n_hashes=2,
        n_buckets=4, mode=mode),
    'pure_masked': lambda mode: ea.PureLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, causal=False, masked=True, chunk_len=8,
        n_chunks_after=1, n_hashes=2, n_buckets=[2, 2], mode=mode),
    'mixed_std_masked': lambda mode: ea.MixedLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, masked=True, std_length=32, chunk_len=8,
        n_hashes=2, n_buckets=4, mode=mode),
    'mixed_lsh_causal': lambda mode: ea.MixedLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, causal=True, std_length=16, chunk_len=8,
        n_hashes=2, n_buckets=4, mode=mode),
    'mixed_std_causal': lambda mode: ea.MixedLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, causal=True, std_length=32, chunk_len=8,
        n_hashes=2, n_buckets=4, mode=mode),
    'wrapper_w3_bias': lambda mode: ea.PureLSHSelfAttentionWrapper(
        n_heads=2, d_qk=8, d_v=8, causal=True, chunk_len=8, n_hashes=2,
        n_buckets=4, bias=True, num_weights=3,
        pure_lsh_implementation=ea.PureLSHSelfAttention, mode=mode),
    'wrapper_w2_masked': lambda mode: ea.PureLSHSelfAttentionWrapper(
        n_heads=2, d_qk=8, d_v=8, causal=False, masked=True, chunk_len=8,
        n_hashes=2, n_buckets=4, bias=False, num_weights=2,
        pure_lsh_implementation=ea.PureLSHSelfAttention, mode=mode),
    'lshff': lambda mode: ea.LSHFF(d_ff=32, n_buckets=[4, 2], n_hashes=2,
                                   mode=mode),
}


@pytest.fixture(scope='module')
def golden():
  return dict(np.load(GOLDEN))


@pytest.fixture(autouse=True)
def trax_random_bits():
  with jax.threefry_partitionable(False):
    yield


def _group(golden, name, prefix):
  n = 0
  while f'{name}/{prefix}{n}' in golden:
    n += 1
  return [golden[f'{name}/{prefix}{i}'] for i in range(n)]


def _with_leaves(tree, leaves):
  """`tree` with Trax's leaves, which must map one to one (count and shapes)."""
  own = jax.tree_util.tree_leaves(tree)
  assert len(own) == len(leaves)
  for a, b in zip(own, leaves):
    assert tuple(np.shape(a)) == b.shape
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree),
                                      [jnp.asarray(x) for x in leaves])


def _loaded(golden, name, mode='eval'):
  layer = CASES[name](mode)
  inputs = tuple(_group(golden, name, 'in'))
  arg = inputs if len(inputs) > 1 else inputs[0]
  weights, state = layer.init(shapes.signature(arg))
  weights = _with_leaves(weights, _group(golden, name, 'w'))
  state = _with_leaves(state, _group(golden, name, 's'))
  return layer, inputs, arg, weights, state


def _close(actual, desired, tol=1e-5):
  desired = np.asarray(desired)
  np.testing.assert_allclose(
      np.asarray(actual), desired,
      **float32_tolerance(rtol=0, atol=tol,
                          scale=max(1.0, np.abs(desired).max())))


@pytest.mark.parametrize('name', sorted(CASES))
def test_outputs_and_states_match_trax(golden, name):
  layer, _, arg, weights, state = _loaded(golden, name)
  out, new_state = layer.pure_fn(arg, weights, state,
                                 jax.random.PRNGKey(CALL_SEED))
  _close(out, golden[f'{name}/out'])
  for a, b in zip(jax.tree_util.tree_leaves(new_state),
                  _group(golden, name, 'ns')):
    np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize('name', sorted(set(CASES) - {'lshff'}))
def test_gradients_match_trax(golden, name):
  layer, inputs, _, weights, state = _loaded(golden, name)
  rng = jax.random.PRNGKey(CALL_SEED)
  ct = golden[f'{name}/ct']
  is_float = [x.dtype == np.float32 for x in inputs]

  def loss(w, floats):
    it = iter(floats)
    full = tuple(next(it) if f else x for x, f in zip(inputs, is_float))
    a = full if len(full) > 1 else full[0]
    return jnp.sum(layer.pure_fn(a, w, state, rng)[0] * ct)
  floats = tuple(jnp.asarray(x) for x, f in zip(inputs, is_float) if f)
  gw, gx = jax.grad(loss, argnums=(0, 1))(weights, floats)
  for a, b in zip(jax.tree_util.tree_leaves(gw), _group(golden, name, 'gw')):
    _close(a, b)
  for a, b in zip(gx, _group(golden, name, 'gx')):
    _close(a, b)


def test_predict_matches_trax_on_every_call(golden):
  name = 'pure_predict'
  layer = ea.PureLSHSelfAttention(
      n_heads=2, d_qk=8, d_v=8, causal=True, chunk_len=4, n_hashes=2,
      n_buckets=4, predict_mem_len=16, predict_drop_len=8, mode='predict')
  inputs = _group(golden, name, 'in')
  sig = tuple(shapes.ShapeDtype(x.shape[:1] + (1,) + x.shape[2:], x.dtype)
              for x in inputs)
  _, state = layer.init(sig)
  state = _with_leaves(state, _group(golden, name, 's'))
  rng = jax.random.PRNGKey(CALL_SEED)
  steps = [(0, PROMPT)] + [(t, t + 1)
                           for t in range(PROMPT, inputs[0].shape[1])]
  for i, (a, b) in enumerate(steps):
    out, state = layer.pure_fn(tuple(x[:, a:b] for x in inputs), (), state,
                               rng)
    _close(out, golden[f'{name}/out{i}'])


def _qkv(batch=2, heads=2, length=32, depth=8, seed=0):
  rs = np.random.RandomState(seed)
  return tuple(jnp.asarray(rs.normal(size=(batch * heads, length, depth)),
                           jnp.float32) for _ in range(2))


def test_equals_lsh_self_attention_on_its_projections():
  n_heads, d_head, batch, length = 4, 4, 1, 32
  kwargs = dict(n_heads=n_heads, d_qk=d_head, d_v=d_head, causal=True,
                chunk_len=8, n_hashes=4, n_buckets=8)
  lsh = tl.LSHSelfAttention(**kwargs)
  pure = ea.PureLSHSelfAttention(**kwargs)
  x = jax.random.uniform(jax.random.PRNGKey(0), (batch, length, 16))
  (w_qk, w_v, w_o), lsh_state = lsh.init(shapes.signature(x))
  expected = lsh(x, rng=jax.random.PRNGKey(42))
  qk = jnp.einsum('blm,hmn->bhln', x, w_qk).reshape((-1, length, d_head))
  v = jnp.einsum('blm,hmn->bhln', x, w_v).reshape((-1, length, d_head))
  pure.init(shapes.signature((qk, v)))
  out = pure((qk, v), state=lsh_state, rng=jax.random.PRNGKey(42))
  out = out.reshape((batch, n_heads, length, d_head))
  _close(jnp.einsum('bhld,hdm->blm', out, w_o), expected)


def test_one_bucket_round_is_chunked_softmax_attention():
  # One bucket: the sort is the identity, so each chunk of 8 attends to
  # itself and the previous chunk, causally, self only when alone.
  layer = ea.PureLSHSelfAttention(n_heads=1, d_qk=4, d_v=4, causal=True,
                                  chunk_len=8, n_hashes=1, n_buckets=2)
  qk, v = _qkv(batch=1, heads=1, length=16, depth=4)
  qk = qk.at[..., 0].set(50.0)  # Every vector hashes into the same bucket.
  layer.init(shapes.signature((qk, v)))
  out = np.asarray(layer((qk, v)))[0]
  q, vals = np.asarray(qk[0], np.float64), np.asarray(v[0], np.float64)
  k = q / np.sqrt(np.mean(q**2, -1, keepdims=True) + 1e-6) / 2.0
  logits = q @ k.T
  i, j = np.meshgrid(np.arange(16), np.arange(16), indexing='ij')
  visible = (j <= i) & (j // 8 >= i // 8 - 1)
  logits = np.where(visible, logits, -1e9) - 1e5 * (i == j)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  _close(out, probs @ vals, tol=1e-4)


@pytest.mark.parametrize('masked', [False, True])
def test_recomputing_backward_equals_reference_autodiff(masked):
  kwargs = dict(n_heads=2, d_qk=8, d_v=8, causal=not masked, masked=masked,
                chunk_len=8, n_hashes=2, n_buckets=4, n_parallel_heads=2)
  fast = ea.PureLSHSelfAttention(**kwargs)
  ref = ea.PureLSHSelfAttention(use_reference_code=True, **kwargs)
  qk, v = _qkv(batch=1, length=16)
  extra = (jnp.ones((1, 16), jnp.bool_).at[0, 10:].set(False),) if masked else ()
  inputs = (qk, v) + extra
  _, state = fast.init(shapes.signature(inputs))
  _, new_state = fast.pure_fn(inputs, (), state, jax.random.PRNGKey(0))
  ct = jax.random.normal(jax.random.PRNGKey(1), qk.shape)

  def loss(layer, qk, v):
    out = layer.pure_fn((qk, v) + extra, (), state, jax.random.PRNGKey(0))[0]
    return jnp.sum(out * ct)
  g_fast = jax.grad(functools.partial(loss, fast), argnums=(0, 1))(qk, v)
  ref.init(shapes.signature(inputs))
  g_ref = jax.grad(functools.partial(loss, ref), argnums=(0, 1))(qk, v)
  for a, b in zip(g_fast, g_ref):
    _close(a, b)
  assert len(jax.tree_util.tree_leaves(new_state)) == 2


def test_wrapper_in_reversible_half_residual_replays_buckets():
  attn = ea.PureLSHSelfAttentionWrapper(
      n_heads=2, d_qk=4, d_v=4, causal=True, chunk_len=8, n_hashes=2,
      n_buckets=4, num_weights=2, bias=False)
  block = tl.ReversibleSerial(
      tl.ReversibleHalfResidual(tl.LayerNorm(), attention_layer=attn),
      tl.ReversibleSwap())
  x = jax.random.normal(jax.random.PRNGKey(0), (1, 16, 8))
  weights, state = block.init(shapes.signature((x, x)))
  rng = jax.random.PRNGKey(5)

  def loss(w, a, b):
    y1, y2 = block.pure_fn((a, b), w, state, rng)[0]
    return jnp.sum(y1 * jnp.cos(y2))
  grads = jax.grad(loss, argnums=(0, 1, 2))(weights, x, x * 0.5)
  # The same function with the attention's buckets fixed by a first call:
  # a plain Serial of the same layers, differentiated by JAX.
  _, new_state = block.pure_fn((x, x * 0.5), weights, state, rng)
  assert not np.array_equal(jax.tree_util.tree_leaves(new_state)[0],
                            jax.tree_util.tree_leaves(state)[0])
  plain = tl.Serial(tl.Select([1, 0, 1]),
                    tl.Serial(tl.LayerNorm(), attn),
                    tl.Add(), tl.Select([1, 0]))
  plain_w = ((), (weights[0][0][0], weights[0][1]), (), ())
  plain_s = ((), (state[0][0][0], state[0][1]), (), ())

  def plain_loss(w, a, b):
    y1, y2 = plain.pure_fn((a, b), w, plain_s, rng)[0]
    return jnp.sum(y1 * jnp.cos(y2))
  expected = jax.grad(plain_loss, argnums=(1, 2))(plain_w, x, x * 0.5)
  _close(grads[1], expected[0], tol=1e-4)
  _close(grads[2], expected[1], tol=1e-4)


def test_mixed_uses_plain_attention_up_to_std_length():
  layer = ea.MixedLSHSelfAttention(n_heads=2, d_qk=8, d_v=8, masked=True,
                                   std_length=32, chunk_len=8, n_buckets=4)
  qk, v = _qkv()
  mask = jnp.ones((2, 32), jnp.bool_).at[1, 20:].set(False)
  layer.init(shapes.signature((qk, v, mask)))
  out = np.asarray(layer((qk, v, mask)))
  q, vals = np.asarray(qk, np.float64), np.asarray(v, np.float64)
  logits = q @ np.swapaxes(q, 1, 2) / np.sqrt(8)
  rows_mask = np.repeat(np.asarray(mask), 2, axis=0)[:, None, :]
  logits = np.where(rows_mask, logits, -1e9)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  _close(out, probs @ vals, tol=1e-4)


def test_lshff_with_one_always_shared_bucket_is_a_dense_relu_block():
  # With 2 buckets and many hashes, every input shares a bucket with every
  # hidden unit in some round: the block is Dense -> Relu -> Dense.
  layer = ea.LSHFF(d_ff=16, n_buckets=2, n_hashes=64)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8))
  (w1, w2, b2), _ = layer.init(shapes.signature(x))
  expected = np.maximum(np.asarray(x) @ np.asarray(w1).T, 0) @ np.asarray(
      w2) + np.asarray(b2)
  _close(layer(x), expected, tol=1e-5)
  assert layer.name == 'LSHFF_16'


def test_bad_arguments_name_the_layer_and_argument():
  with pytest.raises(ValueError, match='PureLSHSelfAttention.*n_parallel_heads'):
    ea.PureLSHSelfAttention(n_heads=4, n_parallel_heads=3)
  with pytest.raises(ValueError, match='PureLSHSelfAttention.*causal=True'):
    ea.PureLSHSelfAttention(mode='predict')
  with pytest.raises(ValueError, match='LSHFF: n_buckets'):
    ea.LSHFF(d_ff=8, n_buckets=3)
  with pytest.raises(ValueError, match='weights_format'):
    ea.PureLSHSelfAttentionWrapper(weights_format='dense')
  with pytest.raises(ValueError, match='MixedLSHSelfAttention: causal=True'):
    ea.MixedLSHSelfAttention(causal=True, masked=True)
  with pytest.raises(ValueError, match='MixedLSHSelfAttention: qkv_attention_type'):
    ea.MixedLSHSelfAttention(masked=True,
                             qkv_attention_type=tl.DotProductCausalAttention)
  layer = ea.PureLSHSelfAttention(n_heads=3, d_qk=8, d_v=8, chunk_len=8)
  qk, v = _qkv(batch=1, heads=2)
  with pytest.raises(Exception, match='batch \\* n_heads'):
    layer.init(shapes.signature((qk, v)))
    layer((qk, v))


def test_exported_at_trax_paths():
  for name in ('PureLSHSelfAttention', 'PureLSHSelfAttentionWrapper',
               'MixedLSHSelfAttention', 'LSHFF'):
    assert getattr(tl, name) is getattr(ea, name)


def test_mixed_predict_state_layout_matches_the_state_shapes():
  """Declared rows per example of each state leaf equal what the shapes of
  states made for 1 and 2 examples show (decoding traces the model
  otherwise, which Terraformer's one-example portal layers cannot run)."""
  def predict_layer(batch):
    layer = ea.MixedLSHSelfAttention(
        n_heads=2, d_qk=8, d_v=8, causal=True, std_length=4, chunk_len=4,
        n_hashes=1, n_buckets=2, predict_mem_len=8, predict_drop_len=8,
        mode='predict')
    qk = np.zeros((batch * 2, 1, 8), np.float32)
    layer.init(shapes.signature((qk, qk)))
    return layer
  one, two = predict_layer(1), predict_layer(2)
  layout = one.predict_state_layout(one.state)
  expected = [a.shape[0] if np.ndim(a) and b.shape[0] == 2 * a.shape[0]
              else 0 for a, b in zip(jax.tree_util.tree_leaves(one.state),
                                     jax.tree_util.tree_leaves(two.state))]
  assert jax.tree_util.tree_leaves(layout.rows) == expected
  assert 2 in expected and 0 in expected
  # The standard attention's cache: 2048 positions (its default), none used.
  assert (int(layout.positions_used), layout.max_positions) == (0, 2048)
