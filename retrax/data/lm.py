"""Language-model example builders: LM inputs, prefix-LM chunks, MLM spans."""

import math
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from retrax.configurable import configurable
from retrax.data.combinators import Serial
from retrax.errors import InputValueError
from retrax.validation import ArgumentValueError

StreamFn = Callable[[Iterable[Any]], Iterator[Any]]


@configurable('trax.data')
def ConcatenateToLMInput(pad_to_length: Optional[int] = None) -> StreamFn:
  """Turns ``(input, target)`` pairs into LM examples.

  A pair becomes ``(x, x, weights)`` with ``x = concat(input, target)`` and
  weights 0 on the input part and 1 on the target part (same dtype as the
  arrays, as in Trax). With `pad_to_length`, ``x`` and weights are
  zero-padded to that length. A 1-tuple ``(x,)`` or a bare array ``x``
  becomes ``(x, x)``.

  Raises (when iterated):
    ValueError: if a pair is longer than `pad_to_length`, or an example is
      neither an array nor a 1- or 2-tuple.
  """
  def _concatenate(generator):
    for example in generator:
      if isinstance(example, (list, tuple)) and len(example) == 2:
        inputs, targets = np.asarray(example[0]), np.asarray(example[1])
        concatenated = np.concatenate((inputs, targets), axis=-1)
        weights = np.concatenate((np.zeros_like(inputs),
                                  np.ones_like(targets)))
        if pad_to_length is not None:
          padding = pad_to_length - (inputs.shape[0] + targets.shape[0])
          if padding < 0:
            raise InputValueError(
                f'Example lengths ({inputs.shape[0]}, {targets.shape[0]}) '
                f'longer than pad_to_length ({pad_to_length}).')
          weights = np.pad(weights, (0, padding), 'constant')
          concatenated = np.pad(concatenated, (0, padding), 'constant')
        yield (concatenated, concatenated, weights)
      elif isinstance(example, (list, tuple)) and len(example) == 1:
        yield (example[0], example[0])
      elif isinstance(example, np.ndarray):
        yield (example, example)
      else:
        raise InputValueError(f'Unknown input to ConcatenateToLMInput: {example!r}')
  return _concatenate


@configurable('trax.data')
def PrefixLM(input_length: int = 128, output_length: int = 512) -> StreamFn:
  """Cuts each sequence into ``(input, output)`` chunks for prefix LM.

  Chunks of `input_length` tokens followed by up to `output_length` tokens
  are emitted while a full input chunk plus at least one output token fit:
  ``[1..8]`` with lengths (2, 3) gives ``([1, 2], [3, 4, 5])`` and
  ``([6, 7], [8])``.
  """
  def _f(generator):
    for example in generator:
      n_tokens = len(example)
      begin = 0
      while begin + input_length < n_tokens:
        end = begin + input_length
        out_end = min(end + output_length, n_tokens)
        yield (example[begin:end], example[end:out_end])
        begin = out_end
  return _f


@configurable('trax.data')
def generate_sequential_chunks(max_length: Optional[int]) -> StreamFn:
  """Returns a stream function cutting sequences into chunks of <= max_length.

  `None` (an unset gin binding, or `MLM`'s default) raises a `ValueError`.
  """
  if max_length is None or max_length < 1:
    raise ArgumentValueError(f'max_length must be a positive int, got {max_length}.')

  def _f(generator):
    for example in generator:
      n_tokens = len(example)
      if n_tokens <= max_length:
        yield example
      else:
        for i in range(int(math.ceil(n_tokens / max_length))):
          start = max_length * i
          yield example[start:min(start + max_length, n_tokens)]
  return _f


def _random_segmentation(num_items, num_segments, seed):
  """Lengths of `num_segments` random non-empty segments summing to num_items."""
  first = np.arange(num_items - 1) < num_segments - 1
  if seed is not None:
    np.random.seed(seed)
  np.random.shuffle(first)
  first_in_segment = np.pad(first, (1, 0), mode='constant')
  segment_id = np.cumsum(first_in_segment)
  return np.bincount(segment_id, minlength=num_segments)


def random_spans_noise_mask(length: int,
                            noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0,
                            seed1: Optional[int] = None,
                            seed2: Optional[int] = None,
                            example: Any = None) -> np.ndarray:
  """T5's span-corruption mask: a bool array of `length`, True on noise.

  About ``length * noise_density`` tokens are noise, in spans of mean length
  `mean_noise_span_length`, alternating with non-noise spans and starting
  with non-noise. `seed1`/`seed2` (if given) seed numpy's global generator
  before drawing the noise/non-noise segmentations, as in Trax.
  """
  del example
  orig_length = length
  length = max(length, 2)
  num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
  num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
  num_nonnoise = length - num_noise
  noise_lengths = _random_segmentation(num_noise, num_spans, seed1)
  nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, seed2)
  interleaved = np.reshape(np.stack([nonnoise_lengths, noise_lengths], axis=1),
                           [num_spans * 2])
  span_starts = np.cumsum(interleaved)[:-1]
  start_indicator = np.zeros(length)
  start_indicator[span_starts] = 1
  is_noise = np.equal(np.cumsum(start_indicator) % 2, 1)
  return is_noise[:orig_length]


@configurable('trax.data')
def generate_random_noise_mask(noise_density: float = 0.15,
                               mean_noise_span_length: float = 3.0,
                               seed1: Optional[int] = None,
                               seed2: Optional[int] = None) -> StreamFn:
  """Returns a stream function mapping ``tokens`` to ``(tokens, noise_mask)``."""
  def _f(generator):
    for example in generator:
      yield (example, random_spans_noise_mask(
          len(example), noise_density, mean_noise_span_length, seed1, seed2))
  return _f


@configurable('trax.data')
def consume_noise_mask(vocab_size: int = 32100) -> StreamFn:
  """Maps ``(tokens, noise_mask)`` to T5-style ``(inputs, targets)``.

  Each noise span is replaced in the inputs by one sentinel id
  (``vocab_size - 1``, ``vocab_size - 2``, ...); the targets hold the
  complementary spans, replaced the same way.
  """
  def _to_sentinels(tokens, noise_mask):
    tokens = np.asarray(tokens)
    noise_mask = np.asarray(noise_mask, dtype=bool)
    prev_noise = np.pad(noise_mask[:-1], [1, 0], mode='constant',
                        constant_values=False)
    first_noise = np.logical_and(noise_mask, np.logical_not(prev_noise))
    later_noise = np.logical_and(noise_mask, prev_noise)
    sentinel = vocab_size - np.cumsum(first_noise)
    tokens = np.where(first_noise, sentinel, tokens)
    return tokens[np.logical_not(later_noise)]

  def _f(generator):
    for tokens, noise_mask in generator:
      yield (_to_sentinels(tokens, noise_mask),
             _to_sentinels(tokens, np.logical_not(noise_mask)))
  return _f


@configurable('trax.data')
def MLM(vocab_size: Optional[int] = None,
        max_length: Optional[int] = None,
        noise_density: float = 0.15,
        mean_noise_span_length: float = 3.0) -> Callable[..., Iterator[Any]]:
  """T5-style masked-LM pipeline: chunk, draw span masks, make (inputs, targets)."""
  if vocab_size is None:
    raise ArgumentValueError('MLM needs vocab_size (sentinels count down from it).')
  return Serial(
      generate_sequential_chunks(max_length=max_length),
      generate_random_noise_mask(noise_density=noise_density,
                                 mean_noise_span_length=mean_noise_span_length),
      consume_noise_mask(vocab_size=vocab_size),
  )
