"""Batch, UnBatch, pad_to_max_dims and BucketByLength with hand-checked batches."""

import numpy as np
import pytest

from retrax import data


def test_pad_to_max_dims_shapes_and_values():
  out = data.pad_to_max_dims([np.array([1, 2]), np.array([3, 4, 5])])
  np.testing.assert_array_equal(out, [[1, 2, 0], [3, 4, 5]])
  # Shapes from Trax's inputs_test, including the power-of-two rule.
  assert data.pad_to_max_dims([np.zeros((3, 10)), np.ones((3, 10))]).shape == (
      2, 3, 10)
  assert data.pad_to_max_dims([np.zeros((2, 10)), np.ones((3, 9))]).shape == (
      2, 3, 10)
  assert data.pad_to_max_dims([np.zeros((8, 10)), np.ones((8, 9))],
                              12).shape == (2, 12, 12)
  padded = data.pad_to_max_dims([np.zeros((2, 10)), np.ones((3, 9))], 12)
  assert padded.shape == (2, 4, 12)
  assert padded[1, :3, :9].sum() == 27 and padded[1, 3].sum() == 0
  # Equal to the boundary everywhere: stacked as is.
  assert data.pad_to_max_dims([np.ones(4), np.ones(4)], 4).shape == (2, 4)


def test_pad_to_max_dims_matches_np_pad_reference():
  rng = np.random.RandomState(0)
  for _ in range(30):
    ndim = rng.randint(1, 4)
    dtype = [np.int32, np.int64, np.float32, np.bool_][rng.randint(4)]
    tensors = [(rng.rand(*rng.randint(0, 5, ndim)) * 10).astype(dtype)
               for _ in range(rng.randint(1, 5))]
    target = [max(t.shape[i] for t in tensors) for i in range(ndim)]
    expected = np.stack([np.pad(t, [(0, n - m) for n, m in zip(target,
                                                                t.shape)])
                         for t in tensors])
    out = data.pad_to_max_dims(tensors)
    assert out.dtype == expected.dtype
    np.testing.assert_array_equal(out, expected)


def test_pad_to_max_dims_multiples():
  t = [np.zeros((1, 15, 31)), np.ones((2, 10, 35)), np.ones((4, 2, 3))]
  assert data.pad_to_max_dims(t, boundary=(None, 15, 20)).shape == (3, 4, 15,
                                                                     40)
  out = data.pad_to_max_dims([np.ones(15), np.ones(12), np.ones(14)],
                             boundary=10, strict_pad_on_len=True)
  assert out.shape == (3, 20) and out.sum(axis=1).tolist() == [15, 12, 14]
  with pytest.raises(ValueError, match='2 entries'):
    data.pad_to_max_dims([np.ones(3)], boundary=(2, 2))
  with pytest.raises(ValueError, match='equal rank'):
    data.pad_to_max_dims([np.ones(3), np.ones((3, 1))])


def test_batch_pads_and_drops_remainder():
  stream = [([1] * (3 - i % 3), i) for i in range(7)]
  batches = list(data.Batch(3)(stream))
  assert len(batches) == 2
  xs, ys = batches[0]
  np.testing.assert_array_equal(xs, [[1, 1, 1], [1, 1, 0], [1, 0, 0]])
  assert ys.tolist() == [0, 1, 2]
  assert batches[1][1].tolist() == [3, 4, 5]
  bare = next(data.Batch(2)([np.arange(2), np.arange(3)]))
  np.testing.assert_array_equal(bare, [[0, 1, 0], [0, 1, 2]])


def test_batch_errors():
  with pytest.raises(ValueError, match='positive'):
    data.Batch(0)
  with pytest.raises(ValueError, match='positive'):
    next(data.batch(iter([(1, 2)]), -1))
  with pytest.raises(ValueError, match='batch 0.*shapes'):
    next(data.batch(iter([(np.ones(2),), (np.ones((2, 2)),)]), 2))
  with pytest.raises(ValueError, match='numbers of elements'):
    next(data.batch(iter([(1, 2), (1, 2, 3)]), 2))


def test_unbatch_inverts_batch():
  batches = [(np.arange(6).reshape(3, 2), np.arange(9).reshape(3, 3)),
             (np.arange(8).reshape(4, 2), np.arange(12).reshape(4, 3))]
  examples = list(data.UnBatch()(batches))
  assert len(examples) == 7
  assert examples[1][0].tolist() == [2, 3] and examples[4][1].tolist() == [3, 4,
                                                                           5]
  rebatched = list(data.Batch(7)(examples))
  np.testing.assert_array_equal(rebatched[0][0],
                                np.concatenate([b[0] for b in batches]))
  with pytest.raises(ValueError, match='batch size'):
    list(data.UnBatch()([(np.ones((2, 1)), np.ones((3, 1)))]))
  with pytest.raises(TypeError, match='tuple'):
    list(data.UnBatch()([np.ones((2, 1))]))


def _ex(n, fill=1):
  return (np.full(n, fill), np.full(n, fill))


def test_bucket_by_length_routes_and_pads_each_bucket():
  # Boundaries [4, 8]: lengths <= 4 in bucket 0 (batch 2), <= 8 in bucket 1
  # (batch 2), longer in bucket 2 (batch 1, no boundary).
  stream = [_ex(3, 1), _ex(6, 2), _ex(4, 3), _ex(12, 4), _ex(8, 5), _ex(1, 6)]
  fn = data.BucketByLength(boundaries=[4, 8], batch_sizes=[2, 2, 1])
  out = list(fn(stream))
  assert [b[0].shape for b in out] == [(2, 4), (1, 12), (2, 8)]
  np.testing.assert_array_equal(out[0][0], [[1, 1, 1, 0], [3, 3, 3, 3]])
  np.testing.assert_array_equal(out[1][1], [[4] * 12])
  np.testing.assert_array_equal(out[2][0][0], [2] * 6 + [0, 0])
  # The last example (length 1) stays in an incomplete bucket: dropped.


def test_bucket_by_length_examples_longer_than_every_bucket():
  fn = data.BucketByLength(boundaries=[2], batch_sizes=[4, 2],
                           length_keys=[0])
  out = list(fn([_ex(5), _ex(9)]))
  assert len(out) == 1 and out[0][0].shape == (2, 9)
  assert out[0][0][0].tolist() == [1] * 5 + [0] * 4


def test_bucket_by_length_power_of_two_and_strict_padding():
  # Max length 3 in a bucket with boundary 16: 2 * 3 < 16, so pad to 4.
  out = next(data.BucketByLength([16], [2, 1])([_ex(3), _ex(2)]))
  assert out[0].shape == (2, 4)
  out = next(data.BucketByLength([16], [2, 1], strict_pad_on_len=True)(
      [_ex(3), _ex(2)]))
  assert out[0].shape == (2, 16)


def test_bucket_by_length_length_axis():
  stream = [(np.ones((2, 3)),), (np.ones((2, 5)),)]
  out = next(data.BucketByLength([8], [2, 1], length_keys=[0], length_axis=1)(
      stream))
  assert out[0].shape == (2, 2, 8)


@pytest.mark.parametrize('boundaries, sizes, match', [
    ([4, 8], [2], r'len\(batch_sizes\) == len\(boundaries\) \+ 1'),
    ([4, 8], [2, 2, 1, 1], r'len\(batch_sizes\) == len\(boundaries\) \+ 1'),
    ([8, 4], [1, 1, 1], 'increasing'),
    ([4], [0, 1], 'positive'),
])
def test_bucket_by_length_bad_arguments(boundaries, sizes, match):
  with pytest.raises(ValueError, match=match):
    data.BucketByLength(boundaries, sizes)


def test_bucket_by_length_without_overflow_bucket_as_trax_allows():
  def ex(n):
    return (np.ones(n), np.ones(n))
  batches = list(data.bucket_by_length(iter([ex(5)] * 6), lambda e: len(e[0]),
                                       [20], [2], strict_pad_on_len=True))
  assert len(batches) == 3
  assert [b.shape for b in batches[0]] == [(2, 20), (2, 20)]
  with pytest.raises(ValueError, match='longer than the last boundary 20'):
    list(data.bucket_by_length(iter([ex(21)]), lambda e: len(e[0]), [20], [2]))
