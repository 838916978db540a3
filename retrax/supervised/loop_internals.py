"""Trax's underscore `Loop` methods, for subclasses that drive the loop.

Trax programs subclass `training.Loop` and rewrite `run` from Trax's own
building blocks (as trax/examples/earlystopping.ipynb does):

    with self._open_summary_writers() as (train_writers, eval_writers):
      for _ in range(n_steps):
        self._step += 1
        loss, optimizer_metrics = self._run_one_step(task_index, task_changed)
        ...
        if self._eval_at(self.step):
          self._log_training_progress(
              task=..., total_loss=..., n_steps=..., elapsed_time=...,
              optimizer_metrics=..., summary_writer=train_writers[task_index])
          self.run_evals(eval_writers)

`TraxLoopInternals` gives `Loop` those names with Trax's signatures and
results, built on retrax's training step, logs and writers. It also holds
the progress log that `Loop.run` writes, shared with Trax's entry point.
"""

import contextlib
from typing import TYPE_CHECKING, Any, Mapping, Optional

from retrax.supervised import history
from retrax.supervised import loop_steps
from retrax.supervised import metrics_log
from retrax.supervised import run_dir
from retrax.supervised import tasks
from retrax.supervised import train_state


class TraxLoopInternals:
  """Mixin of `Loop`: Trax's underscore methods and attributes."""

  # What these methods read of `Loop`, declared for the type checker (set
  # in `Loop.__init__`; the methods are `Loop`'s, see there).
  _train_state: train_state.TrainState
  _run_dir: run_dir.RunDir
  _tasks: list[tasks.TrainTask]
  _eval_tasks: list[tasks.EvalTask]
  _pending: loop_steps.PendingLosses
  _loss_sums: train_state.LossSums
  _history: history.History
  _checkpoint_low_metric: Optional[str]
  _checkpoint_high_metric: Optional[str]

  if TYPE_CHECKING:
    @property
    def step(self) -> int: ...

    @property
    def output_dir(self) -> Optional[str]: ...

    def _log(self, message: str, stdout: bool = True) -> None: ...

    def log_step(self, message: str, stdout: bool = True) -> None: ...

    def log_summary(self, values: Mapping[str, Any],
                    summary_writer: Optional[metrics_log.EventWriter],
                    value_prefix: str, log_prefix: str, stdout: bool = True,
                    rjust_len: Optional[int] = None) -> None: ...

    def n_weights(self) -> int: ...

    def _call_callbacks(self, hook: str) -> None: ...

    def _train_on_batch(self, task_index: int, batch: Any) -> tuple: ...

    def _sync_model(self) -> None: ...

    def _opt_step(self) -> int: ...

  @property
  def _step(self):
    """The step count, which Trax's subclasses advance (`self._step += 1`)."""
    return self.step

  @_step.setter
  def _step(self, step):
    self._train_state = self._train_state._replace(step=int(step))

  @property
  def _output_dir(self):
    return self.output_dir

  @contextlib.contextmanager
  def _open_summary_writers(self):
    """Opens the run's TensorBoard writers for the duration of a `run`.

    Yields:
      `(train_summary_writers, eval_summary_writers)`: lists with one writer
      per training / eval task (Nones without `output_dir` or off the
      chief), for `_log_training_progress` and `run_evals`. On exit the
      writers are closed and the last step's loss is checked.
    """
    self._run_dir.open_writers()
    if self._run_dir.writes:
      self._log(f'Metrics will be written in {self.output_dir}.', stdout=False)
    train_writers = [self._run_dir.writer('train', i, self._tasks)
                     for i in range(len(self._tasks))]
    eval_writers = [self._run_dir.writer('eval', i, self._eval_tasks)
                    for i in range(len(self._eval_tasks))]
    try:
      yield train_writers, eval_writers
      self._pending.check()
    finally:
      self._run_dir.close_writers()

  def _run_one_step(self, task_index, task_changed):
    """Trains task `task_index` on its next batch at the current step.

    Calls the callbacks' `on_step_begin` and `on_step_end` around the step,
    and leaves the model's weights and state current, as Trax's does.

    Args:
      task_index: the training task to run.
      task_changed: whether the task differs from the previous step's (its
        loss and optimizer sums start afresh).

    Returns:
      `(loss, optimizer_metrics)`: the step's loss and a dict of optimizer
      statistics, as device scalars (read them to wait for the step).
    """
    if task_changed:
      self._loss_sums.reset(task_index)
    self._call_callbacks('on_step_begin')
    batch = self._tasks[task_index].next_batch()
    loss, stats = self._train_on_batch(task_index, batch)
    self._call_callbacks('on_step_end')
    self._sync_model()  # The next step donates these buffers: sync again then.
    return loss, stats

  def _log_training_progress(self, task, total_loss, n_steps, elapsed_time,
                             optimizer_metrics, summary_writer):
    """Logs the training metrics of the `n_steps` steps since the last log.

    Trax's signature: the mean loss (`total_loss / n_steps`) to stdout and
    history, and the learning rate, steps per second and the means of
    `optimizer_metrics` (sums over the steps) to `summary_writer`.
    """
    n_steps = max(1, n_steps)
    stats = {k: v / n_steps for k, v in optimizer_metrics.items()}
    self._pending.check()
    self._loss_sums.reset(self._loss_sums.task_index)  # This period is logged.
    self._write_progress(task, n_steps, total_loss / n_steps, stats,
                         elapsed_time, summary_writer)

  def _log_progress(self, task_index, elapsed_time, stdout=True):
    """`Loop.run`'s progress log: the losses and optimizer stats summed since
    the last log, to the task's writer (and stdout, unless `stdout=False`)."""
    self._pending.check()
    n_steps, mean_loss, stats = self._loss_sums.means()
    self._write_progress(self._tasks[task_index], n_steps, mean_loss, stats,
                         elapsed_time,
                         self._run_dir.writer('train', task_index, self._tasks),
                         stdout)

  def _write_progress(self, task, n_steps, mean_loss, stats, elapsed_time,
                      writer, stdout=True):
    self._log('', stdout=stdout)
    if self.step == 1:
      self._log_n_weights()
    self.log_step(f'Ran {n_steps} train steps in {elapsed_time:0.2f} secs',
                  stdout=stdout)
    self.log_summary({task.loss_name: mean_loss}, writer, 'metrics/', 'train',
                     stdout=stdout)
    params = {'steps per second': n_steps / max(elapsed_time, 1e-9)}
    learning_rate = task.learning_rate(self._opt_step())
    if learning_rate is not None:
      params['learning_rate'] = float(learning_rate)
    params.update(stats)
    self.log_summary(params, writer, 'training/', 'train', stdout=False)

  def _log_n_weights(self):
    self.log_step(f'Total number of trainable weights: {self.n_weights()}')

  def _log_step(self, msg, stdout=True):
    """Trax's name of `log_step`."""
    self.log_step(msg, stdout=stdout)

  def _at_lowest(self):
    """Whether the newest eval of `checkpoint_low_metric` is its lowest."""
    return self._at_best(self._checkpoint_low_metric, min)

  def _at_highest(self):
    """Whether the newest eval of `checkpoint_high_metric` is its highest."""
    return self._at_best(self._checkpoint_high_metric, max)

  def _at_best(self, metric, best):
    values = [float(v) for _, v in self._history.get('eval',
                                                     f'metrics/{metric}')]
    return bool(values) and values[-1] == best(values)
