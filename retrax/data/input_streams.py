"""`Inputs`: the train and eval batch streams of a task, and one batch's shapes.

Trax's container for a task's data (``trax.data.inputs.Inputs``, re-exported
there by `retrax.data.inputs`); the synthetic and text tasks
(`retrax.data.tasks`) return one.
"""

from typing import Any, Callable, Iterator, Optional, Tuple

from retrax.errors import InputValueError
from retrax.validation import ArgumentTypeError

StreamFactory = Callable[[int], Iterator[Any]]


class Inputs:
  """Train / eval batch streams and the shapes of one batch.

  Each stream is a function ``fn(n_devices) -> iterator of batches``; a batch
  is a tuple ``(inputs[B, ...], targets[B, ...], ...)``. At construction one
  batch of ``train_stream(1)`` is drawn to record shapes and dtypes.

  Example::

    def stream(n_devices):
      while True:
        yield np.zeros((8, 16), np.int32), np.ones((8, 16), np.int32)
    inputs = Inputs(stream)
    inputs.input_shape   # (16,)

  Args:
    train_stream: training batches.
    eval_stream: evaluation batches (default: `train_stream`).
    train_eval_stream: training data for evaluation (default:
      `train_stream`). Trax ignores this argument (its method returns the
      train stream); retrax uses it.

  Raises:
    TypeError: if `train_stream` is not callable.
    ValueError: if the first train batch is not a non-empty tuple of arrays.
  """

  def __init__(self, train_stream: StreamFactory,
               eval_stream: Optional[StreamFactory] = None,
               train_eval_stream: Optional[StreamFactory] = None):
    if not callable(train_stream):
      raise ArgumentTypeError(
          'Inputs should be initialized with a function taking n_devices. If '
          'your inputs do not use it, try `lambda _: your_iterator`; got '
          f'{type(train_stream).__name__}.')
    self._train_stream = train_stream
    self._eval_stream = eval_stream or train_stream
    self._train_eval_stream = train_eval_stream or train_stream

    example = next(iter(train_stream(1)))
    if not isinstance(example, (tuple, list)) or not example or not all(
        hasattr(x, 'shape') and hasattr(x, 'dtype') for x in example):
      raise InputValueError(
          f'Inputs: train_stream must yield tuples of arrays such as (inputs, '
          f'targets), got {type(example).__name__}.')
    self._input_shape = tuple(example[0].shape)[1:]
    self._input_dtype = example[0].dtype
    self._target_shape = tuple(example[-1].shape)[1:]
    self._target_dtype = example[-1].dtype
    self._example_shape = [x.shape for x in example]
    self._example_dtype = [x.dtype for x in example]

  def train_stream(self, n_devices: int) -> Iterator[Any]:
    return self._train_stream(n_devices)

  def eval_stream(self, n_devices: int) -> Iterator[Any]:
    return self._eval_stream(n_devices)

  def train_eval_stream(self, n_devices: int) -> Iterator[Any]:
    return self._train_eval_stream(n_devices)

  @property
  def input_shape(self) -> Tuple[int, ...]:
    """Shape of the first batch element, without the batch dimension."""
    return self._input_shape

  @property
  def input_dtype(self):
    return self._input_dtype

  @property
  def target_shape(self) -> Tuple[int, ...]:
    """Shape of the *last* batch element, without batch dimension (as Trax)."""
    return self._target_shape

  @property
  def target_dtype(self):
    return self._target_dtype

  @property
  def example_shape_dtype(self):
    """``(list of shapes, list of dtypes)`` of the elements of one batch."""
    return self._example_shape, self._example_dtype
