"""Autoregressive sampling: `autoregressive_sample` (one compiled loop) and its stream.

Predict mode feeds one token per step: the prefix, then the samples, in one
`lax.while_loop` (after `Decoder.settle`, which runs a first step that
changes the state's structure on its own). The prefix is zero-padded to a
power of two and its length is an argument, so prompts of similar lengths
share a program. Eval mode reruns the whole sequence, zero-padded to a power
of two, at every step.
"""

import numbers
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from retrax.models import registry
from retrax.supervised.decoding import inspection
from retrax.supervised.decoding.decoder import decoder_for
from retrax.supervised.decoding.decoder import log_probs_of as log_probs_of
from retrax.supervised.decoding.decoder import step
from retrax.validation import ArgumentValueError


def _check_sampling(temperature, top_k, top_p):
  # numbers.Real, not np.isscalar: a str is a NumPy scalar too.
  if isinstance(temperature, bool) or not isinstance(
      temperature, numbers.Real) or temperature < 0:
    raise ArgumentValueError(f'temperature must be a number >= 0; got {temperature!r}.')
  if top_k is not None and (not isinstance(top_k, (int, np.integer)) or
                            isinstance(top_k, bool) or top_k < 1):
    raise ArgumentValueError(f'top_k must be None or an int >= 1; got {top_k!r}.')
  if top_p is not None and not 0.0 < top_p <= 1.0:
    raise ArgumentValueError(f'top_p must be None or in (0, 1]; got {top_p!r}.')


def _filtered(scores, temperature, top_k, top_p):
  """`scores` with -inf outside the `top_k` / nucleus `top_p` ids."""
  if top_k is not None:
    if top_k > scores.shape[-1]:
      raise ArgumentValueError(f'top_k={top_k} exceeds the vocabulary size '
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
  return scores


def sampler(temperature, top_k, top_p):
  """`sample(log_probs (batch, vocab), key) -> ids (batch,)`.

  Gumbel-max sampling of `softmax(log_probs / temperature)` (Trax's
  `logsoftmax_sample`, noise uniform in [1e-6, 1 - 1e-6]); temperature 0 is
  argmax. `top_k` keeps the k most likely ids; `top_p` then keeps the
  smallest set of most likely ids whose tempered probability reaches `top_p`.
  """
  _check_sampling(temperature, top_k, top_p)
  temperature = float(temperature)

  def sample(log_probs, key):
    if temperature == 0.0:
      return jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    scores = _filtered(log_probs, temperature, top_k, top_p)
    u = jax.random.uniform(key, scores.shape, jnp.float32, 1e-6, 1.0 - 1e-6)
    gumbel = -jnp.log(-jnp.log(u))
    return jnp.argmax(scores + gumbel * temperature, axis=-1).astype(jnp.int32)
  return sample


def fed_token(prefix, n_prefix, i, sampled):
  """The token fed at position `i`: the prefix's, then `sampled` (a `(batch,)` array)."""
  last = prefix.shape[1] - 1
  known = lax.dynamic_index_in_dim(prefix, jnp.minimum(i, last), axis=1,
                                   keepdims=False)
  return jnp.where(i < n_prefix, known, sampled)


def prefill(model_ref, weights, state, prefix, n_fed, n_prefix, log_probs,
            enc, rng):
  """Feeds `prefix[:, n_fed:n_prefix]` one token per step: `(log-probs of the next token, state)`.

  A `lax.while_loop` (the bounds are traced: one program serves every prompt
  length up to the padded `prefix`); `log_probs` are returned when nothing
  is fed.
  """
  def body(loop):
    i, _, state = loop
    tok = lax.dynamic_index_in_dim(prefix, i, axis=1)
    logits, state = step(model_ref, weights, state, tok, enc, rng)
    return i + 1, log_probs_of(logits[:, -1]), state
  _, log_probs, state = lax.while_loop(lambda loop: loop[0] < n_prefix, body,
                                       (n_fed, log_probs, state))
  return log_probs, state


def _generate(log_probs, ready, carry, advance, sample, key, max_length,
              capacity, eos_id):
  """Samples up to `max_length` tokens in a `lax.while_loop`.

  `max_length` is traced and `capacity >= max_length` (static) sizes the
  output buffer, so one compiled program serves every `max_length` up to
  its capacity (a power of two: a session of varied lengths compiles a
  handful of programs, not one per length).

  `advance(carry, tokens) -> (log_probs, carry, ready)` feeds a token to the
  model; `ready` (a bool scalar) says whether `log_probs` are those of a
  token to sample (False while the prefix is still fed: nothing is sampled,
  and the zeros written are overwritten by the next sample). Stops early
  once every row has produced `eos_id` (as in Trax, rows that finished
  earlier keep sampling). Returns `(tokens, n, carry)`.
  """
  batch = log_probs.shape[0]

  def skip(log_probs, key):
    del key
    return jnp.zeros(log_probs.shape[:1], jnp.int32)

  def record(log_probs, ready, out, n_gen, eos_seen):
    # A cond: a long prompt's steps skip top-p's sort of the vocabulary.
    tok = lax.cond(ready, sample, skip, log_probs,
                   jax.random.fold_in(key, n_gen))
    out = lax.dynamic_update_index_in_dim(out, tok, n_gen, axis=1)
    if eos_id is not None:
      eos_seen = eos_seen | (ready & (tok == eos_id))
    return tok, out, n_gen + ready.astype(jnp.int32), eos_seen

  def cond(loop):
    return (loop[3] < max_length) & jnp.logical_not(jnp.all(loop[4]))

  def body(loop):
    tok, carry, out, n_gen, eos_seen = loop
    log_probs, carry, ready = advance(carry, tok)
    tok, out, n_gen, eos_seen = record(log_probs, ready, out, n_gen, eos_seen)
    return tok, carry, out, n_gen, eos_seen

  tok, out, n_gen, eos_seen = record(
      log_probs, jnp.asarray(ready), jnp.zeros((batch, capacity), jnp.int32),
      jnp.int32(0), jnp.zeros((batch,), bool))
  loop = lax.while_loop(cond, body, (tok, carry, out, n_gen, eos_seen))
  return loop[2], loop[3], loop[1]


def _predict_program(capacity, sample, eos_id):
  """`autoregressive_sample` in predict mode: one loop feeds the prefix, then the samples.

  The model's step is traced once. `log_probs` are the first sample's when
  `n_fed == n_prefix` (`Decoder.settle` fed a one-token prefix).
  """
  def run(model_ref, weights, state, prefix, n_fed, n_prefix, log_probs, enc,
          rng, key, max_length):
    def advance(carry, tok):
      state, i = carry
      tok = fed_token(prefix, n_prefix, i, tok)
      logits, state = step(model_ref, weights, state, tok[:, None], enc, rng)
      return log_probs_of(logits[:, -1]), (state, i + 1), i + 1 >= n_prefix
    out, n_gen, (state, _) = _generate(
        log_probs, n_fed >= n_prefix, (state, n_fed), advance, sample, key,
        max_length, capacity, eos_id)
    return out, n_gen, state
  return run


def _eval_program(capacity, sample, eos_id, eval_length, lag):
  """`autoregressive_sample` in eval mode: per token, the whole sequence is rerun.

  The sequence is zero-padded to `eval_length`; `lag` as `_eval_prefix`'s.
  """
  def run(model_ref, weights, state, prefix, enc, rng, key, max_length):
    def at(buf, state, pos):  # Log-probs of the token at `pos`.
      logits, state = step(model_ref, weights, state, buf, enc, rng)
      return log_probs_of(lax.dynamic_index_in_dim(logits, pos - lag, axis=1,
                                                   keepdims=False)), state

    def advance(carry, tok):
      buf, state, pos = carry
      buf = lax.dynamic_update_index_in_dim(buf, tok, pos, axis=1)
      log_probs, state = at(buf, state, pos + 1)
      return log_probs, (buf, state, pos + 1), jnp.asarray(True)

    n_known = prefix.shape[1]
    buf = jnp.pad(prefix, ((0, 0), (0, eval_length - n_known)))
    log_probs, state = at(buf, state, n_known)
    out, n_gen, (_, state, _) = _generate(
        log_probs, True, (buf, state, jnp.int32(n_known)), advance, sample,
        key, max_length, capacity, eos_id)
    return out, n_gen, state
  return run


def _stream_programs(sample):
  """The stream's programs: prefill and sample, feed and sample, eval step."""
  def first(model_ref, weights, state, prefix, n_fed, n_prefix, log_probs,
            enc, rng, key):
    log_probs, state = prefill(model_ref, weights, state, prefix, n_fed,
                               n_prefix, log_probs, enc, rng)
    return sample(log_probs, jax.random.fold_in(key, 0)), state

  def feed(model_ref, weights, state, tok, enc, rng, key, index):
    logits, state = step(model_ref, weights, state, tok[:, None], enc, rng)
    return sample(log_probs_of(logits[:, -1]),
                  jax.random.fold_in(key, index)), state

  def eval_step(model_ref, weights, state, buf, enc, rng, key, n, index):
    logits, state = step(model_ref, weights, state, buf, enc, rng)
    log_probs = log_probs_of(lax.dynamic_index_in_dim(logits, n, axis=1,
                                                      keepdims=False))
    return sample(log_probs, jax.random.fold_in(key, index)), state
  return first, feed, eval_step


def base_key(rng):
  """A PRNG key from `rng` (a key, an int seed, or None: drawn from `np.random`)."""
  if rng is None:  # Like Trax's sampling, follow np.random's state.
    rng = np.random.randint(0, 2**31 - 1)
  if isinstance(rng, (int, np.integer)):
    return jax.random.PRNGKey(int(rng))
  return jnp.asarray(rng)


def pow2(n):
  """The smallest power of two >= n (at least 1)."""
  return int(2**np.ceil(np.log2(max(n, 1))))


def start(decoder, state, prefix, enc, accelerate):
  """`(state, (prefix, n_fed, n_prefix, log_probs))`: a predict-mode loop's start.

  After `Decoder.settle`; the prefix is zero-padded to a power of two and
  `n_prefix` is its length, so prompts of similar lengths share a program.
  """
  state, n_fed, log_probs = decoder.settle(state, prefix, enc, accelerate)
  n = prefix.shape[1]
  padded = jnp.asarray(np.pad(prefix, ((0, 0), (0, pow2(n) - n))))
  return state, (padded, np.int32(n_fed), np.int32(n), log_probs)


def _prepared(model, inputs, prompt, batch_size, start_id, eval_mode):
  """`(decoder, prefix, encoder inputs)` after the mode and id checks."""
  inspection.check_mode(model, eval_mode)
  decoder = decoder_for(model)
  prefix, enc = inspection.prepare(
      model, inputs, prompt, batch_size, start_id,
      None if eval_mode else decoder.logits_vocab)
  return decoder, prefix, enc


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
  decoder, prefix, enc = _prepared(model, inputs, prompt, batch_size,
                                   start_id, eval_mode)
  sample = sampler(temperature, top_k, top_p)
  programs = [decoder.program((name, float(temperature), top_k, top_p), run)
              for name, run in zip(('first', 'step', 'eval_step'),
                                   _stream_programs(sample))]
  state, budget = model.state, (None, '')
  if not eval_mode:
    state = decoder.start_state(enc, batch_size)
    inspection.check_positions(model, prefix.shape[1], 1)
    budget = inspection.position_budget(model)
  return _stream(model, state, prefix, enc, programs, base_key(rng),
                 accelerate, eval_mode, eval_min_length, budget)


def _eval_prefix(model, prefix):
  """`(the tokens eval mode reruns, lag)`. Trax's language models put the
  start symbol back themselves (ShiftRight): they rerun the prefix without
  it, and their logits at position n are for token n (lag 0). A model that
  does not shift (HF's convention, `registry.shifts_right`) reruns all of
  it, and its logits at n - 1 are for token n (lag 1)."""
  if registry.shifts_right(model):
    return prefix[:, 1:], 0
  return prefix, 1


def _stream(model, state, prefix, enc, programs, key, accelerate, eval_mode,
            eval_min_length, budget):
  """The stream's generator; each token updates `model.state`."""
  first, feed, eval_step = programs
  decoder = decoder_for(model)
  call = decoder.call
  weights, rng = model.stacked_weights, model.rng
  known, lag = _eval_prefix(model, prefix)
  free, where = budget
  n_fed, index, tok = prefix.shape[1], 0, None
  while True:
    if eval_mode:
      n = known.shape[1]
      buf = np.pad(known, ((0, 0), (0, pow2(max(eval_min_length, n + 1)) - n)))
      tok, state = call(eval_step, accelerate, weights, state, buf, enc, rng,
                        key, np.int32(n - lag), np.int32(index))
    elif index == 0:
      state, args = start(decoder, state, prefix, enc, accelerate)
      tok, state = call(first, accelerate, weights, state, *args, enc, rng,
                        key)
    else:
      if free is not None and n_fed >= free:
        raise ArgumentValueError(f'Sampling past the predict-mode caches: {n_fed} '
                                 f'positions fed, {free} were free ({where}).')
      tok, state = call(feed, accelerate, weights, state, tok, enc, rng, key,
                        np.int32(index))
      n_fed += 1
    model.state = state
    index += 1
    yield np.asarray(tok)
    if eval_mode:
      known = np.concatenate([known, np.asarray(tok)[:, None]], axis=1)


def autoregressive_sample(model: Any, inputs: Any = None, batch_size: int = 1,
                          temperature: float = 1.0, start_id: int = 0,
                          eos_id: Optional[int] = 1, max_length: int = 100,
                          accelerate: bool = True, eval_mode: bool = False,
                          eval_min_length: int = 1, prompt: Any = None,
                          top_k: Optional[int] = None,
                          top_p: Optional[float] = None,
                          rng: Any = None) -> Any:
  """Returns a batch of sequences sampled autoregressively, in one compiled loop.

  Decoding stops when every row has produced `eos_id` (rows that finished
  earlier keep sampling, as in Trax) or after `max_length` tokens. Arguments
  as in `autoregressive_sample_stream`; with the same `rng` the tokens equal
  the stream's. `eos_id=None` never stops early.

  Returns:
    int32 array `(batch_size, n)` of generated tokens, `n <= max_length`.
  """
  inspection.check_count('max_length', max_length)
  decoder, prefix, enc = _prepared(model, inputs, prompt, batch_size,
                                   start_id, eval_mode)
  sample = sampler(temperature, top_k, top_p)
  capacity = pow2(max_length)  # The loop bound is traced; see `_generate`.
  config = (float(temperature), top_k, top_p, eos_id, capacity)
  if eval_mode:
    prefix, lag = _eval_prefix(model, prefix)
    length = pow2(max(eval_min_length, prefix.shape[1] + max_length))
    state, args = model.state, (jnp.asarray(prefix),)
    run = _eval_program(capacity, sample, eos_id, length, lag)
  else:
    length = None
    inspection.check_positions(model, prefix.shape[1], max_length)
    state, args = start(decoder, decoder.start_state(enc, batch_size), prefix,
                        enc, accelerate)
    run = _predict_program(capacity, sample, eos_id)
  program = decoder.program(('sample', length) + config, run)
  out, n_gen, state = decoder.call(program, accelerate, model.stacked_weights, state,
                                   *args, enc, model.rng, base_key(rng),
                                   jnp.int32(max_length))
  model.state = state
  return np.asarray(out)[:, :int(n_gen)]
