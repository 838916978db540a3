"""Supervised training: `TrainTask`, `EvalTask` and `Loop` (Trax's API).

    loop = training.Loop(model, [train_task], eval_tasks=[eval_task],
                         output_dir='~/run')
    loop.run(1000)

The loop initializes the model from the first task's sample batch, runs the
jitted step of `engine.TrainStep` (donated buffers, data parallel over the
local devices), evaluates and checkpoints at step 1 and every
`n_steps_per_checkpoint` steps, writes `metrics.jsonl` and TensorBoard event
files, and resumes by itself from the newest valid checkpoint in
`output_dir`, continuing with the same losses as an uninterrupted run (see
`checkpointing` for what that needs of the data streams).
"""

import collections
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from retrax import fastmath
from retrax import run as run_lib
from retrax import shapes
from retrax.layers import base
from retrax.layers import combinators
from retrax.layers import tutorial_checks
from retrax.supervised import batch_checks
from retrax.supervised import checkpointing
from retrax.supervised import devices
from retrax.supervised import engine
from retrax.supervised import history as trax_history
from retrax.supervised import loop_io
from retrax.supervised.batch_checks import BadBatchError
from retrax.supervised.batch_checks import NonFiniteLossError
from retrax.supervised.devices import init_host_and_devices
from retrax.supervised.tasks import EvalTask
from retrax.supervised.tasks import TrainTask

__all__ = ['EvalTask', 'Loop', 'TrainTask', 'init_host_and_devices',
           'BadBatchError', 'NonFiniteLossError']



# One dispatch per new key (splitting, then unpacking on the host, takes three).
_split_key = jax.jit(lambda key: tuple(jax.random.split(key)))


def _never(*args):
  del args
  return False


def _at_step_1_and_every_nth_step(period):
  """True at step 1 and at every multiple of `period` (never if None)."""
  if period is None:
    return _never
  return lambda step: step == 1 or (step > 0 and step % period == 0)


def _is_empty(x):
  if isinstance(x, (list, tuple)):
    return all(_is_empty(y) for y in x)
  return x is None


def _is_uninitialized(model):
  if not _is_empty(model.weights):
    return False
  return all(_is_uninitialized(l) for l in model.sublayers)


def _model_with_ends(model, end_layers, batch_signature):
  """`Serial(model, Branch(*end_layers))`, ends initialized on the model's output."""
  ends = combinators.Branch(*end_layers)
  ends.init(model.output_signature(batch_signature))
  return combinators.Serial(model, ends)


class _Accumulator:
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
    """Restores sums saved by `to_dict`."""
    self.reset(d['task_index'])
    self.n_steps, self.loss = int(d['n_steps']), float(d['loss'])
    self.stats.update({k: float(v) for k, v in d['stats'].items()})

  def means(self):
    """`(n_steps, mean loss, {stat: mean})`; then starts a new period."""
    self._fold()
    n = max(1, self.n_steps)
    out = (n, self.loss / n, {k: v / n for k, v in self.stats.items()})
    self.reset(self.task_index)
    return out


class _TaskState:
  """What the loop keeps per training task: its step function and arrays."""

  def __init__(self, task, step_fn, loss_weights, loss_state, slots, opt_params):
    self.task = task
    self.step_fn = step_fn
    self.loss_weights = loss_weights
    self.loss_state = loss_state
    self.slots = slots
    self.opt_params = opt_params


class Loop(loop_io.LoopIO):
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
    loss_chunk_size: if > 0, final dense + loss in chunks (see `engine`).
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

  Args (retrax's, keyword-only):
    keep_checkpoints: rolling checkpoints kept (permanent ones never deleted).
    progress_bar: True/False, or None for a bar on terminals for long runs.
    check_batches: check each batch on the host (shapes, dtypes, id ranges).
    write_trax_files: also write Trax's checkpoint files at each checkpoint.
  """

  def __init__(self, model, tasks, eval_model=None, eval_tasks=None,
               output_dir=None, checkpoint_at=None, checkpoint_low_metric=None,
               checkpoint_high_metric=None, permanent_checkpoint_at=None,
               eval_at=None, which_task=None, n_devices=None, random_seed=None,
               loss_chunk_size=0, use_memory_efficient_trainer=False,
               adasum=False, callbacks=None, *, keep_checkpoints=3,
               progress_bar=None, check_batches=True, write_trax_files=True,
               _opt_step_offset=0):
    self._is_chief, self._n_hosts, self._n_devices, self._rng = (
        init_host_and_devices(n_devices, random_seed))
    self._parallel = devices.DataParallel(self._n_devices)
    tasks = list(tasks) if isinstance(tasks, (list, tuple)) else [tasks]
    if not tasks:
      raise ValueError('Must provide at least one training task.')
    if eval_tasks is None:
      eval_tasks, eval_at = [], _never
    elif not isinstance(eval_tasks, (list, tuple)):
      eval_tasks = [eval_tasks]
    self._tasks, self._eval_tasks = tasks, list(eval_tasks)
    self._model = model
    self._eval_model = model if (eval_model is None or
                                 use_memory_efficient_trainer) else eval_model
    self._opt_step_offset = _opt_step_offset
    self._checkpoint_kind = 'Loop'
    default_at = _at_step_1_and_every_nth_step(tasks[0].n_steps_per_checkpoint)
    self._checkpoint_at = checkpoint_at or default_at
    self._permanent_checkpoint_at = (
        permanent_checkpoint_at or _at_step_1_and_every_nth_step(
            tasks[0].n_steps_per_permanent_checkpoint))
    self._eval_at = eval_at or default_at
    self._checkpoint_low_metric = checkpoint_low_metric
    self._checkpoint_high_metric = checkpoint_high_metric
    self._which_task = which_task or (lambda n: n % len(tasks))
    self._keep_checkpoints = keep_checkpoints
    self._write_trax_files = write_trax_files
    self._progress_bar_setting = progress_bar
    self._step = 0
    self._history = trax_history.History()
    self._pending = collections.deque()  # (step, task, loss, stats) unchecked
    self._acc = _Accumulator()
    self._last_loss = None
    self._last_saved_step = None
    self._last_rolling_step = None  # Of the newest ckpt_<step> / model.pkl.gz.
    self._bar = loop_io.make_progress_bar(self, 0, enabled=False)

    # Initialization, in Trax's order of PRNG use.
    self._batch_signature = shapes.signature(tuple(tasks[0].sample_batch))
    self._model.rng = self.new_rng()
    if _is_uninitialized(self._model):
      self._model.init(self._batch_signature)
    self._eval_model.rng = self.new_rng()
    if _is_uninitialized(self._eval_model):
      self._eval_model.init(self._batch_signature)
    self._input_signature = self._batch_signature[:self._model.n_in]
    replicate = self._parallel.replicate
    self._weights = replicate(self._model.weights)
    self._state = replicate(self._model.state)
    self._eval_state = replicate(self._eval_model.state)
    self._task_states = [self._init_task(t, loss_chunk_size, adasum)
                         for t in tasks]
    self._checkers = [
        self._batch_checker(t.sample_batch, 'training' if len(tasks) == 1
                            else f'task {i}') if check_batches else None
        for i, t in enumerate(tasks)]
    self._eval_checkers = [
        self._batch_checker(t.sample_batch, f'eval task {i}')
        if check_batches else None for i, t in enumerate(self._eval_tasks)]
    self._evaluators = [self._init_evaluator(t) for t in self._eval_tasks]
    self._rjust_len = max(map(len, [t.loss_name for t in tasks] + [
        n for t in self._eval_tasks for n in t.metric_names]))
    self._callbacks = [c(self) for c in (callbacks or [])]
    self._open_output_dir(output_dir)
    self._resume_or_start()  # Run files are written only after this succeeds.
    if self._is_chief:  # model.json: what `retrax.load_run` rebuilds.
      run_lib.write_model_file(self._output_dir, self._model)

  # --- set-up -------------------------------------------------------------------------

  def _init_task(self, task, loss_chunk_size, adasum):
    loss_layer = task.loss_layer
    loss_layer.init(self._model.output_signature(
        shapes.signature(tuple(task.sample_batch))))
    step_fn = engine.TrainStep(self._model, loss_layer, task.optimizer,
                               self._parallel, loss_chunk_size, adasum)
    weights = (self._model.weights, loss_layer.weights)
    slots, opt_params = task.optimizer.tree_init(weights)
    if task.lr_schedule is not None and 'learning_rate' not in opt_params:
      raise ValueError(
          f'The task has an lr_schedule but its optimizer '
          f'{type(task.optimizer).__name__} has no learning_rate '
          'hyperparameter to set; for optax use '
          'retrax.optimizers.from_optax(optax.adam, learning_rate=...).')
    loss_sig = step_fn.loss_signature(
        weights, (self._model.state, loss_layer.state),
        shapes.signature(tuple(task.sample_batch)), self._rng)
    if isinstance(loss_sig, (tuple, list)):
      raise ValueError(
          f'The model and loss layer {loss_layer.name} leave '
          f'{len(loss_sig)} items on the stack for a batch of '
          f'{len(task.sample_batch)} items; the batch must hold the model\'s '
          f'{self._model.n_in} input(s) plus the {loss_layer.n_in - 1} '
          'other input(s) of the loss (targets, weights).')
    if loss_sig.shape:
      raise ValueError(
          f'The loss layer {loss_layer.name} must return a scalar; it returns '
          f'shape {loss_sig.shape}.')
    replicate = self._parallel.replicate
    return _TaskState(task, step_fn, replicate(loss_layer.weights),
                      replicate(loss_layer.state), replicate(slots),
                      replicate(dict(opt_params)))

  def _batch_checker(self, sample_batch, name):
    signature = shapes.signature(tuple(sample_batch))
    vocab = None
    if np.dtype(signature[0].dtype).kind in 'iu':
      vocab = batch_checks.find_embedding_vocab(self._model)
    n_classes = None
    if len(signature) > self._model.n_in:
      out = self._model.output_signature(signature[:self._model.n_in])
      targets = signature[self._model.n_in]
      if (not isinstance(out, (tuple, list)) and np.dtype(
          targets.dtype).kind in 'iu' and len(out.shape) == len(
              targets.shape) + 1):
        n_classes = out.shape[-1]
    return batch_checks.BatchChecker(signature, self._model.n_in, vocab,
                                     n_classes, self._parallel, name)

  def _init_evaluator(self, eval_task):
    model_with_metrics = _model_with_ends(
        self._eval_model, eval_task.metrics,
        shapes.signature(tuple(eval_task.sample_batch)))
    replicate = self._parallel.replicate
    return (engine.EvalStep(model_with_metrics, self._parallel),
            replicate(model_with_metrics.weights[1]),
            replicate(model_with_metrics.state[1]))

  # --- properties (Trax's) ----------------------------------------------------------

  @property
  def step(self):
    """The number of training steps run so far."""
    return self._step

  @property
  def history(self):
    return self._history

  @property
  def n_devices(self):
    return self._n_devices

  @property
  def is_chief(self):
    return self._is_chief

  @property
  def model(self):
    """The model being trained (its weights are current between `run` calls)."""
    return self._model

  @property
  def tasks(self):
    return self._tasks

  @property
  def eval_model(self):
    return self._eval_model

  @property
  def eval_tasks(self):
    return self._eval_tasks

  @property
  def output_dir(self):
    return self._output_dir

  @property
  def slots(self):
    """Optimizer slots of the first task (replicated device arrays)."""
    return self._task_states[0].slots

  def save_checkpoint(self, basename=None, permanent=False):
    """Saves a checkpoint, under Trax's names; a hook subclasses may override.

    `run` calls it as Trax's `Loop.run` does, with one positional name:
    'model' at `checkpoint_at` steps (retrax's rolling `ckpt_<step>` and
    Trax's `model.*` files), 'model_<step>' at `permanent_checkpoint_at`
    steps (the permanent `model_<step>`), and 'lowest_<metric>' /
    'highest_<metric>' for the best ones (see `LoopIO.save_checkpoint`).
    """
    if basename == checkpointing.TRAX_BASENAME:
      basename = None
    elif basename == f'{checkpointing.TRAX_BASENAME}_{self._step}':
      basename, permanent = None, True
    return super().save_checkpoint(basename, permanent)

  def new_rng(self):
    """Returns a new single-use PRNG key (splitting the loop's key)."""
    self._rng, rng = _split_key(self._rng)
    return rng

  def update_weights_and_state(self, weights=None, state=None):
    """Replaces the trained model's weights and/or state."""
    if weights is not None:
      self._model.weights = weights
      self._weights = self._parallel.replicate(weights)
    if state is not None:
      self._model.state = state
      self._state = self._parallel.replicate(state)

  def _sync_model(self):
    """Puts the current weights and state into the model objects."""
    self._model.weights = self._weights
    self._model.state = self._state
    if self._eval_model is not self._model:
      self._eval_model.weights = self._weights
      self._eval_model.state = self._eval_state

  # --- training -------------------------------------------------------------------

  def run(self, n_steps=1):
    """Runs `n_steps` training steps, with evals and checkpoints as configured.

    The last step is checkpointed at the end (if `output_dir` is set), even
    when it is not a checkpoint step.

    Raises:
      BadBatchError: a batch does not fit the model (nothing more is saved).
      NonFiniteLossError: the loss, the learning rate or the weights became
        NaN/inf (nothing more is saved).
    """
    self._open_writers()
    self._bar = loop_io.make_progress_bar(self, n_steps)
    start_time = time.time()
    try:
      for _ in range(n_steps):
        prev_task_index = self._which_task(self._step)
        self._step += 1
        task_index = self._which_task(self._step)
        if task_index != prev_task_index:
          self._acc.reset(task_index)
        self._call_callbacks('on_step_begin')
        batch = self._tasks[task_index].next_batch()
        self._train_on_batch(task_index, batch)
        self._call_callbacks('on_step_end')
        # Evals come before the checkpoint of the same step (Trax saves first),
        # so a resumed run has the step's eval results and eval stream
        # position, exactly as an uninterrupted run.
        if self._eval_at(self._step):
          self._log_training_progress(task_index, time.time() - start_time)
          self.run_evals()
          start_time = time.time()
        # Trax's names, one positional argument: `save_checkpoint` is a hook.
        at_checkpoint = self._checkpoint_at(self._step)
        if at_checkpoint:
          self.save_checkpoint(checkpointing.TRAX_BASENAME)
        if self._permanent_checkpoint_at(self._step):
          self.save_checkpoint(f'{checkpointing.TRAX_BASENAME}_{self._step}')
        if at_checkpoint:
          if self._checkpoint_low_metric is not None and self._at_best(
              self._checkpoint_low_metric, min):
            self.save_checkpoint(f'lowest_{self._checkpoint_low_metric}')
          if self._checkpoint_high_metric is not None and self._at_best(
              self._checkpoint_high_metric, max):
            self.save_checkpoint(f'highest_{self._checkpoint_high_metric}')
      self._check_pending()
      if self._last_rolling_step != self._step:
        # The final step is always saved as the newest checkpoint (also when
        # it is only a permanent one's step), so model.pkl.gz holds it too.
        self.save_checkpoint(checkpointing.TRAX_BASENAME)
    finally:
      self._bar.close()
      self._bar = loop_io.make_progress_bar(self, 0, enabled=False)
      self._close_writers()
    self._sync_model()

  def _call_callbacks(self, hook):
    active = [c for c in self._callbacks if c.call_at(self._step)]
    if active:
      self._check_pending()
      self._sync_model()
    for c in active:
      getattr(c, hook)(self._step)

  def _opt_step(self):
    return self._step + self._opt_step_offset

  def _train_on_batch(self, task_index, batch):
    """One optimizer step of task `task_index` on `batch`; loss checked lazily."""
    state = self._task_states[task_index]
    step = self._step
    if self._checkers[task_index] is not None:
      self._checkers[task_index].check(batch, step)
    opt_params = dict(state.opt_params)
    lr = state.task.learning_rate(self._opt_step())
    if lr is not None and not math.isfinite(float(lr)):
      last = ('no checkpoint was saved' if self._last_saved_step is None
              else f'the last checkpoint is from step {self._last_saved_step}')
      raise NonFiniteLossError(
          f'Step {step}: the learning rate of task {task_index} is {lr}. '
          f'Training stopped before the step ({last}); check the learning '
          'rate and lr_schedule.')
    if lr is not None:
      opt_params['learning_rate'] = np.asarray(
          lr, np.asarray(opt_params['learning_rate']).dtype)
    rng = self.new_rng()
    try:
      weights, slots, new_state, loss, stats = state.step_fn(
          (self._weights, state.loss_weights), state.slots,
          (self._state, state.loss_state), batch,
          rng, self._opt_step(), opt_params)
    except (base.LayerError, TypeError, ValueError) as e:
      raise BadBatchError(
          f'Step {step}: the training step failed on a batch of signature '
          f'{shapes.signature(tuple(batch))}: {e}') from e
    self._weights, state.loss_weights = weights
    self._state, state.loss_state = new_state
    state.slots = slots
    self._pending.append((step, task_index, loss, stats))
    # Checking the previous step's loss waits for that step only, so one step
    # is always queued on the device while Python prepares the next.
    self._check_pending(keep=1)
    self._bar.update(batch, self._last_loss)

  def _check_pending(self, keep=0):
    """Checks the losses of all but `keep` queued steps (NaN/inf stops training)."""
    while len(self._pending) > keep:
      step, task_index, loss, stats = self._pending.popleft()
      value = float(loss)
      self._check_loss(step, task_index, value)
      self._last_loss = value
      self._acc.add(task_index, value, stats)

  def _check_loss(self, step, task_index, value):
    tutorial_checks.raise_pending()
    tutorial_checks.check_loss_value(
        self._task_states[task_index].task.loss_layer.name, value)
    if not math.isfinite(value):
      last = ('no checkpoint was saved' if self._last_saved_step is None else
              f'the last checkpoint is from step {self._last_saved_step}')
      raise NonFiniteLossError(
          f'Step {step}: the training loss of task {task_index} is {value}. '
          f'Training stopped and saved nothing after it ({last}). Lower the '
          'learning rate, clip gradients (clip_grad_norm=) or check the data.')

  def _at_best(self, metric, best):
    values = [float(v) for _, v in self._history.get('eval',
                                                     f'metrics/{metric}')]
    return bool(values) and values[-1] == best(values)

  # --- evals -------------------------------------------------------------------

  def evaluate_task(self, index, n_batches=None):
    """Averages the metrics of eval task `index` over its batches; returns a dict."""
    eval_task = self._eval_tasks[index]
    step_fn, metric_weights, metric_state = self._evaluators[index]
    n_batches = eval_task.n_eval_batches if n_batches is None else n_batches
    sums = np.zeros((len(eval_task.metrics),))
    for _ in range(n_batches):
      rng = self.new_rng()
      batch = eval_task.next_batch()
      if self._eval_checkers[index] is not None:
        self._eval_checkers[index].check(batch, self._step)
      sums += np.asarray(step_fn((self._weights, metric_weights),
                                 (self._state, metric_state),
                                 self._parallel.put_batch(batch), rng))
    averages = sums / max(n_batches, 1)
    return dict(zip(eval_task.metric_names, averages.tolist()))

  def run_evals(self, summary_writers=None):
    """Runs every eval task and records its metrics (history, logs, files)."""
    # As in Trax the eval model takes the training model's state (a copy: the
    # next training step donates the training state's buffers).
    self._eval_state = jax.tree_util.tree_map(jnp.copy, self._state)
    for index in range(len(self._eval_tasks)):
      writer = (summary_writers[index] if summary_writers is not None else
                self._eval_writer(index))
      self.log_summary(self.evaluate_task(index), writer, 'metrics/', 'eval')

  def _log_training_progress(self, task_index, elapsed_time):
    """Logs the mean loss and optimizer stats of the steps since the last log."""
    self._check_pending()
    task = self._tasks[task_index]
    n_steps, mean_loss, stats = self._acc.means()
    self._log('')
    if self._step == 1:
      self._log_step(f'Total number of trainable weights: {self.n_weights()}')
    self._log_step(f'Ran {n_steps} train steps in {elapsed_time:0.2f} secs')
    writer = self._train_writer(task_index)
    self.log_summary({task.loss_name: mean_loss}, writer, 'metrics/', 'train')
    params = {'steps per second': n_steps / max(elapsed_time, 1e-9)}
    learning_rate = task.learning_rate(self._opt_step())
    if learning_rate is not None:
      params['learning_rate'] = float(learning_rate)
    params.update(stats)
    self.log_summary(params, writer, 'training/', 'train', stdout=False)

  def n_weights(self):
    """Total number of trainable weight values of the model."""
    return int(sum(np.size(x) for x in fastmath.tree_leaves(self._weights)))
