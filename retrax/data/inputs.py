"""`Inputs` (the data bundle of the legacy `Trainer`), `batcher`, `make_inputs`.

This module also re-exports the pipeline functions and synthetic tasks, so
Trax code that imports them from ``trax.data.inputs`` (e.g.
``trax.data.inputs.sequence_copy_inputs``) works with
``retrax.data.inputs``.
"""

import logging
from typing import Any, Iterator, Optional, Sequence, Tuple

from retrax.configurable import configurable
from retrax.data.batching import Batch as Batch
from retrax.data.batching import batch as batch
from retrax.data.batching import bucket_by_length as bucket_by_length
from retrax.data.batching import BucketByLength as BucketByLength
from retrax.data.batching import pad_to_max_dims as pad_to_max_dims
from retrax.data.batching import UnBatch as UnBatch
from retrax.data.combinators import Parallel as Parallel
from retrax.data.combinators import Serial as Serial
from retrax.data.counters import count_and_skip as count_and_skip
from retrax.data.counters import CountAndSkip as CountAndSkip
from retrax.data.counters import data_counters as data_counters
from retrax.data.counters import load_data_counters as load_data_counters
from retrax.data.counters import save_data_counters as save_data_counters
from retrax.data.counters import UniformlySeek as UniformlySeek
from retrax.data.input_streams import Inputs as Inputs
from retrax.data.input_streams import StreamFactory as StreamFactory
from retrax.data.lm import ConcatenateToLMInput as ConcatenateToLMInput
from retrax.data.lm import consume_noise_mask as consume_noise_mask
from retrax.data.lm import generate_random_noise_mask as generate_random_noise_mask
from retrax.data.lm import generate_sequential_chunks as generate_sequential_chunks
from retrax.data.lm import MLM as MLM
from retrax.data.lm import PrefixLM as PrefixLM
from retrax.data.lm import random_spans_noise_mask as random_spans_noise_mask
from retrax.data.prefetch import Prefetch as Prefetch
from retrax.data.transforms import add_loss_weights as add_loss_weights
from retrax.data.transforms import AddLossWeights as AddLossWeights
from retrax.data.transforms import AppendValue as AppendValue
from retrax.data.transforms import CastTo as CastTo
from retrax.data.transforms import Dup as Dup
from retrax.data.transforms import FilterByLength as FilterByLength
from retrax.data.transforms import FilterEmptyExamples as FilterEmptyExamples
from retrax.data.transforms import Log as Log
from retrax.data.transforms import PadToLength as PadToLength
from retrax.data.transforms import shuffle as shuffle
from retrax.data.tasks import addition_input_stream as addition_input_stream
from retrax.data.tasks import addition_inputs as addition_inputs
from retrax.data.tasks import duplication_inputs as duplication_inputs
from retrax.data.tasks import random_inputs as random_inputs
from retrax.data.tasks import sequence_copy_inputs as sequence_copy_inputs
from retrax.data.tasks import simple_sequence_copy_inputs as simple_sequence_copy_inputs
from retrax.data.tasks import sine_inputs as sine_inputs
from retrax.data.transforms import Shuffle as Shuffle
from retrax.data.transforms import TruncateToLength as TruncateToLength
from retrax.validation import ArgumentValueError

_log = logging.getLogger('retrax.data')

@configurable('trax.data')
def make_inputs(train_stream: Any, eval_stream: Any = None) -> Inputs:
  """Wraps ready iterators (or lists of stream functions) into `Inputs`.

  A list/tuple is treated as stream functions and composed with `Serial`.
  Each stream function then returns *the same* iterator for every call, as in
  Trax (so the batch drawn for the shapes is consumed).
  """
  if isinstance(train_stream, (list, tuple)):
    train_stream = Serial(train_stream)()
  if isinstance(eval_stream, (list, tuple)):
    eval_stream = Serial(eval_stream)()
  eval_fn = None if eval_stream is None else (lambda _: eval_stream)
  return Inputs(train_stream=lambda _: train_stream, eval_stream=eval_fn)


@configurable('trax.data')
def make_additional_stream(stream: Any) -> Iterator[Any]:
  """The iterator of a pipeline given as a list of stream functions.

  Gin configs build the streams of extra train or eval tasks with it
  (`make_additional_stream.stream = [@data.TFDS(), @data.Tokenize(), ...]`).
  """
  return Serial(stream)()


@configurable('trax.data')
def make_parallel_stream(streams: Sequence[Any],
                         counters: Optional[Sequence[int]] = None
                         ) -> Iterator[Any]:
  """The iterator interleaving `streams` (`Parallel(streams, counters)`)."""
  return Parallel(streams, counters=counters)()


def _buckets_for_length(bucket_length, batch_size, max_eval_length, n_devices,
                        training):
  """Trax's heuristic buckets around `bucket_length`; see `batcher`."""
  boundaries = [bucket_length // 4, bucket_length // 2, bucket_length,
                bucket_length * 2, bucket_length * 4, bucket_length * 8,
                bucket_length * 16]
  if not training:
    max_eval_length = max_eval_length or bucket_length * 32
    boundaries = [b for b in boundaries if b < max_eval_length] + [
        max_eval_length]
    boundaries.append(max_eval_length)
  sizes = [batch_size * 4, batch_size * 2, batch_size, batch_size // 2,
           batch_size // 4, batch_size // 8, batch_size // 16, 1]
  if not training:
    sizes = sizes[:len(boundaries)] + [1]
    sizes[-2] = batch_size // max_eval_length
  sizes = [max(b // n_devices, 1) * n_devices for b in sizes]
  return boundaries, sizes


def batch_fn(dataset, training, n_devices, variable_shapes,
             batch_size_per_device=32, batch_size=None, eval_batch_size=32,
             bucket_length=32, buckets=None,
             buckets_include_inputs_in_length=False,
             batch_shuffle_size=None, max_eval_length=None,
             id_to_mask=None, strict_pad_on_len=False):
  """Batches (with bucketing), optionally shuffles batches, adds weights."""
  batch_size = batch_size or batch_size_per_device * n_devices
  cur_batch_size = batch_size if training else eval_batch_size
  cur_batch_size = max(cur_batch_size // n_devices, 1) * n_devices
  if buckets is None and variable_shapes:
    buckets = _buckets_for_length(bucket_length, cur_batch_size,
                                  max_eval_length, n_devices, training)
  if buckets:
    def example_length(x):
      other = x[0].shape[0] if buckets_include_inputs_in_length else 0
      return max(x[1].shape[0], other)
    boundaries, batch_sizes = buckets
    dataset = bucket_by_length(dataset, example_length, list(boundaries),
                               list(batch_sizes), strict_pad_on_len)
  else:
    dataset = batch(dataset, cur_batch_size)
  if training and batch_shuffle_size is not None:
    dataset = shuffle(dataset, batch_shuffle_size)
  return add_loss_weights(dataset, id_to_mask)


@configurable('trax.data')
def batcher(data_streams: Any = None,
            variable_shapes: bool = True,
            batch_size_per_device: int = 32,
            batch_size: Optional[int] = None,
            eval_batch_size: int = 32,
            bucket_length: int = 32,
            buckets: Optional[Tuple[Sequence[int], Sequence[int]]] = None,
            buckets_include_inputs_in_length: bool = False,
            batch_shuffle_size: Optional[int] = None,
            max_eval_length: Optional[int] = None,
            id_to_mask: Optional[int] = None,
            strict_pad_on_len: bool = False) -> Inputs:
  """Builds `Inputs` from single-example train/eval streams.

  Examples ``(inputs, targets)`` are batched by `bucket_by_length` (buckets
  ``(boundaries, batch_sizes)``, or with ``variable_shapes`` heuristic
  buckets at 1/4, 1/2, 1, 2, 4, 8 and 16 x `bucket_length` with batch sizes
  4x, 2x, 1x, 1/2x ... of the batch size, lengths taken from the targets)
  or else in fixed batches; then loss weights are added
  (`add_loss_weights` with `id_to_mask`).

  Args:
    data_streams: a pair ``(train_fn, eval_fn)`` of functions returning
      example iterators, or a function returning that pair.
    variable_shapes: use heuristic buckets when `buckets` is None.
    batch_size_per_device: train batch per device if `batch_size` is None.
    batch_size: total train batch size.
    eval_batch_size: total eval batch size.
    bucket_length: middle bucket length of the heuristic buckets.
    buckets: explicit ``(boundaries, batch_sizes)``.
    buckets_include_inputs_in_length: length = max(input, target) lengths.
    batch_shuffle_size: shuffle train batches with this queue size.
    max_eval_length: longest eval bucket (default 32 x `bucket_length`).
    id_to_mask: target id whose loss weight is zeroed (e.g. 0 = padding).
    strict_pad_on_len: pad lengths to multiples of bucket boundaries.

  Returns:
    `Inputs` whose streams take ``n_devices`` (batch sizes are rounded to
    multiples of it).
  """
  if callable(data_streams):
    data_streams = data_streams()
  if not isinstance(data_streams, (tuple, list)) or len(data_streams) != 2:
    raise ArgumentValueError(
        'batcher needs data_streams = (train_fn, eval_fn) or a function '
        'returning them (gin: `batcher.data_streams = @data.data_streams`), '
        f'got {data_streams!r}.')
  train_fn, eval_fn = data_streams
  kwargs = dict(
      variable_shapes=variable_shapes,
      batch_size_per_device=batch_size_per_device, batch_size=batch_size,
      eval_batch_size=eval_batch_size, bucket_length=bucket_length,
      buckets=buckets,
      buckets_include_inputs_in_length=buckets_include_inputs_in_length,
      batch_shuffle_size=batch_shuffle_size, max_eval_length=max_eval_length,
      id_to_mask=id_to_mask, strict_pad_on_len=strict_pad_on_len)
  return Inputs(
      train_stream=lambda n: batch_fn(train_fn(), True, n, **kwargs),
      eval_stream=lambda n: batch_fn(eval_fn(), False, n, **kwargs),
      train_eval_stream=lambda n: batch_fn(train_fn(), False, n, **kwargs))
