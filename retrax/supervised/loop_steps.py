"""What `Loop` runs around each training step: batch checks, loss checks, evals.

* `batch_checker(model, sample_batch, parallel, name)`: the host-side check
  of a task's batches against the model (shapes, dtypes, id ranges).
* `PendingLosses`: the losses of steps still running on the device, read and
  checked in order (a NaN/inf stops training) and summed into `LossSums`.
* `LossSums`: the checked losses and optimizer stats since the last log,
  saved in checkpoints so that a resumed run logs the same means.
* `Evaluator`: one eval task's jitted metrics step (`EvalStep`), averaged
  over batches.

The training step itself is `train_step`.
"""

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np

from retrax import shapes
from retrax.fastmath import xla_cpu
from retrax.layers import combinators
from retrax.layers import tutorial_checks
from retrax.supervised import batch_checks
from retrax.supervised import devices
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


class LossSums:
  """Sums of the checked losses and optimizer stats since the last log."""

  def __init__(self):
    self.reset(None)

  def reset(self, task_index):
    self.task_index, self.n_steps, self.loss = task_index, 0, 0.0
    self.stats = collections.defaultdict(float)
    self._unread = []  # Device stats, fetched in batches to avoid syncs.

  def add(self, task_index, loss, stats):
    if task_index != self.task_index:
      self.reset(task_index)
    self.n_steps += 1
    self.loss += loss
    self._unread.append(stats)
    if len(self._unread) >= 256:
      self._fold()

  def _fold(self):
    for step_stats in jax.device_get(self._unread):
      for name, value in step_stats.items():  # 'loss' too: training/loss.
        self.stats[name] += float(value)
    self._unread = []

  def to_dict(self):
    """The sums as JSON-able values (floats round-trip exactly)."""
    self._fold()
    return {'task_index': self.task_index, 'n_steps': self.n_steps,
            'loss': self.loss, 'stats': dict(self.stats)}

  def load(self, d):
    """Restores sums saved by `to_dict` (None: empty sums)."""
    self.reset(None if d is None else d['task_index'])
    if d is not None:
      self.n_steps, self.loss = int(d['n_steps']), float(d['loss'])
      self.stats.update({k: float(v) for k, v in d['stats'].items()})

  def means(self):
    """`(n_steps, mean loss, {stat: mean})`; then starts a new period."""
    self._fold()
    n = max(1, self.n_steps)
    out = (n, self.loss / n, {k: v / n for k, v in self.stats.items()})
    self.reset(self.task_index)
    return out


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
    self._step_fn = EvalStep(model_with_metrics, parallel)
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


class EvalStep:
  """The jitted metrics step: `(weights, state, batch, rng) -> metric values`.

  `weights`/`state` are those of `Serial(eval_model, Branch(*metrics))`; the
  result is a float32 vector with one value per metric layer.
  """

  def __init__(self, model_with_metrics, parallel):
    self._model = model_with_metrics
    rep, shard = parallel.replicated, parallel.batch
    # The weights keep the sharding they come with (FSDP or replicated).
    self._jitted = xla_cpu.jit(self._eval, in_shardings=(None, rep, shard, rep),
                               out_shardings=rep)

  def _eval(self, weights, state, batch, rng):
    outputs, _ = self._model.pure_fn(batch, weights, state, rng)
    if not isinstance(outputs, (tuple, list)):
      outputs = (outputs,)
    return jnp.stack([jnp.asarray(o, jnp.float32).reshape(()) for o in outputs])

  def __call__(self, weights, state, batch, rng):
    return self._jitted(weights, state, tuple(batch), rng)
