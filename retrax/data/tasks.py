"""Tasks as `Inputs`: copy / duplication, addition, random, sine; LM on a text file.

Trax draws these from numpy's (and Python's) *global* random generators; with
``seed=None`` retrax does the same, call for call, so after
``np.random.seed(s); random.seed(s)`` the batches equal Trax's. With an int
`seed` each stream call gets its own generators (``random.Random(seed)`` and
``np.random.RandomState(seed)`` for train, ``seed + 1`` for eval), so a stream
is reproducible on its own.
"""

import math
import random
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from retrax.configurable import configurable
from retrax.data import tokenizers
from retrax.data.batching import pad_to_max_dims
from retrax.data.input_streams import Inputs
from retrax.errors import UserInputError
from retrax.validation import ArgumentValueError


def _rngs(seed):
  """(python rng, numpy rng): the global ones for None, else fresh seeded ones."""
  if seed is None:
    return random, np.random
  return random.Random(seed), np.random.RandomState(seed)


def _seed_plus(seed, k):
  return None if seed is None else seed + k


def _pad_to_multiple_of(x, y, axis):
  """Zero-pads `x` on `axis` up to a multiple of `y`."""
  pad_len = int(math.ceil(x.shape[axis] / y) * y)
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, pad_len - x.shape[axis])
  return np.pad(x, widths, mode='constant', constant_values=x.dtype.type(0))


def _check_positive(owner, **kwargs):
  """Each keyword argument a positive int; else one line naming `owner` and it."""
  for name, value in kwargs.items():
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
        or value < 1):
      raise ArgumentValueError(f'{owner}: {name} must be a positive int; got '
                               f'{value!r}.')


def _copy_batches(lengths, vocab_size, batch_size, reverse, pad_to_multiple,
                  seed):
  """Batches of 0 w 0 w (or 0 w 0 reversed(w)), weights on the second w."""
  py_rng, np_rng = _rngs(seed)
  while True:
    length = py_rng.choice(lengths)
    w_length = length // 2 - 1
    w = np_rng.randint(low=1, high=vocab_size - 1, size=(batch_size, w_length))
    zero = np.zeros([batch_size, 1], np.int32)
    loss_weights = np.concatenate([np.zeros((batch_size, w_length + 2)),
                                   np.ones((batch_size, w_length))], axis=1)
    second = np.flip(w, axis=1) if reverse else w
    x = np.concatenate([zero, w, zero, second], axis=1)
    x = _pad_to_multiple_of(x, pad_to_multiple, 1)
    loss_weights = _pad_to_multiple_of(loss_weights, pad_to_multiple, 1)
    yield (x, x, loss_weights)


@configurable('trax.data')
def sequence_copy_inputs(vocab_size: int, batch_size: int, train_length: int,
                         eval_min_length: int, eval_max_length: int,
                         reverse: bool = False, pad_to_multiple: int = 32,
                         seed: Optional[int] = None) -> Inputs:
  """The copy task ``0 w 0 w`` of Trax's ``reformer_copy.gin``.

  Each batch has one length ``2 * (|w| + 1)``, drawn uniformly from
  4, 6, ..., ``2 * train_length`` for training and from
  ``2 * (eval_min_length + 1)`` ... ``2 * eval_max_length`` for eval; symbols
  of ``w`` are uniform in ``[1, vocab_size - 2]`` (Trax's range). Batches are
  ``(x, x, weights)`` with weights 1 on the second ``w`` only, all
  zero-padded on the length axis to a multiple of `pad_to_multiple`. ``x`` is
  int64 and weights float64, as in Trax.

  Args:
    vocab_size: symbols are below ``vocab_size - 1``; must be >= 3.
    batch_size: examples per batch.
    train_length: max ``|w| + 1`` for training (>= 2).
    eval_min_length, eval_max_length: eval ``|w| + 1`` range (min < max).
    reverse: the second copy is reversed.
    pad_to_multiple: length padding multiple.
    seed: see the module docstring.
  """
  _check_positive('sequence_copy_inputs', batch_size=batch_size,
                  pad_to_multiple=pad_to_multiple)
  if vocab_size < 3:
    raise ArgumentValueError(f'sequence_copy_inputs: vocab_size must be >= 3 '
                             f'(0 is the separator); got {vocab_size}.')
  train_lengths = [2 * (i + 2) for i in range(train_length - 1)]
  eval_lengths = [2 * (i + 1) for i in range(eval_min_length, eval_max_length)]
  if not train_lengths:
    raise ArgumentValueError(f'sequence_copy_inputs: train_length must be '
                             f'>= 2; got {train_length}.')
  if not eval_lengths:
    raise ArgumentValueError(f'sequence_copy_inputs: need eval_min_length < '
                             f'eval_max_length; got {eval_min_length} and '
                             f'{eval_max_length}.')
  return Inputs(
      train_stream=lambda _: _copy_batches(train_lengths, vocab_size,
                                           batch_size, reverse,
                                           pad_to_multiple, seed),
      eval_stream=lambda _: _copy_batches(eval_lengths, vocab_size,
                                          batch_size, reverse,
                                          pad_to_multiple,
                                          _seed_plus(seed, 1)))


def _simple_copy_batches(lengths, vocab_size, batch_size, pad_to_multiple,
                         seed):
  py_rng, np_rng = _rngs(seed)
  while True:
    length = py_rng.choice(lengths)
    x = np_rng.randint(low=1, high=vocab_size - 1, size=(batch_size, length))
    loss_weights = np.ones((batch_size, length))
    x = _pad_to_multiple_of(x, pad_to_multiple, 1)
    loss_weights = _pad_to_multiple_of(loss_weights, pad_to_multiple, 1)
    yield (x, x, loss_weights)


@configurable('trax.data')
def simple_sequence_copy_inputs(vocab_size: int, batch_size: int,
                                train_length: int, eval_min_length: int,
                                eval_max_length: int,
                                pad_to_multiple: int = 32,
                                seed: Optional[int] = None) -> Inputs:
  """Batches ``(w, w, weights)`` with ``|w|`` uniform in 1..train_length.

  Eval lengths are uniform in ``eval_min_length..eval_max_length``; symbols
  uniform in ``[1, vocab_size - 2]``; weights 1 on ``w``; zero-padded to a
  multiple of `pad_to_multiple`.
  """
  _check_positive('simple_sequence_copy_inputs', batch_size=batch_size,
                  pad_to_multiple=pad_to_multiple, train_length=train_length)
  if vocab_size < 3:
    raise ArgumentValueError(f'simple_sequence_copy_inputs: vocab_size must be '
                             f'>= 3; got {vocab_size}.')
  eval_lengths = list(range(eval_min_length, eval_max_length + 1))
  if not eval_lengths or eval_min_length < 1:
    raise ArgumentValueError(f'simple_sequence_copy_inputs: need 1 <= '
                             f'eval_min_length <= eval_max_length; got '
                             f'{eval_min_length} and {eval_max_length}.')
  train_lengths = list(range(1, train_length + 1))
  return Inputs(
      train_stream=lambda _: _simple_copy_batches(
          train_lengths, vocab_size, batch_size, pad_to_multiple, seed),
      eval_stream=lambda _: _simple_copy_batches(
          eval_lengths, vocab_size, batch_size, pad_to_multiple,
          _seed_plus(seed, 1)))


def _lower_endian_to_number(digits, base):
  return sum(d * base ** i for i, d in enumerate(digits))


def _number_to_lower_endian(n, base):
  digits = [n % base]
  while n >= base:
    n //= base
    digits.append(n % base)
  return digits


def _random_number_lower_endian(length, base, rng):
  if length == 1:  # Only a 1-digit number may be 0.
    return [rng.randint(base)]
  prefix = [rng.randint(base) for _ in range(length - 1)]
  return prefix + [rng.randint(base - 1) + 1]


@configurable('trax.data')
def addition_input_stream(vocab_size: int, batch_size: int, min_length: int,
                          max_length: int, pad_to_multiple: int = 32,
                          encdec: bool = False,
                          seed: Optional[int] = None) -> Iterator[Any]:
  """Batches for the addition task ``<S>x+y<S>(x+y)``, digits lower-endian.

  Digits are in base ``vocab_size - 3``; ids are digit + 1, ``base + 1`` is
  "+" and ``base + 2`` is "<S>" (0 pads). LM mode gives ``(x, x, weights)``
  with weights on the sum; ``encdec=True`` gives ``(x + y, sum, ones)``.
  Lengths are padded to multiples of `pad_to_multiple`.

  Raises (at the first batch):
    ValueError: if `max_length` or `min_length` is below 3.
  """
  base = vocab_size - 3
  _, rng = _rngs(seed)

  def single_example():
    while True:
      add_len = (min_length - 1) // 2
      l1 = rng.randint((max_length - add_len + 1) // 2) + add_len
      l2 = rng.randint(max_length - l1 - 1) + 1
      n1 = _random_number_lower_endian(l1, base, rng)
      n2 = _random_number_lower_endian(l2, base, rng)
      total = (_lower_endian_to_number(n1, base) +
               _lower_endian_to_number(n2, base))
      inp = n1 + [base] + n2
      tgt = _number_to_lower_endian(total, base)
      if encdec:
        x = np.array([i + 1 for i in inp])
        y = np.array([i + 1 for i in tgt])
        weights = np.array([1] * len(tgt))
        if any(len(s) > max_length for s in (x, y, weights)):
          continue  # Too long: draw again (Trax recurses).
        return (x, y, weights)
      x = np.array([base + 2] + [i + 1 for i in inp] + [base + 2] +
                   [i + 1 for i in tgt])
      weights = np.array([0] * (len(inp) + 2) + [1] * len(tgt))
      return (x, x, weights)

  if max_length < 3 or min_length < 3:
    raise ArgumentValueError(f'addition_input_stream: max_length and '
                             f'min_length must be at least 3; got '
                             f'max_length={max_length}, min_length={min_length}.')
  while True:
    examples = [single_example() for _ in range(batch_size)]
    yield tuple(pad_to_max_dims(list(x), boundary=pad_to_multiple,
                                strict_pad_on_len=True)
                for x in zip(*examples))


@configurable('trax.data')
def addition_inputs(vocab_size: int, batch_size: int, train_length: int,
                    eval_min_length: int, eval_max_length: int,
                    pad_to_multiple: int = 32, encdec: bool = False,
                    seed: Optional[int] = None) -> Inputs:
  """`Inputs` for the addition task; see `addition_input_stream`.

  Train sequences have lengths 3..`train_length`, eval ones
  `eval_min_length`..`eval_max_length`.

  Raises:
    ValueError: if a length bound is below 3 (train: at construction, when
      the first batch is drawn; eval: when the eval stream is first read).
  """
  if vocab_size < 5:
    raise ArgumentValueError(f'addition_inputs: vocab_size must be >= 5 '
                             f'(base >= 2); got {vocab_size}.')
  return Inputs(
      train_stream=lambda _: addition_input_stream(
          vocab_size, batch_size, 3, train_length, pad_to_multiple, encdec,
          seed),
      eval_stream=lambda _: addition_input_stream(
          vocab_size, batch_size, eval_min_length, eval_max_length,
          pad_to_multiple, encdec, _seed_plus(seed, 1)))


_FLOAT_DTYPES = (np.float16, np.float32, np.float64)


@configurable('trax.data')
def random_inputs(input_shape: Sequence[int], input_dtype: Any = np.int32,
                  input_range: Sequence[float] = (0, 255),
                  output_shape: Optional[Sequence[int]] = None,
                  output_dtype: Any = np.int32,
                  output_range: Sequence[float] = (0, 9),
                  seed: Optional[int] = None) -> Inputs:
  """Random batches ``(inputs, outputs)`` for debugging.

  Float dtypes are uniform in ``[low, high)``; int dtypes uniform in
  ``[low, high]`` (inclusive, like Trax's ``random_integers``). Shapes
  include the batch dimension.

  Differences from Trax: Trax asserts ``input_range[0] % n_devices == 0``;
  retrax checks that the batch dimension divides by ``n_devices``.
  """
  if output_shape is None:
    raise ArgumentValueError('random_inputs: output_shape (with the batch '
                             'dimension) is required; got None.')

  def draw(rng, shape, dtype, value_range):
    low, high = value_range
    if np.dtype(dtype) in [np.dtype(d) for d in _FLOAT_DTYPES]:
      values = rng.uniform(low, high, shape)
    else:
      values = rng.randint(low, high + 1, shape)
    return values.astype(dtype)

  def random_minibatches(n_devices):
    if input_shape[0] % n_devices:
      raise ArgumentValueError(f'random_inputs: the batch dimension '
                               f'{input_shape[0]} of input_shape is not '
                               f'divisible by n_devices={n_devices}.')
    _, rng = _rngs(seed)
    while True:
      inp = draw(rng, input_shape, input_dtype, input_range)
      out = draw(rng, output_shape, output_dtype, output_range)
      yield inp, out

  return Inputs(random_minibatches)


@configurable('trax.data')
def sine_inputs(batch_size: int, length: int, max_phase: float = 2 * math.pi,
                min_period: float = 0.1, max_period: float = 10.0,
                seed: Optional[int] = None) -> Inputs:
  """Sinusoids ``sin((t - phase) / period)`` of random phase and period.

  Phase is uniform in ``[0, max_phase)``, log-period uniform between the
  logs of `min_period` and `max_period`. Batches are
  ``(obs, actions, obs, mask)``: obs float64 ``[batch_size, length]``,
  actions int32 zeros, mask float64 ones. Train and eval streams are alike.
  """
  _check_positive('sine_inputs', batch_size=batch_size, length=length)

  def random_minibatches(_):
    _, rng = _rngs(seed)
    t = np.arange(length)
    while True:
      series = []
      for _ in range(batch_size):
        phase = rng.uniform(0, max_phase)
        period = np.exp(rng.uniform(np.log(min_period), np.log(max_period)))
        series.append(np.sin((t - phase) / period))
      obs = np.stack(series)
      yield (obs, np.zeros_like(obs, dtype=np.int32), obs, np.ones_like(obs))

  return Inputs(train_stream=random_minibatches, eval_stream=random_minibatches)


def _duplication_batches(vocab_size, length, batch_size, n_devices, seed):
  if batch_size % n_devices:
    raise ArgumentValueError(f'duplication_inputs: batch_size {batch_size} is '
                             f'not divisible by n_devices={n_devices}.')
  rng = np.random.default_rng(seed)
  half = length // 2
  weights = np.zeros((batch_size, length), np.float32)
  weights[:, half + 1:] = 1.0
  while True:
    w = rng.integers(1, vocab_size, size=(batch_size, half - 1),
                     dtype=np.int32)
    zero = np.zeros((batch_size, 1), np.int32)
    x = np.concatenate([zero, w, zero, w], axis=1)
    yield (x, x, weights.copy())


def duplication_inputs(vocab_size: int, length: int, batch_size: int,
                       eval_batch_size: Optional[int] = None,
                       seed: int = 0) -> Inputs:
  """The Reformer paper's duplication task: sequences ``0 w 0 w``.

  ``w`` has ``length // 2 - 1`` symbols uniform in ``[1, vocab_size - 1]``
  (the paper: length 1024, vocab_size 128). Batches are ``(x, x, weights)``,
  ``x`` int32 ``[batch, length]``, weights float32 equal to 1 on the second
  ``w`` (positions ``length // 2 + 1`` onward) and 0 elsewhere, so a causal
  LM is scored only where the answer is determined by the first half.
  Deterministic: train uses ``np.random.default_rng(seed)``, eval
  ``seed + 1``; each stream call starts over.

  Args:
    vocab_size: number of ids including the separator 0 (>= 2).
    length: total sequence length, even and >= 4.
    batch_size: train batch size (a multiple of ``n_devices``).
    eval_batch_size: eval batch size (default `batch_size`).
    seed: int seed.
  """
  _check_positive('duplication_inputs', batch_size=batch_size)
  if vocab_size < 2:
    raise ArgumentValueError(f'duplication_inputs: vocab_size must be >= 2; '
                             f'got {vocab_size}.')
  if length < 4 or length % 2:
    raise ArgumentValueError(f'duplication_inputs: length must be even and '
                             f'>= 4; got {length}.')
  eval_batch_size = eval_batch_size or batch_size
  return Inputs(
      train_stream=lambda n: _duplication_batches(vocab_size, length,
                                                  batch_size, n, seed),
      eval_stream=lambda n: _duplication_batches(vocab_size, length,
                                                 eval_batch_size, n, seed + 1))


# --- language modelling on a text file (the CLI's `--data text:FILE`) ---------


class TextTokenizer:
  """Text <-> int32 ids for `text_lm_inputs`: UTF-8 bytes or a SentencePiece model.

  Args:
    spec: ``'bytes'`` (id = byte value, vocab 256) or
      ``'sentencepiece:PATH'`` (a SentencePiece ``.model`` file; vocab size
      from the model; lines are joined with its EOS id, decoded as newlines).
  """

  def __init__(self, spec='bytes'):
    self.spec = spec
    # Exactly one of the two is set.
    self._bytes: Optional[tokenizers.ByteTextEncoder]
    self._spm: Optional[tokenizers.SentencePieceVocabulary]
    if spec == 'bytes':
      self._bytes = tokenizers.ByteTextEncoder(num_reserved_ids=0)
      self._spm = None
    elif isinstance(spec, str) and spec.startswith('sentencepiece:'):
      self._bytes = None
      self._spm = tokenizers.SentencePieceVocabulary(spec[len('sentencepiece:'):])
    else:
      raise ArgumentValueError(f"TextTokenizer: spec must be 'bytes' or "
                               f"'sentencepiece:PATH' (a SentencePiece .model "
                               f'file); got {spec!r}.')

  @property
  def vocab_size(self):
    return 256 if self._spm is None else self._spm.vocab_size

  @property
  def model_file(self):
    """The SentencePiece model's path (None for bytes)."""
    return None if self._spm is None else self._spm.model_file

  def encode(self, text):
    """A str -> int32 ids (for SentencePiece: EOS after every line but the last)."""
    if self._spm is None:
      assert self._bytes is not None
      return self._bytes.encode_array(text).astype(np.int32)
    lines = text.split('\n')
    pieces = self._spm.encode_batch(lines) if len(lines) > 1 else [
        self._spm.encode(lines[0])]
    eos = self._spm.eos_id
    ids = []
    for i, p in enumerate(pieces):
      ids.extend(p)
      if eos is not None and i < len(pieces) - 1:
        ids.append(eos)
    return np.asarray(ids, np.int32)

  def decode(self, ids):
    """Ids -> str (invalid UTF-8 bytes become U+FFFD)."""
    ids = [int(i) for i in ids]
    if self._spm is None:
      assert self._bytes is not None
      return self._bytes.decode(ids)
    eos = self._spm.eos_id
    lines: list[list[int]] = []
    line: list[int] = []
    for i in ids:
      if i == eos:
        lines.append(line)
        line = []
      else:
        line.append(i)
    return '\n'.join(self._spm.decode(x) for x in lines + [line])


class TextDataError(UserInputError):
  """A text file (or its held-out part) too short for one row of ids."""


def split_held_out(data: bytes, eval_fraction: float):
  """(train, held_out) bytes: the held-out part is the last `eval_fraction`.

  The cut moves forward to the next line start (when one follows), so no line
  is split between the two parts. The parts never overlap.
  """
  if not 0 < eval_fraction < 1:
    raise ArgumentValueError(f'split_held_out: eval_fraction must be in (0, 1); '
                             f'got {eval_fraction}.')
  cut = int(len(data) * (1 - eval_fraction))
  newline = data.find(b'\n', cut)
  if 0 <= newline < len(data) - 1:
    cut = newline + 1
  return data[:cut], data[cut:]


def _train_windows(ids, length, batch_size, seed):
  rng = np.random.default_rng(seed)
  n_starts = len(ids) - length + 1
  weights = np.ones((batch_size, length), np.float32)
  while True:
    starts = rng.integers(0, n_starts, size=batch_size)
    x = np.stack([ids[s:s + length] for s in starts])
    yield x, x, weights.copy()


def _eval_windows(ids, length, batch_size):
  n_windows = len(ids) // length
  weights = np.ones((batch_size, length), np.float32)
  i = 0
  while True:
    rows = [(i + k) % n_windows for k in range(batch_size)]
    i = (i + batch_size) % n_windows
    x = np.stack([ids[r * length:(r + 1) * length] for r in rows])
    yield x, x, weights.copy()


def text_eval_batches(path, length: int, batch_size: int,
                      tokenizer=None) -> Iterator[Any]:
  """Eval batches over all of a text file: consecutive windows of `length`
  ids (cycling), ``(x, x, ones)`` as `text_lm_inputs`' eval stream.

  Raises:
    TextDataError: the file has fewer than `length` ids.
  """
  _check_positive('text_eval_batches', length=length, batch_size=batch_size)
  tokenizer = tokenizer or TextTokenizer('bytes')
  with open(path, 'rb') as f:
    ids = tokenizer.encode(f.read().decode('utf-8', 'replace'))
  if len(ids) < length:
    raise TextDataError(f'{path} has {len(ids)} tokens, fewer than one row '
                        f'of the model\'s length {length}; use a longer file.')
  return _eval_windows(ids, length, batch_size)


def text_lm_inputs(path, length: int, batch_size: int, tokenizer=None,
                   eval_fraction: float = 0.1, seed: int = 0) -> Inputs:
  """Language-model batches from one text file, evaluated on held-out text.

  The file is split by `split_held_out`: the last `eval_fraction` of its
  bytes (from a line start) is held out. Training batches are windows of
  `length` ids at random offsets of the training part
  (``np.random.default_rng(seed)``); eval batches walk the held-out part in
  consecutive, non-overlapping windows (cycling). Batches are
  ``(x, x, ones)``, ``x`` int32 ``[batch_size, length]``.

  Args:
    path: a UTF-8 text file.
    length: ids per row.
    batch_size: rows per batch.
    tokenizer: a `TextTokenizer` (default: bytes).
    eval_fraction: the held-out share of the file, in (0, 1).
    seed: train-stream seed.

  Raises:
    TextDataError: a part too short for one row of `length` ids.
  """
  _check_positive('text_lm_inputs', length=length, batch_size=batch_size)
  tokenizer = tokenizer or TextTokenizer('bytes')
  with open(path, 'rb') as f:
    train_text, eval_text = split_held_out(f.read(), eval_fraction)
  parts = {}
  for name, text, share in (('training', train_text, 1 - eval_fraction),
                            ('held-out', eval_text, eval_fraction)):
    parts[name] = tokenizer.encode(text.decode('utf-8', 'replace'))
    if len(parts[name]) < length:
      raise TextDataError(
          f'{path}: the {name} part (about {share:.0%} of the file) has '
          f'{len(parts[name])} tokens, fewer than one row of length={length}; '
          'use a longer file, a smaller length or another eval_fraction.')
  return Inputs(
      train_stream=lambda _: _train_windows(parts['training'], length,
                                            batch_size, seed),
      eval_stream=lambda _: _eval_windows(parts['held-out'], length,
                                          batch_size))
