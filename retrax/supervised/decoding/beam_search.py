"""Beam search over `batch * n_beams` predict-mode rows, in one compiled loop."""

import numbers
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np
from jax import lax

from retrax.supervised.decoding import inspection
from retrax.supervised.decoding import state_layout
from retrax.supervised.decoding.decoder import decoder_for
from retrax.supervised.decoding.decoder import step
from retrax.supervised.decoding.sampling import log_probs_of
from retrax.supervised.decoding.sampling import prefill
from retrax.supervised.decoding.sampling import start
from retrax.validation import ArgumentValueError


class _Beams(NamedTuple):
  """The search's carry: live beams, finished pool, the tokens fed next."""
  t: Any  # Tokens generated so far.
  tok: Any  # (batch, k) last tokens of the live beams.
  state: Any  # Model state, row example * k + beam.
  alive_lp: Any  # (batch, k) log-probabilities of the live beams.
  alive_seq: Any  # (batch, k, max_length).
  fin_score: Any  # (batch, k) length-penalized scores, -inf when empty.
  fin_seq: Any  # (batch, k, max_length).


def _top(seqs, scores, n):
  scores, idx = lax.top_k(scores, n)
  return jnp.take_along_axis(seqs, idx[:, :, None], axis=1), scores


class BeamSearch(NamedTuple):
  """Beam search over `batch * n_beams` model rows (example-major).

  Each step ranks the `2k` best extensions of the `k` live beams; those of
  the best `k` that end in eos join the `k`-best finished pool (scored with
  the length penalty), the `k` best others live on. The loop stops at
  `max_length` or when no live beam can beat the worst finished one.
  `layout(state, enc)` gives the rows per example of a state's leaves.
  """
  n_beams: int
  max_length: int
  eos_id: Optional[int]
  alpha: float
  layout: Any

  def penalty(self, length):  # GNMT: ((5 + length) / 6) ** alpha.
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** self.alpha

  def select(self, t, log_probs, alive_seq, alive_lp, fin_seq, fin_score):
    """Extends the beams by token t: new alive and finished beams, source beams."""
    k = self.n_beams
    batch, vocab = alive_lp.shape[0], log_probs.shape[-1]
    log_probs = log_probs.reshape(batch, k, vocab)
    cand = (alive_lp[:, :, None] + log_probs).reshape(batch, k * vocab)
    # 2k candidates hold at least k that do not end in eos (one eos per
    # beam); as in fairseq, an eos among the best k ends its beam.
    n_cand = min(2 * k, k * vocab)
    vals, idx = lax.top_k(cand, n_cand)
    beam, tok = idx // vocab, (idx % vocab).astype(jnp.int32)
    seqs = jnp.take_along_axis(alive_seq, beam[:, :, None], axis=1)
    seqs = lax.dynamic_update_index_in_dim(seqs, tok, t, axis=2)
    is_eos = ((tok == self.eos_id) if self.eos_id is not None
              else jnp.zeros_like(tok, bool))
    ends = is_eos & (jnp.arange(n_cand) < k)[None, :]
    fin_seq, fin_score = _top(
        jnp.concatenate([fin_seq, seqs], axis=1),
        jnp.concatenate([fin_score, jnp.where(ends, vals / self.penalty(t + 1),
                                              -jnp.inf)], axis=1), k)
    alive_lp, sel = lax.top_k(jnp.where(is_eos, -jnp.inf, vals), k)
    alive_seq = jnp.take_along_axis(seqs, sel[:, :, None], axis=1)
    source = jnp.take_along_axis(beam, sel, axis=1)
    next_tok = jnp.take_along_axis(tok, sel, axis=1)
    return alive_seq, alive_lp, fin_seq, fin_score, source, next_tok

  def reorder(self, state, source, enc):
    """The state's rows following each live beam's source beam."""
    batch = source.shape[0]
    rows = jnp.arange(batch, dtype=jnp.int32)[:, None] * self.n_beams + source
    return state_layout.take_examples(state, self.layout(state, enc),
                                      rows.reshape(-1))

  def searching(self, beams):
    """The loop's condition: below max_length and a live beam may still win."""
    best = jnp.max(beams.alive_lp, axis=1)
    bound = best / jnp.maximum(self.penalty(beams.t + 1),
                               self.penalty(self.max_length))
    done = jnp.all(beams.fin_score[:, -1] >= bound)
    return (beams.t < self.max_length) & jnp.logical_not(done)

  def run(self, model_ref, weights, state, prefix, n_fed, n_prefix, log_probs,
          enc, rng):
    """The whole search: `(sequences (batch, k, max_length), scores, length)`.

    Arguments after `state` as `sampling.start` returns them.
    """
    k, max_length = self.n_beams, self.max_length
    batch = prefix.shape[0] // k
    log_probs, state = prefill(model_ref, weights, state, prefix, n_fed,
                               n_prefix, log_probs, enc, rng)
    zeros = jnp.zeros((batch, k, max_length), jnp.int32)
    first_lp = jnp.where(jnp.arange(k) == 0, 0.0, -jnp.inf)
    alive_seq, alive_lp, fin_seq, fin_score, source, tok = self.select(
        0, log_probs, zeros, jnp.broadcast_to(first_lp, (batch, k)), zeros,
        jnp.full((batch, k), -jnp.inf))

    def body(b):
      logits, state = step(model_ref, weights, b.state, b.tok.reshape(-1, 1),
                           enc, rng)
      alive_seq, alive_lp, fin_seq, fin_score, source, tok = self.select(
          b.t, log_probs_of(logits[:, -1]), b.alive_seq, b.alive_lp,
          b.fin_seq, b.fin_score)
      return _Beams(b.t + 1, tok, self.reorder(state, source, enc), alive_lp,
                    alive_seq, fin_score, fin_seq)

    b = lax.while_loop(self.searching, body, _Beams(
        jnp.int32(1), tok, self.reorder(state, source, enc), alive_lp,
        alive_seq, fin_score, fin_seq))
    # Beams still alive end at the length limit and compete as finished ones.
    fin_seq, fin_score = _top(
        jnp.concatenate([b.fin_seq, b.alive_seq], axis=1),
        jnp.concatenate([b.fin_score,
                         b.alive_lp / self.penalty(b.t.astype(jnp.float32))],
                        axis=1), k)
    return fin_seq, fin_score, b.t


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
  inspection.check_count('n_beams', n_beams)
  inspection.check_count('max_length', max_length)
  # numbers.Real, not np.isscalar: a str is a NumPy scalar too.
  if isinstance(length_penalty, bool) or not isinstance(length_penalty,
                                                         numbers.Real):
    raise ArgumentValueError(f'length_penalty must be a number; got {length_penalty!r}.')
  inspection.check_mode(model, False)
  decoder = decoder_for(model)
  prefix, enc = inspection.prepare(model, inputs, prompt, batch_size, start_id,
                                   decoder.logits_vocab)
  inspection.check_positions(model, prefix.shape[1], max_length)
  state = decoder.start_state(enc, batch_size)
  rows = np.repeat(np.arange(batch_size), n_beams)  # Row b * n_beams + beam.
  state = state_layout.take_examples(state, decoder.layout(state, enc),
                                     jnp.asarray(rows))
  enc = None if enc is None else enc[rows]
  state, args = start(decoder, state, prefix[rows], enc, accelerate)
  config = (n_beams, max_length, eos_id, float(length_penalty))
  program = decoder.program(
      ('beam', None if enc is None else enc.shape[1:]) + config,
      BeamSearch(*config, decoder.layout).run)
  seqs, scores, n = decoder.call(program, accelerate, model.stacked_weights, state,
                                 *args, enc, model.rng)
  seqs, scores, n = np.asarray(seqs), np.asarray(scores), int(n)
  return [(seqs[:, i, :n], scores[:, i]) for i in range(n_beams)]
