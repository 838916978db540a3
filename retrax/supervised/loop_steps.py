"""What `Loop` runs around each jitted step: batch checks, loss checks, evals.

* `batch_checker(model, sample_batch, parallel, name)`: the host-side check
  of a task's batches against the model (shapes, dtypes, id ranges).
* `PendingLosses`: the losses of steps still running on the device, read and
  checked in order (a NaN/inf stops training) and summed into `LossSums`.
* `Evaluator`: one eval task's jitted metrics step, averaged over batches.
"""

import collections
import math

import numpy as np

from retrax import shapes
from retrax.layers import combinators
from retrax.layers import tutorial_checks
from retrax.supervised import batch_checks
from retrax.supervised import checkpointing
from retrax.supervised import devices
from retrax.supervised import engine
from retrax.supervised import peers
from retrax.supervised.batch_checks import NonFiniteLossError


def batch_checker(model, sample_batch, parallel, name):
  """A `BatchChecker` of batches like `sample_batch` for `model`."""
  signature = shapes.signature(tuple(sample_batch))
  vocab = None
  if np.dtype(signature[0].dtype).kind in 'iu':
    vocab = batch_checks.find_embedding_vocab(model)
  n_classes = None
  if len(signature) > model.n_in:
    out = model.output_signature(  # Sized for the global batch, as the model.
        devices.global_signature(signature)[:model.n_in])
    targets = signature[model.n_in]
    if (not isinstance(out, (tuple, list)) and np.dtype(
        targets.dtype).kind in 'iu' and len(out.shape) == len(
            targets.shape) + 1):
      n_classes = out.shape[-1]
  return batch_checks.BatchChecker(signature, model.n_in, vocab, n_classes,
                                   parallel, name)


def checkers_and_evaluators(model, eval_model, tasks, eval_tasks, parallel,
                            check_batches=True):
  """`([BatchChecker or None per task], [Evaluator per eval task])`."""
  def checker(sample_batch, name):
    return (batch_checker(model, sample_batch, parallel, name)
            if check_batches else None)
  checkers = [
      checker(t.sample_batch, 'training' if len(tasks) == 1 else f'task {i}')
      for i, t in enumerate(tasks)]
  eval_checkers = [checker(t.sample_batch, f'eval task {i}')
                   for i, t in enumerate(eval_tasks)]
  return checkers, [Evaluator(eval_model, t, parallel, c)
                    for t, c in zip(eval_tasks, eval_checkers)]


def checkpoint_note(last_saved_step, run_dir):
  """Which checkpoint is the run's last, for error messages. A process that
  writes nothing (not the chief) looks for the chief's in the run directory."""
  if last_saved_step is not None:
    return f'the last checkpoint is from step {last_saved_step}'
  if run_dir.path is not None and not run_dir.writes:
    path = checkpointing.find_latest_valid(run_dir.path)
    if path is not None:
      return f'the last checkpoint is {path}'
  return 'no checkpoint was saved'


def step_opt_params(task, task_index, opt_params, opt_step, step,
                    last_checkpoint_note):
  """The optimizer hyperparameters of a step: `opt_params` with the task's
  scheduled learning rate at `opt_step` (if it has a schedule).

  Raises:
    NonFiniteLossError: the scheduled learning rate is NaN/inf.
  """
  opt_params = dict(opt_params)
  lr = task.learning_rate(opt_step)
  if lr is not None and not math.isfinite(float(lr)):
    raise NonFiniteLossError(
        f'Step {step}: the learning rate of task {task_index} is {lr}. '
        f'Training stopped before the step ({last_checkpoint_note()}); '
        'check the learning rate and lr_schedule.')
  if lr is not None:
    opt_params['learning_rate'] = np.asarray(
        lr, np.asarray(opt_params['learning_rate']).dtype)
  return opt_params


class PendingLosses:
  """Losses of queued steps, checked in order (NaN/inf raises).

  Reading a loss waits for its step, so `check(keep=1)` after each step keeps
  one step queued on the device while Python prepares the next.

  Args:
    loss_names: each training task's loss layer name (for messages).
    loss_sums: the `LossSums` the checked losses are added to.
    last_checkpoint_note: `() -> str` saying which checkpoint is the last.
  """

  def __init__(self, loss_names, loss_sums, last_checkpoint_note):
    # (step, task, loss, stats) unchecked
    self._queue: collections.deque = collections.deque()
    self._loss_names = loss_names
    self._sums = loss_sums
    self._note = last_checkpoint_note
    self.last_loss = None

  def push(self, step, task_index, loss, stats):
    self._queue.append((step, task_index, loss, stats))

  def clear(self):
    self._queue.clear()

  def check(self, keep=0):
    """Checks the losses of all but the `keep` newest queued steps."""
    while len(self._queue) > keep:
      step, task_index, loss, stats = self._queue.popleft()
      with peers.guard(self._note):  # A dead peer fails the step's collective.
        value = float(loss)
      self._check(step, task_index, value)
      self.last_loss = value
      self._sums.add(task_index, value, stats)

  def _check(self, step, task_index, value):
    tutorial_checks.raise_pending()
    tutorial_checks.check_loss_value(self._loss_names[task_index], value)
    if not math.isfinite(value):
      raise NonFiniteLossError(
          f'Step {step}: the training loss of task {task_index} is {value}. '
          f'Training stopped and saved nothing after it ({self._note()}). '
          'Lower the learning rate, clip gradients (clip_grad_norm=) or '
          'check the data.')


class Evaluator:
  """The jitted metrics step of `eval_task` on `Serial(eval_model, metrics)`.

  Args:
    eval_model: the (initialized) eval model; its weights are passed in.
    eval_task: the `EvalTask`.
    parallel: the loop's `devices.DataParallel`.
    checker: a `BatchChecker` of the task's batches, or None.
  """

  def __init__(self, eval_model, eval_task, parallel, checker):
    ends = combinators.Branch(*eval_task.metrics)
    ends.init(eval_model.output_signature(devices.global_signature(
        shapes.signature(tuple(eval_task.sample_batch)))))
    model_with_metrics = combinators.Serial(eval_model, ends)
    self._step_fn = engine.EvalStep(model_with_metrics, parallel)
    self._metric_weights = parallel.replicate(model_with_metrics.stacked_weights[1])
    self._metric_state = parallel.replicate(model_with_metrics.state[1])
    self._task, self._parallel, self._checker = eval_task, parallel, checker

  def evaluate(self, weights, state, new_rng, step, n_batches=None):
    """`{metric name: mean}` over `n_batches` (default the task's) batches.

    Args:
      weights, state: the eval model's (replicated) weights and state.
      new_rng: `() -> PRNG key`, called once per batch.
      step: the training step (for batch-check messages).
      n_batches: how many batches.
    """
    task = self._task
    n_batches = task.n_eval_batches if n_batches is None else n_batches
    sums = np.zeros((len(task.metrics),))
    for _ in range(n_batches):
      rng = new_rng()
      batch = task.next_batch()
      if self._checker is not None:
        self._checker.check(batch, step)
      with peers.guard():
        sums += np.asarray(self._step_fn(
            (weights, self._metric_weights), (state, self._metric_state),
            self._parallel.put_batch(batch), rng))
    averages = sums / max(n_batches, 1)
    return dict(zip(task.metric_names, averages.tolist()))
