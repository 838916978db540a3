"""Per-example stream functions: shuffle, filter, truncate, pad, cast, weights.

Each public CamelCase name returns a stream function ``fn(iterable) ->
iterator``, to be composed with `Serial`. Examples are usually tuples of
numpy arrays, e.g. ``(inputs, targets)``.
"""

import logging
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from retrax import shapes
from retrax.configurable import configurable
from retrax.data.batching import _length_fn
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.validation import ArgumentValueError

StreamFn = Callable[[Iterable[Any]], Iterator[Any]]
_log = logging.getLogger('retrax.data')


def shuffle(samples: Iterable[Any], queue_size: int,
            seed: Optional[int] = None) -> Iterator[Any]:
  """Shuffles a stream with a random-out, next-in queue of `queue_size`.

  The queue is first filled with `queue_size` samples; then for each new
  sample a uniformly random slot is emitted and refilled. When the input ends,
  the queue is shuffled and drained. Every sample is emitted exactly once, and
  sample ``i`` is never emitted before position ``i - queue_size + 1``.

  Random numbers: with ``seed=None`` numpy's global legacy generator is used,
  exactly as Trax does (so ``np.random.seed(s)`` reproduces Trax's order);
  with an int seed a fresh ``np.random.RandomState(seed)`` is used per call,
  which gives the same order as Trax after ``np.random.seed(seed)``.

  Args:
    samples: iterable of samples.
    queue_size: positive int; 1 means no shuffling.
    seed: optional int seed (see above).

  Yields:
    The samples, shuffled.

  Raises:
    ValueError: if `queue_size` < 1.
  """
  if queue_size < 1:
    raise ArgumentValueError(f'Arg queue_size ({queue_size}) is less than 1.')
  rng = np.random if seed is None else np.random.RandomState(seed)
  samples = iter(samples)
  queue = []
  for sample in samples:
    queue.append(sample)
    if len(queue) == queue_size:
      break
  if len(queue) == queue_size:
    for sample in samples:
      i = rng.randint(queue_size)
      yield queue[i]
      queue[i] = sample
  else:
    _log.warning('Not enough samples (%d) to fill initial queue (size %d).',
                 len(queue), queue_size)
  rng.shuffle(queue)
  yield from queue


@configurable('trax.data')
def Shuffle(queue_size: int = 1024, seed: Optional[int] = None) -> StreamFn:
  """Returns a stream function shuffling with a queue; see `shuffle`."""
  if queue_size < 1:
    raise ArgumentValueError(f'Arg queue_size ({queue_size}) is less than 1.')
  return lambda g: shuffle(g, queue_size, seed)


@configurable('trax.data')
def Dup() -> StreamFn:
  """Duplicates the first element: ``(x, *rest)`` -> ``(x, x, *rest)``.

  A bare (non-tuple) example ``x`` becomes ``(x, x)``.
  """
  def _dup(generator):
    for example in generator:
      if isinstance(example, (tuple, list)):
        x, *rest = example
        yield (x, x, *rest)
      else:
        yield (example, example)
  return _dup


@configurable('trax.data')
def FilterEmptyExamples(axes: Optional[Sequence[int]] = None,
                        debug: bool = False) -> StreamFn:
  """Drops examples in which some element has shape ``(0,)``.

  Args:
    axes: tuple indices to check (default: all).
    debug: log each dropped example.
  """
  def _filter(generator):
    for example in generator:
      empty = any(np.shape(x) == (0,) for i, x in enumerate(example)
                  if axes is None or i in axes)
      if not empty:
        yield example
      elif debug:
        _log.info('Filtered example: %r', example)
  return _filter


@configurable('trax.data')
def FilterByLength(max_length: Optional[int],
                   min_length: Optional[int] = 0,
                   length_keys: Optional[Sequence[int]] = None,
                   length_axis: int = 0) -> StreamFn:
  """Keeps examples whose length lies in ``[min_length, max_length]``.

  The length is the maximum of ``shape[length_axis]`` over the tuple elements
  in `length_keys` (default ``[0, 1]``); a bare array uses its own shape.

  Args:
    max_length: inclusive upper bound, or None for none.
    min_length: inclusive lower bound, or None for none.
    length_keys: tuple indices whose lengths count.
    length_axis: the axis that is the length.

  Raises:
    ValueError: if both bounds are None.
  """
  if max_length is None and min_length is None:
    raise ArgumentValueError('FilterByLength needs max_length or min_length; both '
                             'are None.')
  length_keys = list(length_keys) if length_keys else [0, 1]

  def _filtered(generator):
    for example in generator:
      n = _length_fn(example, length_axis, length_keys)
      if max_length is not None and n > max_length:
        continue
      if min_length is not None and n < min_length:
        continue
      yield example
  return _filtered


@configurable('trax.data')
def TruncateToLength(len_map: Optional[Dict[int, Any]] = None) -> StreamFn:
  """Truncates tuple elements to the shapes given in `len_map`.

  ``len_map={0: (256,), 1: (256,)}`` cuts elements 0 and 1 to at most 256
  tokens. An int value ``n`` means ``(n,)``. As in Trax, the element is
  resized with ``np.resize`` (row-major refill, repeating if needed) whenever
  its shape is lexicographically greater than the target shape; for 1-D
  arrays that is plain truncation. A bare array example is treated as a
  1-tuple and comes out as one.

  Raises (when iterated):
    TypeError: for an example that is neither an array nor a tuple/list.
  """
  targets = {} if len_map is None else {
      k: (v,) if isinstance(v, int) else tuple(v) for k, v in len_map.items()}

  def _truncate(generator):
    for example in generator:
      if isinstance(example, np.ndarray):
        example = (example,)
      if not isinstance(example, (list, tuple)):
        raise InputTypeError(f'TruncateToLength expects arrays or tuples of '
                             f'arrays, got {type(example).__name__}: {example!r}')
      example = list(example)
      for key, target in targets.items():
        if np.shape(example[key]) > target:
          example[key] = np.resize(example[key], target)
      yield tuple(example)
  return _truncate


def _pad_len(length, value, multiple):
  if multiple:
    return -length % value
  return max(0, value - length)


@configurable('trax.data')
def PadToLength(len_map: Optional[Dict[int, int]] = None,
                pad_value: Union[int, float, Dict[int, Any]] = 0,
                multiple: bool = False) -> StreamFn:
  """Pads axis 0 of tuple elements to the lengths given in `len_map`.

  Args:
    len_map: dict ``{index: length}``; each element ``index`` is padded at the
      end of axis 0 to ``length`` (longer elements are left as they are). For
      a bare array example, key 0 is used.
    pad_value: the fill value, a scalar for all keys or a dict per key.
    multiple: pad up to the next multiple of ``length`` instead.

  Differences from Trax: Trax's ``multiple=True`` adds ``length % value``
  (7 with multiple 4 became 10); here 7 becomes 8, as its docstring says.
  Trax pads every axis of a multi-dimensional element; here only axis 0.
  A scalar `pad_value` is accepted (Trax needs a dict).

  Raises:
    ValueError: if `len_map` is None.
  """
  if len_map is None:
    raise ArgumentValueError('PadToLength needs len_map ({index: length}); got None.')
  if multiple and any(v <= 0 for v in len_map.values()):
    raise ArgumentValueError(f'PadToLength(multiple=True) needs positive lengths, got '
                             f'{len_map}.')

  def fill(key):
    return pad_value[key] if isinstance(pad_value, dict) else pad_value

  def pad(x, key, value):
    x = np.asarray(x)
    widths = [(0, _pad_len(x.shape[0], value, multiple))] + [(0, 0)] * (
        x.ndim - 1)
    return np.pad(x, widths, mode='constant', constant_values=fill(key))

  def _pad(generator):
    for example in generator:
      if isinstance(example, (list, tuple)):
        example = list(example)
        for key, value in len_map.items():
          example[key] = pad(example[key], key, value)
        yield tuple(example)
      elif isinstance(example, np.ndarray):
        yield pad(example, 0, len_map[0])
      else:
        raise InputTypeError(f'PadToLength expects arrays or tuples of arrays, got '
                             f'{type(example).__name__}: {example!r}')
  return _pad


def add_loss_weights(generator: Iterable[Any],
                     id_to_mask: Optional[int] = None) -> Iterator[Any]:
  """Adds float32 loss weights to ``(inputs, targets)`` examples.

  Pairs get weights of ones shaped like targets; triples keep their weights
  (cast to float32). If `id_to_mask` is given, weights are zeroed where
  ``targets == id_to_mask``. Other tuple lengths pass through unchanged.

  Raises (when iterated):
    ValueError: if `id_to_mask` is given and an example is not a pair/triple.
  """
  for example in generator:
    if len(example) > 3 or len(example) < 2:
      if id_to_mask is not None:
        raise InputValueError(
            f'AddLossWeights(id_to_mask={id_to_mask}) needs (inputs, targets) '
            f'or (inputs, targets, weights) examples, got {len(example)} '
            f'elements.')
      yield example
      continue
    targets = np.asarray(example[1])
    if len(example) == 2:
      if id_to_mask is None:
        weights = np.ones(targets.shape, np.float32)
      else:  # Equals ones * (1 - (targets == id_to_mask)), in one pass.
        weights = np.not_equal(targets, id_to_mask).astype(np.float32)
    else:
      weights = np.asarray(example[2]).astype(np.float32)
      if id_to_mask is not None:
        weights *= 1.0 - np.equal(targets, id_to_mask).astype(np.float32)
    yield (example[0], example[1], weights)


@configurable('trax.data')
def AddLossWeights(id_to_mask: Optional[int] = None) -> StreamFn:
  """Returns a stream function adding loss weights; see `add_loss_weights`."""
  return lambda g: add_loss_weights(g, id_to_mask=id_to_mask)


@configurable('trax.data')
def CastTo(dtype: Any = np.int32, indices: Sequence[int] = (0, 1),
           debug: bool = False) -> StreamFn:
  """Casts tuple elements at `indices` to `dtype`.

  Args:
    dtype: the target numpy dtype.
    indices: tuple positions to cast.
    debug: log examples whose dtype changed (int64 -> int32 is not reported).
  """
  def _cast(generator):
    for count, example in enumerate(generator, 1):
      if not isinstance(example, tuple):
        raise InputTypeError(f'CastTo expects tuple examples, got '
                             f'{type(example).__name__}.')
      example = list(example)
      changed = []
      for i in range(len(example)):
        if i not in indices:
          continue
        x = np.asarray(example[i])
        if x.dtype != dtype:
          if not (x.dtype == np.int64 and np.dtype(dtype) == np.int32):
            changed.append((i, x.dtype))
          x = x.astype(dtype)
        example[i] = x
      if debug and changed:
        _log.info('dtype mismatch in example[%d] = %r was earlier: %r', count,
                  example, changed)
      yield tuple(example)
  return _cast


@configurable('trax.data')
def AppendValue(val: Optional[Dict[int, Any]] = None) -> StreamFn:
  """Appends ``val[key]`` along the last axis of tuple element ``key``.

  ``AppendValue({0: [[5]], 1: [[4]]})`` turns ``(zeros[1, 5], ones[1, 5])``
  into ``([[0, 0, 0, 0, 0, 5]], [[1, 1, 1, 1, 1, 4]])``. A bare array example
  gets ``val[0]`` appended to its flattened values (``np.append``).
  """
  def _append(generator):
    for example in generator:
      if isinstance(example, tuple):
        example = list(example)
        for key, value in (val or {}).items():
          example[key] = np.append(example[key], value, -1)
        yield tuple(example)
      elif isinstance(example, np.ndarray):
        if not val or 0 not in val:
          raise ArgumentValueError('AppendValue on bare array examples needs val[0].')
        yield np.append(example, val[0])
      else:
        raise InputTypeError(f'AppendValue expects arrays or tuples of arrays, got '
                             f'{type(example).__name__}: {example!r}')
  return _append


@configurable('trax.data')
def Log(n_steps_per_example: int = 1, only_shapes: bool = True) -> StreamFn:
  """Prints (and logs) every `n_steps_per_example`-th example, passing all on.

  With ``only_shapes=True`` the `ShapeDtype` signature is printed instead of
  the values, e.g. ``(ShapeDtype{shape:(8, 32), dtype:int64}, ...)``.
  """
  if n_steps_per_example < 1:
    raise ArgumentValueError(f'n_steps_per_example must be >= 1, got '
                             f'{n_steps_per_example}.')

  def log(stream):
    for counter, example in enumerate(stream):
      if counter % n_steps_per_example == 0:
        item = shapes.signature(example) if only_shapes else example
        _log.info('%s', item)
        print(item)
      yield example
  return log
