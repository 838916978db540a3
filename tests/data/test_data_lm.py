"""LM example builders: ConcatenateToLMInput, PrefixLM, T5 span corruption."""

import numpy as np
import pytest

from retrax import data


def test_concatenate_to_lm_input():
  ex = (np.array([7, 8]), np.array([9, 10, 11]))
  x, y, w = next(data.ConcatenateToLMInput()([ex]))
  assert x.tolist() == [7, 8, 9, 10, 11] and y is x
  assert w.tolist() == [0, 0, 1, 1, 1] and w.dtype == ex[0].dtype
  x, _, w = next(data.ConcatenateToLMInput(pad_to_length=7)([ex]))
  assert x.tolist() == [7, 8, 9, 10, 11, 0, 0]
  assert w.tolist() == [0, 0, 1, 1, 1, 0, 0]
  single = np.array([1, 2])
  assert all(a is single for a in next(data.ConcatenateToLMInput()([single])))
  assert len(next(data.ConcatenateToLMInput()([(single,)]))) == 2
  with pytest.raises(ValueError, match='longer than pad_to_length'):
    next(data.ConcatenateToLMInput(pad_to_length=4)([ex]))
  with pytest.raises(ValueError, match='Unknown input'):
    next(data.ConcatenateToLMInput()([(single, single, single)]))


@pytest.mark.parametrize('seq, expected', [
    (list(range(1, 9)), [([1, 2], [3, 4, 5]), ([6, 7], [8])]),
    (list(range(1, 7)), [([1, 2], [3, 4, 5])]),
    (list(range(1, 8)), [([1, 2], [3, 4, 5])]),
])
def test_prefix_lm(seq, expected):
  assert list(data.PrefixLM(input_length=2, output_length=3)([seq])) == expected


def test_generate_sequential_chunks():
  out = list(data.generate_sequential_chunks(3)([list(range(7)), [1, 2]]))
  assert out == [[0, 1, 2], [3, 4, 5], [6], [1, 2]]


def _spans(mask):
  """(lengths of noise spans, lengths of non-noise spans, starts with noise)."""
  runs, cur, count = [], mask[0], 0
  for m in mask:
    if m == cur:
      count += 1
    else:
      runs.append((cur, count))
      cur, count = m, 1
  runs.append((cur, count))
  return ([n for v, n in runs if v], [n for v, n in runs if not v],
          bool(mask[0]))


@pytest.mark.parametrize('seeds', [(1, 2), (5, 9), (42, 0)])
def test_random_spans_noise_mask_counts(seeds):
  mask = data.random_spans_noise_mask(100, 0.15, 3.0, seed1=seeds[0],
                                      seed2=seeds[1])
  noise, clean, starts_noisy = _spans(mask)
  # round(100 * .15) = 15 noise tokens in round(15 / 3) = 5 spans.
  assert mask.dtype == bool and mask.sum() == 15 and len(noise) == 5
  assert not starts_noisy and len(clean) == 5 and min(noise) >= 1


def test_random_spans_noise_mask_short_inputs():
  assert data.random_spans_noise_mask(1).tolist() == [False]
  assert data.random_spans_noise_mask(2, seed1=0, seed2=0).tolist() == [False,
                                                                        True]


def test_consume_noise_mask_replaces_spans_with_sentinels():
  tokens = np.array([10, 11, 12, 13, 14, 15])
  mask = np.array([False, True, True, False, True, False])
  inputs, targets = next(data.consume_noise_mask(vocab_size=100)(
      [(tokens, mask)]))
  assert inputs.tolist() == [10, 99, 13, 98, 15]
  assert targets.tolist() == [99, 11, 12, 98, 14, 97]


def test_mlm_pipeline_end_to_end():
  np.random.seed(0)
  out = list(data.MLM(vocab_size=1000, max_length=20)(iter([np.arange(30)])))
  assert len(out) == 2  # chunks of 20 and 10
  for (inputs, targets), n in zip(out, (20, 10)):
    # Every original token appears in exactly one of inputs / targets.
    kept = [t for t in inputs.tolist() + targets.tolist() if t < 900]
    assert len(kept) == n
  with pytest.raises(ValueError, match='vocab_size'):
    data.MLM()
