"""Tests of LSHSelfAttention against NumPy references, Trax's golden model and itself."""

import functools

import jax
import jax.numpy as jnp
from jax.test_util import check_grads
import numpy as np
import pytest

from retrax.layers.attention import efficient_base
from retrax.layers.attention import ops
from retrax.layers.attention import lsh
from retrax.layers.base import LayerError
from retrax.shapes import signature
from tests.backend_tolerance import float32_tolerance
from tests.float64 import float64

import efficient_attention_refs as refs

N_HEADS, D_MODEL, D_QK, D_V = 2, 6, 4, 3


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def _weights(seed=0, n_heads=N_HEADS):
  rng = np.random.RandomState(seed)
  shapes = [(D_MODEL, D_QK), (D_MODEL, D_V), (D_V, D_MODEL)]
  return tuple((rng.normal(size=(n_heads,) + s) / np.sqrt(s[0])).astype(
      np.float32) for s in shapes)


def _state(batch, length, n_hashes, seed=5, n_heads=N_HEADS):
  rngs = jax.random.split(jax.random.PRNGKey(seed), batch * n_heads)
  return (jnp.zeros((batch * n_heads, n_hashes * length), jnp.int32), rngs)


def _layer(**kwargs):
  kwargs = dict(dict(n_heads=N_HEADS, d_qk=D_QK, d_v=D_V, mode='eval'),
                **kwargs)
  return lsh.LSHSelfAttention(**kwargs)


def _gather_in_blocks(monkeypatch, blocks_seen=None, speed=False):
  """Makes every LSH attention run in blocks of two chunks: as where memory
  decides (`ops.gathers_in_blocks`: each block gathers its own rows) or,
  `speed`, as blocks run for speed taking the sorted queries|values whole
  (`JOINT_SPEED_BLOCKS`) and returning outputs and normalisers side by side
  (`LSE_IN_BLOCKS`, set either way: its default depends on the backend).
  Records in `blocks_seen` `(given rows, side by side)` of each blocked
  attention."""
  monkeypatch.setattr(ops, 'LSE_IN_BLOCKS', speed)
  if speed:
    monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 0)
    monkeypatch.setattr(ops, 'JOINT_SPEED_BLOCKS', True)
  else:
    monkeypatch.setattr(ops, 'REMAT_MIN_LOGITS', 0)
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', 2)
  if blocks_seen is not None:
    in_blocks = ops._attend_in_blocks  # pylint: disable=protected-access

    def spy(*args, **kwargs):
      blocks_seen.append((kwargs.get('rows') is not None,
                          kwargs.get('side_by_side', False)))
      return in_blocks(*args, **kwargs)
    monkeypatch.setattr(ops, '_attend_in_blocks', spy)


def _full_attention(x, weights, causal):
  """Shared-QK attention over the whole sequence, self masked (-1e5)."""
  x = np.asarray(x, np.float64)
  out = np.zeros(x.shape)
  for w_q, w_v, w_o in zip(*[np.asarray(w, np.float64) for w in weights]):
    for b in range(x.shape[0]):
      q = x[b] @ w_q
      k = refs.rms_normalize(q) / np.sqrt(q.shape[-1])
      v = x[b] @ w_v
      pos = np.arange(x.shape[1])
      for i in pos:
        o, _ = refs.attend_one(q[i], k, v, i, pos, causal, True)
        out[b, i] += o @ w_o
  return out


@pytest.mark.parametrize('causal,n_hashes,n_chunks_before', [
    (True, 1, 0), (False, 3, 1)])
def test_one_chunk_per_round_is_full_shared_qk_attention(causal, n_hashes,
                                                         n_chunks_before):
  """One chunk per round: every round is full shared-QK attention.

  (Causal with several rounds is covered with the paper-algorithm reference:
  there Trax's float32 merge of rounds shifts position 0, which sees only
  itself, by ~0.4%; the reference reproduces that rounding.)
  """
  x = _normal(0, (2, 8, D_MODEL))
  layer = _layer(causal=causal, chunk_len=8, n_hashes=n_hashes, n_buckets=4,
                 n_chunks_before=n_chunks_before)
  weights = _weights()
  got, _ = jax.jit(layer.pure_fn)(x, weights, _state(2, 8, n_hashes),
                                  jax.random.PRNGKey(0))
  np.testing.assert_allclose(got, _full_attention(x, weights, causal),
                             rtol=1e-5, atol=1e-5)


LSH_CASES = [
    dict(causal=True, n_hashes=2, n_buckets=4, chunk_len=4),
    dict(causal=False, n_hashes=3, n_buckets=[2, 4], chunk_len=6,
         n_chunks_after=1),
    dict(causal=False, n_hashes=2, n_buckets=6, chunk_len=4, masked=True),
    dict(causal=True, n_hashes=1, n_buckets=None, chunk_len=2,
         n_chunks_before=2),
]


@pytest.mark.parametrize('case', LSH_CASES + [
    dict(LSH_CASES[2], unsort_as_one=False)] + [
        dict(c, in_blocks=True) for c in LSH_CASES] + [
            dict(LSH_CASES[i], in_blocks='speed') for i in (1, 2)])
def test_lsh_matches_paper_algorithm_given_buckets(monkeypatch, case):
  """Also where memory decides (`in_blocks`): each block of chunks gathers
  its own sorted rows and the rounds are unsorted apart; and in blocks run
  for speed that return outputs and normalisers side by side."""
  case = dict(case)
  monkeypatch.setattr(lsh, 'UNSORT_AS_ONE', case.pop('unsort_as_one', True))
  blocks_seen = []
  in_blocks = case.pop('in_blocks', False)
  if in_blocks:
    _gather_in_blocks(monkeypatch, blocks_seen, speed=in_blocks == 'speed')
  length = 12
  x = _normal(1, (2, length, D_MODEL))
  layer = _layer(**case)
  inputs, mask = x, None
  if case.get('masked'):
    mask = np.ones((2, length), bool)
    mask[0, 9:] = False
    mask[1, [1, 4]] = False
    inputs = (x, mask)
  weights = _weights()
  got, new_state = jax.jit(layer.pure_fn)(
      inputs, weights, _state(2, length, case['n_hashes']),
      jax.random.PRNGKey(0))
  buckets = np.asarray(new_state[0])
  assert len(np.unique(buckets)) > 2 * case['n_hashes']  # several buckets
  want = refs.lsh_attention(
      x, weights, buckets, n_heads=N_HEADS, n_hashes=case['n_hashes'],
      chunk_len=case['chunk_len'],
      n_chunks_before=case.get('n_chunks_before', 1),
      n_chunks_after=case.get('n_chunks_after', 0), causal=case['causal'],
      mask=mask)
  np.testing.assert_allclose(got, want,
                             **float32_tolerance(rtol=1e-5, atol=1e-5))
  assert set(blocks_seen) == _blocks_expected(in_blocks)


def _blocks_expected(in_blocks):
  """What `_gather_in_blocks`' spy records for `in_blocks` (False, True or
  'speed')."""
  if not in_blocks:
    return set()
  speed = in_blocks == 'speed'
  return {(not speed, speed)}


def test_state_layout_and_hashing_per_example_and_head():
  """Row e * n_heads + h: buckets of hash_vecs(x[e] @ w_q[h], split(rng)[1])."""
  batch, length, n_hashes, n_buckets = 2, 8, 2, 4
  x = _normal(2, (batch, length, D_MODEL))
  layer = _layer(causal=True, chunk_len=4, n_hashes=n_hashes,
                 n_buckets=n_buckets, mode='train')
  weights, state = layer.init(signature(x), rng=jax.random.PRNGKey(4))
  assert [w.shape for w in weights] == [(2, 6, 4), (2, 6, 3), (2, 3, 6)]
  assert state[0].shape == (batch * N_HEADS, n_hashes * length)
  assert state[0].dtype == jnp.int32 and state[1].dtype == jnp.uint32
  assert state[1].shape == (batch * N_HEADS, 2)
  np.testing.assert_array_equal(
      state[1], jax.random.split(jax.random.PRNGKey(4), batch * N_HEADS))
  _, new_state = jax.jit(layer.pure_fn)(x, weights, state,
                                        jax.random.PRNGKey(0))
  for e in range(batch):
    for h in range(N_HEADS):
      row = e * N_HEADS + h
      new_rng, sub = jax.random.split(state[1][row])
      np.testing.assert_array_equal(new_state[1][row], new_rng)
      want, _ = ops.hash_vecs(x[e] @ weights[0][h], n_buckets, n_hashes, sub)
      want = want + n_buckets * np.arange(n_hashes)[:, None]
      np.testing.assert_array_equal(new_state[0][row], np.ravel(want))


def test_default_n_buckets_follows_trax():
  assert lsh.default_n_buckets(100, 128) == 2
  assert lsh.default_n_buckets(1024, 16) == 128
  assert lsh.default_n_buckets(65536, 128) == [32, 32]
  assert lsh.default_n_buckets(16384, 64) == [32, 16]


@pytest.mark.parametrize('n_ids', [3, 512, 2**25, None])
def test_sort_by_bucket_is_numpy_s_stable_argsort(n_ids):
  # Many ties (a stable order is needed); 2**25 * 96 overflows int32 keys,
  # so that bound and None take the argsort fallback.
  buckets = jax.random.randint(jax.random.PRNGKey(n_ids or 1), (96,), 0,
                               min(n_ids or 7, 7), jnp.int32)
  got = jax.jit(lsh.sort_by_bucket, static_argnums=1)(buckets, n_ids)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(
      got, np.argsort(np.asarray(buckets), kind='stable'))


def test_gather_rounds_is_a_tiled_take_and_its_gradient_a_sum_of_rounds():
  n_hashes, length, depth = 3, 10, 4
  x = jax.random.normal(jax.random.PRNGKey(0), (length, depth))
  sticker = jax.random.permutation(jax.random.PRNGKey(1), n_hashes * length)
  undo = ops.inverse_permutation(sticker)
  got = lsh.gather_rounds(x, sticker, undo, n_hashes)
  x_np, s_np = np.asarray(x), np.asarray(sticker)
  np.testing.assert_array_equal(got, np.tile(x_np, (n_hashes, 1))[s_np])
  # The custom gradient against numpy's: each row's cotangents summed over
  # the sorted rows that copy it.
  ct = np.asarray(jax.random.normal(jax.random.PRNGKey(2), got.shape))
  grad = jax.grad(lambda a: jnp.sum(
      lsh.gather_rounds(a, sticker, undo, n_hashes) * ct))(x)
  want = np.zeros_like(x_np)
  np.add.at(want, s_np % length, ct)
  np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('backend', ['cpu', 'tpu'])
def test_normalisers_unsorted_with_the_outputs_are_exactly_those_apart(
    monkeypatch, backend):
  """One `[N, V + 1]` unsort gives the same bits as two gathers, outputs and
  gradients: the normalisers read back by a slice, and as on a TPU (its
  choices faked here) by a masked sum over the row, their cotangent a
  select."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  layer = _layer(causal=True, n_hashes=2, n_buckets=4, chunk_len=4)
  x = _normal(3, (2, 12, D_MODEL))

  def run(as_one):
    monkeypatch.setattr(lsh, 'UNSORT_AS_ONE', as_one)
    state, key = _state(2, 12, 2), jax.random.PRNGKey(0)
    f = lambda x, w: layer.pure_fn(x, w, state, key)[0]
    y = jax.jit(f)(x, _weights())
    grads = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * jnp.cos(f(x, w))),
                             argnums=(0, 1)))(x, _weights())
    return [y] + jax.tree_util.tree_leaves(grads)

  for got, want in zip(run(True), run(False)):
    np.testing.assert_array_equal(got, want)


def test_n_bucket_ids_bounds_the_hashed_ids():
  vecs = jax.random.normal(jax.random.PRNGKey(0), (256, 8))
  mask = jnp.arange(256) < 200
  for n_buckets in (None, 6, [4, 6]):
    bound = lsh.n_bucket_ids(n_buckets, 3, 16, 256)
    ids = lsh.lsh_buckets(vecs, jax.random.PRNGKey(1), n_buckets, 3, 16,
                          mask=mask)
    assert 0 <= int(ids.min()) and int(ids.max()) < bound
    assert int(ids.max()) >= bound - 3  # The last round's padding bucket.


@pytest.mark.parametrize('unsort_as_one,in_blocks', [
    (True, False), (False, False), (True, True), (True, 'speed')])
def test_check_grads_replaying_the_forward_buckets(monkeypatch, unsort_as_one,
                                                   in_blocks):
  """The custom backward (per-head recomputation with the buckets the forward
  stored) gives the gradient of the function the forward computed, with the
  outputs and normalisers unsorted as one gather or two (`UNSORT_AS_ONE`),
  and with the rows gathered block by block (`in_blocks`: the blocks'
  cotangents added into the unsorted queries' and values'; 'speed': blocks
  returning outputs and normalisers side by side).

  Central differences move the inputs by ~1e-4 (float64), far less than the
  hashing margins of this fixed example, so every evaluation hashes alike.
  """
  monkeypatch.setattr(lsh, 'UNSORT_AS_ONE', unsort_as_one)
  blocks_seen = []
  if in_blocks:
    _gather_in_blocks(monkeypatch, blocks_seen, speed=in_blocks == 'speed')
  layer = _layer(causal=True, chunk_len=4, n_hashes=2, n_buckets=4,
                 n_parallel_heads=1)
  assert layer.has_backward
  with float64():
    x = np.random.RandomState(1).normal(size=(2, 8, D_MODEL))
    weights = tuple(w.astype(np.float64) for w in _weights())
    state = _state(2, 8, 2)
    f = jax.jit(lambda x, w: layer.pure_fn(x, w, state,
                                           jax.random.PRNGKey(0))[0])
    check_grads(f, (x, weights), order=1, modes=['rev'])
  assert set(blocks_seen) == _blocks_expected(in_blocks)


@pytest.mark.parametrize('masked,bias,n_parallel_heads,mode', [
    (False, False, 1, 'train'), (True, True, 2, 'eval'),
    (False, True, None, 'train')])
def test_batched_pass_matches_the_reference_loop(masked, bias,
                                                 n_parallel_heads, mode):
  """The batched pass (groups of units, custom backward) == the plain loop.

  Outputs, new state and gradients (the custom backward against autodiff of
  the per-example, per-head reference loop), masked and with biases; in
  train mode with attention and output dropout.
  """
  x = _normal(9, (2, 16, D_MODEL))
  mask = jnp.asarray(np.arange(16)[None] < np.array([[16], [11]]))
  inputs = (x, mask) if masked else x
  rng = np.random.RandomState(3)
  weights = _weights() + ((tuple(rng.normal(size=(N_HEADS, d)).astype(
      np.float32) for d in (D_QK, D_V))) if bias else ())
  dropout = dict(attention_dropout=0.2, output_dropout=0.3) if (
      mode == 'train') else {}
  layers = [_layer(causal=not masked, masked=masked, bias=bias, chunk_len=4,
                   n_hashes=2, n_buckets=4, n_parallel_heads=n_parallel_heads,
                   mode=mode, use_reference_code=ref, **dropout)
            for ref in (False, True)]
  state, key = _state(2, 16, 2), jax.random.PRNGKey(4)
  (y, s), (y_ref, s_ref) = (layer.pure_fn(inputs, weights, state, key)
                            for layer in layers)
  np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(s),
                  jax.tree_util.tree_leaves(s_ref)):
    np.testing.assert_array_equal(a, b)
  ct = _normal(10, y.shape)

  def grads(layer):
    def loss(x, w):
      ins = (x, mask) if masked else x
      return jnp.sum(layer.pure_fn(ins, w, state, key)[0] * ct)
    return jax.grad(loss, (0, 1))(x, weights)
  for a, b in zip(jax.tree_util.tree_leaves(grads(layers[0])),
                  jax.tree_util.tree_leaves(grads(layers[1]))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_backward_does_not_hash_again():
  """Hashing is traced once under jax.grad: the backward replays the state."""
  calls = []

  class Counting(lsh.LSHSelfAttention):

    def hash_vectors(self, vecs, rng, mask=None):
      calls.append(vecs.shape)
      return super().hash_vectors(vecs, rng, mask)

  layer = Counting(n_heads=N_HEADS, d_qk=D_QK, d_v=D_V, causal=True,
                   chunk_len=4, n_hashes=2, n_buckets=4)
  x = _normal(3, (1, 8, D_MODEL))
  loss = lambda x, w: jnp.sum(layer.pure_fn(x, w, _state(1, 8, 2),
                                            jax.random.PRNGKey(0))[0])
  jax.make_jaxpr(jax.grad(loss, (0, 1)))(x, _weights())
  assert calls == [(8, D_QK)]


def test_padding_does_not_change_real_outputs():
  layer = _layer(causal=False, masked=True, chunk_len=8, n_hashes=2,
                 n_buckets=4)
  x = np.asarray(_normal(4, (2, 16, D_MODEL)))
  mask = np.ones((2, 16), bool)
  mask[0, 10:] = False
  mask[1, 5:] = False
  x2 = x.copy()
  x2[0, 10:] += 1.0
  x2[1, 5:] -= 2.0
  call = jax.jit(layer.pure_fn)
  y, _ = call((x, mask), _weights(), _state(2, 16, 2), jax.random.PRNGKey(0))
  y2, _ = call((x2, mask), _weights(), _state(2, 16, 2), jax.random.PRNGKey(0))
  np.testing.assert_allclose(y[0, :10], y2[0, :10], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(y[1, :5], y2[1, :5], rtol=1e-5, atol=1e-6)
  assert np.mean(np.abs(y[0, 10:] - y2[0, 10:])) > 1e-3


def test_max_length_for_buckets_pads_the_stored_buckets():
  x = _normal(5, (1, 8, D_MODEL))
  layer = _layer(causal=True, chunk_len=4, n_hashes=2, n_buckets=4,
                 max_length_for_buckets=16)
  plain = _layer(causal=True, chunk_len=4, n_hashes=2, n_buckets=4)
  rngs = _state(1, 8, 2)[1]
  state = (jnp.zeros((2, 32), jnp.int32), rngs)
  y, new_state = jax.jit(layer.pure_fn)(x, _weights(), state,
                                        jax.random.PRNGKey(0))
  y2, new_state2 = jax.jit(plain.pure_fn)(x, _weights(), _state(1, 8, 2),
                                          jax.random.PRNGKey(0))
  np.testing.assert_allclose(y, y2, rtol=1e-6)
  assert new_state[0].shape == (2, 32)
  np.testing.assert_array_equal(new_state[0][:, :16], new_state2[0])
  np.testing.assert_array_equal(new_state[0][:, 16:], 0)


@pytest.mark.parametrize('length,chunk_len,n_chunks_before', [
    pytest.param(8, 8, 0, marks=pytest.mark.slow), (12, 4, 2)])
def test_eval_equals_predict_when_the_window_covers_the_prefix(
    length, chunk_len, n_chunks_before):
  """Eval == token-by-token predict where Trax's two algorithms coincide.

  When every chunk's window is the whole (sorted) sequence once, eval-mode LSH
  is full causal attention; predict mode attends to the n_hashes * chunk_len *
  (1 + n_chunks_before) most relevant earlier positions, here all of them.
  (With n_hashes > 1, or a window holding some position twice, Trax's float32
  normalisers near -1e5 shift the outputs of positions that see only
  themselves by ~0.4% in eval mode only.)
  """
  x = _normal(6, (2, length, D_MODEL))
  common = dict(causal=True, chunk_len=chunk_len, n_hashes=1, n_buckets=4,
                n_chunks_before=n_chunks_before)
  weights = _weights()
  want, _ = jax.jit(_layer(**common).pure_fn)(x, weights, _state(2, length, 1),
                                              jax.random.PRNGKey(0))
  np.testing.assert_allclose(want, _full_attention(x, weights, True),
                             **float32_tolerance(rtol=1e-5, atol=1e-5))
  predict = _layer(mode='predict', predict_mem_len=length, predict_drop_len=4,
                   **common)
  got = refs.predict_outputs(predict, x, weights, jax.random.PRNGKey(0))
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_predict_prompt_then_tokens_keeps_buckets():
  x = _normal(7, (1, 12, D_MODEL))
  layer = _layer(mode='predict', causal=True, chunk_len=4, n_hashes=2,
                 n_buckets=4, predict_mem_len=8, predict_drop_len=4)
  weights = _weights()
  _, state = layer.init(signature(x[:, :1]))
  call = jax.jit(layer.pure_fn)
  y, state = call(x[:, :6], weights, state, jax.random.PRNGKey(0))
  mem_end, mem, (buckets, idx, rngs, k_cache, v_cache) = state
  assert int(mem_end) == 6 and np.all(np.asarray(idx) == 6)
  _assert_caches_project_memory(state, weights)
  np.testing.assert_array_equal(mem[0][:, :6], x[:, :6])
  # The stored buckets are the prompt's hashes with the stored rng.
  for h in range(N_HEADS):
    q = jnp.pad(x[0, :6] @ weights[0][h], ((0, 2), (0, 0)))
    want, _ = ops.hash_vecs(q, 4, 2, rngs[h])
    want = (want + 4 * np.arange(2)[:, None])[:, :6]
    np.testing.assert_array_equal(np.reshape(buckets[h], (2, 8))[:, :6], want)
  for t in range(6, 12):  # rolls the memory at t = 8
    y, state = call(x[:, t:t + 1], weights, state, jax.random.PRNGKey(0))
    assert y.shape == (1, 1, D_MODEL) and np.all(np.isfinite(y))
  assert int(state[0]) == 8 and np.all(np.asarray(state[2][1]) == 8)
  _assert_caches_project_memory(state, weights)


def test_predict_reference_loop_equals_batched_steps():
  """The per-example, per-head reference loop decodes like the batched layer.

  Batch 2, a prompt, then single positions through a roll of the memory: the
  batched layer computes a step for all units at once (`_all_units_step`),
  the reference loop per unit (`_one_position_forward`).
  """
  x = _normal(8, (2, 11, D_MODEL))
  weights = _weights()
  layers = [_layer(mode='predict', causal=True, chunk_len=2, n_hashes=2,
                   n_buckets=4, predict_mem_len=8, predict_drop_len=4,
                   use_reference_code=ref) for ref in (False, True)]
  state = layers[0].init(signature(x[:, :1]))[1]
  layers[1].init(signature(x[:, :1]))
  final = refs.assert_decodes_alike(layers, [state, state],  # Same rngs.
                                    x, weights, prompt_len=5)
  _assert_caches_project_memory(final, weights)


def _assert_caches_project_memory(state, weights):
  """Predict-mode caches hold the memory's keys (normalised queries) and values."""
  mem_end, mem, (_, _, _, k_cache, v_cache) = state
  n = int(mem_end)
  for h in range(N_HEADS):
    q = np.asarray(mem[0][0, :n] @ weights[0][h])
    for cache, want in ((k_cache, refs.rms_normalize(q)),
                        (v_cache, mem[0][0, :n] @ weights[1][h])):
      np.testing.assert_allclose(cache[h, :n], want, rtol=1e-5, atol=1e-5)
      np.testing.assert_array_equal(cache[h, n:], 0)


def test_golden_reformerlm_lsh_logits():
  """Trax 1.4.1 logits of the golden LSH ReformerLM, attention computed here.

  The checkpoint's state holds each LSH layer's per-(example, head) rngs; the
  reference call splits them and hashes, so matching logits needs our hashing
  to reproduce Trax's buckets bit for bit (with threefry_partitionable off).
  """
  weights, state, data = refs.read_golden('reformerlm_lsh')
  layer = lsh.LSHSelfAttention(n_heads=2, d_qk=16, d_v=16, causal=True,
                               n_hashes=2, chunk_len=8, mode='eval')
  new_states = []
  call = jax.jit(layer.pure_fn)

  def attention(h, w, s):
    assert s[0].shape == (8, 64) and s[1].shape == (8, 2)
    y, new_state = call(h.astype(np.float32), w, s, jax.random.PRNGKey(0))
    new_states.append(new_state)
    return np.asarray(y)

  with jax.threefry_partitionable(False):
    logits = refs.reformer_lm_logits(weights, state, data['inputs'], attention,
                                     n_attn_weights=3, n_attn_state=2)
    for new_state, old_rng in zip(new_states, (state[2], state[6])):
      np.testing.assert_array_equal(
          new_state[1], jax.vmap(lambda k: jax.random.split(k)[0])(old_rng))
      assert int(jnp.max(new_state[0])) < 16  # 2 rounds x 8 buckets
  np.testing.assert_allclose(logits, data['logits'], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_memory_grows_linearly_with_length():
  """Fwd+bwd temp memory in XLA:CPU's plan grows ~linearly with the length."""
  def temp_bytes(length):
    # One head at a time (a CPU's default) on any default backend.
    layer = lsh.LSHSelfAttention(n_heads=2, d_qk=16, d_v=16, causal=True,
                                 chunk_len=64, n_hashes=2, n_parallel_heads=1)
    return refs.grad_temp_bytes(layer, length)
  ratio = temp_bytes(8192) / temp_bytes(2048)
  assert ratio < 4.5, ratio


def test_errors_are_clear():
  with pytest.raises(ValueError, match='causal=True'):
    lsh.LSHSelfAttention(mode='predict')
  with pytest.raises(ValueError, match='n_chunks_after=0'):
    lsh.LSHSelfAttention(mode='predict', causal=True, n_chunks_after=1)
  with pytest.raises(ValueError, match='masked=True'):
    lsh.LSHSelfAttention(mode='predict', causal=True, masked=True)
  with pytest.raises(ValueError, match='even'):
    lsh.LSHSelfAttention(n_buckets=[4, 3])
  qv = jnp.zeros((8, 6))
  with pytest.raises(ValueError, match=r'depth=4 the values come in q .*\(8, 6\)'
                     r'.*v must be None, got \(8, 2\)'):
    lsh.lsh_attend(qv, qv[:, 4:], jnp.zeros(8, jnp.int32), n_hashes=1,
                   chunk_len=4, n_chunks_before=1, n_chunks_after=0,
                   causal=True, depth=4)
  layer = _layer(chunk_len=4, n_hashes=1)
  with pytest.raises(LayerError, match='must be a multiple of chunk_len=4'):
    layer.pure_fn(jnp.zeros((1, 6, D_MODEL)), _weights(), _state(1, 6, 1),
                  jax.random.PRNGKey(0))
  with pytest.raises(LayerError, match='the state has 6 rows but needs batch '
                     r'\* n_heads = 2 \* 2 = 4 .* initialize the layer with '
                     'inputs of batch size 2 or 1'):
    layer.pure_fn(jnp.zeros((2, 8, D_MODEL)), _weights(), _state(3, 8, 1),
                  jax.random.PRNGKey(0))


def test_a_one_example_state_serves_any_batch_row_by_row():
  # What a run loaded for eval (`retrax.load_run`, batch 1) is called with.
  layer = _layer(chunk_len=4, n_hashes=2, n_buckets=4)
  x = _normal(4, (3, 8, D_MODEL))
  rng = jax.random.PRNGKey(0)
  batch, _ = layer.pure_fn(x, _weights(), _state(1, 8, 2), rng)
  for i in range(3):
    alone, _ = layer.pure_fn(x[i:i + 1], _weights(), _state(1, 8, 2), rng)
    np.testing.assert_allclose(batch[i], alone[0], rtol=1e-6, atol=1e-6)


def test_eager_predict_equals_jitted_and_compiles_once():
  """The blog's eager token loop: same outputs as jit, across memory rolls."""
  layer = _layer(mode='predict', causal=True, chunk_len=4, n_hashes=2,
                 n_buckets=4, predict_mem_len=8, predict_drop_len=4)
  refs.eager_equals_jitted_without_recompiles(
      layer, _weights(), _normal(3, (1, 14, D_MODEL)), prompt_len=2)


def test_decode_step_projects_only_its_own_position():
  """A decoding step gathers cached keys and values instead of projecting.

  Projecting the `n_hashes * chunk_len * (1 + n_chunks_before) = 32` memory
  rows a step attends to would cost `32 * d_model * (d_qk + d_v) * 2` FLOPs
  per head; with the caches a step projects only its own position.
  """
  n_heads, d_model, d_head = 2, 256, 16
  layer = lsh.LSHSelfAttention(
      n_heads=n_heads, d_qk=d_head, d_v=d_head, causal=True, chunk_len=8,
      n_hashes=2, mode='predict', predict_mem_len=64, predict_drop_len=8)
  x = jnp.zeros((1, 1, d_model))
  weights, state = layer.init(signature(x))
  cost = jax.jit(layer.pure_fn).lower(
      x, weights, state, jax.random.PRNGKey(0)).compile().cost_analysis()
  flops = (cost[0] if isinstance(cost, (list, tuple)) else cost)['flops']
  projecting_attended_rows = n_heads * 32 * d_model * 2 * d_head * 2
  assert flops < projecting_attended_rows / 4


def test_decode_step_attends_to_recent_bucket_mates():
  """One decoded position over a memory larger than its key window.

  NumPy reference of Trax's rule: the `n_hashes * chunk_len * (1 +
  n_chunks_before) = 8` positions sharing a bucket with the query in some
  round, most recent first (then the most recent others), self masked.
  """
  mem_len, n_keys, t = 16, 8, 11
  x = _normal(9, (1, t + 1, D_MODEL))
  layer = _layer(mode='predict', causal=True, chunk_len=2, n_hashes=2,
                 n_buckets=4, predict_mem_len=mem_len, predict_drop_len=4)
  weights = _weights()
  _, state = layer.init(signature(x[:, :1]))
  call = jax.jit(layer.pure_fn)
  _, state = call(x[:, :t], weights, state, jax.random.PRNGKey(0))
  y, state = call(x[:, t:], weights, state, jax.random.PRNGKey(0))
  buckets = np.reshape(np.asarray(state[2][0]), (N_HEADS, 2, mem_len))
  xs = np.asarray(x[0], np.float64)
  positions = np.arange(mem_len)
  want = np.zeros(D_MODEL)
  for h, (w_q, w_v, w_o) in enumerate(zip(*weights)):
    valid = np.any(buckets[h] == buckets[h][:, t:t + 1], axis=0)
    priority = np.where(positions > t + 1, -(mem_len + positions), positions)
    chosen = np.sort(np.argsort(priority + mem_len * valid)[-n_keys:])
    assert not set(chosen) <= set(range(t - n_keys + 1, t + 1))  # Not recency.
    keys = np.zeros((mem_len, D_QK))
    keys[:t + 1] = refs.rms_normalize(xs @ w_q) / np.sqrt(D_QK)
    values = np.zeros((mem_len, D_V))
    values[:t + 1] = xs @ w_v
    o, _ = refs.attend_one(xs[t] @ w_q, keys[chosen], values[chosen], t,
                           chosen, True, True)
    want += o @ w_o
  np.testing.assert_allclose(y[0, 0], want, rtol=1e-4, atol=1e-5)


def test_decode_step_runs_all_units_at_once(monkeypatch):
  """A one-position call vmaps every (example, head) unit, whatever n_parallel_heads.

  With `n_parallel_heads=1` the units of longer calls run in a loop, one at a
  time; for a decoding step that loop would make batch 8 cost 8 batch-1 steps.
  (A GPU's budget: everything batched.)
  """
  monkeypatch.setattr(efficient_base, 'group_memory_bytes', lambda: 1 << 30)
  def n_loops(n_parallel_heads, length):
    layer = _layer(mode='predict', causal=True, chunk_len=2, n_hashes=2,
                   predict_mem_len=16, predict_drop_len=4,
                   n_parallel_heads=n_parallel_heads)
    x = jnp.zeros((4, length, D_MODEL))
    weights, state = layer.init(signature(x[:, :1]))
    text = jax.jit(layer.pure_fn).lower(x, weights, state,
                                        jax.random.PRNGKey(0)).as_text()
    return text.count('stablehlo.while')

  assert n_loops(1, 1) == n_loops(None, 1)
  assert n_loops(1, 8) > n_loops(None, 8)  # A prompt keeps its unit loop.


@pytest.mark.parametrize('q_start,density', [(40, 0.3), (40, 0.02), (5, 0.5),
                                             (63, 0.0)])
def test_recent_matching_mask_picks_the_sorted_rule_s_keys(q_start, density):
  """The sort-free mask picks the same positions as Trax's sorted rule.

  Few bucket-mates fill up with other earlier positions, and a query near
  the start with later positions.
  """
  seqlen, n_keys = 64, 16
  for seed in range(5):
    valid = np.random.RandomState(seed).rand(seqlen) < density
    keys = lsh.recent_matching_keys(jnp.asarray(valid), seqlen, q_start, 1,
                                    n_keys)
    mask = lsh.recent_matching_mask(jnp.asarray(valid), seqlen, q_start, 1,
                                    n_keys)
    np.testing.assert_array_equal(np.nonzero(np.asarray(mask))[0],
                                  np.sort(np.asarray(keys)))


def _round_to_bfloat16(x):
  return np.asarray(jnp.asarray(x, jnp.float32).astype(jnp.bfloat16),
                    np.float64)


@pytest.mark.parametrize('masked,speed_blocks', [
    (False, False), (True, False), (False, True), (True, True)])
def test_sorted_bfloat16_rows_compute_as_float32_from_the_rounded_rows(
    monkeypatch, masked, speed_blocks):
  """`SORTED_BFLOAT16`: the queries|values are sorted as bfloat16 rows, and
  everything after computes in float32 as from those rounded rows: the
  paper-algorithm reference (float64) on the rounded queries and values
  matches to float32 rounding, whole and in blocks run for speed; their
  gradients are the float32 path's at the rounded inputs up to the
  bfloat16 rounding of the sorted rows' cotangents."""
  if speed_blocks:
    _gather_in_blocks(monkeypatch, speed=True)
  length, chunk_len, n_hashes, depth, n_values = 16, 4, 2, 8, 8
  q = np.random.RandomState(0).normal(size=(length, depth)).astype(np.float32)
  v = np.random.RandomState(1).normal(size=(length, n_values)).astype(
      np.float32)
  mask = np.ones(length, bool)
  if masked:
    mask[[3, 11, 15]] = False
  buckets = lsh.lsh_buckets(jnp.asarray(q), jax.random.PRNGKey(2), 4, n_hashes,
                            chunk_len)
  kw = dict(n_hashes=n_hashes, chunk_len=chunk_len, n_chunks_before=1,
            n_chunks_after=0, causal=True)

  def run(narrow, q, v):
    monkeypatch.setattr(lsh, 'SORTED_BFLOAT16', narrow)
    f = lambda q, v: lsh.lsh_attend(q, v, buckets, jnp.asarray(mask)
                                    if masked else None, **kw)
    loss = lambda q, v: jnp.sum(f(q, v) * jnp.cos(f(q, v)))
    assert ('bf16[' in str(jax.make_jaxpr(f)(q, v))) == narrow
    return jax.jit(f)(q, v), jax.jit(jax.grad(loss, (0, 1)))(q, v)

  got, grads = run(True, q, v)
  q16, v16 = _round_to_bfloat16(q), _round_to_bfloat16(v)
  # One head whose projections pick the rounded queries and values out of x.
  x = np.concatenate([q16, v16], axis=-1)[None]
  eye = np.eye(depth + n_values)
  weights = (eye[None, :, :depth], eye[None, :, depth:],
             eye[None, depth:])  # The output lands in x's last columns.
  want = refs.lsh_attention(x, weights, np.asarray(buckets)[None], n_heads=1,
                            n_hashes=n_hashes, chunk_len=chunk_len,
                            causal=True, mask=mask[None] if masked else None)
  want = want[0, :, depth:]
  np.testing.assert_allclose(got, want,
                             **float32_tolerance(rtol=2e-5, atol=2e-5))
  # The float32 rows differ from the rounded ones by far more than that.
  full, full_grads = run(False, q, v)
  assert np.abs(np.asarray(full) - want).max() > 1e-4
  _, rounded_grads = run(False, jnp.asarray(q16, jnp.float32),
                         jnp.asarray(v16, jnp.float32))
  for g, want_g in zip(grads, rounded_grads):
    np.testing.assert_allclose(g, want_g, rtol=0, atol=1e-2 * np.abs(
        want_g).max())


@pytest.mark.parametrize('backend,asked,narrow', [
    ('tpu', 'default', True), ('tpu', 'bfloat16', True),
    ('tpu', 'highest', False), ('cpu', 'default', False),
    ('gpu', 'default', False)])
def test_sorted_bfloat16_by_default_where_matmuls_round_to_it(
    monkeypatch, backend, asked, narrow):
  """`SORTED_BFLOAT16` None: on a TPU at JAX's default matmul precision
  (one bfloat16 pass), not where `jax.default_matmul_precision` asks for
  more, nor on other backends; never for the Pallas kernel."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  q = _normal(0, (32, 8))
  buckets = lsh.lsh_buckets(q, jax.random.PRNGKey(2), 4, 2, 8)
  kw = dict(n_hashes=2, chunk_len=8, n_chunks_before=1, n_chunks_after=0,
            causal=True)
  for implementation, want in (('xla', narrow), ('pallas', False)):
    with jax.default_matmul_precision(asked):
      jaxpr = str(jax.make_jaxpr(functools.partial(
          lsh.lsh_attend, v=q, buckets=buckets, implementation=implementation,
          **kw))(q))
    # The sorted rows of both rounds, queries|values side by side.
    assert ('bf16[64,16]' in jaxpr) == want, (implementation, jaxpr)
