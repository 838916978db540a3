"""Host-side checks of each training batch, and the errors training raises.

Each check is cheap (shapes, dtypes, and min/max of integer NumPy arrays) and
runs before the batch reaches the jitted step, so bad data stops training with
a message naming the step and the problem instead of silently training on
clipped token ids or retracing for a wrong dtype.
"""

import numpy as np

from retrax.errors import Error
from retrax.errors import InputError
from retrax.layers import core
from retrax.layers.errors import LayerError


class TrainingError(Error, RuntimeError):
  """Base class of the errors that stop a training run."""


class BadBatchError(TrainingError, ValueError):
  """A batch does not fit the model (structure, shape, dtype or value range)."""


class NonFiniteLossError(TrainingError, FloatingPointError):
  """The training loss became NaN or infinite."""


def about_the_batch(error):
  """Whether `error`, raised by a training step, says the batch does not fit:
  a `LayerError` (the model ran on the batch) caused by an `InputError` of
  retrax's own checks (shape, dtype, arity, value range). Anything else, a
  bug in a layer or an optimizer say, is not and keeps its traceback."""
  return isinstance(error, LayerError) and isinstance(error.__cause__,
                                                      InputError)


def _kind(dtype):
  dtype = np.dtype(dtype)
  if dtype.kind in 'iu':
    return 'integer'
  if dtype.kind == 'b':
    return 'bool'
  if dtype.kind in 'fc' or dtype.name == 'bfloat16':
    return 'float'
  return dtype.kind


def find_embedding_vocab(model):
  """Vocabulary size of the first Embedding (depth-first) in `model`, or None."""
  return next((layer.vocab_size for layer in model.walk()
               if isinstance(layer, core.Embedding)), None)


class BatchChecker:
  """Checks batches against the signature a model was initialized with.

  Args:
    batch_signature: tuple of `ShapeDtype` of the sample batch.
    n_model_inputs: how many leading batch items the model takes; the next
      one is the targets.
    input_vocab: if not None, batch item 0 (integer token ids) must lie in
      `[0, input_vocab)`.
    n_classes: if not None, integer targets must lie in `[0, n_classes)`.
    parallel: a `DataParallel` whose `check_batch` checks divisibility.
    names: what to call the tasks in messages (e.g. 'task 0').
  """

  def __init__(self, batch_signature, n_model_inputs, input_vocab=None,
               n_classes=None, parallel=None, name='training'):
    self._signature = tuple(batch_signature)
    self._n_in = n_model_inputs
    self._input_vocab = input_vocab
    self._n_classes = n_classes
    self._parallel = parallel
    self._name = name

  def _item_name(self, i):
    if i < self._n_in:
      return 'inputs' if self._n_in == 1 else f'inputs[{i}]'
    if i == self._n_in:
      return 'targets'
    return 'weights' if i == self._n_in + 1 else f'item {i}'

  def check(self, batch, step):
    """Raises `BadBatchError` (naming `step`) if `batch` does not fit."""
    where = f'Step {step}: {self._name} batch'
    if not isinstance(batch, (tuple, list)):
      raise BadBatchError(
          f'{where} is a {type(batch).__name__}; expected a tuple (inputs, '
          f'targets[, weights]) of {len(self._signature)} arrays.')
    if len(batch) != len(self._signature):
      raise BadBatchError(
          f'{where} has {len(batch)} items; the model was set up for '
          f'{len(self._signature)} ({self._signature}).')
    for i, (x, sig) in enumerate(zip(batch, self._signature)):
      name = self._item_name(i)
      if not (hasattr(x, 'shape') and hasattr(x, 'dtype')):
        raise BadBatchError(
            f'{where}: {name} is a {type(x).__name__}, not an array.')
      if len(x.shape) != len(sig.shape):
        raise BadBatchError(
            f'{where}: {name} has shape {tuple(x.shape)} (rank {len(x.shape)}) '
            f'but the model was set up for rank {len(sig.shape)} {sig.shape}.')
      if _kind(x.dtype) != _kind(sig.dtype):
        raise BadBatchError(
            f'{where}: {name} has dtype {np.dtype(x.dtype)} but the model was '
            f'set up for {sig.dtype} ({_kind(sig.dtype)} values).')
    if self._parallel is not None:
      try:
        self._parallel.check_batch(batch, step)
      except InputError as e:
        raise BadBatchError(f'{self._name}: {e}') from None
    if self._input_vocab is not None:
      self._check_range(batch[0], self._input_vocab, where, self._item_name(0),
                        'the vocabulary size of the model\'s Embedding')
    if self._n_classes is not None and len(batch) > self._n_in:
      self._check_range(batch[self._n_in], self._n_classes, where, 'targets',
                        'the size of the model\'s output (classes)')

  @staticmethod
  def _check_range(x, limit, where, name, what):
    if not isinstance(x, np.ndarray) or x.dtype.kind not in 'iu' or not x.size:
      return  # Device arrays would need a transfer: not a cheap check.
    low, high = x.min(), x.max()
    if low < 0 or high >= limit:
      bad = high if high >= limit else low
      raise BadBatchError(
          f'{where}: {name} holds the id {bad}, outside [0, {limit}) where '
          f'{limit} is {what}.')
