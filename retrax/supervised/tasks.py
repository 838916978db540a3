"""`TrainTask` and `EvalTask`: labeled data plus what to do with it."""

from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from retrax import fastmath
from retrax import optimizers
from retrax.configurable import configurable
from retrax.layers import base
from retrax.validation import ArgumentValueError


class _Stream:
  """Batches from an iterator, counting how many were taken (for resuming)."""

  def __init__(self, labeled_data: Iterator[Any], sample_batch: Any,
               export_prefix: Optional[str]) -> None:
    self._labeled_data = labeled_data
    self._sample_batch = sample_batch if sample_batch is not None else next(
        labeled_data)
    self._export_prefix = export_prefix
    self.n_batches = 0

  @property
  def labeled_data(self) -> Iterator[Any]:
    return self._labeled_data

  @property
  def sample_batch(self) -> Any:
    return self._sample_batch

  @property
  def export_prefix(self) -> Optional[str]:
    return self._export_prefix

  def next_batch(self) -> Any:
    """Returns one batch: a tuple of input(s), targets and maybe weights."""
    batch = next(self._labeled_data)
    self.n_batches += 1
    return batch

  def skip(self, n: int) -> None:
    """Drops the next `n` batches (counted as taken)."""
    for _ in range(n):
      self.next_batch()


@configurable('trax.supervised.training')
class TrainTask(_Stream):
  """A supervised task (labeled data + feedback mechanism) for training.

  Args:
    labeled_data: iterator of batches `(inputs..., targets[, weights])`, NumPy
      or JAX arrays with a leading batch dimension. To resume exactly after a
      restart, the iterator must yield the same batches each time the program
      creates it (e.g. a seeded generator): a resumed `Loop` skips the batches
      the checkpointed run had already taken.
    loss_layer: layer computing a scalar loss from `(model_output, targets[,
      weights])`.
    optimizer: a retrax `Optimizer` (instance or class) or an
      `optax.GradientTransformation`.
    lr_schedule: function `step -> learning_rate`, or None for the
      optimizer's own learning rate.
    n_steps_per_checkpoint: steps between checkpoints (and evals by default).
    n_steps_per_permanent_checkpoint: steps between permanent checkpoints.
    loss_name: name of the loss metric (default: the loss layer's name).
    sample_batch: batch used to initialize the model; by default the first
      batch of `labeled_data` (which is then not trained on, as in Trax).
    export_prefix: name of this task's metrics subdirectory when a loop has
      several tasks.
  """

  def __init__(self, labeled_data: Iterator[Any], loss_layer: base.Layer,
               optimizer: optimizers.OptimizerLike,
               lr_schedule: Optional[Callable[[int], Any]] = None,
               n_steps_per_checkpoint: Optional[int] = 100,
               n_steps_per_permanent_checkpoint: Optional[int] = None,
               loss_name: Optional[str] = None, sample_batch: Any = None,
               export_prefix: Optional[str] = None) -> None:
    super().__init__(labeled_data, sample_batch, export_prefix)
    self._loss_layer = loss_layer
    self._optimizer = optimizers.as_optimizer(optimizer)
    self._lr_schedule = lr_schedule
    self._n_steps_per_checkpoint = n_steps_per_checkpoint
    self._n_steps_per_permanent_checkpoint = n_steps_per_permanent_checkpoint
    self._loss_name = loss_name or loss_layer.name

  @property
  def loss_layer(self) -> base.Layer:
    return self._loss_layer

  @property
  def loss_name(self) -> str:
    return self._loss_name

  @property
  def n_steps_per_checkpoint(self) -> Optional[int]:
    return self._n_steps_per_checkpoint

  @property
  def n_steps_per_permanent_checkpoint(self) -> Optional[int]:
    return self._n_steps_per_permanent_checkpoint

  @property
  def optimizer(self) -> optimizers.Optimizer:
    return self._optimizer

  @property
  def lr_schedule(self) -> Optional[Callable[[int], Any]]:
    return self._lr_schedule

  def learning_rate(self, step: int) -> Any:
    """The learning rate for `step`: the schedule's, else the optimizer's.

    None when there is no schedule and the optimizer has no `learning_rate`
    hyperparameter (e.g. a plain optax transformation).
    """
    if self._lr_schedule is None:
      value = dict(self._optimizer.opt_params).get('learning_rate')
      return None if value is None else np.asarray(value)
    with fastmath.use_backend('numpy'):
      value = self._lr_schedule(step)
    if isinstance(value, dict):  # A Trax 1.2 schedule: {'learning_rate': ...}.
      value = value['learning_rate']
    return value


@configurable('trax.supervised.training')
class EvalTask(_Stream):
  """Labeled data plus metric layers, measured now and then during training.

  Args:
    labeled_data: iterator of batches `(inputs..., targets[, weights])`.
    metrics: list of layers, each computing a scalar from `(model_output,
      targets[, weights])`.
    metric_names: names for the metrics (default: the layers' names).
    n_eval_batches: how many batches each evaluation averages over.
    sample_batch: batch used to initialize the metric layers; by default the
      first batch of `labeled_data`.
    export_prefix: name of this task's metrics subdirectory when a loop has
      several eval tasks.
  """

  def __init__(self, labeled_data: Iterator[Any],
               metrics: Sequence[base.Layer],
               metric_names: Optional[Sequence[str]] = None,
               n_eval_batches: int = 1, sample_batch: Any = None,
               export_prefix: Optional[str] = None) -> None:
    super().__init__(labeled_data, sample_batch, export_prefix)
    self._metrics = list(metrics)
    self._metric_names = list(metric_names or [m.name for m in self._metrics])
    self._n_eval_batches = n_eval_batches
    if len(self._metrics) != len(self._metric_names):
      raise ArgumentValueError(
          f'Number of metrics ({len(self._metrics)}) does not equal '
          f'number of metric names ({len(self._metric_names)}).')

  @property
  def metrics(self) -> list[base.Layer]:
    return self._metrics

  @property
  def metric_names(self) -> list[str]:
    return self._metric_names

  @property
  def n_eval_batches(self) -> int:
    return self._n_eval_batches
