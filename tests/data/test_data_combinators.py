"""Serial and Parallel: expected orders are those Trax's inputs_test pins."""

import itertools

import pytest

from retrax import data


def _take(gen, n):
  return [next(gen) for _ in range(n)]


def test_serial_composes_in_order_and_flattens_nested_lists():
  source = lambda _: iter(range(6))
  add1 = lambda g: (x + 1 for x in g)
  double = lambda g: (2 * x for x in g)
  assert list(data.Serial(source, add1, double)()) == [2, 4, 6, 8, 10, 12]
  assert list(data.Serial(source, [double, [add1]])()) == [1, 3, 5, 7, 9, 11]
  inner = data.Serial(source, add1)
  assert list(data.Serial(inner, double)()) == [2, 4, 6, 8, 10, 12]


def test_serial_passes_its_argument_to_the_first_function():
  pipeline = data.Serial(lambda g: (x * 10 for x in g))
  assert list(pipeline(iter([1, 2]))) == [10, 20]


def test_serial_rejects_non_callables():
  with pytest.raises(TypeError, match='element 1'):
    data.Serial(lambda _: iter([]), 3)


def test_serial_with_python_map_and_filter_then_batch():
  dataset = lambda _: ((i, i + 1) for i in range(10))
  batches = data.Serial(dataset,
                        lambda g: map(lambda x: (x[0], x[1] + 1), g),
                        lambda g: filter(lambda x: x[0] % 2 == 1, g),
                        data.Batch(2))
  xs, ys = next(batches())
  assert xs.tolist() == [1, 3] and ys.tolist() == [3, 5]


def test_parallel_alternates_by_default():
  parallel = data.Parallel([lambda: iter(range(10)),
                            lambda: iter(range(10, 20))])
  assert _take(parallel(), 6) == [0, 10, 1, 11, 2, 12]


def test_parallel_passes_a_given_generator_to_each_stream():
  seen = []

  def stream(offset):
    def f(g):
      seen.append(g)
      return iter(range(offset, offset + 10))
    return f

  marker = iter([])
  out = _take(data.Parallel([stream(0), stream(10)])(marker), 4)
  assert out == [0, 10, 1, 11] and seen == [marker, marker]


def test_parallel_with_counters():
  gen = data.Parallel([lambda: iter(range(10)), lambda: iter(range(10, 20))],
                      counters=(2, 1))()
  assert _take(gen, 10) == [0, 10, 1, 11, 2, 3, 12, 4, 5, 13]


def test_parallel_with_three_counters_resets_after_each_round():
  gen = data.Parallel([lambda: iter(range(10)), lambda: iter(range(10, 20)),
                       lambda: iter(range(20, 30))], counters=(2, 1, 3))()
  assert _take(gen, 13) == [0, 10, 20, 1, 21, 22, 2, 11, 23, 3, 24, 25, 4]


def test_parallel_reweight_by_minimum():
  gen = data.Parallel([lambda: iter(range(10)), lambda: iter(range(10, 110))],
                      counters=(10, 100), reweight_by_minimum=True)()
  expected = [0] + list(range(10, 20)) + [1] + list(range(20, 30)) + [2]
  assert _take(gen, len(expected)) == expected


def test_parallel_gradual_reweighting():
  gen = data.Parallel(
      [lambda: itertools.cycle(range(10, 30)), lambda: itertools.cycle([0]),
       lambda: itertools.cycle(range(30, 70))],
      counters=(20, 1, 40), gradually_reweight=True)()
  one_round = [0] + [v for i in range(20)
                     for v in (10 + i, 30 + 2 * i, 31 + 2 * i)]
  assert _take(gen, 3 * len(one_round)) == one_round * 3


def test_parallel_gradual_reweighting_with_remainders():
  gen = data.Parallel(
      [lambda: itertools.cycle(range(10, 30)), lambda: itertools.cycle([0]),
       lambda: itertools.cycle(range(100, 220)),
       lambda: itertools.cycle(range(30, 80))],
      counters=(20, 1, 120, 50), gradually_reweight=True, use_remainders=True)()
  one_round = [0]
  for i in range(20):
    one_round.append(10 + i)
    for j in range(2):
      one_round.append(30 + 2 * i + j)
      one_round.extend(100 + 4 * i + 2 * j + k for k in range(2))
  one_round += list(range(70, 80)) + list(range(180, 220))
  assert _take(gen, 3 * len(one_round)) == one_round * 3


def test_parallel_nested_and_zero_counters():
  lev0 = data.Parallel([lambda: iter(range(10)), lambda: iter(range(10, 20))])
  gen = data.Parallel([lev0, lambda: iter(range(20, 30))])()
  assert _take(gen, 11) == [0, 20, 10, 21, 1, 22, 11, 23, 2, 24, 12]
  gen = data.Parallel([lambda: iter(range(10)), lambda: iter(range(10, 20)),
                       lambda: iter(range(20, 30))], counters=[1, 0, 1])()
  assert _take(gen, 8) == [0, 20, 1, 21, 2, 22, 3, 23]


def test_parallel_ends_when_a_stream_runs_dry():
  gen = data.Parallel([lambda: iter([1, 2]), lambda: iter([10, 20, 30])])()
  assert list(gen) == [1, 10, 2, 20]


def test_parallel_propagates_real_errors():
  def bad():
    yield 1
    raise RuntimeError('boom')
  with pytest.raises(RuntimeError, match='boom'):
    list(data.Parallel([bad, lambda: iter(range(5))])())


@pytest.mark.parametrize('kwargs, match', [
    (dict(fns=[lambda: iter([])], counters=[1, 2]), 'one counter per stream'),
    (dict(fns=[lambda: iter([])], counters=[-1]), '>= 0'),
    (dict(fns=[lambda: iter([]), lambda: iter([])], counters=[0, 0]),
     'all zero'),
    (dict(fns=[]), 'at least one'),
])
def test_parallel_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    data.Parallel(**kwargs)
