"""Supervised training: `TrainTask`, `EvalTask` and `Loop` (Trax's API).

    loop = training.Loop(model, [train_task], eval_tasks=[eval_task],
                         output_dir='~/run')
    loop.run(1000)

The loop initializes the model from the first task's sample batch, runs
`train_step` (one jitted step with donated buffers, data parallel over the
local devices: read that module for what a step does), evaluates and checkpoints at step 1 and every
`n_steps_per_checkpoint` steps, writes `metrics.jsonl` and TensorBoard event
files, and resumes by itself from the newest valid checkpoint in
`output_dir`, continuing with the same losses as an uninterrupted run (see
`checkpointing` for what that needs of the data streams).
"""

import contextlib
import logging
import os
import time
from typing import Any, Callable, Mapping, Optional, Sequence, Type, Union

import jax
import jax.numpy as jnp
import numpy as np

from retrax import fastmath
from retrax import local_paths
from retrax import run_layout
from retrax import shapes
from retrax.layers import base
from retrax.models import registry
from retrax.optimizers import placement
from retrax.supervised import callbacks as callbacks_lib
from retrax.supervised import checkpointing
from retrax.supervised import devices
from retrax.supervised import history as trax_history
from retrax.supervised import interrupts
from retrax.supervised import loop_schedules
from retrax.supervised import loop_steps
from retrax.supervised import metrics_log
from retrax.supervised import peers
from retrax.supervised import progress
from retrax.supervised import reporters
from retrax.supervised import run_dir
from retrax.supervised import sharding
from retrax.supervised import train_step as train_step_lib
from retrax.supervised.batch_checks import BadBatchError
from retrax.supervised.batch_checks import NonFiniteLossError
from retrax.supervised.devices import init_host_and_devices
from retrax.supervised.loop_options import LoopOptions
from retrax.supervised.loop_schedules import StepSchedule
from retrax.supervised.loop_schedules import never
from retrax.supervised.tasks import EvalTask
from retrax.supervised.tasks import TrainTask
from retrax.supervised.train_step import TaskState
from retrax.supervised.train_step import TrainState
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

__all__ = ['EvalTask', 'Loop', 'LoopOptions', 'TaskState', 'TrainState',
           'TrainTask', 'init_host_and_devices', 'never', 'BadBatchError',
           'NonFiniteLossError']

_log = logging.getLogger('retrax.supervised')


class Loop:
  """Runs supervised training for a number of steps, with evals and checkpoints.

  Args (Trax's):
    model: the layer to train (loss and metrics are added on top).
    tasks: a `TrainTask` or a list of them.
    eval_model: layer used for evals (e.g. built with mode='eval'); shares
      the trained weights. Default: `model`.
    eval_tasks: an `EvalTask`, a list of them, or None for no evals.
    output_dir: where checkpoints and metrics go; None writes nothing.
    checkpoint_at: `step -> bool`; default step 1 and every
      `tasks[0].n_steps_per_checkpoint` steps.
    checkpoint_low_metric / checkpoint_high_metric: eval metric names; at
      checkpoint steps, also save `lowest_<name>` / `highest_<name>` when the
      metric reaches a new low / high.
    permanent_checkpoint_at: `step -> bool`; default every
      `tasks[0].n_steps_per_permanent_checkpoint` steps (and step 1).
    eval_at: `step -> bool`; default like `checkpoint_at`.
    which_task: `step -> task index`; default cycles through the tasks.
    n_devices: local devices to train on (data parallel); default all.
    random_seed: seed of all randomness; None for a time-based one.
    loss_chunk_size: if > 0, final dense + loss in chunks (see `loss_chunks`).
    use_memory_efficient_trainer: accepted for Trax compatibility. Reversible
      layers already save activation memory through their custom VJP under
      the ordinary step, so this only makes evals use the training model.
    adasum: merge per-device gradients with Adasum.
    callbacks: list of `callbacks.TrainingStepCallback` subclasses.

  Differences from Trax: at a step that both evaluates and checkpoints, the
  evals run first, so the checkpoint holds their results and a resumed run
  matches an uninterrupted one exactly; a NaN/inf loss or a batch that does
  not fit the model stops training (`NonFiniteLossError`, `BadBatchError`);
  `save_checkpoint` writes retrax's native format (a checksummed directory)
  and, beside it, the files Trax writes (`model.pkl.gz` with its
  `.weights.npy.gz` and `.opt_slots{i}.npy.gz`; `model_<step>.pkl.gz` for
  permanent checkpoints), so Trax programs and Trax itself can read them.

  Subclasses may rewrite `run` from Trax's underscore methods
  (`_open_summary_writers`, `_run_one_step`, `_log_training_progress`, ...),
  as Trax's notebooks do.

  Args (retrax's, keyword-only):
    options: a `LoopOptions` (checkpoints kept, progress bar, batch checks,
      Trax files, metric logs and reporters, FSDP mesh); default
      `LoopOptions()`.
  """

  _said_no_trax_files = False  # Said once per loop (see `_save_split`).
  _last_saved_step: Optional[int] = None  # Of the newest checkpoint saved.
  _last_rolling_step: Optional[int] = None  # Of ckpt_<step> / model.pkl.gz.

  def __init__(
      self, model: base.Layer,
      tasks: Union[TrainTask, list[TrainTask], tuple[TrainTask, ...]],
      eval_model: Optional[base.Layer] = None,
      eval_tasks: Union[EvalTask, list[EvalTask], tuple[EvalTask, ...],
                        None] = None,
      output_dir: Union[str, os.PathLike, None] = None,
      checkpoint_at: Optional[StepSchedule] = None,
      checkpoint_low_metric: Optional[str] = None,
      checkpoint_high_metric: Optional[str] = None,
      permanent_checkpoint_at: Optional[StepSchedule] = None,
      eval_at: Optional[StepSchedule] = None,
      which_task: Optional[Callable[[int], int]] = None,
      n_devices: Optional[int] = None, random_seed: Optional[int] = None,
      loss_chunk_size: int = 0, use_memory_efficient_trainer: bool = False,
      adasum: bool = False,
      callbacks: Optional[
          Sequence[Type[callbacks_lib.TrainingStepCallback]]] = None,
      *, options: Optional[LoopOptions] = None) -> None:
    self._options = _check_options(options)
    self._is_chief, self._n_hosts, self._n_devices, rng = (
        init_host_and_devices(n_devices, random_seed))
    self._parallel = sharding.parallel(self._n_devices, self._options.mesh)
    self._tasks, self._eval_tasks = _task_lists(tasks, eval_tasks)
    self._model = model
    self._eval_model = model if (eval_model is None or
                                 use_memory_efficient_trainer) else eval_model
    self._use_memory_efficient_trainer = use_memory_efficient_trainer
    self._checkpoint_at, self._permanent_checkpoint_at, self._eval_at = (
        loop_schedules.defaults(
            self._tasks[0], checkpoint_at, permanent_checkpoint_at,
            never if eval_tasks is None else eval_at))
    self._log_at = loop_schedules.at_step_1_and_every_nth_step(
        self._options.log_every)
    self._checkpoint_low_metric, self._checkpoint_high_metric = (
        checkpoint_low_metric, checkpoint_high_metric)
    self._which_task = which_task or (lambda n: n % len(self._tasks))
    self._history, self._loss_sums = (trax_history.History(),
                                      loop_steps.LossSums())
    self._pending = loop_steps.PendingLosses(
        [t.loss_layer.name for t in self._tasks], self._loss_sums,
        self._last_checkpoint_note)
    self._input_signature = devices.global_signature(shapes.signature(tuple(
        self._tasks[0].sample_batch)))[:model.n_in]
    self._train_state, self._step_fns = train_step_lib.init_state(
        self._model, self._eval_model, self._tasks, self._parallel, rng,
        loss_chunk_size, adasum)
    self._bar = self._progress_bar(0, enabled=False)
    sharding.report_bytes(self._parallel, self._train_state, self._log)
    self._checkers, self._evaluators = loop_steps.checkers_and_evaluators(
        self._model, self._eval_model, self._tasks, self._eval_tasks,
        self._parallel, self._options.check_batches)
    self._rjust_len = _name_width(self._tasks, self._eval_tasks)  # Aligns logs.
    self._callbacks = [c(self) for c in (callbacks or [])]
    self._run_dir = run_dir.RunDir(output_dir, self._is_chief)
    self._resume_or_start()  # Run files are written only after this succeeds.
    if self._is_chief:  # model.json: what `retrax.load_run` rebuilds.
      registry.write_model_file(self.output_dir, self._model)
      options = self._options
      self._run_dir.reporters = reporters.make(
          options.report_to, self.output_dir, config=options.report_config)

  # --- properties (Trax's, and the training state) ------------------------------------

  @property
  def step(self) -> int:
    """The number of training steps run so far."""
    return self._train_state.step

  @property
  def history(self) -> trax_history.History:
    return self._history

  @property
  def n_devices(self) -> int:
    return self._n_devices

  @property
  def is_chief(self) -> bool:
    return self._is_chief

  @property
  def model(self) -> base.Layer:
    """The model being trained (its weights are current between `run` calls)."""
    return self._model

  @property
  def tasks(self) -> list[TrainTask]:
    return self._tasks

  @property
  def eval_model(self) -> base.Layer:
    return self._eval_model

  @property
  def eval_tasks(self) -> list[EvalTask]:
    return self._eval_tasks

  @property
  def output_dir(self) -> Optional[str]:
    return self._run_dir.path

  @property
  def train_state(self) -> TrainState:
    """The current `TrainState` (replicated device arrays; a training step
    donates them, so read them before the next `run`/`train_step`)."""
    return self._train_state

  @property
  def slots(self) -> Any:
    """Optimizer slots of the first task (replicated device arrays)."""
    return self._train_state.tasks[0].slots

  @property
  def options(self) -> LoopOptions:
    """retrax's options of this loop (see `LoopOptions`)."""
    return self._options

  def new_rng(self) -> jax.Array:
    """Returns a new single-use PRNG key (splitting the loop's key)."""
    self._train_state, rng = train_step_lib.new_rng(self._train_state)
    return rng

  def update_weights_and_state(self, weights: Any = None,
                               state: Any = None) -> None:
    """Replaces the trained model's weights and/or state."""
    if weights is not None:
      self._model.weights = weights
      # As the step takes them: Trax's per-layer tree in, stacked blocks out.
      self._train_state = self._train_state._replace(
          weights=self._parallel.place_weights(self._model.stacked_weights))
    if state is not None:
      self._model.state = state
      self._train_state = self._train_state._replace(
          state=self._parallel.replicate(state))

  def _sync_model(self):
    """Puts the current weights and state into the model objects."""
    self._model.weights = self._train_state.weights
    self._model.state = self._train_state.state
    if self._eval_model is not self._model:
      self._eval_model.weights = self._train_state.weights
      self._eval_model.state = self._train_state.eval_state

  def _progress_bar(self, n_steps, enabled=None):
    """The progress bar of `run(n_steps)` (see `progress.Progress`)."""
    if enabled is None:
      enabled = self._options.progress_bar
    return progress.Progress(n_steps, enabled=enabled if self._is_chief
                             else False, initial=self.step)

  # --- Trax's underscore methods, for subclasses that rewrite `run` ------------
  #
  # As trax/examples/earlystopping.ipynb does:
  #
  #   with self._open_summary_writers() as (train_writers, eval_writers):
  #     for _ in range(n_steps):
  #       self._step += 1
  #       loss, optimizer_metrics = self._run_one_step(task_index, task_changed)
  #       if self._eval_at(self.step):
  #         self._log_training_progress(
  #             task=..., total_loss=..., n_steps=..., elapsed_time=...,
  #             optimizer_metrics=..., summary_writer=train_writers[task_index])
  #         self.run_evals(eval_writers)
  #
  # Same names, signatures and results as Trax's, built on retrax's step, logs
  # and writers; `run` shares the progress log (`_log_progress`).

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

  # --- training -------------------------------------------------------------------

  def run(self, n_steps: int = 1) -> None:
    """Runs `n_steps` training steps, with evals and checkpoints as configured.

    The last step is checkpointed at the end (if `output_dir` is set), even
    when it is not a checkpoint step.

    Raises:
      BadBatchError: a batch does not fit the model (nothing more is saved).
      NonFiniteLossError: the loss, the learning rate or the weights became
        NaN/inf (nothing more is saved).
      interrupts.Interrupted / Terminated: Ctrl-C / SIGTERM stopped the run
        after the step in progress, which is saved (see `interrupts`).
    """
    self._run_dir.open_writers()
    self._bar = self._progress_bar(n_steps)
    start_time = time.time()
    stop = interrupts.StopOnSignal(self._last_checkpoint_note).install()
    try:
      for _ in range(n_steps):
        if stop.agreed():  # Every process alike, before the same step.
          break
        prev_task_index = self._which_task(self.step)
        self._advance()
        task_index = self._which_task(self.step)
        if task_index != prev_task_index:
          self._loss_sums.reset(task_index)
        self._call_callbacks('on_step_begin')
        batch = self._tasks[task_index].next_batch()
        self._train_on_batch(task_index, batch)
        self._call_callbacks('on_step_end')
        # Evals come before the checkpoint of the same step (Trax saves first),
        # so a resumed run has the step's eval results and eval stream
        # position, exactly as an uninterrupted run.
        if self._eval_at(self.step):
          self._log_progress(task_index, time.time() - start_time)
          self.run_evals()
          start_time = time.time()
        elif self._log_at(self.step):
          self._log_progress(task_index, time.time() - start_time,
                             stdout=False)
          start_time = time.time()
        self._save_scheduled_checkpoints()
      else:  # A signal during the last step: every process reports it.
        stop.agreed()
      self._pending.check()
      if self._last_rolling_step != self.step:
        # The final step is always saved as the newest checkpoint (also when
        # it is only a permanent one's step), so model.pkl.gz holds it too.
        self._save_newest()
    finally:
      stop.restore()
      self._bar.close()
      self._bar = self._progress_bar(0, enabled=False)
      self._run_dir.close_writers()
    self._sync_model()
    stop.raise_if_requested(self)

  def close_reporters(self) -> None:
    """Ends the W&B / MLflow runs of `report_to` (else ended at exit)."""
    self._run_dir.close_reporters()

  def train_step(self, batch: Sequence[Any], task_index: int = 0) -> None:
    """Runs one training step of task `task_index` on `batch`: no evals,
    checkpoints or callbacks (the legacy `Trainer`'s step).

    Its loss is checked (NaN/inf raises `NonFiniteLossError`) at the next
    step, save or log.
    """
    self._advance()
    self._train_on_batch(task_index, batch)

  def _advance(self):
    self._train_state = self._train_state._replace(step=self.step + 1)

  def _save_scheduled_checkpoints(self):
    """Saves what this step's schedules ask for, with Trax's names (one
    positional argument: `save_checkpoint` is a hook)."""
    at_checkpoint = self._checkpoint_at(self.step)
    if at_checkpoint:
      self._save_newest()
    if self._permanent_checkpoint_at(self.step):
      self.save_checkpoint(f'{run_layout.TRAX_BASENAME}_{self.step}')
    if at_checkpoint:
      if self._checkpoint_low_metric is not None and self._at_lowest():
        self.save_checkpoint(f'lowest_{self._checkpoint_low_metric}')
      if self._checkpoint_high_metric is not None and self._at_highest():
        self.save_checkpoint(f'highest_{self._checkpoint_high_metric}')

  def _save_newest(self):
    """The `save_checkpoint('model')` hook; the step counts as saved (once)."""
    self.save_checkpoint(run_layout.TRAX_BASENAME)
    self._last_rolling_step = self.step

  def _call_callbacks(self, hook):
    active = [c for c in self._callbacks if c.call_at(self.step)]
    if active:
      self._pending.check()
      self._sync_model()
    for c in active:
      getattr(c, hook)(self.step)

  def _opt_step(self):
    return self.step + self._options.opt_step_offset

  def _last_checkpoint_note(self):
    return self._run_dir.checkpoint_note(self._last_saved_step)

  def _train_on_batch(self, task_index, batch):
    """One optimizer step of task `task_index` on `batch` (see `train_step`);
    its loss is checked a step later.

    Returns:
      The step's `(loss, stats)` (device values).
    """
    self._train_state, loss, stats = train_step_lib.train_step(
        self._step_fns[task_index], self._train_state, task_index, batch,
        task=self._tasks[task_index], checker=self._checkers[task_index],
        opt_step=self._opt_step(), note=self._last_checkpoint_note)
    self._pending.push(self.step, task_index, loss, stats)
    self._pending.check(keep=1)  # The previous step's: one stays queued.
    self._bar.update(batch, self._pending.last_loss)
    return loss, stats

  # --- evals -------------------------------------------------------------------

  def evaluate_task(self, index: int,
                    n_batches: Optional[int] = None) -> dict[str, float]:
    """Averages the metrics of eval task `index` over its batches; returns a dict."""
    return self._evaluators[index].evaluate(
        self._train_state.weights, self._train_state.state, self.new_rng,
        self.step, n_batches)

  def run_evals(self, summary_writers: Optional[
      Sequence[Optional[metrics_log.EventWriter]]] = None) -> None:
    """Runs every eval task and records its metrics (history, logs, files)."""
    # As in Trax the eval model takes the training model's state (a copy: the
    # next training step donates the training state's buffers).
    self._train_state = self._train_state._replace(eval_state=(
        jax.tree_util.tree_map(jnp.copy, self._train_state.state)))
    for index in range(len(self._eval_tasks)):
      writer = (summary_writers[index] if summary_writers is not None else
                self._run_dir.writer('eval', index, self._eval_tasks))
      self.log_summary(self.evaluate_task(index), writer, 'metrics/', 'eval')

  def n_weights(self) -> int:
    """Total number of trainable weight values of the model."""
    return int(sum(np.size(x) for x in fastmath.tree_leaves(
        self._train_state.weights)))

  # --- logs -------------------------------------------------------------------

  def _log(self, message, stdout=True):
    _log.info(message)
    if stdout and self._is_chief:
      self._bar.write(message)

  def log_step(self, message: str, stdout: bool = True) -> None:
    """Logs `Step <n>: <message>` (and prints it, unless `stdout=False`)."""
    self._log(f'Step {self.step:6d}: {message}', stdout=stdout)

  def log_summary(self, values: Mapping[str, Any],
                  summary_writer: Optional[metrics_log.EventWriter],
                  value_prefix: str, log_prefix: str, stdout: bool = True,
                  rjust_len: Optional[int] = None) -> None:
    """Logs scalar `{name: value}`s to stdout, history, metrics.jsonl and
    TensorBoard (other values are skipped)."""
    rjust_len = self._rjust_len if rjust_len is None else rjust_len
    for name, value in values.items():
      if not np.shape(value):  # Scalars only: the history goes in checkpoints.
        self.log_step(f'{log_prefix.ljust(5)} {name.rjust(rjust_len)} '
                      f'| {float(value): .8f}', stdout=stdout)
        self._run_dir.record(summary_writer, self.step, log_prefix,
                             value_prefix + name, value)
        self._history.append(log_prefix, value_prefix + name, self.step, value)
    self._run_dir.flush(summary_writer)

  # --- checkpoints -------------------------------------------------------------

  def save_checkpoint(self, basename: Optional[str] = None,
                      permanent: bool = False) -> Optional[str]:
    """Saves the complete training state; a hook subclasses may override.

    `run` calls it as Trax's `Loop.run` does, with one positional name:
    'model' at `checkpoint_at` steps (the rolling `ckpt_<step>`),
    'model_<step>' at `permanent_checkpoint_at` steps (the permanent
    `model_<step>`) and 'lowest_<metric>' / 'highest_<metric>' for the best
    ones. Each is a native checkpoint directory; unless the loop was built
    with `LoopOptions(write_trax_files=False)`, Trax's files are written
    beside it (`model.pkl.gz`, `model_<step>.pkl.gz`, `<basename>.pkl.gz`).

    Args:
      basename: a name under `output_dir` (an existing one is replaced
        atomically); None (or 'model') saves a rolling checkpoint and keeps
        the newest `keep_checkpoints` of those.
      permanent: with `basename=None`, save the never-deleted `model_<step>`.

    Returns:
      The checkpoint's path, or None when there is no `output_dir` or this
      host is not the chief.
    """
    step = self.step
    if basename == run_layout.TRAX_BASENAME:
      basename = None
    elif basename == f'{run_layout.TRAX_BASENAME}_{step}':
      basename, permanent = None, True
    split = self.output_dir is not None and sharding.split_over_processes(
        self._train_state)
    path = (self._save_split if split else self._save_whole)(basename,
                                                             permanent)
    if path is None:
      return None
    if basename is None and not permanent:
      self._last_rolling_step = step
    self._last_saved_step = step
    self.log_step(f'Saved checkpoint {path}', stdout=False)
    return path

  def _save_whole(self, basename, permanent):
    """`save_checkpoint` of a state fetched whole to the host (the chief's
    path; None elsewhere)."""
    host_state = self._host_state()  # Never saves weights after a NaN loss.
    if host_state is None:
      return None
    options = self._options
    return checkpointing.save_in_dir(
        self.output_dir, host_state, basename, permanent,
        keep=options.keep_checkpoints,
        write_trax_files=options.write_trax_files, report=self._log,
        input_signature=self._input_signature, history=self._history,
        batches=self._batch_counts(), kind=options.checkpoint_kind,
        loss_sums=self._loss_sums.to_dict())

  def _save_split(self, basename, permanent):
    """`save_checkpoint` of a state split over processes: every process
    writes the pieces it holds, none gathers a whole array (the chief's
    path; None elsewhere)."""
    self._pending.check()  # Next: collectives that every process joins.
    writes = self._run_dir.writes
    if (writes and self._options.write_trax_files and
        not self._said_no_trax_files):
      self._said_no_trax_files = True
      self._log("Trax's model.pkl.gz files are not written: the weights and "
                'slots are split over processes and no host gathers them '
                '(export_trax_checkpoint gathers them on request).',
                stdout=False)
    # Its token, checks and barriers are collectives: a peer lost in
    # them is one line (the save is not committed; the last one stands).
    with peers.guard(self._last_checkpoint_note):
      path = checkpointing.save_split_in_dir(
          self.output_dir, sharding.local_shards(self._train_state), basename,
          permanent, keep=self._options.keep_checkpoints,
          process_index=jax.process_index(),
          process_count=jax.process_count(), token=sharding.shared_token(),
          gather_ints=sharding.gather_ints,
          last_saved_step=self._last_saved_step, report=self._log,
          input_signature=self._input_signature, history=self._history,
          batches=self._batch_counts(), kind=self._options.checkpoint_kind,
          loss_sums=self._loss_sums.to_dict())
    return path if writes else None

  def export_trax_checkpoint(self, basename: str = 'model') -> Optional[str]:
    """Writes Trax's `Loop` checkpoint files (`<basename>.pkl.gz` ...).

    Trax 1.4 and `Layer.init_from_file` read them; they hold weights, state,
    optimizer slots, step and history (not the data position or PRNG key).

    Returns:
      The `.pkl.gz` path, or None without `output_dir` / on non-chief hosts.
    """
    host_state = self._host_state()
    return None if host_state is None else self._save_trax_files(basename,
                                                                 host_state)

  def _host_state(self):
    """The state fetched to the host (once per save) and checked finite, or
    None where this host writes nothing."""
    self._pending.check()  # Next: a collective where weights span processes.
    with peers.guard(self._last_checkpoint_note):  # A gather, maybe.
      host_state = sharding.to_host(self._train_state, self._run_dir.writes)
    if host_state is None:
      return None
    checkpointing.check_finite(host_state, self._last_saved_step)
    return host_state

  def _batch_counts(self):
    return {'train': [t.n_batches for t in self._tasks],
            'eval': [t.n_batches for t in self._eval_tasks]}

  def _save_trax_files(self, basename, host_state):
    output_dir = self.output_dir
    assert output_dir is not None  # Called only where this host writes.
    return checkpointing.save_trax_state(
        os.path.join(output_dir, basename), host_state, self._history,
        self._input_signature)

  def load_checkpoint(self, directory: Union[str, os.PathLike, None] = None,
                      filename: Optional[str] = None) -> Optional[str]:
    """Restores the training state from a checkpoint.

    Args:
      directory: where to look (default `output_dir`).
      filename: a checkpoint name in `directory` (a native checkpoint
        directory, or a Trax `<name>.pkl.gz`). None takes the newest native
        checkpoint whose checksums verify (a damaged newer one is reported and
        skipped), else Trax's `model.pkl.gz` if present.
        Checkpoints are ordered by the step recorded inside them.

    Returns:
      The path loaded, or None if there was nothing to load.

    Raises:
      CheckpointError: the named checkpoint is damaged; with `filename=None`,
        checkpoints exist but none is usable (each is named in the message).
      CheckpointNotFoundError (a FileNotFoundError): the named checkpoint
        does not exist.
    """
    directory = directory or self.output_dir
    if directory is None:
      return None
    directory = os.path.expanduser(
        local_paths.check_local(os.fspath(directory), 'load_checkpoint'))
    restored = checkpointing.load_state(directory, filename,
                                        self._train_state, report=self._log)
    if restored is None:
      return None
    self._train_state = train_step_lib.replicate(self._parallel,
                                                 restored.state)
    native = restored.kind == 'native'
    if native:
      self._run_dir.adopt_legacy_metrics(restored.path)
    self._restore_position(restored)
    if native and self._options.write_trax_files and self._run_dir.writes and (
        self._run_dir.holds(restored.path)):
      self._repair_trax_files()
    self.log_step(
        f'Resumed from checkpoint {restored.path}' if native else
        f'Loaded Trax checkpoint {restored.path} (weights, state, slots and '
        'history; data streams and random keys start afresh)')
    return restored.path

  def _repair_trax_files(self):
    """Rewrites Trax's files of the resumed step where a kill came between
    the native save and theirs."""
    if sharding.split_over_processes(self._train_state):
      return  # Such runs write no Trax files (see `_save_split`).
    stale = checkpointing.stale_trax_names(self.output_dir, self.step)
    host_state = placement.to_host(self._train_state) if stale else None
    for name in stale:
      self._save_trax_files(name, host_state)
      self.log_step(f'Rewrote Trax files {name}.* of the resumed step '
                    '(their save had been interrupted)', stdout=False)

  def _restore_position(self, restored):
    """After a restore: history and sums set, consumed batches skipped, the
    run's logs cut back to the step."""
    step = self.step
    self._history = trax_history.History.from_dict(restored.history)
    self._pending.clear()
    self._loss_sums.load(restored.loss_sums)
    self._last_saved_step = step
    self._last_rolling_step = step
    checkpointing.skip_consumed_batches(
        {'train': self._tasks, 'eval': self._eval_tasks}, restored.batches,
        self._log)
    self._run_dir.truncate(step)
    self._sync_model()

  def _resume_or_start(self):
    """Resumes from `output_dir` if it holds a checkpoint, else starts afresh;
    either way cuts the run's own logs back to the step and removes temporary
    files that killed writes left."""
    if self.output_dir is None:
      return
    self._run_dir.remove_orphans()
    if self.load_checkpoint() is None:
      self._run_dir.truncate(0)  # A fresh run: drop logs of an unsaved one.


def _task_lists(tasks, eval_tasks
                ) -> tuple[list[TrainTask], list[EvalTask]]:
  """`(tasks, eval_tasks)` as lists: each given as one task, a list or tuple
  of them (eval tasks also None)."""
  def as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]
  tasks = as_list(tasks)
  if not tasks:
    raise ArgumentValueError('Must provide at least one training task.')
  return tasks, [] if eval_tasks is None else as_list(eval_tasks)


def _name_width(tasks, eval_tasks):
  """The longest loss or metric name of the tasks."""
  return max(map(len, [t.loss_name for t in tasks] + [
      n for t in eval_tasks for n in t.metric_names]))


def _check_options(options):
  """`options`, or the defaults for None; anything else is one clear line."""
  if options is None:
    return LoopOptions()
  if not isinstance(options, LoopOptions):
    raise ArgumentTypeError(
        f'Loop: options must be a LoopOptions (or None); got {options!r} '
        f'({type(options).__name__}).')
  return options
