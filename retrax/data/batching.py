"""Batching: `Batch`, `UnBatch`, `BucketByLength` and the padding they share.

Examples are tuples of arrays (``(inputs, targets)`` or
``(inputs, targets, weights)``); a batch is a tuple of the same length whose
arrays gain a leading batch axis ``[B, ...]``, each padded with zeros to the
largest shape in the batch.
"""

import math
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
from retrax.configurable import configurable
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.validation import ArgumentValueError


def _stack_padded(tensors, target):
  """Stacks `tensors`, each zero-padded at the end of every axis to `target`."""
  target = tuple(target)
  if all(t.shape == target for t in tensors):
    return np.stack(tensors)
  dtypes = {t.dtype for t in tensors}
  if all(d.kind in 'biufc' for d in dtypes):
    # One zeros buffer and slice copies: same result as np.pad + np.stack,
    # several times faster for many small examples.
    dtype = dtypes.pop() if len(dtypes) == 1 else np.result_type(*dtypes)
    out = np.zeros((len(tensors),) + target, dtype)
    if len(target) == 1:
      for i, t in enumerate(tensors):
        out[i, :t.shape[0]] = t
    else:
      for i, t in enumerate(tensors):
        out[(i,) + tuple(slice(0, n) for n in t.shape)] = t
    return out
  return np.stack([
      np.pad(t, [(0, n - m) for n, m in zip(target, t.shape)],
             mode='constant', constant_values=t.dtype.type(0))
      for t in tensors])


def _pad_to_multiples(tensors, boundary, ndim):
  """Pads every dim i up to a multiple of boundary[i] (None: to the max)."""
  if not isinstance(boundary, (list, tuple)):
    boundary = [boundary] * ndim
  if len(boundary) != ndim:
    raise InputValueError(
        f'pad_to_max_dims: boundary {tuple(boundary)} has {len(boundary)} '
        f'entries but the tensors have {ndim} dimensions.')
  max_per_dim = [max(t.shape[i] for t in tensors) for i in range(ndim)]
  target = [m if not b else b * math.ceil(m / b)
            for m, b in zip(max_per_dim, boundary)]
  return _stack_padded(tensors, target)


def pad_to_max_dims(tensors: Sequence[np.ndarray],
                    boundary: Any = None,
                    strict_pad_on_len: bool = False) -> np.ndarray:
  """Pads arrays with zeros to a joint shape and stacks them.

  Shapes (2, 10) and (3, 9) become a [2, 3, 10] batch. With an int `boundary`
  each dimension whose sizes differ (or differ from `boundary`) is padded to
  ``max(max_len, boundary)``, except that when this is more than twice
  ``max_len`` the next power of two of ``max_len`` is used: (2, 10) and (3, 9)
  with boundary 12 give [2, 4, 12]. With ``strict_pad_on_len=True`` or a
  list/tuple `boundary` (one entry per dimension, ``None`` for "just the max")
  every dimension is padded up to a multiple of its boundary instead.

  Args:
    tensors: arrays of equal rank.
    boundary: None, an int, or a list/tuple of ints/None per dimension.
    strict_pad_on_len: pad to multiples of `boundary` (see above).

  Returns:
    The stacked array, shape ``[len(tensors), *padded_shape]``.

  Raises:
    ValueError: for no tensors, tensors of different rank, or a boundary list
      whose length is not the rank.
  """
  tensors = [np.asarray(t) for t in tensors]
  if not tensors:
    raise ArgumentValueError('pad_to_max_dims needs at least one tensor, got none.')
  ndim = tensors[0].ndim
  if any(t.ndim != ndim for t in tensors):
    raise InputValueError(
        f'pad_to_max_dims: tensors must have equal rank to be batched, got '
        f'shapes {[t.shape for t in tensors]}.')
  if boundary is not None and (strict_pad_on_len or
                               isinstance(boundary, (list, tuple))):
    return _pad_to_multiples(tensors, boundary, ndim)

  target = []
  padding_needed = False
  for i in range(ndim):
    sizes = [t.shape[i] for t in tensors]
    max_len, min_len = max(sizes), min(sizes)
    if max_len == min_len and max_len == boundary:
      target.append(max_len)
    elif boundary is None:
      target.append(max_len)
      padding_needed = True
    else:
      padding_needed = True
      cur = max(max_len, boundary)
      if 2 * max_len < cur:
        cur = 2 ** int(np.ceil(np.log2(max_len))) if max_len > 0 else 0
      target.append(cur)
  if not padding_needed:
    return np.stack(tensors)
  return _stack_padded(tensors, target)


def _stack_examples(buf, index):
  """Batches a list of examples (tuples, or bare arrays) into one batch."""
  try:
    if isinstance(buf[0], (tuple, list)):
      lengths = {len(x) for x in buf}
      if len(lengths) > 1:
        raise InputValueError(f'examples have different numbers of elements '
                              f'{sorted(lengths)}')
      columns = list(zip(*buf))
      out: list = []
      for j, column in enumerate(columns):
        # A column of the very same objects as an earlier one (e.g. after
        # Dup) is padded once and copied, so the arrays stay distinct.
        same = next((k for k in range(j) if all(
            a is b for a, b in zip(columns[k], column))), None)
        out.append(pad_to_max_dims(column) if same is None else
                   out[same].copy())
      return tuple(out)
    return pad_to_max_dims(buf)
  except ValueError as e:
    shapes = [tuple(np.shape(t) for t in x) if isinstance(x, (tuple, list))
              else np.shape(x) for x in buf]
    raise InputValueError(
        f'Cannot batch examples of batch {index}: {e}. Element shapes per '
        f'example: {shapes}.') from e


def batch(generator: Iterable[Any], batch_size: int) -> Iterator[Any]:
  """Groups examples into zero-padded batches of `batch_size`.

  Like ``tf.data.Dataset.padded_batch``: a final incomplete batch is dropped.
  Tuple examples give tuple batches; bare-array examples give array batches.

  Args:
    generator: iterable of examples.
    batch_size: positive int.

  Yields:
    Batches; see `pad_to_max_dims` for the padding.

  Raises:
    ValueError: if `batch_size` is not positive, or the examples of a batch
      cannot be stacked (message lists their shapes).
  """
  if batch_size <= 0:
    raise ArgumentValueError(f'Batch size must be positive, but is {batch_size}.')
  buf = []
  index = 0
  for example in generator:
    buf.append(example)
    if len(buf) == batch_size:
      yield _stack_examples(buf, index)
      index += 1
      buf = []


@configurable('trax.data')
def Batch(batch_size: int) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function batching examples; see `batch`."""
  if batch_size <= 0:
    raise ArgumentValueError(f'Batch size must be positive, but is {batch_size}.')
  return lambda g: batch(g, batch_size)


@configurable('trax.data')
def UnBatch() -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function splitting tuple batches into examples.

  ``(xs[B, ...], ys[B, ...])`` becomes B examples ``(xs[i], ys[i])``.

  Raises (when iterated):
    TypeError: if a batch is not a tuple.
    ValueError: if the arrays of a batch have different batch sizes.
  """
  def _unbatch(generator):
    for batched in generator:
      if not isinstance(batched, tuple):
        raise InputTypeError(
            f'UnBatch expects tuple batches such as (inputs, targets), got '
            f'{type(batched).__name__}.')
      sizes = sorted({np.shape(x)[0] for x in batched})
      if len(sizes) != 1:
        raise InputValueError(
            f'UnBatch: arrays in one batch must share the batch size, got '
            f'shapes {[np.shape(x) for x in batched]}.')
      for i in range(sizes[0]):
        yield tuple(x[i] for x in batched)
  return _unbatch


def _length_fn(example, length_axis, length_keys):
  """Length: the max of shape[length_axis] over `length_keys` of a tuple."""
  if isinstance(example, (list, tuple)):
    return max(np.shape(example[i])[length_axis] for i in length_keys)
  return np.shape(example)[length_axis]


def bucket_by_length(generator: Iterable[Any],
                     length_fn: Callable[[Any], int],
                     boundaries: Sequence[int],
                     batch_sizes: Sequence[int],
                     strict_pad_on_len: bool = False) -> Iterator[Any]:
  """Batches examples of similar length together.

  An example of length ``l`` goes to the first bucket ``i`` with
  ``l <= boundaries[i]``; examples longer than every boundary go to the last
  bucket, whose length is unbounded (with ``len(boundaries) + 1`` batch
  sizes; with ``len(boundaries)`` of them, as Trax allows, there is no such
  bucket and a longer example raises). When bucket ``i`` holds
  ``batch_sizes[i]`` examples they are emitted as one batch, padded by
  `pad_to_max_dims` with ``boundary=boundaries[i]`` (no boundary for the last
  bucket). Examples left in buckets when the stream ends are dropped.

  Args:
    generator: iterable of tuple examples.
    length_fn: maps an example to its length.
    boundaries: increasing bucket upper bounds (inclusive).
    batch_sizes: ``len(boundaries) + 1`` (or ``len(boundaries)``) positive
      batch sizes.
    strict_pad_on_len: pad lengths to a multiple of the bucket boundary.

  Yields:
    Padded batches (tuples of arrays).

  Raises:
    ValueError: for inconsistent `boundaries`/`batch_sizes`.
  """
  _check_buckets(boundaries, batch_sizes)
  buckets: list[list] = [[] for _ in batch_sizes]
  bounds = list(boundaries) + [math.inf]
  for example in generator:
    length = length_fn(example)
    idx = next(i for i, b in enumerate(bounds) if length <= b)
    if idx == len(batch_sizes):
      raise InputValueError(
          f'BucketByLength: an example of length {length} is longer than the '
          f'last boundary {bounds[-2]}, and there is no bucket for longer '
          f'examples (give len(boundaries) + 1 = {len(bounds)} batch sizes).')
    buckets[idx].append(example)
    if len(buckets[idx]) == batch_sizes[idx]:
      boundary = None if bounds[idx] == math.inf else bounds[idx]
      yield tuple(pad_to_max_dims([np.asarray(t) for t in x], boundary,
                                  strict_pad_on_len)
                  for x in zip(*buckets[idx]))
      buckets[idx] = []


def _check_buckets(boundaries, batch_sizes):
  if len(batch_sizes) not in (len(boundaries), len(boundaries) + 1):
    raise ArgumentValueError(
        f'BucketByLength needs len(batch_sizes) == len(boundaries) + 1 (the '
        f'last bucket takes longer examples) or len(boundaries); got '
        f'{len(boundaries)} boundaries {list(boundaries)} and '
        f'{len(batch_sizes)} batch sizes {list(batch_sizes)}.')
  if any(b <= 0 for b in batch_sizes):
    raise ArgumentValueError(f'Bucket batch sizes must be positive, got '
                             f'{list(batch_sizes)}.')
  if list(boundaries) != sorted(boundaries):
    raise ArgumentValueError(f'Bucket boundaries must be increasing, got '
                             f'{list(boundaries)}.')


@configurable('trax.data')
def BucketByLength(
    boundaries: Sequence[int],
    batch_sizes: Sequence[int],
    length_keys: Optional[Sequence[int]] = None,
    length_axis: int = 0,
    strict_pad_on_len: bool = False) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function bucketing examples by length.

  The length of an example is the maximum of ``shape[length_axis]`` over the
  tuple elements in `length_keys` (default ``[0, 1]``). See
  `bucket_by_length` for the rest.

  Example::

    BucketByLength(boundaries=[32, 128], batch_sizes=[16, 4, 1])

  batches examples of length <= 32 by 16 (padded to 32), <= 128 by 4
  (padded to 128 when that is at most twice the longest, else to a power of
  two) and longer ones one at a time.
  """
  _check_buckets(boundaries, batch_sizes)
  length_keys = list(length_keys) if length_keys else [0, 1]
  length_fn = lambda x: _length_fn(x, length_axis, length_keys)
  return lambda g: bucket_by_length(g, length_fn, list(boundaries),
                                    list(batch_sizes), strict_pad_on_len)
