"""Decoding with Trax models: sampling and beam search, compiled whole under `jax.jit`.

The model is built with `mode='predict'`: its layers keep fixed-size caches
(keys and values, position counters, LSH buckets) in `model.state`, and each
step feeds one token. `autoregressive_sample` and `beam_search` compile the
whole decoding of a batch into one XLA program (a `lax.while_loop` over
positions: one dispatch per call, compiled once per model and shapes);
`autoregressive_sample_stream` runs one compiled step per token.

Fed tokens, one per step: the start symbol, then the prefix (for a language
model `inputs` then `prompt`; for an encoder-decoder, whose `inputs` go to the
encoder, `prompt`), then the samples. Results hold only generated tokens.
Decoding starts from the current `model.state`; as in Trax, sampling leaves
the decoded sequence in it (reset it with `model.state = initial_state`
between sequences); `beam_search` leaves it unchanged.
"""

import weakref

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from retrax.layers import core
from retrax.shapes import ShapeDtype

# Compiled programs and state layouts per model; programs hold only a weak
# reference to their model, so a dropped model frees its entries.
_PROGRAMS = weakref.WeakKeyDictionary()
_LAYOUTS = weakref.WeakKeyDictionary()


# --- model inspection ----------------------------------------------------------


def _walk(layer):
  yield layer
  for sub in layer.sublayers:
    yield from _walk(sub)


def _check_mode(model, eval_mode):
  modes = {getattr(layer, '_mode', None) for layer in _walk(model)} - {None}
  if eval_mode and 'predict' in modes:
    raise ValueError(
        "eval_mode=True reruns the whole sequence at every step and needs a "
        "model built with mode='eval'; this model has layers in "
        "mode='predict' (decode it with eval_mode=False).")
  if not eval_mode and 'predict' not in modes:
    raise ValueError(
        "Fast decoding needs a model built with mode='predict' (its layers "
        "keep caches in model.state); this model's layers are in mode(s) "
        f"{sorted(modes)}. Build it with mode='predict', or pass "
        "eval_mode=True to recompute the full sequence at every step.")


def _position_budget(model):
  """`(free positions, description)` of the tightest predict-mode limit, or `(None, '')`."""
  best = (None, '')
  for layer in _walk(model):
    limit = getattr(layer, '_max_len', None)
    if getattr(layer, '_mode', None) != 'predict' or not isinstance(limit, int):
      continue
    counters = [x for x in jax.tree_util.tree_leaves(layer.state)
                if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype,
                                                     np.integer)]
    used = int(counters[-1]) if counters else 0
    if best[0] is None or limit - used < best[0]:
      best = (limit - used, f'{layer.name} holds {limit} positions and '
                            f'{used} are used')
  return best


def _check_positions(model, n_prefix, max_length):
  """Raises if the prefix and `max_length` samples do not fit in the caches."""
  free, where = _position_budget(model)
  if free is None:
    return
  if n_prefix > free:
    raise ValueError(
        f'The prompt needs {n_prefix} positions (start symbol, inputs and '
        f'prompt) but the predict-mode caches have {free} free ({where}); '
        'shorten the prompt, reset model.state or build the model with a '
        'larger max_len.')
  n_fed = n_prefix + max_length - 1
  if n_fed > free:
    raise ValueError(
        f'A {n_prefix}-token prompt and max_length={max_length} feed {n_fed} '
        f'positions but the predict-mode caches have {free} free ({where}); '
        f'use max_length <= {free - n_prefix + 1} or a larger max_len.')


def _embedding_vocabs(model):
  """Vocabulary sizes of the first and last `Embedding` (encoder, decoder)."""
  sizes = [layer._vocab_size for layer in _walk(model)  # pylint: disable=protected-access
           if isinstance(layer, core.Embedding)]
  return (sizes[0], sizes[-1]) if sizes else (None, None)


def _check_ids(what, ids, vocab_size):
  ids = np.asarray(ids)
  if not np.issubdtype(ids.dtype, np.integer):
    raise TypeError(f'{what} must hold integer token ids; got dtype '
                    f'{ids.dtype}.')
  if vocab_size is not None and ids.size and (ids.min() < 0 or
                                              ids.max() >= vocab_size):
    raise ValueError(f'{what} must hold token ids in [0, {vocab_size}) (the '
                     f"model's vocabulary); got ids from {ids.min()} to "
                     f'{ids.max()}.')
  return ids.astype(np.int32)


def _tokens_2d(what, x, batch_size):
  x = np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{what} must be a 2-D array (batch_size, length); got '
                     f'shape {x.shape}.')
  if x.shape[0] != batch_size:
    raise ValueError(f'{what} batch size ({x.shape[0]}) does not match '
                     f'batch_size arg ({batch_size}).')
  return x


def _prepare(model, inputs, prompt, batch_size, start_id, eval_mode):
  """Returns `(prefix (batch, n) int32 starting with the start symbol, encoder inputs or None)`.

  Token ids are checked against the model's vocabulary: the size of its
  logits (predict mode) or of its last `Embedding` for decoder tokens, and of
  its first `Embedding` for encoder inputs.
  """
  if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f'batch_size must be a positive int; got {batch_size!r}.')
  if np.isscalar(start_id):
    start = np.full((batch_size, 1), start_id)
  else:
    start = np.asarray(start_id)
    if start.shape != (batch_size, 1):
      raise ValueError(f'start_id must be an int or an array of shape '
                       f'(batch_size, 1) = {(batch_size, 1)}; got shape '
                       f'{start.shape}.')
  if inputs is not None:
    inputs = _tokens_2d('Inputs', inputs, batch_size)
  elif model.n_in > 1:
    raise ValueError(f'This model takes {model.n_in} inputs (an encoder-'
                     'decoder): pass the encoder input as inputs, token ids '
                     'of shape (batch_size, length).')
  if prompt is not None:
    prompt = _tokens_2d('Prompt', prompt, batch_size)
  enc_vocab, dec_vocab = _embedding_vocabs(model)
  enc = None
  if model.n_in > 1:
    enc = _check_ids('inputs', inputs, enc_vocab)
  if not eval_mode:
    dec_vocab = _state_layouts(model, enc)[2]
  parts = [_check_ids('start_id', start, dec_vocab)]
  if model.n_in == 1 and inputs is not None:
    parts.append(_check_ids('inputs', inputs, dec_vocab))
  if prompt is not None:
    parts.append(_check_ids('prompt', prompt, dec_vocab))
  return np.concatenate(parts, axis=1), enc


# --- per-example state layout ------------------------------------------------------


def _structs(tree):
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree,
      is_leaf=lambda x: isinstance(x, ShapeDtype))


def _rows_per_example(x1, x2):
  """Rows per example of a state leaf, from its shapes at batch 1 and 2 (0: shared)."""
  s1, s2 = tuple(x1.shape), tuple(x2.shape)
  if s1 == s2:
    return 0
  if len(s1) == len(s2) and s1[1:] == s2[1:] and s2[0] == 2 * s1[0]:
    return s1[0]
  raise ValueError(f'Cannot tell how a state array of shape {s1} at batch 1 '
                   f'({s2} at batch 2) is laid out per example: decoding '
                   'needs the examples along axis 0.')


def _state_layouts(model, enc):
  """Rows per example of each state leaf, before and after the first step.

  Found by tracing `init` and one predict step at batch sizes 1 and 2
  (nothing is computed). Axis 0 of a per-example leaf holds `m` rows per
  example, example-major (e.g. `example * n_heads + head`); leaves whose shape
  does not change with the batch are shared. The two layouts differ when the
  state changes structure at the first call (`tl.Cache`).
  """
  enc_key = None if enc is None else (enc.shape[1:], enc.dtype.name)
  cache = _LAYOUTS.setdefault(model, {})
  if enc_key in cache:
    return cache[enc_key]

  def abstract(batch):
    tokens = ShapeDtype((batch, 1), np.int32)
    enc_sig = None if enc is None else ShapeDtype((batch,) + enc.shape[1:],
                                                  enc.dtype)
    _, state0 = model.weights_and_state_signature(
        tokens if enc is None else (enc_sig, tokens))
    state0 = _structs(state0)
    logits, state1 = jax.eval_shape(
        lambda w, s, t, e, r: _apply(lambda: model, w, s, t, e, r),
        model.weights, state0, _structs(tokens), _structs(enc_sig), model.rng)
    return state0, state1, logits.shape[-1]

  (a0, a1, vocab), (b0, b1, _) = abstract(1), abstract(2)
  cache[enc_key] = (jax.tree_util.tree_map(_rows_per_example, a0, b0),
                    jax.tree_util.tree_map(_rows_per_example, a1, b1), vocab)
  return cache[enc_key]


def _layout_for(state, layouts):
  treedef = jax.tree_util.tree_structure(state)
  for layout in layouts:
    if jax.tree_util.tree_structure(layout) == treedef:
      return layout
  raise ValueError('model.state does not have the structure of this model\'s '
                   'predict-mode state; reset it with the state of a fresh '
                   '`model.init(...)`.')


def _take_examples(state, layout, rows):
  """`state` with its examples replaced by examples `rows` (an int vector)."""
  def take(x, m):
    if not m:
      return x
    x = jnp.asarray(x)
    grouped = jnp.reshape(x, (x.shape[0] // m, m) + x.shape[1:])
    picked = jnp.take(grouped, rows, axis=0)
    return jnp.reshape(picked, (rows.shape[0] * m,) + x.shape[1:])
  return jax.tree_util.tree_map(take, state, layout)


def reorder_examples(model, state, rows, inputs=None):
  """Returns a predict-mode `state` whose example `i` is example `rows[i]` of `state`.

  Every per-example cache leaf is gathered along its batch axis (whatever its
  rows per example, e.g. `batch * n_heads` for efficient attention); shared
  leaves (counters, dropout rates) are kept. `rows` may be longer than the
  batch (tiling). `inputs` are the encoder inputs of an encoder-decoder.
  """
  enc = None if inputs is None else np.asarray(inputs)
  layout = _layout_for(state, _state_layouts(model, enc)[:2])
  return _take_examples(state, layout, jnp.asarray(rows, jnp.int32))


def _start_state(model, enc, batch_size):
  """`(model.state for batch_size rows, its layout)`; tiles a batch-1 state."""
  state = model.state
  layout = _layout_for(state, _state_layouts(model, enc)[:2])
  batches = {int(np.shape(x)[0]) // m for x, m in zip(
      jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(layout)) if m}
  if len(batches) > 1:
    raise ValueError(f'model.state mixes caches of batch sizes {batches}.')
  current = batches.pop() if batches else batch_size
  if current == batch_size:
    return state, layout
  if current == 1:
    return _take_examples(state, layout,
                          jnp.zeros((batch_size,), jnp.int32)), layout
  raise ValueError(f'model.state holds caches for batch size {current} but '
                   f'decoding asks for batch_size={batch_size}; initialize the '
                   'model with that batch size (or 1).')


# --- the compiled pieces ------------------------------------------------------------


def _apply(model_ref, weights, state, tokens, enc, rng):
  """Runs the model on `tokens` (and encoder inputs): `(logits, new_state)`."""
  model = model_ref()
  if model is None:
    raise RuntimeError('The decoded model no longer exists.')
  x = tokens if enc is None else (enc, tokens)
  out, state = model.pure_fn(x, weights, state, rng)
  return (out[0] if isinstance(out, (tuple, list)) else out), state


def _log_probs(logits):
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def _sampler(temperature, top_k, top_p):
  """`sample(log_probs (batch, vocab), key) -> ids (batch,)`.

  Gumbel-max sampling of `softmax(log_probs / temperature)` (Trax's
  `logsoftmax_sample`, noise uniform in [1e-6, 1 - 1e-6]); temperature 0 is
  argmax. `top_k` keeps the k most likely ids; `top_p` then keeps the
  smallest set of most likely ids whose tempered probability reaches `top_p`.
  """
  if isinstance(temperature, bool) or not np.isscalar(temperature) or (
      temperature < 0):
    raise ValueError(f'temperature must be a number >= 0; got {temperature!r}.')
  if top_k is not None and (not isinstance(top_k, (int, np.integer)) or
                            isinstance(top_k, bool) or top_k < 1):
    raise ValueError(f'top_k must be None or an int >= 1; got {top_k!r}.')
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ValueError(f'top_p must be None or in (0, 1]; got {top_p!r}.')
  temperature = float(temperature)

  def sample(log_probs, key):
    if temperature == 0.0:
      return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    scores = log_probs
    if top_k is not None:
      if top_k > scores.shape[-1]:
        raise ValueError(f'top_k={top_k} exceeds the vocabulary size '
                         f'{scores.shape[-1]}.')
      kth = lax.top_k(scores, top_k)[0][..., -1:]
      scores = jnp.where(scores < kth, -jnp.inf, scores)
    if top_p is not None and top_p < 1.0:
      probs = jax.nn.softmax(scores / temperature, axis=-1)
      desc = -jnp.sort(-probs, axis=-1)
      mass_before = jnp.cumsum(desc, axis=-1) - desc
      smallest = jnp.min(jnp.where(mass_before < top_p, desc, jnp.inf),
                         axis=-1, keepdims=True)
      scores = jnp.where(probs < smallest, -jnp.inf, scores)
    u = jax.random.uniform(key, scores.shape, jnp.float32, 1e-6, 1.0 - 1e-6)
    gumbel = -jnp.log(-jnp.log(u))
    return jnp.argmax(scores + gumbel * temperature, axis=-1).astype(jnp.int32)
  return sample


def _prefill(model_ref, weights, state, prefix, enc, rng):
  """Feeds `prefix` one token per step: `(log-probs of the next token, state)`.

  The first step runs on its own: it may change the state's structure
  (`tl.Cache` stores its outputs); the others run in a `lax.scan`.
  """
  logits, state = _apply(model_ref, weights, state, prefix[:, :1], enc, rng)
  if prefix.shape[1] > 1:
    def feed(carry, tok):
      return _apply(model_ref, weights, carry[1], tok[:, None], enc, rng), None
    (logits, state), _ = lax.scan(feed, (logits, state), prefix[:, 1:].T)
  return _log_probs(logits[:, -1]), state


def _generate(log_probs, carry, advance, sample, key, max_length, eos_id):
  """Samples up to `max_length` tokens in a `lax.while_loop`.

  `advance(carry, tokens) -> (log_probs, carry)` feeds the samples to the
  model. Stops early once every row has produced `eos_id` (as in Trax, rows
  that finished earlier keep sampling). Returns `(tokens, n, carry)`.
  """
  batch = log_probs.shape[0]

  def record(log_probs, out, n_gen, eos_seen):
    tok = sample(log_probs, jax.random.fold_in(key, n_gen))
    out = lax.dynamic_update_index_in_dim(out, tok, n_gen, axis=1)
    if eos_id is not None:
      eos_seen = eos_seen | (tok == eos_id)
    return tok, out, n_gen + 1, eos_seen

  def cond(loop):
    return (loop[3] < max_length) & jnp.logical_not(jnp.all(loop[4]))

  def body(loop):
    tok, carry, out, n_gen, eos_seen = loop
    log_probs, carry = advance(carry, tok)
    tok, out, n_gen, eos_seen = record(log_probs, out, n_gen, eos_seen)
    return tok, carry, out, n_gen, eos_seen

  tok, out, n_gen, eos_seen = record(
      log_probs, jnp.zeros((batch, max_length), jnp.int32), jnp.int32(0),
      jnp.zeros((batch,), bool))
  loop = lax.while_loop(cond, body, (tok, carry, out, n_gen, eos_seen))
  return loop[2], loop[3], loop[1]


def _sampling_program(max_length, sample, eos_id, eval_length=None):
  """`autoregressive_sample` as one program.

  Predict mode feeds one token per step. Eval mode (`eval_length` set) reruns
  the model on the whole sequence, zero-padded to `eval_length`, per token.
  """
  def run(model_ref, weights, state, prefix, enc, rng, key):
    if eval_length is None:
      log_probs, state = _prefill(model_ref, weights, state, prefix, enc, rng)

      def advance(state, tok):
        logits, state = _apply(model_ref, weights, state, tok[:, None], enc,
                               rng)
        return _log_probs(logits[:, -1]), state
      out, n_gen, state = _generate(log_probs, state, advance, sample, key,
                                    max_length, eos_id)
      return out, n_gen, state

    def at(buf, state, pos):  # Log-probs of the token at `pos`.
      logits, state = _apply(model_ref, weights, state, buf, enc, rng)
      return _log_probs(lax.dynamic_index_in_dim(logits, pos, axis=1,
                                                 keepdims=False)), state

    def advance(carry, tok):
      buf, state, pos = carry
      buf = lax.dynamic_update_index_in_dim(buf, tok, pos, axis=1)
      log_probs, state = at(buf, state, pos + 1)
      return log_probs, (buf, state, pos + 1)

    n_known = prefix.shape[1]
    buf = jnp.pad(prefix, ((0, 0), (0, eval_length - n_known)))
    log_probs, state = at(buf, state, n_known)
    out, n_gen, (_, state, _) = _generate(
        log_probs, (buf, state, jnp.int32(n_known)), advance, sample, key,
        max_length, eos_id)
    return out, n_gen, state
  return run


def _stream_programs(sample):
  """The stream's programs: prefill and sample, feed and sample, eval step."""
  def first(model_ref, weights, state, prefix, enc, rng, key):
    log_probs, state = _prefill(model_ref, weights, state, prefix, enc, rng)
    return sample(log_probs, jax.random.fold_in(key, 0)), state

  def step(model_ref, weights, state, tok, enc, rng, key, index):
    logits, state = _apply(model_ref, weights, state, tok[:, None], enc, rng)
    return sample(_log_probs(logits[:, -1]),
                  jax.random.fold_in(key, index)), state

  def eval_step(model_ref, weights, state, buf, enc, rng, key, n, index):
    logits, state = _apply(model_ref, weights, state, buf, enc, rng)
    log_probs = _log_probs(lax.dynamic_index_in_dim(logits, n, axis=1,
                                                    keepdims=False))
    return sample(log_probs, jax.random.fold_in(key, index)), state
  return first, step, eval_step


def _beam_program(n_beams, max_length, eos_id, alpha, layout):
  """Beam search over `batch * n_beams` model rows (example-major).

  Each step ranks the `2k` best extensions of the `k` live beams; those of
  the best `k` that end in eos join the `k`-best finished pool (scored with
  the length penalty), the `k` best others live on. The loop stops at
  `max_length` or when no live beam can beat the worst finished one.
  """
  k = n_beams

  def penalty(length):  # GNMT: ((5 + length) / 6) ** alpha.
    return ((5.0 + length) / 6.0) ** alpha

  def top(seqs, scores, n):
    scores, idx = lax.top_k(scores, n)
    return jnp.take_along_axis(seqs, idx[:, :, None], axis=1), scores

  def select(t, log_probs, alive_seq, alive_lp, fin_seq, fin_score):
    """Extends the beams by token t: new alive and finished beams, source beams."""
    batch = alive_lp.shape[0]
    vocab = log_probs.shape[-1]
    log_probs = log_probs.reshape(batch, k, vocab)
    cand = (alive_lp[:, :, None] + log_probs).reshape(batch, k * vocab)
    # 2k candidates hold at least k that do not end in eos (one eos per
    # beam); as in fairseq, an eos among the best k ends its beam.
    n_cand = min(2 * k, k * vocab)
    vals, idx = lax.top_k(cand, n_cand)
    beam, tok = idx // vocab, (idx % vocab).astype(jnp.int32)
    seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1)
    seqs = lax.dynamic_update_index_in_dim(seqs, tok, t, axis=2)
    is_eos = (tok == eos_id) if eos_id is not None else jnp.zeros_like(tok,
                                                                         bool)
    ends = is_eos & (jnp.arange(n_cand) < k)
    fin_seq, fin_score = top(
        jnp.concatenate([fin_seq, seqs], axis=1),
        jnp.concatenate([fin_score, jnp.where(ends, vals / penalty(t + 1),
                                              -jnp.inf)], axis=1), k)
    alive_lp, sel = lax.top_k(jnp.where(is_eos, -jnp.inf, vals), k)
    alive_seq = jnp.take_along_axis(seqs, sel[:, :, None], axis=1)
    source = jnp.take_along_axis(beam, sel, axis=1)
    next_tok = jnp.take_along_axis(tok, sel, axis=1)
    return alive_seq, alive_lp, fin_seq, fin_score, source, next_tok

  def reorder(state, source):
    batch = source.shape[0]
    rows = (jnp.arange(batch, dtype=jnp.int32)[:, None] * k + source)
    return _take_examples(state, layout, rows.reshape(-1))

  def run(model_ref, weights, state, prefix, enc, rng):
    batch = prefix.shape[0] // k
    log_probs, state = _prefill(model_ref, weights, state, prefix, enc, rng)
    zeros = jnp.zeros((batch, k, max_length), jnp.int32)
    first_lp = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf)
    alive_seq, alive_lp, fin_seq, fin_score, source, tok = select(
        0, log_probs, zeros, jnp.broadcast_to(first_lp, (batch, k)), zeros,
        jnp.full((batch, k), -jnp.inf))
    state = reorder(state, source)

    def cond(carry):
      t, alive_lp, fin_score = carry[0], carry[3], carry[5]
      best = jnp.max(alive_lp, axis=1)
      bound = best / jnp.maximum(penalty(t + 1.0), penalty(float(max_length)))
      done = jnp.all(fin_score[:, -1] >= bound)
      return (t < max_length) & jnp.logical_not(done)

    def body(carry):
      t, tok, state, alive_lp, alive_seq, fin_score, fin_seq = carry
      logits, state = _apply(model_ref, weights, state, tok.reshape(-1, 1), enc,
                             rng)
      alive_seq, alive_lp, fin_seq, fin_score, source, tok = select(
          t, _log_probs(logits[:, -1]), alive_seq, alive_lp, fin_seq, fin_score)
      return (t + 1, tok, reorder(state, source), alive_lp, alive_seq,
              fin_score, fin_seq)

    t, _, _, alive_lp, alive_seq, fin_score, fin_seq = lax.while_loop(
        cond, body, (jnp.int32(1), tok, state, alive_lp, alive_seq, fin_score,
                     fin_seq))
    # Beams still alive end at the length limit and compete as finished ones.
    fin_seq, fin_score = top(
        jnp.concatenate([fin_seq, alive_seq], axis=1),
        jnp.concatenate([fin_score, alive_lp / penalty(t.astype(jnp.float32))],
                        axis=1), k)
    return fin_seq, fin_score, t
  return run


def _compiled(model, key, run):
  """`(jitted, plain)` versions of `run(model_ref, *args)` for `model`, cached on `key`."""
  programs = _PROGRAMS.setdefault(model, {})
  if key not in programs:
    model_ref = weakref.ref(model)
    plain = lambda *args: run(model_ref, *args)  # pylint: disable=unnecessary-lambda-assignment
    programs[key] = (jax.jit(plain), plain)
  return programs[key]


def _call(program, accelerate, *args):
  """Runs a compiled program, or (accelerate=False) the same code op by op."""
  jitted, plain = program
  if accelerate:
    return jitted(*args)
  with jax.disable_jit():
    return plain(*args)


def _base_key(rng):
  if rng is None:  # Like Trax's sampling, follow np.random's state.
    rng = np.random.randint(0, 2**31 - 1)
  if isinstance(rng, (int, np.integer)):
    return jax.random.PRNGKey(int(rng))
  return jnp.asarray(rng)


def _check_count(name, value):
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or (
      value < 1):
    raise ValueError(f'{name} must be an int >= 1; got {value!r}.')


def _pow2(n):
  return int(2**np.ceil(np.log2(max(n, 1))))


# --- public API --------------------------------------------------------------------


def autoregressive_sample_stream(model, inputs=None, batch_size=1,
                                 temperature=1.0, start_id=0, accelerate=True,
                                 eval_mode=False, eval_min_length=1,
                                 prompt=None, top_k=None, top_p=None,
                                 rng=None):
  """Yields samples from `model`, one position at a time, indefinitely.

  Each yield is one compiled step (the first one also feeds the prefix, one
  token per step inside the same program) and updates `model.state`.

  Args:
    model: A layer built with `mode='predict'` (or with `mode='eval'` and
      `eval_mode=True`: the whole sequence is rerun at every step, padded to
      a power of two of at least `eval_min_length`, as in Trax).
    inputs: Token ids `(batch_size, length)`: for a language model the prefix
      fed after the start symbol; for an encoder-decoder the encoder input.
    batch_size: Number of sequences decoded in parallel.
    temperature: Softmax temperature of the sampling; 0 is greedy (argmax).
    start_id: Start symbol: an int or ids of shape `(batch_size, 1)`.
    accelerate: If False, run the same steps op by op (no `jax.jit`).
    eval_mode: See `model`.
    eval_min_length: Minimum padded length in eval mode.
    prompt: Token ids `(batch_size, length)` fed on the decoder side after
      the start symbol (and after `inputs` for a language model).
    top_k: If set, sample only among the `top_k` most likely ids.
    top_p: If set, sample only among the most likely ids whose total
      probability reaches `top_p` (nucleus sampling).
    rng: PRNG key or int seed of the sampling (default: drawn from
      `np.random`, as Trax's sampling is).

  Returns:
    A generator of int32 arrays of shape `(batch_size,)`.
  """
  _check_mode(model, eval_mode)
  prefix, enc = _prepare(model, inputs, prompt, batch_size, start_id,
                         eval_mode)
  sample = _sampler(temperature, top_k, top_p)
  programs = [_compiled(model, (name, float(temperature), top_k, top_p), run)
              for name, run in zip(('first', 'step', 'eval_step'),
                                   _stream_programs(sample))]
  state, budget = model.state, (None, '')
  if not eval_mode:
    state, _ = _start_state(model, enc, batch_size)
    _check_positions(model, prefix.shape[1], 1)
    budget = _position_budget(model)
  return _stream(model, state, prefix, enc, programs, _base_key(rng),
                 accelerate, eval_mode, eval_min_length, budget)


def _stream(model, state, prefix, enc, programs, key, accelerate, eval_mode,
            eval_min_length, budget):
  """The stream's generator; each token updates `model.state`."""
  first, step, eval_step = programs
  weights, rng = model.weights, model.rng
  known = prefix[:, 1:]  # Eval mode: the model's ShiftRight adds the start.
  free, where = budget
  n_fed, index, tok = prefix.shape[1], 0, None
  while True:
    if eval_mode:
      n = known.shape[1]
      buf = np.pad(known, ((0, 0), (0, _pow2(max(eval_min_length, n + 1)) - n)))
      tok, state = _call(eval_step, accelerate, weights, state, buf, enc, rng,
                         key, np.int32(n), np.int32(index))
    elif index == 0:
      tok, state = _call(first, accelerate, weights, state,
                         jnp.asarray(prefix), enc, rng, key)
    else:
      if free is not None and n_fed >= free:
        raise ValueError(f'Sampling past the predict-mode caches: {n_fed} '
                         f'positions fed, {free} were free ({where}).')
      tok, state = _call(step, accelerate, weights, state, tok, enc, rng, key,
                         np.int32(index))
      n_fed += 1
    model.state = state
    index += 1
    yield np.asarray(tok)
    if eval_mode:
      known = np.concatenate([known, np.asarray(tok)[:, None]], axis=1)


def autoregressive_sample(model, inputs=None, batch_size=1, temperature=1.0,
                          start_id=0, eos_id=1, max_length=100, accelerate=True,
                          eval_mode=False, eval_min_length=1, prompt=None,
                          top_k=None, top_p=None, rng=None):
  """Returns a batch of sequences sampled autoregressively, in one compiled loop.

  Decoding stops when every row has produced `eos_id` (rows that finished
  earlier keep sampling, as in Trax) or after `max_length` tokens. Arguments
  as in `autoregressive_sample_stream`; with the same `rng` the tokens equal
  the stream's. `eos_id=None` never stops early.

  Returns:
    int32 array `(batch_size, n)` of generated tokens, `n <= max_length`.
  """
  _check_count('max_length', max_length)
  _check_mode(model, eval_mode)
  prefix, enc = _prepare(model, inputs, prompt, batch_size, start_id,
                         eval_mode)
  sample = _sampler(temperature, top_k, top_p)
  config = (float(temperature), top_k, top_p, eos_id, max_length)
  if eval_mode:
    prefix = prefix[:, 1:]  # The model's ShiftRight adds the start symbol.
    length = _pow2(max(eval_min_length, prefix.shape[1] + max_length))
    state = model.state
  else:
    length = None
    _check_positions(model, prefix.shape[1], max_length)
    state, _ = _start_state(model, enc, batch_size)
  program = _compiled(model, ('sample', length) + config,
                      _sampling_program(max_length, sample, eos_id, length))
  out, n_gen, state = _call(program, accelerate, model.weights, state,
                            jnp.asarray(prefix), enc, model.rng,
                            _base_key(rng))
  model.state = state
  return np.asarray(out)[:, :int(n_gen)]


def beam_search(model, inputs=None, batch_size=1, n_beams=2, start_id=0,
                eos_id=1, max_length=100, length_penalty=1.0, accelerate=True,
                prompt=None):
  """Returns the `n_beams` best sequences of each row, by beam search in one compiled loop.

  Every beam is a row of the predict-mode model; after each step every
  per-example cache leaf is gathered to follow its beam. A beam ends at
  `eos_id` (or at `max_length` tokens) and scores `sum(log p) / ((5 + n) /
  6) ** length_penalty` for `n` tokens (GNMT); the search stops once no live
  beam can beat the finished ones. With `n_beams=1` and `length_penalty=0` it
  is greedy decoding. `model.state` is left unchanged.

  Returns:
    A list of `n_beams` pairs `(tokens (batch_size, n) int32, scores
    (batch_size,))`, best first; tokens after a beam's eos are 0.
  """
  _check_count('n_beams', n_beams)
  _check_count('max_length', max_length)
  if isinstance(length_penalty, bool) or not np.isscalar(length_penalty):
    raise ValueError(f'length_penalty must be a number; got {length_penalty!r}.')
  _check_mode(model, False)
  prefix, enc = _prepare(model, inputs, prompt, batch_size, start_id, False)
  _check_positions(model, prefix.shape[1], max_length)
  state, layout = _start_state(model, enc, batch_size)
  rows = np.repeat(np.arange(batch_size), n_beams)  # Row b * n_beams + beam.
  state = _take_examples(state, layout, jnp.asarray(rows))
  config = (n_beams, max_length, eos_id, float(length_penalty))
  program = _compiled(
      model, ('beam', None if enc is None else enc.shape[1:]) + config,
      _beam_program(*config, _state_layouts(model, enc)[1]))
  seqs, scores, n = _call(program, accelerate, model.weights, state,
                          jnp.asarray(prefix[rows]),
                          None if enc is None else enc[rows], model.rng)
  seqs, scores, n = np.asarray(seqs), np.asarray(scores), int(n)
  return [(seqs[:, i, :n], scores[:, i]) for i in range(n_beams)]
