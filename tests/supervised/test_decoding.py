"""Tests of retrax.supervised.decoding: compiled sampling and beam search.

References: a toy language model whose next-token logits are a table lookup
`table[previous fed token, fed token]`, decoded by small numpy
re-implementations (greedy, Trax's eos rule, the filtered sampling
distribution, beam search) and by brute-force enumeration; the golden
copy-task checkpoints written by Trax 1.4.1 (greedy decoding copies the
prompt); eval-mode decoding (full recompute) of the same weights.
"""

import functools
import itertools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax.shapes import ShapeDtype
from retrax.supervised import decoding
from tests.backend_tolerance import float32_tolerance

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                      'fixtures', 'golden')


class ToyLM(tl.Layer):
  """Next-token logits `table[previous fed token, fed token]` (0 before the first).

  Eval mode shifts its input right (like the models' ShiftRight). Predict
  state: `(previous token, two rows per example (batch * 2,), position (),
  a shared (2,) array)`, so decoding must find rows per example and leave
  shared leaves alone. Counts `forward` calls (traces, when jitted).
  """

  def __init__(self, table, max_len=64, mode='predict'):
    super().__init__(name='ToyLM', mode=mode)
    self._table = np.asarray(table, np.float32)
    self._positions = max_len
    self._n_forward = 0

  @property
  def max_len(self):
    return self._positions

  def forward(self, x):
    self._n_forward += 1
    if self.mode == 'predict':
      prev, pos, shared = self.state
      fed = jnp.concatenate([prev[::2, None], x], axis=1)
      self.state = (jnp.repeat(x[:, -1], 2), pos + x.shape[1], shared)
    else:
      fed = jnp.pad(x, ((0, 0), (2, 0)))[:, :-1]
    return self.weights[fed[:, :-1], fed[:, 1:]]

  def init_weights_and_state(self, input_signature):
    self.weights = jnp.asarray(self._table)
    if self.mode == 'predict':
      batch = input_signature.shape[0]
      self.state = (jnp.zeros((2 * batch,), jnp.int32),
                    jnp.zeros((), jnp.int32), jnp.arange(2, dtype=jnp.float32))


def _table(vocab, seed, scale=3.0):
  """Logits `table[previous, current]` of the next token: `(vocab,) * 3`."""
  return np.random.RandomState(seed).normal(size=(vocab,) * 3) * scale


def _toy(table, batch=1, **kwargs):
  model = ToyLM(table, **kwargs)
  model.init(ShapeDtype((batch, 1), np.int32))
  return model


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  return x - np.log(np.sum(np.exp(x - x.max()))) - x.max()


def _toy_log_probs(table, fed):
  return _log_softmax(table[fed[-2] if len(fed) > 1 else 0, fed[-1]])


def _greedy_reference(table, fed, max_length, eos_id):
  """Greedy decoding of each row; stops when every row has produced eos (Trax)."""
  fed = [list(row) for row in fed]
  out, seen = [], set()
  for _ in range(max_length):
    step = [int(np.argmax(_toy_log_probs(table, row))) for row in fed]
    out.append(step)
    for i, tok in enumerate(step):
      fed[i].append(tok)
      if tok == eos_id:
        seen.add(i)
    if len(seen) == len(fed):
      break
  return np.array(out).T


def _beam_reference(log_probs_fn, k, max_length, eos_id, alpha):
  """Beam search in plain Python: of the 2k best candidates, eos among the
  best k finish (a pool of k), the k best others live on."""
  penalty = lambda n: ((5.0 + n) / 6.0)**alpha
  alive, finished = [(0.0, [])], []
  for t in range(max_length):
    cands = [(lp + v, seq + [tok]) for lp, seq in alive
             for tok, v in enumerate(log_probs_fn(seq))]
    cands = sorted(cands, key=lambda c: -c[0])[:2 * k]
    finished += [(lp / penalty(t + 1), seq) for lp, seq in cands[:k]
                 if seq[-1] == eos_id]
    finished = sorted(finished, key=lambda c: -c[0])[:k]
    alive = [c for c in cands if c[1][-1] != eos_id][:k]
  finished += [(lp / penalty(max_length), seq) for lp, seq in alive]
  return sorted(finished, key=lambda c: -c[0])[:k]


def _same_leaves(source, target):
  """`source`'s arrays in `target`'s tree (a predict model adds tl.Cache nodes)."""
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(target),
                                      jax.tree_util.tree_leaves(source))


def _padded(seq, length):
  return np.pad(np.asarray(seq), (0, length - len(seq)))


# --- the golden copy-task models ------------------------------------------------


def _golden_model(name, mode, batch):
  ctor = {'reformerlm_copy': functools.partial(
              models.ReformerLM, d_ff=128, d_attention_key=16,
              d_attention_value=16),
          'transformerlm': functools.partial(models.TransformerLM, d_ff=64)}
  model = ctor[name](vocab_size=32, d_model=32, n_layers=2, n_heads=2,
                     max_len=64, mode=mode)
  sig = ShapeDtype((batch, 1 if mode == 'predict' else 16), np.int32)
  model.init_from_file(os.path.join(GOLDEN, name, 'model.pkl.gz'),
                       weights_only=True, input_signature=sig)
  return model


def _copy_task(name):
  x = np.load(os.path.join(GOLDEN, name, 'io.npz'))['inputs']  # 0 w 0 w
  half = x.shape[1] // 2 + 1  # The prompt `0 w 0`; ShiftRight's 0 comes first.
  return x[:, :half], x[:, half:]


def test_golden_reformer_copies_its_prompts():
  prompts, copies = _copy_task('reformerlm_copy')
  model = _golden_model('reformerlm_copy', 'predict', batch=1)  # Tiled to 4.
  got = decoding.autoregressive_sample(model, inputs=prompts, batch_size=4,
                                       temperature=0.0,
                                       max_length=copies.shape[1])
  np.testing.assert_array_equal(got, copies)


def test_golden_transformer_copies_and_beam_search_matches_eval_logits():
  """Greedy decoding copies; beam search with real caches equals beam search on eval logits."""
  prompts, copies = _copy_task('transformerlm')
  model = _golden_model('transformerlm', 'predict', batch=1)
  initial_state = model.state
  greedy = decoding.autoregressive_sample(model, inputs=prompts, batch_size=4,
                                          temperature=0.0,
                                          max_length=copies.shape[1])
  np.testing.assert_array_equal(greedy, copies)

  model.state = initial_state
  prompt, k, max_length, alpha = prompts[2:3, :3], 3, 4, 0.6
  model_eval = models.TransformerLM(32, d_model=32, d_ff=64, n_layers=2,
                                    n_heads=2, max_len=64, mode='eval')
  model_eval.init(ShapeDtype((1, 16), np.int32))
  model_eval.weights = model.weights
  eval_fn = jax.jit(model_eval.pure_fn)

  def log_probs(seq):
    tokens = list(prompt[0]) + seq
    padded = _padded(tokens, 16)[None].astype(np.int32)
    logits = eval_fn(padded, model_eval.weights, model_eval.state,
                     model_eval.rng)[0]
    return _log_softmax(np.asarray(logits)[0, len(tokens)])

  want = _beam_reference(log_probs, k, max_length, 1, alpha)
  got = decoding.beam_search(model, inputs=prompt, n_beams=k,
                             max_length=max_length, length_penalty=alpha)
  for (seq, score), (want_score, want_seq) in zip(got, want):
    np.testing.assert_array_equal(_padded(seq[0], max_length),
                                  _padded(want_seq, max_length))
    np.testing.assert_allclose(score[0], want_score, atol=1e-4)
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(  # Left unchanged.
      lambda a, b: np.array_equal(a, b), model.state, initial_state))


def test_encoder_decoder_beam_search_matches_eval_logits():
  """Transformer (encoder cached by tl.Cache): beam search vs eval logits."""
  make = functools.partial(models.Transformer, 12, d_model=16, d_ff=32,
                           n_encoder_layers=1, n_decoder_layers=1, n_heads=2,
                           max_len=32)
  source = np.array([[3, 5, 7, 2, 0], [4, 4, 9, 11, 6]], np.int32)
  prompt = np.array([[7], [8]])
  model, model_eval = make(mode='predict'), make(mode='eval')
  model_eval.init((ShapeDtype((2, 5), np.int32), ShapeDtype((2, 8), np.int32)))
  model.init((ShapeDtype((2, 5), np.int32), ShapeDtype((2, 1), np.int32)))
  model.weights = _same_leaves(model_eval.weights, model.weights)
  eval_fn = jax.jit(model_eval.pure_fn)

  def log_probs(row, seq):
    tokens = _padded(list(prompt[row]) + seq, 8)[None].astype(np.int32)
    logits = eval_fn((source[row:row + 1], tokens), model_eval.weights,
                     model_eval.state, model_eval.rng)[0][0]
    return _log_softmax(np.asarray(logits)[0, len(seq) + 1])

  kwargs = dict(inputs=source, batch_size=2, eos_id=None, max_length=5,
                prompt=prompt)
  beams = decoding.beam_search(model, n_beams=2, length_penalty=0.0, **kwargs)
  for row in range(2):
    want = _beam_reference(functools.partial(log_probs, row), 2, 5, None, 0.0)
    for (seqs, scores), (want_score, want_seq) in zip(beams, want):
      np.testing.assert_array_equal(seqs[row], want_seq)
      np.testing.assert_allclose(scores[row], want_score, atol=1e-4)


# --- the toy model: references in numpy ----------------------------------------


def test_greedy_sampling_matches_numpy_and_trax_eos_rule():
  table = _table(7, seed=0)
  model = _toy(table, batch=3)
  inputs = np.array([[2, 3], [4, 4], [6, 1]])
  prompt = np.array([[5], [0], [2]])
  for eos_id in (None, 3):
    model.state = _toy(table, batch=3).state
    got = decoding.autoregressive_sample(
        model, inputs=inputs, prompt=prompt, batch_size=3, temperature=0.0,
        start_id=0, eos_id=eos_id, max_length=12)
    fed = np.concatenate([np.zeros((3, 1), int), inputs, prompt], axis=1)
    np.testing.assert_array_equal(got, _greedy_reference(table, fed, 12, eos_id))
    # The state holds the fed tokens: all but the last sample.
    assert int(model.state[1]) == fed.shape[1] + got.shape[1] - 1


def test_sampling_distribution_with_temperature_top_k_and_top_p():
  table = _table(8, seed=1, scale=1.5)
  n = 40000
  log_probs = _log_softmax(table[0, 0])
  model = _toy(table)
  initial_state = model.state
  for temperature, top_k, top_p in [(1.0, None, None), (0.7, 5, None),
                                    (1.3, None, 0.6), (0.8, 6, 0.75)]:
    model.state = initial_state
    got = decoding.autoregressive_sample(
        model, batch_size=n, temperature=temperature, top_k=top_k, top_p=top_p,
        max_length=1, eos_id=None, rng=jax.random.PRNGKey(7))
    freq = np.bincount(got[:, 0], minlength=8) / n
    p = np.exp(log_probs / temperature)
    if top_k is not None:
      p[np.argsort(-p)[top_k:]] = 0.0
    p /= p.sum()
    if top_p is not None:
      order = np.argsort(-p)
      mass_before = np.cumsum(p[order]) - p[order]
      p[order[mass_before >= top_p]] = 0.0
      p /= p.sum()
    np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / n) + 1e-3)
    assert np.all(freq[p == 0] == 0)


def test_stream_yields_the_tokens_of_autoregressive_sample():
  table = _table(9, seed=2, scale=1.0)
  inputs = np.array([[1, 2, 3], [3, 2, 1]])
  kwargs = dict(inputs=inputs, batch_size=2, temperature=1.2, top_k=6, rng=3)
  model = _toy(table, batch=2)
  want = decoding.autoregressive_sample(model, eos_id=None, max_length=10,
                                        **kwargs)
  model = _toy(table, batch=2)
  stream = decoding.autoregressive_sample_stream(model, **kwargs)
  got = np.stack([next(stream) for _ in range(10)], axis=1)
  np.testing.assert_array_equal(got, want)
  assert int(model.state[1]) == 1 + 3 + 9  # Start, inputs, samples but last.


def test_accelerate_false_runs_the_same_decoding_op_by_op():
  table = _table(5, seed=2)
  kwargs = dict(inputs=np.array([[1, 2]]), temperature=0.0, eos_id=None,
                max_length=2)
  want = decoding.autoregressive_sample(_toy(table), **kwargs)
  got = decoding.autoregressive_sample(_toy(table), accelerate=False, **kwargs)
  np.testing.assert_array_equal(got, want)


def test_eval_mode_decoding_equals_predict_mode():
  table = _table(6, seed=3)
  inputs = np.array([[2, 5, 1], [4, 0, 3]])
  kwargs = dict(inputs=inputs, batch_size=2, temperature=0.0, eos_id=None,
                max_length=9)
  want = decoding.autoregressive_sample(_toy(table, batch=2), **kwargs)
  model_eval = _toy(table, batch=2, mode='eval')
  got = decoding.autoregressive_sample(model_eval, eval_mode=True,
                                       eval_min_length=16, **kwargs)
  np.testing.assert_array_equal(got, want)
  stream = decoding.autoregressive_sample_stream(
      model_eval, eval_mode=True, **{k: v for k, v in kwargs.items()
                                     if k not in ('eos_id', 'max_length')})
  np.testing.assert_array_equal(
      np.stack([next(stream) for _ in range(9)], 1), want)


def test_decoding_loop_is_compiled_once_per_shape():
  model = _toy(_table(5, seed=4), batch=2)
  initial_state = model.state
  out = decoding.autoregressive_sample(model, batch_size=2, max_length=30,
                                       eos_id=None, temperature=0.5, rng=0)
  assert out.shape == (2, 30)
  traced = model._n_forward
  assert traced <= 6  # Layout probes and the loop's steps, not one per token.
  model.state = initial_state
  again = decoding.autoregressive_sample(model, batch_size=2, max_length=30,
                                         eos_id=None, temperature=0.5, rng=0)
  np.testing.assert_array_equal(again, out)
  assert model._n_forward == traced


# --- beam search ------------------------------------------------------------------


def test_beam_search_matches_numpy_beam_search():
  table = _table(10, seed=5, scale=2.0)
  prompts = np.array([[3, 7], [8, 2]])
  k, max_length, eos_id, alpha = 3, 7, 4, 0.6
  model = _toy(table, batch=2)
  got = decoding.beam_search(model, inputs=prompts, batch_size=2, n_beams=k,
                             eos_id=eos_id, max_length=max_length,
                             length_penalty=alpha)
  assert len(got) == k
  for row in range(2):
    fed = [0] + list(prompts[row])
    want = _beam_reference(lambda seq, fed=fed: _toy_log_probs(table, fed + seq),
                           k, max_length, eos_id, alpha)
    for (seqs, scores), (want_score, want_seq) in zip(got, want):
      np.testing.assert_array_equal(_padded(seqs[row], max_length),
                                    _padded(want_seq, max_length))
      np.testing.assert_allclose(scores[row], want_score,
                                 **float32_tolerance(rtol=1e-5, atol=0))


def test_wide_beam_search_finds_the_best_sequences_by_enumeration():
  table = _table(3, seed=6, scale=2.0)
  eos_id, max_length, alpha = 1, 3, 0.8
  penalty = lambda n: ((5.0 + n) / 6.0)**alpha
  complete = []
  for n in range(1, max_length + 1):
    for seq in itertools.product(range(3), repeat=n):
      ends = seq[-1] == eos_id
      if eos_id in seq[:-1] or (n < max_length and not ends):
        continue
      fed = [0] + list(seq)
      lp = sum(_toy_log_probs(table, fed[:i + 1])[fed[i + 1]] for i in range(n))
      complete.append((lp / penalty(n), seq))
  complete.sort(key=lambda c: -c[0])
  assert len(complete) == 15
  got = decoding.beam_search(_toy(table), n_beams=16, eos_id=eos_id,
                             max_length=max_length, length_penalty=alpha)
  for (seqs, scores), (want_score, want_seq) in zip(got, complete):
    np.testing.assert_array_equal(_padded(seqs[0], max_length),
                                  _padded(want_seq, max_length))
    np.testing.assert_allclose(scores[0], want_score, rtol=1e-5)
  assert got[15][1][0] == -np.inf


def test_one_beam_is_greedy():
  table = _table(8, seed=7)
  model = _toy(table, batch=3)
  inputs = np.array([[1], [2], [3]])
  greedy = decoding.autoregressive_sample(model, inputs=inputs, batch_size=3,
                                          temperature=0.0, eos_id=5,
                                          max_length=15)
  model = _toy(table, batch=3)
  (beam, _), = decoding.beam_search(model, inputs=inputs, batch_size=3,
                                    n_beams=1, eos_id=5, max_length=15,
                                    length_penalty=0.0)
  for row in range(3):  # Equal up to and including each row's eos.
    ends = np.nonzero(greedy[row] == 5)[0]
    n = ends[0] + 1 if ends.size else greedy.shape[1]
    np.testing.assert_array_equal(beam[row, :n], greedy[row, :n])
    assert np.all(beam[row, n:] == 0)


def test_reorder_examples_moves_per_example_rows_only():
  model = _toy(_table(4, seed=8), batch=3)
  state = (jnp.array([1, 1, 2, 2, 3, 3], jnp.int32), jnp.int32(5),
           jnp.array([7.0, 8.0]))
  prev, pos, shared = decoding.reorder_examples(model, state, [2, 2, 0, 1])
  np.testing.assert_array_equal(prev, [3, 3, 3, 3, 1, 1, 2, 2])
  assert int(pos) == 5
  np.testing.assert_array_equal(shared, [7.0, 8.0])


# --- errors -----------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
  table = _table(6, seed=9)
  with pytest.raises(ValueError, match="mode='predict'"):
    decoding.autoregressive_sample(_toy(table, mode='eval'))
  with pytest.raises(ValueError, match="mode='predict'"):
    decoding.beam_search(models.TransformerLM(6, d_model=8, n_layers=1,
                                              mode='eval'))
  with pytest.raises(ValueError, match="needs a model built with mode='eval'"):
    decoding.autoregressive_sample(_toy(table), eval_mode=True)
  model = _toy(table, max_len=8)
  with pytest.raises(ValueError, match=r'prompt needs 10 positions .* 8 free'):
    decoding.autoregressive_sample(model, inputs=np.ones((1, 9), np.int32))
  with pytest.raises(ValueError, match=r'max_length=10 feed 13 positions'):
    decoding.autoregressive_sample(model, inputs=np.ones((1, 3), np.int32),
                                   max_length=10)
  with pytest.raises(ValueError, match=r'max_length=7 feed 10 positions'):
    decoding.beam_search(model, inputs=np.ones((1, 3), np.int32), max_length=7)
  with pytest.raises(ValueError, match=r'ids in \[0, 6\).* from 0 to 99'):
    decoding.autoregressive_sample(model, inputs=np.array([[0, 99]]))
  with pytest.raises(ValueError, match=r'start_id must hold token ids in'):
    decoding.autoregressive_sample(model, start_id=-1)
  with pytest.raises(TypeError, match='integer token ids'):
    decoding.autoregressive_sample(model, prompt=np.array([[1.5]]))
  with pytest.raises(ValueError, match=r'batch size \(2\) does not match'):
    decoding.autoregressive_sample(model, inputs=np.ones((2, 2), np.int32))
  with pytest.raises(ValueError, match='caches for batch size 2'):
    decoding.autoregressive_sample(_toy(table, batch=2), batch_size=3,
                                   max_length=2)
  with pytest.raises(ValueError, match='encoder input'):
    decoding.autoregressive_sample(models.Transformer(6, d_model=8,
                                                      mode='predict'))
  with pytest.raises(ValueError, match='top_k=9 exceeds the vocabulary size 6'):
    decoding.autoregressive_sample(model, top_k=9, max_length=2)
  with pytest.raises(ValueError, match='temperature must be a number >= 0'):
    decoding.autoregressive_sample(model, temperature=-1.0)
  with pytest.raises(ValueError, match=r'top_p must be None or in \(0, 1\]'):
    decoding.autoregressive_sample(model, top_p=0.0)
  with pytest.raises(ValueError, match='n_beams must be an int >= 1'):
    decoding.beam_search(model, n_beams=0)
  stream = decoding.autoregressive_sample_stream(_toy(table, max_len=3))
  for _ in range(3):
    next(stream)
  with pytest.raises(ValueError, match='past the predict-mode caches'):
    next(stream)
