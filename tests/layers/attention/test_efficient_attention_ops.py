"""Tests of the efficient-attention array functions: hashing, masks, attend, permutations."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.fastmath import precision
from retrax import layers as tl
from retrax.layers.attention import efficient as ea
from retrax.layers.attention import ops
from tests.backend_tolerance import float32_tolerance

import efficient_attention_refs as refs


def _normal(seed, shape):
  return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)


def test_length_normalized_gives_unit_rms():
  x = np.asarray(_normal(0, (5, 7)))
  got = ea.length_normalized(x)
  want = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_look_adjacent_wraps_around():
  x = np.arange(4 * 2).reshape(4, 2)  # 4 chunks of 2
  got = np.asarray(ea.look_adjacent(x, 1, 1))
  for c in range(4):
    want = np.concatenate([x[(c - 1) % 4], x[c], x[(c + 1) % 4]])
    np.testing.assert_array_equal(got[c], want)
  assert ea.look_adjacent(x, 0, 0) is x


@pytest.mark.parametrize('n_buckets', [6, [4, 6]])
def test_hash_vecs_is_argmax_of_rotations(n_buckets):
  vecs = np.asarray(_normal(0, (10, 5)))
  rng = jax.random.PRNGKey(3)
  buckets, total = ea.hash_vecs(vecs, n_buckets, 3, rng)
  factors = [n_buckets] if isinstance(n_buckets, int) else n_buckets
  rot = np.asarray(jax.random.normal(rng, (5, 3, sum(factors) // 2)))
  want, start, radix = 0, 0, 1
  for f in factors:
    r = np.einsum('tf,fhb->htb', vecs, rot[..., start:start + f // 2])
    want = want + radix * np.argmax(np.concatenate([r, -r], -1), -1)
    start, radix = start + f // 2, radix * f
  assert total == int(np.prod(factors))
  assert buckets.shape == (3, 10) and buckets.dtype == jnp.int32
  np.testing.assert_array_equal(buckets, want)


@pytest.mark.parametrize('kind', ['normal', 'ties', 'nan', 'inf'])
def test_argmax_of_both_signs_is_numpy_argmax_of_the_concatenation(kind):
  rs = np.random.RandomState(0)
  x = rs.randn(3, 50, 8).astype(np.float32)
  if kind == 'ties':  # Many equal maxima, and max(x) == -min(x).
    x = rs.randint(-2, 3, size=x.shape).astype(np.float32)
  elif kind == 'nan':
    x[rs.rand(*x.shape) < 0.1] = np.nan
  elif kind == 'inf':
    x[rs.rand(*x.shape) < 0.1] = np.inf
    x[rs.rand(*x.shape) < 0.1] = -np.inf
  want = np.argmax(np.concatenate([x, -x], -1), -1)
  got = ops.argmax_of_both_signs(jnp.asarray(x))
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, want)


def test_hash_vecs_rejects_odd_bucket_counts():
  with pytest.raises(ValueError, match='even'):
    ea.hash_vecs(np.ones((2, 3), np.float32), 5, 1, jax.random.PRNGKey(0))


def test_mask_self_attention_penalties():
  dots = np.zeros((1, 3), np.float32)
  q_info = np.array([[1]])
  kv_info = np.array([[0, 1, -2]])
  got = np.asarray(ea.mask_self_attention(dots, q_info, kv_info, causal=True,
                                          exclude_self=True, masked=True))
  np.testing.assert_allclose(got, [[0., -1e5, -1e9]])
  got = ea.mask_self_attention(dots, np.array([[0]]), np.array([[1, 0, 2]]))
  np.testing.assert_allclose(got, [[-1e9, -1e5, -1e9]])


@pytest.mark.parametrize('keys_major_from', [1, 100])  # both logit layouts
def test_attend_chunked_shared_qk_matches_reference(monkeypatch,
                                                    keys_major_from):
  monkeypatch.setattr(ops, 'KEYS_MAJOR_MIN_QUERIES', keys_major_from)
  causal = True
  q = np.asarray(_normal(0, (12, 4)))
  v = np.asarray(_normal(1, (12, 3)))
  mask_fn = functools.partial(ea.mask_self_attention, causal=causal,
                              exclude_self=True)
  out, lse = ea.attend(q, None, v, q_chunk_len=4, n_chunks_before=1,
                       mask_fn=mask_fn)
  k = refs.rms_normalize(q.astype(np.float64)) / 2.0
  for i in range(12):
    c = i // 4
    idx = np.concatenate([np.arange(4) + ((c - 1) % 3) * 4,
                          np.arange(4) + c * 4])
    o_i, lse_i = refs.attend_one(q[i], k[idx], v[idx], i, idx, causal, True)
    np.testing.assert_allclose(out[i], o_i, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[i], lse_i, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize('keys_major_from', [1, 100])  # both logit layouts
def test_attend_gives_a_custom_mask_fn_query_major_logits(monkeypatch,
                                                          keys_major_from):
  # A mask_fn that is not elementwise (it reads the layout: each query row
  # keeps only its first key) still gets Trax's [chunks, C, W] logits.
  monkeypatch.setattr(ops, 'KEYS_MAJOR_MIN_QUERIES', keys_major_from)
  q = np.asarray(_normal(0, (8, 4)))
  k = np.asarray(_normal(1, (8, 4)))
  v = np.asarray(_normal(2, (8, 3)))
  seen = []

  def first_key_only(dots, q_info, kv_info):
    del q_info, kv_info
    seen.append(dots.shape)
    keys = jnp.arange(dots.shape[-1])
    return jnp.where(keys == 0, dots, dots - 1e9)
  out, _ = ea.attend(q, k, v, q_chunk_len=4, kv_chunk_len=4,
                     n_chunks_before=1, mask_fn=first_key_only)
  assert seen == [(2, 4, 8)]
  # Chunk c's first key is the first of chunk c - 1 (wrapping): rows 4, 0.
  want = np.concatenate([np.tile(v[4], (4, 1)), np.tile(v[0], (4, 1))])
  np.testing.assert_allclose(out, want, rtol=1e-6)


def test_attend_logit_layouts_agree_with_dropout(monkeypatch):
  # Keys-major and query-major logits: the same dropout bits, values and
  # gradients.
  q = np.asarray(_normal(0, (24, 4)))
  v = np.asarray(_normal(1, (24, 3)))
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True)

  def value_and_grads(keys_major_from):
    monkeypatch.setattr(ops, 'KEYS_MAJOR_MIN_QUERIES', keys_major_from)
    def loss(q, v):
      out, lse = ops.attend(q, None, v, q_chunk_len=4, n_chunks_before=1,
                            mask_fn=mask_fn, dropout=0.4,
                            rng=jax.random.PRNGKey(3))
      return jnp.sum(out * out) + jnp.sum(lse), out
    (_, out), grads = jax.value_and_grad(loss, (0, 1), has_aux=True)(q, v)
    return out, grads
  out_k, grads_k = value_and_grads(1)
  out_q, grads_q = value_and_grads(100)
  np.testing.assert_allclose(out_k, out_q, rtol=1e-5, atol=1e-6)
  for a, b in zip(grads_k, grads_q):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  no_dropout, _ = ops.attend(q, None, v, q_chunk_len=4, n_chunks_before=1,
                             mask_fn=mask_fn)
  assert not np.allclose(out_k, no_dropout)  # The dropout did drop.


@pytest.mark.parametrize('dropout, remat', [(0.0, True), (0.3, True),
                                             (0.0, False)])
def test_attend_in_blocks_of_chunks_equals_whole(monkeypatch, dropout, remat):
  # 11 chunks of 4 in blocks of 3 (a remainder of 2): the values match the
  # NumPy reference, and values and gradients the whole-array computation,
  # the blocks rematerialized or not (`remat_blocks`).
  q = np.asarray(_normal(0, (44, 4)))
  v = np.asarray(_normal(1, (44, 3)))
  info = np.asarray(jax.random.permutation(jax.random.PRNGKey(2), 44))
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True)

  def attend(q, v):
    return ops.attend(q, None, v, q_chunk_len=4, n_chunks_before=1,
                      mask_fn=mask_fn, q_info=info, dropout=dropout,
                      rng=jax.random.PRNGKey(3))

  def loss(q, v):
    out, lse = attend(q, v)
    return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(lse))

  whole = attend(q, v), jax.grad(loss, (0, 1))(q, v)
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', 3)
  monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 0)
  monkeypatch.setattr(ops, 'remat_blocks', lambda *shape: remat)
  jaxpr = str(jax.make_jaxpr(attend)(q, v))
  assert 'scan' in jaxpr or 'while' in jaxpr  # the blocks are a loop
  assert ('checkpoint' in jaxpr or 'remat' in jaxpr) == remat
  with precision.matmul_precision('bfloat16'):  # bfloat16: whole arrays
    jaxpr = str(jax.make_jaxpr(attend)(q, v))
  assert 'scan' not in jaxpr and 'while' not in jaxpr
  blocked = attend(q, v), jax.grad(loss, (0, 1))(q, v)
  for got, want in zip(jax.tree_util.tree_leaves(blocked),
                       jax.tree_util.tree_leaves(whole)):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  if dropout:
    return
  out, lse = blocked[0]
  k = refs.rms_normalize(q.astype(np.float64)) / 2.0
  for i in range(44):
    c = i // 4
    idx = np.concatenate([np.arange(4) + ((c - 1) % 11) * 4,
                          np.arange(4) + c * 4])
    o_i, lse_i = refs.attend_one(q[i], k[idx], v[idx], info[i], info[idx],
                                 True, True)
    np.testing.assert_allclose(out[i], o_i,
                               **float32_tolerance(rtol=1e-5, atol=1e-5))
    np.testing.assert_allclose(lse[i], lse_i,
                               **float32_tolerance(rtol=1e-5, atol=1e-3))


@pytest.mark.parametrize('with_rows,dropout,speed', [
    (True, 0.0, False), (True, 0.3, False), (False, 0.0, False),
    (False, 0.3, True)])
def test_attend_shared_qk_in_blocks_equals_attend(monkeypatch, with_rows,
                                                  dropout, speed):
  # Queries and values side by side in `qv`, given in sorted order or as
  # `qv[rows]` (rows repeating, as LSH's rounds do): where memory decides
  # (or, `speed`, in blocks run for speed with `JOINT_SPEED_BLOCKS`) the
  # blocks part them (and gather their rows) themselves; values and
  # gradients are `attend`'s of the gathered, parted arrays.
  qv = np.asarray(_normal(0, (22, 7)))
  rows = np.concatenate([np.asarray(jax.random.permutation(
      jax.random.PRNGKey(s), 22)) for s in (1, 2)])
  info = rows if with_rows else np.arange(44)
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True)
  common = dict(n_chunks_before=1, mask_fn=mask_fn, q_info=info,
                dropout=dropout, rng=jax.random.PRNGKey(3))

  def reference(qv):
    x = qv[rows] if with_rows else jnp.concatenate([qv, qv[::-1]])
    return ops.attend(x[:, :4], None, x[:, 4:], q_chunk_len=4, **common)

  def shared(qv):
    if with_rows:
      return ops.attend_shared_qk(qv, 4, 4, rows=rows, **common)
    return ops.attend_shared_qk(jnp.concatenate([qv, qv[::-1]]), 4, 4,
                                **common)

  def loss(f):
    return lambda qv: sum(jnp.sum(t * jnp.cos(t)) for t in f(qv))

  want = reference(qv), jax.grad(loss(reference))(qv)
  seen = []
  in_blocks = ops._attend_in_blocks  # pylint: disable=protected-access
  monkeypatch.setattr(ops, '_attend_in_blocks', lambda *a, **k: (
      seen.append((k['depth'], k['rows'] is not None)), in_blocks(*a, **k))[1])
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', 3)
  if speed:
    monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 0)
    monkeypatch.setattr(ops, 'JOINT_SPEED_BLOCKS', True)
    assert not ops.gathers_in_blocks(44, 4, 1, 0, 'xla')
  else:
    monkeypatch.setattr(ops, 'REMAT_MIN_LOGITS', 0)
    assert ops.gathers_in_blocks(44, 4, 1, 0, 'xla')
    assert not ops.gathers_in_blocks(44, 4, 1, 0, 'pallas')
  got = shared(qv), jax.grad(loss(shared))(qv)
  assert seen and set(seen) == {(4, with_rows)}
  for g, w in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('blocks', [None, 'memory', 'memory_lse', 'speed',
                                    'speed_lse'])
def test_attend_shared_qk_joint_output_is_attend_side_by_side(monkeypatch,
                                                              blocks):
  # `joint_output`: one `[N, V + 1]` array of `attend`'s outputs and
  # log-normalisers, whole, in blocks that gather rows (memory), in blocks
  # of the sorted rows (speed), either joining them inside (`_lse`:
  # `LSE_IN_BLOCKS`).
  qv = np.asarray(_normal(4, (22, 7)))
  rows = np.concatenate([np.asarray(jax.random.permutation(
      jax.random.PRNGKey(s), 22)) for s in (5, 6)])
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True)
  common = dict(n_chunks_before=1, mask_fn=mask_fn, q_info=rows, dropout=0.2,
                rng=jax.random.PRNGKey(7))
  given_rows = blocks in (None, 'memory', 'memory_lse')

  def reference(qv):
    x = qv[rows]
    out, lse = ops.attend(x[:, :4], None, x[:, 4:], q_chunk_len=4, **common)
    return jnp.concatenate([out, lse[:, None]], axis=-1)

  def joint(qv):
    if given_rows:
      return ops.attend_shared_qk(qv, 4, 4, rows=rows, joint_output=True,
                                  **common)
    return ops.attend_shared_qk(qv[rows], 4, 4, joint_output=True, **common)

  def loss(f):
    return lambda qv: jnp.sum(f(qv) * jnp.cos(f(qv)))

  want = reference(qv), jax.grad(loss(reference))(qv)
  seen = []
  in_blocks = ops._attend_in_blocks  # pylint: disable=protected-access
  monkeypatch.setattr(ops, '_attend_in_blocks', lambda *a, **k: (
      seen.append(k['side_by_side']), in_blocks(*a, **k))[1])
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', 3)
  lse_in_blocks = bool(blocks) and blocks.endswith('_lse')
  monkeypatch.setattr(ops, 'LSE_IN_BLOCKS', lse_in_blocks)
  if blocks in ('memory', 'memory_lse'):
    monkeypatch.setattr(ops, 'REMAT_MIN_LOGITS', 0)
  elif blocks:
    monkeypatch.setattr(ops, 'BLOCK_MIN_LOGITS', 0)
    monkeypatch.setattr(ops, 'JOINT_SPEED_BLOCKS', True)
  got = joint(qv), jax.grad(loss(joint))(qv)
  assert got[0].shape == (44, 4)
  assert set(seen) == ({lse_in_blocks} if blocks else set())
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_joint_speed_blocks_and_lse_in_blocks_by_default_on_a_tpu_only(
    monkeypatch):
  # Both measured faster on a TPU v5e (whose tiles pad 64-wide arrays and
  # `[N, 1]` columns); elsewhere the slices and the concatenation stay,
  # unless set.
  assert ops.JOINT_SPEED_BLOCKS is None and ops.LSE_IN_BLOCKS is None
  for backend, want in [('tpu', True), ('cpu', False), ('gpu', False)]:
    monkeypatch.setattr(ops.jax, 'default_backend', lambda b=backend: b)
    assert ops.on_tpu_unless_set(None) is want
    for setting in (True, False):
      assert ops.on_tpu_unless_set(setting) is setting


def test_speed_blocks_are_rematerialized_as_set_memory_blocks_always(
    monkeypatch):
  below = ops.REMAT_MIN_LOGITS // (128 * 256)  # chunks of 128 over 256 keys
  assert ops.REMAT_SPEED_BLOCKS  # the default
  for speed, want in [(True, (True, True)), (False, (False, True))]:
    monkeypatch.setattr(ops, 'REMAT_SPEED_BLOCKS', speed)
    assert (ops.remat_blocks(below, 128, 256),
            ops.remat_blocks(below + 1, 128, 256)) == want, speed


def test_attend_queries_scaled_matches_reference_and_attend():
  q = np.asarray(_normal(0, (2, 8)))
  k = np.asarray(_normal(1, (9, 8)))
  v = np.asarray(_normal(2, (9, 3)))
  q_info = np.array([5, 6])
  kv_info = np.array([0, 1, -4, 3, 4, 5, 6, 7, 8])  # -4: masked (padding).
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True, masked=True)
  out, lse = ops.attend_queries_scaled(q, k, v, mask_fn=mask_fn,
                                       q_info=q_info, kv_info=kv_info)
  for i in range(2):
    o_i, lse_i = refs.attend_one(q[i] / np.sqrt(8), k, v, q_info[i], kv_info,
                                 True, True, k_valid=kv_info >= 0)
    np.testing.assert_allclose(out[i], o_i, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse[i], lse_i, rtol=1e-5, atol=1e-3)
  want = ea.attend(q, k, v, mask_fn=mask_fn, q_info=q_info, kv_info=kv_info)
  np.testing.assert_allclose(out, want[0], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match='keys `k` and values `v`'):
    ops.attend_queries_scaled(q, None, v)


def test_attend_rejects_bad_chunking():
  with pytest.raises(ValueError, match='divisible'):
    ea.attend(np.ones((5, 2)), np.ones((5, 2)), np.ones((5, 2)),
              q_chunk_len=2, kv_chunk_len=2)


def test_apply_broadcasted_dropout_shares_mask_across_rows():
  x = np.ones((6, 50), np.float32)
  y = np.asarray(ea.apply_broadcasted_dropout(x, 0.4, jax.random.PRNGKey(0)))
  assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.6)}
  np.testing.assert_array_equal(y, np.broadcast_to(y[:1], y.shape))
  assert ea.apply_broadcasted_dropout(x, 0.0, None) is x


@pytest.mark.parametrize('permute', ['gather', 'sort'])
def test_permutations_and_their_gradients(permute):
  perm = np.array([2, 0, 3, 1], np.int32)
  inv = np.argsort(perm).astype(np.int32)
  val = np.asarray(_normal(0, (4, 3)))
  w = np.asarray(_normal(1, (4, 3)))
  if permute == 'gather':
    f = lambda x: ea.permute_via_gather(x, perm, inv)
  else:  # sorting by keys `inv` puts element perm[i] at i.
    f = lambda x: ea.permute_via_sort(x.T, inv, perm, axis=-1).T
  np.testing.assert_allclose(f(val), val[perm])
  grad = jax.grad(lambda x: jnp.sum(w * f(x)))(val)
  np.testing.assert_allclose(grad, w[inv])


@pytest.mark.parametrize('method', ['scatter', 'sort'])
@pytest.mark.parametrize('shape', [(1,), (96,), (50000,), (3, 40), (2, 2, 17)])
def test_inverse_permutation_is_numpys_argsort(method, shape):
  # 1-D as `lsh_attend` calls it (its n_hashes * L positions), vmapped as
  # attention's groups of units run it, and with leading axes.
  rs = np.random.RandomState(len(shape))
  perms = np.stack([rs.permutation(shape[-1]) for _ in range(
      int(np.prod(shape[:-1])))]).reshape(shape).astype(np.int32)
  inverse = functools.partial(ops.inverse_permutation, method=method)
  got = jax.jit(inverse)(perms)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, np.argsort(perms, axis=-1))
  rows = perms.reshape(-1, shape[-1])
  np.testing.assert_array_equal(jax.jit(jax.vmap(inverse))(rows),
                                np.argsort(rows, axis=-1))


def test_inverse_permutation_sorts_on_tpus_only(monkeypatch):
  perm = np.random.RandomState(0).permutation(8).astype(np.int32)

  def primitives(backend):
    monkeypatch.setattr(jax, 'default_backend', lambda: backend)
    # A new function each time: JAX caches traces by function, not backend.
    eqns = jax.make_jaxpr(lambda p: ops.inverse_permutation(p))(perm).eqns
    return {e.primitive.name for e in eqns} & {'sort', 'scatter'}
  assert primitives('cpu') == {'scatter'}  # XLA:CPU scatters 100x faster.
  assert primitives('gpu') == {'scatter'}
  assert primitives('tpu') == {'sort'}
  with pytest.raises(ValueError, match=r"method must be one of \('scatter', "
                     r"'sort'\); got 'gather'"):
    ops.inverse_permutation(perm, method='gather')


def _dots_contract_first_operands_minor_axis(fun, *args):
  """Whether every dot XLA compiles `fun` to contracts its lhs's last axis.

  Read from the optimised HLO, after XLA has folded transposes into dots.
  """
  hlo = jax.jit(lambda *a: fun(*a)).lower(*args).compile().as_text()  # no cache
  ranks = {name: len(dims.split(',')) if dims else 0 for name, dims in
           re.findall(r'(%[\w.-]+) = \w+\[([\d,]*)\]', hlo)}
  dots = re.findall(r' dot\((%[\w.-]+), [^)]*\), lhs_batch_dims=\{[\d,]*\}, '
                    r'lhs_contracting_dims=\{(\d+)\}', hlo)
  assert dots, hlo
  return all(int(axis) == ranks[lhs] - 1 for lhs, axis in dots)


@pytest.mark.parametrize('dropout', [0.0, 0.3])
def test_attend_bf16_logits_in_both_layouts(monkeypatch, dropout):
  # With bfloat16 matmuls a block computes its logits keys-major and
  # query-major, so that no matmul (forward or gradient) contracts a
  # non-minor axis of its first operand. Values and gradients equal the
  # one-layout computation's under the same policy (the same bfloat16
  # roundings, with the same dropout bits).
  q = np.asarray(_normal(0, (96, 8)))  # 12 chunks of 8: 96 rows, bf16.
  v = np.asarray(_normal(1, (96, 4)))
  mask_fn = functools.partial(ea.mask_self_attention, causal=True,
                              exclude_self=True)

  def loss(q, v):
    out, lse = ops.attend(q, None, v, q_chunk_len=8, n_chunks_before=1,
                          mask_fn=mask_fn, dropout=dropout,
                          rng=jax.random.PRNGKey(3))
    return jnp.sum(out * jnp.cos(out)) + jnp.sum(jnp.sin(lse)), (out, lse)

  grad = jax.grad(loss, (0, 1), has_aux=True)
  float32 = jax.tree_util.tree_leaves(grad(q, v))
  with precision.matmul_precision('bfloat16'):
    assert _dots_contract_first_operands_minor_axis(grad, q, v)
    both = jax.tree_util.tree_leaves(grad(q, v))
    monkeypatch.setattr(ops, 'BOTH_LAYOUTS_POLICIES', ())
    assert not _dots_contract_first_operands_minor_axis(grad, q, v)
    one = jax.tree_util.tree_leaves(grad(q, v))
  for a, b, c in zip(both, one, float32):
    scale = np.median(np.abs(b))  # (lse has -1e5 where a query sees itself)
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)
    assert np.max(np.abs(a - c)) > 1e-4 * scale  # bfloat16 did round.


def test_memory_estimate_keeps_every_block_where_blocks_are_not_remat(
    monkeypatch):
  # 64K tokens, 2 rounds, chunks of 128 over 256 keys: 1024 chunks in blocks.
  layer = tl.LSHSelfAttention(n_hashes=2, chunk_len=128)
  rows, depths, length = 2 * 65536, 128, 65536
  assert ops.in_blocks(rows // 128, 128, 256)
  block = ops.BLOCK_CHUNKS * 128
  for remat, logit_rows in [(True, block), (False, rows)]:
    monkeypatch.setattr(ops, 'remat_blocks', lambda *shape, r=remat: r)
    assert layer.unit_bytes(length) == 4 * (logit_rows * 4 * 256 +
                                            rows * 6 * depths), remat
