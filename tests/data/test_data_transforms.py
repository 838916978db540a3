"""Per-example transforms, checked against hand-made expected examples."""

import numpy as np
import pytest

from retrax import data


def _trax_shuffle_reference(samples, queue_size):
  """Trax's inputs.shuffle, restated: global numpy RNG, fill-swap-drain."""
  it = iter(samples)
  queue = []
  out = []
  try:
    for _ in range(queue_size):
      queue.append(next(it))
    for s in it:
      i = np.random.randint(queue_size)
      out.append(queue[i])
      queue[i] = s
  except StopIteration:
    pass
  np.random.shuffle(queue)
  return out + queue


@pytest.mark.parametrize('queue_size, n', [(1, 10), (5, 3), (5, 5), (7, 100)])
def test_shuffle_matches_trax_algorithm_for_a_seed(queue_size, n):
  np.random.seed(123)
  expected = _trax_shuffle_reference(range(n), queue_size)
  assert list(data.shuffle(iter(range(n)), queue_size, seed=123)) == expected
  np.random.seed(123)
  assert list(data.Shuffle(queue_size)(iter(range(n)))) == expected


def test_shuffle_is_deterministic_per_seed_and_a_permutation():
  a = list(data.Shuffle(16, seed=7)(range(200)))
  b = list(data.Shuffle(16, seed=7)(range(200)))
  c = list(data.Shuffle(16, seed=8)(range(200)))
  assert a == b and a != c and sorted(a) == list(range(200))
  # Sample i cannot come out before position i - queue_size + 1.
  assert all(x < pos + 16 for pos, x in enumerate(a))
  assert list(data.Shuffle(1, seed=0)(range(10))) == list(range(10))


@pytest.mark.parametrize('queue_size', [0, -5])
def test_shuffle_rejects_bad_queue_size(queue_size):
  with pytest.raises(ValueError, match='less than 1'):
    data.Shuffle(queue_size)
  with pytest.raises(ValueError, match='less than 1'):
    list(data.shuffle(iter(range(3)), queue_size))


def test_dup():
  x, w = np.array([1, 2]), np.array([1., 0.])
  out = list(data.Dup()([(x,), (x, w)]))
  assert len(out[0]) == 2 and out[0][0] is x and out[0][1] is x
  assert len(out[1]) == 3 and out[1][2] is w
  bare = next(data.Dup()([x]))
  assert bare[0] is x and bare[1] is x


def test_filter_empty_examples():
  examples = [(np.zeros((0,)), np.ones((1, 5))),
              (np.zeros((1, 5)), np.ones((1, 5))),
              (np.ones((3,)), np.zeros((0,)))]
  kept = list(data.FilterEmptyExamples()(examples))
  assert len(kept) == 1 and kept[0] is examples[1]
  kept = list(data.FilterEmptyExamples(axes=[1])(examples))
  assert [k[0].shape for k in kept] == [(0,), (1, 5)]


def test_filter_by_length_bounds_are_inclusive_and_keys_select():
  ex = [(np.ones(n), np.ones(m)) for n, m in [(2, 2), (3, 9), (5, 1), (6, 6)]]
  keep = lambda f: [(len(a), len(b)) for a, b in f(ex)]
  assert keep(data.FilterByLength(5, min_length=3)) == [(5, 1)]
  assert keep(data.FilterByLength(5, length_keys=[0])) == [(2, 2), (3, 9),
                                                           (5, 1)]
  assert keep(data.FilterByLength(None, min_length=6)) == [(3, 9), (6, 6)]
  stream = [np.ones((2, 7)), np.ones((2, 3))]
  out = list(data.FilterByLength(4, length_axis=1)(stream))
  assert [x.shape for x in out] == [(2, 3)]
  with pytest.raises(ValueError, match='max_length or min_length'):
    data.FilterByLength(None, None)


def test_truncate_to_length():
  stream = [(np.arange(5), np.arange(10, 13))]
  a, b = next(data.TruncateToLength({0: (3,), 1: 7})(stream))
  assert a.tolist() == [0, 1, 2] and b.tolist() == [10, 11, 12]
  a, b = next(data.TruncateToLength()(stream))
  assert a.tolist() == list(range(5)) and b.tolist() == [10, 11, 12]
  y, = next(data.TruncateToLength({0: (1, 3)})([np.zeros((1, 5))]))
  assert y.shape == (1, 3)


def test_truncate_to_length_keeps_trax_resize_behaviour():
  # Trax resizes whenever the shape is lexicographically larger: (1, 21, 1)
  # > (1, 4, 6), and np.resize refills row-major, repeating the values.
  x = np.arange(21).reshape((1, 21, 1))
  (y,) = next(data.TruncateToLength({0: (1, 4, 6)})([x]))
  assert y.shape == (1, 4, 6)
  assert y[0, 3].tolist() == [18, 19, 20, 0, 1, 2]


def test_pad_to_length():
  stream = [(np.zeros(5), np.ones(3))]
  a, b = next(data.PadToLength({0: 10, 1: 11}, pad_value={0: 0, 1: 1})(stream))
  assert a.tolist() == [0.] * 10 and b.tolist() == [1.] * 11
  a, b = next(data.PadToLength({0: 4, 1: 4}, pad_value=-1)(stream))
  assert a.tolist() == [0.] * 5 and b.tolist() == [1., 1., 1., -1.]
  stream = [(np.arange(7), np.arange(20), np.ones((3, 2)))]
  a, b, c = next(data.PadToLength({0: 4, 1: 10, 2: 4}, multiple=True)(stream))
  assert a.tolist() == list(range(7)) + [0]
  assert b.shape == (20,) and c.shape == (4, 2) and c[3].tolist() == [0, 0]
  assert next(data.PadToLength({0: 3})([np.array([5])])).tolist() == [5, 0, 0]
  with pytest.raises(ValueError, match='len_map'):
    data.PadToLength()


def test_add_loss_weights():
  x, y = np.array([3, 4, 0]), np.array([5, 0, 0])
  out = next(data.AddLossWeights()([(x, y)]))
  assert out[2].dtype == np.float32 and out[2].tolist() == [1., 1., 1.]
  out = next(data.AddLossWeights(id_to_mask=0)([(x, y)]))
  assert out[2].tolist() == [1., 0., 0.]
  w = np.array([0.5, 2., 3.])
  out = next(data.AddLossWeights(id_to_mask=0)([(x, y, w)]))
  assert out[2].dtype == np.float32 and out[2].tolist() == [0.5, 0., 0.]
  quad = (x, y, w, w)
  assert next(data.AddLossWeights()([quad])) is quad
  with pytest.raises(ValueError, match='id_to_mask'):
    next(data.AddLossWeights(id_to_mask=0)([quad]))


def test_cast_to():
  ex = (np.array([1, 2], np.int64), np.array([1.5, 2.5]), np.array([1.]))
  a, b, c = next(data.CastTo()([ex]))
  assert a.dtype == np.int32 and b.dtype == np.int32 and b.tolist() == [1, 2]
  assert c.dtype == np.float64
  a, b, c = next(data.CastTo(np.float32, indices=(2,))([ex]))
  assert a.dtype == np.int64 and c.dtype == np.float32
  with pytest.raises(TypeError, match='tuple'):
    next(data.CastTo()([np.array([1])]))


def test_append_value():
  ex = (np.zeros((1, 5)), np.ones((1, 5)))
  a, b = next(data.AppendValue({0: [[5]], 1: [[4]]})([ex]))
  assert a.tolist() == [[0, 0, 0, 0, 0, 5]] and b.tolist() == [[1] * 5 + [4]]
  a, b = next(data.AppendValue()([ex]))
  assert a.shape == (1, 5)
  assert next(data.AppendValue({0: 9})([np.array([1, 2])])).tolist() == [1, 2,
                                                                          9]


def test_log_prints_signatures_every_n(capsys):
  stream = [(np.zeros((2, 3), np.int32),)] * 5
  out = list(data.Log(n_steps_per_example=2)(stream))
  assert len(out) == 5
  printed = capsys.readouterr().out.strip().splitlines()
  assert len(printed) == 3
  assert 'shape:(2, 3)' in printed[0] and 'int32' in printed[0]
  list(data.Log(only_shapes=False)([(np.array([7, 8]),)]))
  assert '7, 8' in capsys.readouterr().out
