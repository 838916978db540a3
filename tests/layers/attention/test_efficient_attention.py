"""Tests of SelfAttention and EncDecAttention (array functions: test_efficient_attention_ops)."""

import functools

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

from retrax.layers.attention import efficient as ea
from retrax.layers.attention import groups as eag
from retrax.layers.attention import lsh
from retrax.layers.base import LayerError
from retrax.shapes import signature
from tests.backend_tolerance import float32_tolerance
from tests.float64 import float64

import efficient_attention_refs as refs


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _init(layer, x, seed=1):
  return layer.init(signature(x), rng=jax.random.PRNGKey(seed))


def _weights(n_heads, d_model, d_qk, d_v, share_qk=False, bias=False, seed=0):
  """Random SelfAttention weights in Trax's layout (cheaper than init)."""
  rng = np.random.RandomState(seed)
  shapes = [(d_model, d_qk)] + ([] if share_qk else [(d_model, d_qk)]) + [
      (d_model, d_v), (d_v, d_model)]
  if bias:
    shapes += [(d_qk,)] + ([] if share_qk else [(d_qk,)]) + [(d_v,)]
  return tuple(
      (rng.normal(size=(n_heads,) + shp) / np.sqrt(shp[0])).astype(np.float32)
      for shp in shapes)


# --- SelfAttention -----------------------------------------------------------------

SA_CASES = [
    dict(causal=True),
    dict(causal=False, share_qk=True, bias=True),
    dict(causal=True, chunk_len=4, n_chunks_before=2, share_qk=True),
    # 12 positions in chunks of 5: padded to 15 with masked positions.
    dict(causal=False, chunk_len=5, n_chunks_before=1, n_chunks_after=1,
         masked=True),
    dict(causal=True, chunk_len=4, n_chunks_before=1, masked=True, bias=True),
]


@pytest.mark.parametrize('case', SA_CASES)
def test_self_attention_matches_local_window_reference(case):
  x = _normal(0, (2, 12, 6))
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, mode='eval', **case)
  inputs = x
  mask = None
  if case.get('masked'):
    mask = np.ones((2, 12), bool)
    mask[0, 9:] = False
    mask[1, [1, 5]] = False  # (Trax leaves padding at positions 0, 1 unmasked)
    inputs = (x, mask)
  weights = _weights(2, 6, 4, 3, case.get('share_qk', False),
                     case.get('bias', False))
  got, _ = jax.jit(layer.pure_fn)(inputs, weights, (), jax.random.PRNGKey(0))
  ref_kwargs = {k: v for k, v in case.items() if k != 'masked'}
  want = refs.local_self_attention(np.asarray(x), weights, mask=mask,
                                   **ref_kwargs)
  np.testing.assert_allclose(got, want, **float32_tolerance(rtol=1e-5, atol=1e-5))


MERGED_CASES = [
    dict(causal=True),
    dict(causal=False, chunk_len=5, n_chunks_before=1, n_chunks_after=1,
         masked=True),
]


@pytest.mark.parametrize('case', MERGED_CASES)
def test_self_attention_with_narrow_model_multiplies_weights_first(case):
  """d_model <= d_qk / 2: W_q W_k^T and W_v W_o are formed first; same function."""
  layer = ea.SelfAttention(n_heads=2, d_qk=8, d_v=8, mode='eval', **case)
  x = _normal(0, (2, 12, 4))
  weights = _weights(2, 4, 8, 8)
  assert layer._attend_inputs(x[0], tuple(w[0] for w in weights))[3] is None
  wide = _weights(2, 6, 8, 8)  # 2 * 6 > 8: the usual projections
  assert layer._attend_inputs(_normal(1, (12, 6)), tuple(
      w[0] for w in wide))[3] is not None
  mask = None
  inputs = x
  if case.get('masked'):
    mask = np.ones((2, 12), bool)
    mask[0, 9:] = False
    inputs = (x, mask)
  got, _ = jax.jit(layer.pure_fn)(inputs, weights, (), jax.random.PRNGKey(0))
  ref_kwargs = {k: v for k, v in case.items() if k != 'masked'}
  want = refs.local_self_attention(np.asarray(x), weights, mask=mask,
                                   **ref_kwargs)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  with float64():
    x64 = np.asarray(x, np.float64)
    w64 = tuple(w.astype(np.float64) for w in weights)
    f = jax.jit(lambda x, w: layer.pure_fn(
        (x, mask) if mask is not None else x, w, (), jax.random.PRNGKey(0))[0])
    check_grads(f, (x64, w64), order=1, modes=['rev'])


def test_self_attention_weight_layout_and_init():
  x = jnp.zeros((3, 8, 32))
  layer = ea.SelfAttention(n_heads=2, d_qk=16, d_v=16)  # the golden sizes
  (w_q, w_k, w_v, w_o), state = _init(layer, x)
  assert state == ()
  assert w_q.shape == w_k.shape == w_v.shape == (2, 32, 16)
  assert w_o.shape == (2, 16, 32)
  lim = np.sqrt(6.0 / (32 + 16 * 2))
  for w in (w_q, w_k, w_v, w_o):
    assert w.dtype == jnp.float32 and float(jnp.max(jnp.abs(w))) <= lim
  # Trax's per-head keys: split(rng, n_heads), then split(head_rng, 4).
  head_rng = jax.random.split(jax.random.PRNGKey(1), 2)[1]
  rng_v = jax.random.split(head_rng, 4)[2]
  want = jax.random.uniform(rng_v, (32, 16), jnp.float32, -lim, lim)
  np.testing.assert_array_equal(w_v[1], want)
  shared = ea.SelfAttention(n_heads=2, d_qk=16, d_v=8, share_qk=True,
                            bias=True)
  shapes = [w.shape for w in _init(shared, x)[0]]
  assert shapes == [(2, 32, 16), (2, 32, 8), (2, 8, 32), (2, 16), (2, 8)]


def _forward_backward(layer, x, weights, state):
  def f(x, w):
    return layer.pure_fn(x, w, state, jax.random.PRNGKey(7))
  out, vjp, new_state = jax.vjp(f, x, weights, has_aux=True)
  ct = _normal(9, out.shape)
  return out, new_state, vjp(ct)


_BATCHING_KWARGS = dict(n_heads=2, d_qk=4, d_v=3, causal=True, chunk_len=5,
                        n_chunks_before=1, attention_dropout=0.2,
                        output_dropout=0.1, mode='train')


@pytest.fixture(scope='module')
def batching_reference():
  """Output, state and gradients of the reference code (plain autodiff)."""
  x = _normal(0, (2, 10, 6))
  ref = ea.SelfAttention(use_reference_code=True, **_BATCHING_KWARGS)
  weights, state = _weights(2, 6, 4, 3), ()
  assert not ref.has_backward
  want = jax.jit(functools.partial(_forward_backward, ref))(x, weights, state)
  return x, weights, state, want


@pytest.mark.parametrize('n_parallel_heads,python_loop,copy_inputs', [
    (1, False, True),  # one (example, head) at a time: 4 groups in lax.scan
    (2, True, True),  # one example (all heads) at a time, unrolled in Python
    (None, False, True),  # all at once, inputs copied per head
    (None, False, False),  # all at once, heads share the inputs (long inputs)
])
def test_self_attention_batching_matches_reference_code(
    batching_reference, monkeypatch, n_parallel_heads, python_loop,
    copy_inputs):
  x, weights, state, want = batching_reference
  if not copy_inputs:
    monkeypatch.setattr(eag, 'MAX_INPUT_COPY_BYTES', 0)
  layer = ea.SelfAttention(n_parallel_heads=n_parallel_heads,
                           use_python_loop=python_loop, **_BATCHING_KWARGS)
  assert layer.has_backward
  got = jax.jit(functools.partial(_forward_backward, layer))(x, weights, state)
  for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_self_attention_custom_backward_check_grads():
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, causal=True, chunk_len=3,
                           n_chunks_before=1, share_qk=True, mode='eval')
  with float64():
    x = np.random.RandomState(0).normal(size=(2, 9, 6))
    weights = tuple(w.astype(np.float64) for w in _weights(2, 6, 4, 3, True))
    f = jax.jit(lambda x, w: layer.pure_fn(x, w, (),
                                           jax.random.PRNGKey(0))[0])
    check_grads(f, (x, weights), order=1, modes=['rev'])


def test_self_attention_grad_keeps_masks_non_differentiable():
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, masked=True, chunk_len=4)
  x = _normal(0, (1, 8, 6))
  mask = np.array([[1, 1, 1, 1, 1, 0, 0, 0]], np.int32)
  weights = _weights(2, 6, 4, 3)
  f = lambda x: jnp.sum(layer.pure_fn((x, mask), weights, (),
                                      jax.random.PRNGKey(0))[0])
  grad = jax.jit(jax.grad(f))(x)
  assert grad.shape == x.shape and np.all(np.isfinite(grad))


@pytest.mark.parametrize('kwargs,length,step', [
    # Memory of 12 positions; it forgets 4 at position 12.
    (dict(chunk_len=4, n_chunks_before=2, share_qk=True), 14, 1),
    # Unchunked, two positions per call.
    (dict(predict_mem_len=16, predict_drop_len=4), 12, 2),
])
def test_self_attention_eval_equals_predict(kwargs, length, step):
  x = _normal(0, (2, length, 6))
  common = dict(n_heads=2, d_qk=4, d_v=3, causal=True, **kwargs)
  eval_layer = ea.SelfAttention(mode='eval', **common)
  weights = _weights(2, 6, 4, 3, kwargs.get('share_qk', False))
  want, _ = jax.jit(eval_layer.pure_fn)(x, weights, (), jax.random.PRNGKey(0))
  got = refs.predict_outputs(ea.SelfAttention(mode='predict', **common), x,
                             weights, jax.random.PRNGKey(0), step)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_self_attention_predict_prompt_then_tokens():
  x = _normal(0, (1, 12, 6))
  common = dict(n_heads=2, d_qk=4, d_v=3, causal=True, chunk_len=4,
                n_chunks_before=1)
  weights = _weights(2, 6, 4, 3)
  want = refs.local_self_attention(np.asarray(x), weights, causal=True,
                                   chunk_len=4, n_chunks_before=1)
  layer = ea.SelfAttention(mode='predict', **common)
  _, state = layer.init(signature(x[:, :1]))
  call = jax.jit(layer.pure_fn)
  outs = []
  y, state = call(x[:, :6], weights, state, jax.random.PRNGKey(0))
  outs.append(y)
  for t in range(6, 12):
    y, state = call(x[:, t:t + 1], weights, state, jax.random.PRNGKey(0))
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, rtol=1e-4,
                             atol=1e-4)


@pytest.mark.parametrize('prompt_len', [1, 6])
@pytest.mark.parametrize('chunk_len,share_qk,bias', [
    (None, False, False), (None, True, True), (4, False, True),
    (4, True, False)])
def test_self_attention_predict_caches_roll_with_the_memory(
    chunk_len, share_qk, bias, prompt_len):
  # An 8-position memory forgetting 4 at a time: position t sees positions
  # 4 * (t // 4 - 1) .. t, i.e. chunks of 4 attending to themselves and the
  # chunk before. 20 positions make the memory (and key/value caches) roll 3
  # times; a 6-position prompt takes the refill path first.
  x = _normal(0, (2, 20, 6))
  weights = _weights(2, 6, 4, 3, share_qk, bias)
  want = refs.local_self_attention(np.asarray(x), weights, causal=True,
                                   chunk_len=4, n_chunks_before=1,
                                   share_qk=share_qk, bias=bias)
  kwargs = (dict(predict_mem_len=8, predict_drop_len=4) if chunk_len is None
            else dict(chunk_len=chunk_len, n_chunks_before=1))
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, causal=True,
                           share_qk=share_qk, bias=bias, mode='predict',
                           **kwargs)
  _, state = layer.init(signature(x[:, :1]))
  call = jax.jit(layer.pure_fn)
  y, state = call(x[:, :prompt_len], weights, state, jax.random.PRNGKey(0))
  outs = [y]
  for t in range(prompt_len, 20):
    y, state = call(x[:, t:t + 1], weights, state, jax.random.PRNGKey(0))
    outs.append(y)
  np.testing.assert_allclose(jnp.concatenate(outs, 1), want, rtol=1e-4,
                             atol=1e-4)
  # The memory holds positions 12..19 and the value cache their values.
  mem_end, mem, (k_cache, v_cache) = state
  assert int(mem_end) == 8 and k_cache.shape == (4, 8, 4)
  np.testing.assert_array_equal(mem[0], x[:, 12:])
  w_v, b_v = weights[1 if share_qk else 2], weights[-1]
  want_v = np.einsum('blm,hmv->bhlv', np.asarray(x[:, 12:]), w_v)
  if bias:
    want_v = want_v + b_v[None, :, None, :]
  np.testing.assert_allclose(v_cache.reshape(2, 2, 8, 3), want_v, rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('chunk_len,share_qk,bias', [
    (None, False, True), (4, True, False)])
def test_self_attention_predict_reference_loop_equals_batched_steps(
    chunk_len, share_qk, bias):
  """The per-example, per-head loop decodes like the batched decoding step.

  Batch 2, a prompt, then single positions through two rolls of the memory:
  the batched layer computes a step for all units at once
  (`_all_units_step`), the reference loop runs `_incremental_forward_unbatched`
  per unit. Outputs and caches agree.
  """
  x = _normal(3, (2, 14, 6))
  weights = _weights(2, 6, 4, 3, share_qk, bias)
  kwargs = (dict(predict_mem_len=8, predict_drop_len=4) if chunk_len is None
            else dict(chunk_len=chunk_len, n_chunks_before=1))
  layers = [ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, causal=True,
                             share_qk=share_qk, bias=bias, mode='predict',
                             use_reference_code=ref, **kwargs)
            for ref in (False, True)]
  states = [layer.init(signature(x[:, :1]))[1] for layer in layers]
  refs.assert_decodes_alike(layers, states, x, weights, prompt_len=3)


@pytest.mark.parametrize('share_qk', [False, True])
def test_self_attention_decode_step_projects_only_new_positions(share_qk):
  """One decoding step projects only the new position, not the whole memory.

  Recomputing the memory's keys and values costs `mem_len * d_model * (d_qk
  + d_v)` per head (8x from a 64- to a 512-position memory); with the caches
  only the attention itself, `mem_len * (d_qk + d_v)`, grows with the memory.
  """
  def step_flops(mem_len):
    layer = ea.SelfAttention(n_heads=2, d_qk=16, d_v=16, share_qk=share_qk,
                             causal=True, mode='predict',
                             predict_mem_len=mem_len, predict_drop_len=4)
    x = jnp.zeros((1, 1, 256))
    weights, state = _init(layer, x)
    cost = jax.jit(layer.pure_fn).lower(
        x, weights, state, jax.random.PRNGKey(0)).compile().cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)['flops']

  assert step_flops(512) < 3 * step_flops(64)


def test_self_attention_errors_are_clear():
  with pytest.raises(ValueError, match='causal=True'):
    ea.SelfAttention(mode='predict')
  with pytest.raises(ValueError, match='mode must be one of'):
    ea.SelfAttention(mode='test')
  with pytest.raises(ValueError, match='multiple or a divisor'):
    ea.SelfAttention(n_heads=4, n_parallel_heads=3)
  with pytest.raises(ValueError, match='need chunk_len'):
    ea.SelfAttention(n_chunks_before=1)
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3)
  weights, state = _weights(2, 8, 4, 3), ()
  with pytest.raises(LayerError, match='d_model 6 but the weights expect 8'):
    layer.pure_fn(jnp.zeros((1, 4, 6)), weights, state, jax.random.PRNGKey(0))
  with pytest.raises(LayerError, match=r'shape \[batch, length, d_model\]'):
    layer.pure_fn(jnp.zeros((4, 8)), weights, state, jax.random.PRNGKey(0))
  masked = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, masked=True)
  with pytest.raises(LayerError, match=r'mask must have shape \(batch, length'):
    masked.pure_fn((jnp.zeros((1, 4, 8)), jnp.ones((1, 5))), weights, state,
                   jax.random.PRNGKey(0))


def test_self_attention_subclass_forward_unbatched_is_used():
  """The Coursera lab overrides forward_unbatched; both code paths call it."""
  calls = []

  class Doubled(ea.SelfAttention):

    def forward_unbatched(self, x, mask=None, *, weights, state, rng,
                          update_state):
      calls.append((self._n_heads, self._d_qk, self._causal, update_state))
      out, state = super().forward_unbatched(
          x, mask, weights=weights, state=state, rng=rng,
          update_state=update_state)
      return 2 * out, state

  x = _normal(0, (1, 6, 6))
  weights = _weights(2, 6, 4, 3)
  want = refs.local_self_attention(np.asarray(x), weights, causal=True)
  for reference in (True, False):
    layer = Doubled(n_heads=2, d_qk=4, d_v=3, causal=True,
                    use_reference_code=reference)
    got, _ = jax.jit(layer.pure_fn)(x, weights, (), jax.random.PRNGKey(0))
    np.testing.assert_allclose(got, 2 * want, rtol=1e-5, atol=1e-5)
  assert calls and all(c == (2, 4, True, True) for c in calls)


@pytest.mark.slow
def test_self_attention_memory_is_linear_in_length():
  """Chunked attention's fwd+bwd temp memory in XLA:CPU's plan grows ~linearly."""
  def temp_bytes(length):
    # One head at a time (a CPU's default) on any default backend.
    layer = ea.SelfAttention(n_heads=2, d_qk=16, d_v=16, causal=True,
                             chunk_len=64, n_chunks_before=1,
                             n_parallel_heads=1)
    return refs.grad_temp_bytes(layer, length)
  ratio = temp_bytes(8192) / temp_bytes(2048)
  assert ratio < 4.5, ratio


def test_self_attention_matches_golden_reformerlm_copy():
  """Trax 1.4.1's ReformerLM (default SelfAttention) logits, layer under test."""
  weights, state, data = refs.read_golden('reformerlm_copy')
  layer = ea.SelfAttention(n_heads=2, d_qk=16, d_v=16, causal=True,
                           mode='eval')
  call = jax.jit(layer.pure_fn)

  def attention(h, w, s):
    return np.asarray(call(h.astype(np.float32), w, s,
                           jax.random.PRNGKey(0))[0])

  logits = refs.reformer_lm_logits(weights, state, data['inputs'], attention,
                                   n_attn_weights=4, n_attn_state=0)
  np.testing.assert_allclose(logits, data['logits'],
                             **float32_tolerance(rtol=1e-4, atol=1e-4))


# --- EncDecAttention ---------------------------------------------------------------


def test_enc_dec_attention_matches_reference():
  q_in, kv_in = _normal(0, (2, 5, 6)), _normal(1, (2, 7, 4))
  mask = np.ones((2, 7), bool)
  mask[0, 4:] = False
  mask[1, 0] = False
  layer = ea.EncDecAttention(n_heads=2, d_qk=3, d_v=3, mode='eval',
                             penalize_padding_only=True)  # softmax masking
  weights, state = _init(layer, (q_in, kv_in, mask))
  assert [w.shape for w in weights] == [(2, 6, 3), (2, 4, 3), (2, 4, 3),
                                        (2, 3, 6)]
  got, _ = jax.jit(layer.pure_fn)((q_in, kv_in, mask), weights, state,
                                  jax.random.PRNGKey(0))
  want = np.zeros((2, 5, 6))
  for w_q, w_k, w_v, w_o in zip(*[np.asarray(w, np.float64) for w in weights]):
    for b in range(2):
      q = np.asarray(q_in[b]) @ w_q
      k = np.asarray(kv_in[b]) @ w_k / np.sqrt(3)
      v = np.asarray(kv_in[b]) @ w_v
      for i in range(5):
        o, _ = refs.attend_one(q[i], k, v, 0, np.zeros(7), False, False,
                               mask[b])
        want[b, i] += o @ w_o
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_self_attention_eager_predict_equals_jitted_and_compiles_once():
  """The blog's eager token loop: same outputs as jit, across memory rolls."""
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=3, causal=True,
                           mode='predict', predict_mem_len=8,
                           predict_drop_len=4)
  refs.eager_equals_jitted_without_recompiles(
      layer, _weights(2, 6, 4, 3), _normal(0, (2, 14, 6)))


@pytest.mark.parametrize('layer_class,kwargs', [
    (ea.SelfAttention, dict(chunk_len=4, n_chunks_before=1)),
    (lsh.LSHSelfAttention, dict(chunk_len=4, n_hashes=2, n_buckets=4))])
def test_subclass_decoding_step_override_is_used(layer_class, kwargs):
  """A subclass overriding the per-unit predict step keeps it (no batched step)."""
  calls = []

  class Counting(layer_class):

    def _incremental_forward_unbatched(self, *args, **kw):
      calls.append(kw['q_len'])
      return super()._incremental_forward_unbatched(*args, **kw)

  layer = Counting(n_heads=2, d_qk=4, d_v=3, causal=True, mode='predict',
                   **kwargs)
  x = _normal(0, (1, 1, 6))
  _, state = layer.init(signature(x))
  layer.pure_fn(x, layer.weights, state, jax.random.PRNGKey(0))
  assert calls == [1]
