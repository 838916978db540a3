"""NumPy references for the efficient-attention tests (float64, one query at a time).

Written from Trax's formulas and the Reformer paper, independently of the
layers: every query's key set is enumerated explicitly, logits get Trax's
additive penalties (-1e9 for future or padding keys, -1e5 for the query's own
key under shared QK), and the softmax is taken per query.
"""

import io
import pathlib

import jax
import numpy as np

from retrax.shapes import signature

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / 'fixtures' / 'golden'


def rms_normalize(x, eps=1e-6):
  return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + eps)


def logsumexp32(a):
  """Log-sum-exp of float32 values, the result rounded to float32 (as XLA's)."""
  a = np.asarray(a, np.float32)
  m = np.max(a)
  return np.float32(m) + np.float32(
      np.log(np.sum(np.exp(a.astype(np.float64) - np.float64(m)))))


def attend_one(q, keys, values, q_pos, k_pos, causal, exclude_self,
               k_valid=None):
  """Softmax attention of one query; returns (output, logsumexp of logits).

  Logits, Trax's additive penalties and the log-normaliser are float32, as in
  Trax: near -1e5 float32 resolves only 1/128, so a query that sees nothing
  but (copies of) itself gets weights that sum to 1 only within ~0.4%.
  """
  logits = np.asarray(keys @ q, np.float32)
  if causal:
    logits = logits - np.float32(1e9) * (k_pos > q_pos)
  if exclude_self:
    logits = logits - np.float32(1e5) * (k_pos == q_pos)
  if k_valid is not None:
    logits = logits - np.float32(1e9) * (~k_valid)
  lse = logsumexp32(logits)
  probs = np.exp(logits.astype(np.float64) - np.float64(lse))
  return probs @ values, lse


def _heads(weights):
  """Per-head tuples of float64 numpy weights."""
  weights = [np.asarray(w, np.float64) for w in weights]
  return [tuple(w[h] for w in weights) for h in range(weights[0].shape[0])]


def local_self_attention(x, weights, *, chunk_len=None, n_chunks_before=0,
                         n_chunks_after=0, causal=False, share_qk=False,
                         bias=False, mask=None):
  """SelfAttention: each position attends to its chunk window (or all)."""
  x = np.asarray(x, np.float64)
  batch, length, d_model = x.shape
  out = np.zeros((batch, length, d_model))
  for ws in _heads(weights):
    if share_qk:
      w_q, w_v, w_o = ws[:3]
      w_k = None
      b_q, b_v = ws[3:] if bias else (0., 0.)
    else:
      w_q, w_k, w_v, w_o = ws[:4]
      b_q, b_k, b_v = ws[4:] if bias else (0., 0., 0.)
    d_qk = w_q.shape[-1]
    for b in range(batch):
      q = x[b] @ w_q + b_q
      k = rms_normalize(q) if share_qk else x[b] @ w_k + b_k
      k = k / np.sqrt(d_qk)
      v = x[b] @ w_v + b_v
      valid = np.ones(length, bool) if mask is None else np.asarray(
          mask[b], bool)
      if chunk_len:
        padded = -(-length // chunk_len) * chunk_len
        pad = padded - length
        k = np.pad(k, ((0, pad), (0, 0)))
        v = np.pad(v, ((0, pad), (0, 0)))
        valid = np.concatenate([valid, np.zeros(pad, bool)])
        n_chunks = padded // chunk_len
      for i in range(length):
        if chunk_len:
          c = i // chunk_len
          idx = np.concatenate([
              np.arange(chunk_len) + ((c + o) % n_chunks) * chunk_len
              for o in range(-n_chunks_before, n_chunks_after + 1)])
        else:
          idx = np.arange(length)
        o_i, _ = attend_one(q[i], k[idx], v[idx], i, idx, causal, share_qk,
                            None if (mask is None and not chunk_len)
                            else valid[idx])
        out[b, i] += o_i @ w_o
  return out


def lsh_attention(x, weights, buckets, *, n_heads, n_hashes, chunk_len,
                  n_chunks_before=1, n_chunks_after=0, causal=False,
                  mask=None):
  """LSH attention given each (example, head)'s buckets (paper / Trax).

  `buckets[e * n_heads + h]` lists the bucket of every (round, position),
  rounds offset apart. Items are sorted by (bucket, round, position); sorted
  chunk `c` attends to chunks `c - n_chunks_before .. c + n_chunks_after`
  (cyclically); rounds are merged with weights softmax(logsumexp per round).
  """
  x = np.asarray(x, np.float64)
  batch, length, d_model = x.shape
  out = np.zeros((batch, length, d_model))
  n_items = n_hashes * length
  n_chunks = n_items // chunk_len
  for h, (w_q, w_v, w_o) in enumerate(_heads(weights)):
    for b in range(batch):
      q = x[b] @ w_q
      k = rms_normalize(q) / np.sqrt(q.shape[-1])
      v = x[b] @ w_v
      valid = np.ones(length, bool) if mask is None else np.asarray(
          mask[b], bool)
      bk = np.asarray(buckets[b * n_heads + h])
      order = sorted(range(n_items), key=lambda i: (bk[i], i))
      pos = np.array([i % length for i in order])
      round_out = np.zeros((n_hashes, length, v.shape[-1]))
      round_lse = np.zeros((n_hashes, length))
      for s, item in enumerate(order):
        c = s // chunk_len
        window = np.concatenate([
            np.arange(chunk_len) + ((c + o) % n_chunks) * chunk_len
            for o in range(-n_chunks_before, n_chunks_after + 1)])
        k_pos = pos[window]
        p = pos[s]
        o_s, lse = attend_one(q[p], k[k_pos], v[k_pos], p, k_pos, causal, True,
                              valid[k_pos] if mask is not None else None)
        round_out[item // length, p] = o_s
        round_lse[item // length, p] = lse
      # Rounds merge by softmax over their float32 log-normalisers (Trax).
      round_lse = round_lse.astype(np.float32)
      total = np.array([logsumexp32(round_lse[:, p]) for p in range(length)])
      w = np.exp(round_lse.astype(np.float64) - total.astype(np.float64))
      out[b] += np.sum(w[..., None] * round_out, axis=0) @ w_o
  return out


def predict_outputs(layer, x, weights, rng, step=1):
  """Runs a predict-mode layer `step` positions at a time; concatenated outputs."""
  _, state = layer.init(jax.ShapeDtypeStruct((x.shape[0], step, x.shape[2]),
                                             x.dtype))
  call = jax.jit(layer.pure_fn)
  outs = []
  for start in range(0, x.shape[1], step):
    y, state = call(x[:, start:start + step], weights, state, rng)
    outs.append(np.asarray(y))
  return np.concatenate(outs, axis=1)


def assert_decodes_alike(layers, states, x, weights, prompt_len):
  """Two predict-mode layers (batched, reference loop) decode `x` alike.

  A prompt of `prompt_len` positions, then one position at a time; outputs
  and final states agree (1e-5). Returns the first layer's final state.
  """
  rng = jax.random.PRNGKey(0)
  calls = [(0, prompt_len)] + [(t, t + 1) for t in range(prompt_len,
                                                         x.shape[1])]
  for start, stop in calls:
    (y, s0), (y_ref, s1) = (
        layer.pure_fn(x[:, start:stop], weights, state, rng)
        for layer, state in zip(layers, states))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    states = [s0, s1]
  for a, b in zip(jax.tree_util.tree_leaves(states[0]),
                  jax.tree_util.tree_leaves(states[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  return states[0]


# --- golden ReformerLM checkpoints ------------------------------------------------


def read_golden(name):
  """(flat_weights, flat_state, io) of a golden Trax checkpoint."""
  from retrax.checkpoints.trax_format import read_trax_checkpoint
  ckpt = read_trax_checkpoint(GOLDEN / name / 'model.pkl.gz')
  weights = [np.asarray(w) for w in ckpt['flat_weights']]
  state = [np.asarray(s) for s in ckpt['flat_state']]
  with open(GOLDEN / name / 'io.npz', 'rb') as f:
    data = dict(np.load(io.BytesIO(f.read())))
  return weights, state, data


def _layer_norm(h, scale, bias):
  c = h - h.mean(-1, keepdims=True)
  return c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6) * scale + bias


def _fast_gelu(h):
  return 0.5 * h * (1 + np.tanh(h * 0.7978845608 * (1 + 0.044715 * h * h)))


def reformer_lm_logits(weights, state, tokens, attention, n_attn_weights,
                       n_attn_state):
  """Eval-mode ReformerLM (2 layers) in NumPy; `attention(h, w, s)` is the layer.

  Weight order (Trax's flattening): embedding, positional table, then per
  layer [LayerNorm(2), attention weights, LayerNorm(2), Dense(2), Dense(2)],
  then final LayerNorm(2) and Dense(2). Dropouts are identities in eval mode.
  """
  emb, pos = weights[0], weights[1]
  shifted = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], 1)
  h = emb[shifted] + pos[None, :tokens.shape[1]]
  a, b = h, h
  wi, si = 2, 1
  for _ in range(2):
    ln_s, ln_b = weights[wi:wi + 2]
    w_attn = weights[wi + 2:wi + 2 + n_attn_weights]
    wi += 2 + n_attn_weights
    s_attn = state[si:si + n_attn_state]
    si += n_attn_state + 2
    fl_s, fl_b, w1, b1, w2, b2 = weights[wi:wi + 6]
    wi += 6
    a = a + attention(_layer_norm(b, ln_s, ln_b), tuple(w_attn), tuple(s_attn))
    b = b + _fast_gelu(_layer_norm(a, fl_s, fl_b) @ w1 + b1) @ w2 + b2
  h = _layer_norm(np.concatenate([a, b], -1), weights[wi], weights[wi + 1])
  return h @ weights[wi + 2] + weights[wi + 3]



def on_cpu():
  """Context: JAX's computations (layers' inits included) on the first CPU."""
  return jax.default_device(jax.devices('cpu')[0])


def xla_cpu_temp_bytes(jitted, *args):
  """XLA:CPU's planned temporaries (bytes) of `jitted` lowered on `args`.

  Compiled for the CPU whatever the default backend: the memory tests check
  XLA:CPU's plan (a TPU v5e's `memory_analysis()` gave 0 and negative temps,
  JAX 0.10.2). Build `args` (layers' inits) inside `on_cpu()` too.
  """
  with on_cpu():
    compiled = jitted.lower(*args).compile()
  platforms = {d.platform for s in jax.tree.leaves(compiled.input_shardings)
               for d in s.device_set}
  assert platforms == {'cpu'}, platforms
  return compiled.memory_analysis().temp_size_in_bytes


def grad_temp_bytes(layer, length, d_model=32):
  """XLA:CPU's temp memory of `layer`'s forward+backward on `[1, length, d_model]`."""
  x = jax.ShapeDtypeStruct((1, length, d_model), np.float32)
  with on_cpu():
    weights, state = layer.init(x)
  loss = lambda x, w: jax.numpy.sum(
      layer.pure_fn(x, w, state, jax.random.PRNGKey(0))[0])
  return xla_cpu_temp_bytes(jax.jit(jax.grad(loss, (0, 1))), x, weights)


_COMPILES = None


def _compile_events():
  """A list that gets the name of every XLA compilation from now on."""
  global _COMPILES
  if _COMPILES is None:
    _COMPILES = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, *a, **k: _COMPILES.append(name)
        if 'backend_compile' in name else None)
  return _COMPILES


def eager_equals_jitted_without_recompiles(layer, weights, x, prompt_len=1):
  """Runs predict-mode `layer` position by position eagerly and under jit.

  Asserts equal outputs and that, once every position kind has been seen,
  eager calls compile nothing: they run one cached program per input shape
  (eager `lax.scan`/`lax.cond` calls used to compile at every call, which
  made the blog's token-by-token loop 8x slower).
  """
  compiles = _compile_events()
  _, state = layer.init(signature(x[:, :1]))
  rng = jax.random.PRNGKey(0)
  jitted, eager = jax.jit(layer.pure_fn), layer.pure_fn
  ys = {'jit': [], 'eager': []}
  for name, call in (('jit', jitted), ('eager', eager)):
    s = state
    y, s = call(x[:, :prompt_len], weights, s, rng)
    ys[name].append(y)
    for t in range(prompt_len, x.shape[1]):
      if name == 'eager' and t == x.shape[1] - 3:
        before = len(compiles)
      y, s = call(x[:, t:t + 1], weights, s, rng)
      ys[name].append(y)
  np.testing.assert_allclose(np.concatenate(ys['eager'], 1),
                             np.concatenate(ys['jit'], 1), rtol=1e-5,
                             atol=1e-5)
  assert len(compiles) == before, compiles[before:]
