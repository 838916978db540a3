"""The legacy `Trainer` (Trax 1.2's API, as the Reformer blog uses it) and `train`.

    trainer = Trainer(model=tiny_reformer_lm, loss_fn=tl.CrossEntropyLoss,
                      optimizer=optimizers.Adam, lr_schedule=lr.MultifactorSchedule,
                      inputs=copy_inputs, output_dir='~/train_dir', has_weights=True)
    for _ in range(3):
      trainer.train_epoch(500, 2)

prints Trax's report (`Step    500: Ran 500 train steps in 1.67 secs`, then
`Evaluation` and the train/eval metric table). The Trainer runs on the same
engine as `training.Loop` (it drives one internally): one jitted step with
donated buffers, data parallel over the devices, exact-resume native
checkpoints (plus Trax's `model.pkl.gz`, which Trax and `init_from_file`
read). As in Trax's Trainer, the optimizer and the schedule see the number of
steps done BEFORE the update (0 for the first step); `Loop` passes the number
after it.
"""

import collections
import inspect
import itertools
import logging
import os
import time
from typing import Iterable

import numpy as np

from retrax import layers as tl
from retrax import lr as lr_lib
from retrax import optimizers as trax_opt
from retrax.configurable import configurable
from retrax.data import inputs as data_inputs
from retrax.layers import base
from retrax.layers import stacked
from retrax.shapes import ShapeDtype  # Trax programs use trainer_lib.ShapeDtype.
from retrax.supervised import history as trax_history
from retrax.supervised import metrics_log
from retrax.supervised import sharding
from retrax.supervised import training
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

__all__ = ['NamedStream', 'OptState', 'ShapeDtype', 'Trainer', 'TrainerState',
           'epochs', 'named_stream', 'num_devices', 'train']

_log = logging.getLogger('retrax.supervised')

TrainerState = collections.namedtuple(
    '_TrainerState', ['step', 'opt_state', 'history', 'model_state'])
OptState = collections.namedtuple(
    '_OptState', ['weights', 'slots', 'opt_params'])
NamedStream = collections.namedtuple('NamedStream', ['name', 'stream'])

_METRIC_LAYERS = ('WeightedCategoryCrossEntropy', 'WeightedCategoryAccuracy',
                  'Negate', 'Drop', 'Sum')


@configurable('trax.supervised.trainer_lib')
def named_stream(name, stream):
  """A `NamedStream(name, stream)`: an eval stream whose metrics carry `name`."""
  return NamedStream(name=name, stream=stream)


@configurable('trax.supervised.trainer_lib')
def num_devices(value=None):
  """How many devices to use (None: all); Trax's gin hook, kept for programs."""
  return value


def default_metrics():
  """The metrics of the Trainer's report (the blog's table), as Trax defines them.

  `loss` and `accuracy` are weighted over the batch; `neg_log_perplexity`
  is minus the loss (Trax >= 1.2.4); `weights_per_batch_per_core` is the sum
  of the loss weights of one device's share of a batch.
  """
  missing = [name for name in _METRIC_LAYERS if not hasattr(tl, name)]
  if missing:
    raise ArgumentValueError(
        f'The default Trainer metrics need retrax.layers.{", ".join(missing)}, '
        'which this installation lacks; pass metrics={name: layer, ...}.')
  return {
      'loss': tl.WeightedCategoryCrossEntropy(),
      'accuracy': tl.WeightedCategoryAccuracy(),
      'neg_log_perplexity': tl.Serial(tl.WeightedCategoryCrossEntropy(),
                                      tl.Negate()),
      'weights_per_batch_per_core': tl.Serial(tl.Drop(), tl.Drop(), tl.Sum()),
  }


def _as_layer(layer_or_class, what):
  if isinstance(layer_or_class, base.Layer):
    return layer_or_class
  if callable(layer_or_class):
    layer = layer_or_class()
    if isinstance(layer, base.Layer):
      return layer
  raise ArgumentTypeError(f'{what} must be a layer or a function/class making one; got '
                          f'{layer_or_class!r}.')


def _make_model(model, mode):
  """A model layer from a layer or a constructor taking `mode` (Trax 1.2)."""
  if isinstance(model, base.Layer):
    return model
  return model(mode=mode)


def _is_history_schedule(schedule):
  """True for Trax 1.2 factories `history -> (step -> {'learning_rate': ...})`."""
  try:
    params = list(inspect.signature(schedule).parameters)
  except (TypeError, ValueError):
    return False
  return bool(params) and params[0] == 'history'


def _with_weights(stream, has_weights, id_to_mask):
  """Appends loss weights (1, or 0 where targets == id_to_mask) when missing."""
  for batch in stream:
    batch = tuple(batch)
    if has_weights is False:
      targets = np.asarray(batch[-1])
      weights = (np.ones(targets.shape, np.float32) if id_to_mask is None else
                 (targets != id_to_mask).astype(np.float32))
      batch = batch + (weights,)
    yield batch


def _repeat_stream(stream_fn, n_devices, has_weights, id_to_mask):
  """Batches of `stream_fn(n_devices)`, restarting it whenever it ends."""
  def repeat():
    while True:
      yield from stream_fn(n_devices)
  return _with_weights(repeat(), has_weights, id_to_mask)


class Trainer:
  """Trax's legacy trainer: `train_epoch`, `evaluate`, `save_state`.

  Args:
    model: a layer, or a function `mode -> layer` (called with 'train' and
      'eval').
    loss_fn: a loss layer or a function/class making one.
    optimizer: a retrax `Optimizer` class or instance (or optax transform).
    lr_schedule: `step -> learning_rate`, or a Trax 1.2 factory `history ->
      (step -> {'learning_rate': lr})` such as `lr.MultifactorSchedule`.
    inputs: a `retrax.data.inputs.Inputs` (or a function returning one).
    output_dir: checkpoints and metrics; resumes from the newest valid
      checkpoint there.
    random_seed, n_devices: as for `Loop`.
    checkpoints_at: steps at which to also keep a permanent checkpoint.
    should_save_checkpoints, should_write_summaries: write checkpoints /
      TensorBoard files.
    metrics: `{name: layer}` for the report (default `default_metrics()`).
    checkpoint_highest, checkpoint_lowest: eval metric names for extra
      `highest_<name>` / `lowest_<name>` checkpoints.
    init_checkpoint: a checkpoint file whose weights start training.
    has_weights: Trax 1.2's flag: False appends loss weights to each batch
      (1, or 0 where the targets equal `id_to_mask`); True or None (Trax 1.4,
      which has no such flag) take batches as they are.
    id_to_mask: target id whose positions get weight 0 (with has_weights=False).
    progress_bar: show a progress bar while training (default off, as Trax).
    write_trax_files: write Trax's `model.pkl.gz` files beside the native
      checkpoints (default on).
  """

  _loop: training.Loop  # Built by `reset` (from `__init__`, and on request).

  def __init__(self, model, loss_fn, optimizer, lr_schedule, inputs,
               output_dir=None, random_seed=None, n_devices=None,
               checkpoints_at=None, should_save_checkpoints=True,
               should_write_summaries=True, metrics=None,
               checkpoint_highest=None, checkpoint_lowest=None,
               init_checkpoint=None, has_weights=None, id_to_mask=None,
               nontrainable_param_map=None, *, keep_checkpoints=3,
               progress_bar=False, write_trax_files=True):
    del nontrainable_param_map  # Trax 1.2 RL-era option; schedules set lr only.
    self._model_fn, self._loss_fn, self._optimizer = model, loss_fn, optimizer
    self._lr_schedule = lr_schedule
    self._inputs = inputs() if (callable(inputs) and
                                not hasattr(inputs, 'train_stream')) else inputs
    self._random_seed, self._n_devices_arg = random_seed, n_devices
    self._checkpoints_at = set(checkpoints_at or [])
    self._should_save_checkpoints = should_save_checkpoints
    self._should_write_summaries = should_write_summaries
    self._metrics_dict = metrics if metrics is not None else default_metrics()
    self._checkpoint_highest = checkpoint_highest
    self._checkpoint_lowest = checkpoint_lowest
    self._init_checkpoint = init_checkpoint
    self._has_weights, self._id_to_mask = has_weights, id_to_mask
    self._keep_checkpoints, self._progress_bar = keep_checkpoints, progress_bar
    self._write_trax_files = write_trax_files
    self._writers = None
    self.reset(output_dir, init_checkpoint)

  # --- set-up ----------------------------------------------------------------------

  def reset(self, output_dir, init_checkpoint=None):
    """(Re)builds the training state: restored from `output_dir` if it holds a
    checkpoint, else freshly initialized (and saved)."""
    self.close()
    self._output_dir = output_dir
    init_checkpoint = init_checkpoint or self._init_checkpoint
    model_train = _make_model(self._model_fn, 'train')
    model_eval = _make_model(self._model_fn, 'eval')
    shapes_, dtypes = self._inputs.example_shape_dtype
    sample = tuple(np.zeros(s, d) for s, d in zip(shapes_, dtypes))
    if self._has_weights is False:
      sample = sample + (np.ones(np.shape(sample[-1]), np.float32),)
    if init_checkpoint:
      signature = tuple(ShapeDtype(x.shape, x.dtype) for x in sample)
      signature = signature[:model_train.n_in]
      model_train.init_from_file(init_checkpoint, weights_only=True,
                                 input_signature=signature)
      if model_eval is not model_train:
        model_eval.init_from_file(init_checkpoint, weights_only=True,
                                  input_signature=signature)
    n_devices = self._n_devices_arg
    stream = lambda fn: _repeat_stream(fn, n_devices or 1, self._has_weights,
                                       self._id_to_mask)
    self._metric_names = sorted(self._metrics_dict)
    metric_layers = [self._metrics_dict[m] for m in self._metric_names]
    task = training.TrainTask(
        stream(self._inputs.train_stream), _as_layer(self._loss_fn, 'loss_fn'),
        self._optimizer, lr_schedule=self._step_schedule(),
        n_steps_per_checkpoint=None, sample_batch=sample)
    eval_tasks = [
        training.EvalTask(stream(fn), metric_layers, self._metric_names,
                          sample_batch=sample)
        for fn in (self._inputs.train_eval_stream, self._inputs.eval_stream)]
    self._loop = training.Loop(
        model_train, [task], eval_model=model_eval, eval_tasks=eval_tasks,
        output_dir=output_dir, checkpoint_at=training.never,
        permanent_checkpoint_at=training.never, eval_at=training.never,
        n_devices=n_devices, random_seed=self._random_seed,
        options=training.LoopOptions(
            keep_checkpoints=self._keep_checkpoints,
            progress_bar=self._progress_bar,
            write_trax_files=self._write_trax_files, opt_step_offset=-1,
            checkpoint_kind='Trainer'))
    self._refresh_schedule()  # The history may come from a checkpoint.
    loop_dir = self._loop.output_dir  # None exactly when output_dir is.
    if loop_dir is not None and self._should_write_summaries:
      self._writers = {
          mode: metrics_log.EventWriter(os.path.join(loop_dir, mode))
          for mode in ('train', 'eval')}
    if (self._loop.step == 0 and output_dir is not None and
        self._should_save_checkpoints):
      self.save_state(keep=False)

  def _step_schedule(self):
    """The schedule as `step -> learning_rate` (Trax 1.2 factories get history)."""
    if not _is_history_schedule(self._lr_schedule):
      return self._lr_schedule

    def schedule(step):
      # Rebuilt from the current history, as Trax 1.2 does each epoch.
      return self._history_schedule(step)['learning_rate']
    self._history_schedule = self._lr_schedule(trax_history.History())
    return schedule

  def _refresh_schedule(self):
    if _is_history_schedule(self._lr_schedule):
      self._history_schedule = self._lr_schedule(self._loop.history)

  def close(self):
    if self._writers is not None:
      for writer in self._writers.values():
        writer.close()
      self._writers = None

  # --- properties ---------------------------------------------------------------

  @property
  def n_devices(self):
    return self._loop.n_devices

  @property
  def step(self):
    return self._loop.step

  @property
  def history(self):
    return self._loop.history

  @property
  def _history(self):
    """Trax's attribute for the history, which Trax programs read."""
    return self._loop.history

  @property
  def model_weights(self):
    # Trax's tree: the step's stacked blocks shown per layer.
    return stacked.per_layer(self._loop.train_state.weights)

  @model_weights.setter
  def model_weights(self, weights):
    self._loop.update_weights_and_state(weights=weights)

  @property
  def model_state(self):
    return self._loop.train_state.state

  @model_state.setter
  def model_state(self, state):
    self._loop.update_weights_and_state(state=state)

  @property
  def state(self):
    """`TrainerState(step, OptState(weights, slots, opt_params), history, model_state)`."""
    task = self._loop.train_state.tasks[0]
    return TrainerState(
        step=self.step,
        opt_state=OptState((self.model_weights, task.loss_weights), task.slots,
                           task.opt_params),
        history=self.history, model_state=(self.model_state, task.loss_state))

  @property
  def learning_rate(self):
    """The learning rate of the next step."""
    return self._loop.tasks[0].learning_rate(self.step)

  # --- training ------------------------------------------------------------------

  def train_epoch(self, n_steps, n_eval_steps):
    """Runs `n_steps` steps, then evaluates on `n_eval_steps` batches and saves."""
    print()
    self._refresh_schedule()
    start_time = time.time()
    done = 0
    while done < n_steps:
      next_keep = [s for s in self._checkpoints_at
                   if self.step < s <= self.step + n_steps - done]
      chunk = (min(next_keep) - self.step) if next_keep else n_steps - done
      self._loop.run(chunk)
      done += chunk
      if self.step in self._checkpoints_at and self._should_save_checkpoints:
        self.save_state(keep=True)
    elapsed_time = time.time() - start_time
    self.log_step(f'Ran {n_steps} train steps in {elapsed_time:0.2f} secs')
    if self._writers is not None and n_steps > 1:
      self._writers['train'].scalar('training/steps per second',
                                    n_steps / elapsed_time, self.step)
      self._writers['train'].flush()
    self.evaluate(n_eval_steps)
    if self._should_save_checkpoints:
      self.save_state(keep=False)
      for metric, best in ((self._checkpoint_highest, max),
                           (self._checkpoint_lowest, min)):
        if metric is not None and self._current_step_is_best(metric, best):
          prefix = 'highest_' if best is max else 'lowest_'
          self.save_state(keep=False, prefix=prefix + metric)

  def train_step(self, batch):
    """Runs one training step on `batch` (weights appended if has_weights=False)."""
    if self._has_weights is False:
      batch = next(_with_weights([batch], False, self._id_to_mask))
    self._loop.train_step(batch)

  def evaluate(self, n_eval_steps):
    """Evaluates on train-eval and eval batches; logs Trax's metric table."""
    self.log_step('Evaluation')
    for index, mode in enumerate(('train', 'eval')):
      values = self._loop.evaluate_task(index, n_eval_steps)
      if 'weights_per_batch_per_core' in values:
        values['weights_per_batch_per_core'] /= self.n_devices
      self.log_metrics(values, None if self._writers is None else
                       self._writers[mode], mode)
    self.log_step('Finished evaluation')
    self.history.append('train', 'training/learning_rate', self.step,
                        float(self.learning_rate))

  def _current_step_is_best(self, metric, best):
    entries = self.history.get('eval', 'metrics/' + metric)
    values = [float(v) for _, v in entries]
    return bool(entries) and entries[-1][0] == self.step and values[-1] == best(
        values)

  def save_state(self, keep, prefix='model'):
    """Saves a checkpoint (native, plus Trax's `<prefix>.pkl.gz`).

    With prefix 'model' the native checkpoint is a rolling `ckpt_<step>` (and
    with `keep` also a permanent `model_<step>`); other prefixes save
    `<output_dir>/<prefix>`. Trax's file `<prefix>.pkl.gz` (and with `keep`
    `model_<step>.pkl.gz`) is written too, unless `write_trax_files=False`.
    """
    loop = self._loop
    if loop.output_dir is None:
      return
    if prefix == 'model':
      loop.save_checkpoint()
      if keep:
        loop.save_checkpoint(permanent=True)
    else:
      loop.save_checkpoint(prefix)

  # --- output --------------------------------------------------------------------

  def log_step(self, step_message):
    self._loop.log_step(step_message)

  def log_metrics(self, metrics, summ_writer, log_prefix):
    """Logs `{name: value}` as Trax's table rows, into history and files."""
    rjust_len = max([0] + [len(name) for name in metrics])
    self._loop.log_summary(metrics, summ_writer, 'metrics/', log_prefix,
                           rjust_len=rjust_len)

  def print_n_weights(self):
    self.log_step(f'Total number of trainable weights: {self._loop.n_weights()}')


def epochs(total_steps, steps_to_skip, epoch_steps):
  """Yields the lengths of the epochs still to run after `steps_to_skip` steps.

  Args:
    total_steps: the total number of training steps.
    steps_to_skip: steps already done (e.g. restored from a checkpoint).
    epoch_steps: iterable of epoch lengths.

  Yields:
    Epoch lengths that add up to `total_steps - steps_to_skip`; a partly done
    epoch yields its remainder.
  """
  steps_to_go = total_steps - steps_to_skip
  epoch_steps = iter(epoch_steps)
  for steps_this_epoch in epoch_steps:
    if steps_this_epoch > steps_to_skip:
      epoch_steps = itertools.chain([steps_this_epoch - steps_to_skip],
                                    epoch_steps)
    if steps_this_epoch >= steps_to_skip:
      break
    steps_to_skip -= steps_this_epoch
  for steps_this_epoch in epoch_steps:
    if steps_to_go <= 0:
      break
    steps_this_epoch = min(steps_this_epoch, steps_to_go)
    yield steps_this_epoch
    steps_to_go -= steps_this_epoch


@configurable('trax.supervised.trainer_lib', denylist=('output_dir',))
def train(output_dir, model, loss_fn=None, inputs=None, optimizer=None,
          lr_schedule_fn=None, trainer_class=Trainer, steps=1000,
          checkpoints_at=None, permanent_checkpoints_at=None, eval_steps=10,
          eval_frequency=100, permanent_checkpoint_frequency=None,
          random_seed=None, save_graphs=False, metrics=None,
          checkpoint_highest=None, checkpoint_lowest=None, use_loop=True,
          loss_chunk_size=0, use_memory_efficient_trainer=False, adasum=False,
          init_checkpoint=None, callbacks=None, n_weights_shards=1,
          additional_train_tasks=None, additional_eval_tasks=None,
          additional_eval_streams=None):
  """Trains `model` (Trax's `train`; gin configs bind its arguments, see
  `retrax.trax_gin`); returns the `Loop` (`use_loop=True`) or the trainer's
  `TrainerState`.

  Args (Trax's):
    output_dir: checkpoints and metrics; training resumes from it.
    model: function `mode -> layer` (or a layer).
    inputs: an `Inputs` or a function returning one; by default
      `data.batcher` (whose `data_streams` a gin config binds).
    loss_fn, optimizer, lr_schedule_fn, metrics: by default
      `WeightedCategoryCrossEntropy()`, `Adafactor`, `lr.multifactor` (a
      function returning a schedule), `default_metrics()` (`{name: layer}`).
    steps, eval_steps, eval_frequency: total steps (a resumed run's count);
      batches per evaluation; steps between evaluations and checkpoints.
    checkpoints_at, permanent_checkpoints_at, permanent_checkpoint_frequency,
      checkpoint_highest, checkpoint_lowest, random_seed, init_checkpoint,
      loss_chunk_size, use_memory_efficient_trainer, adasum, callbacks: as
      for `Loop` (the last four only with `use_loop`).
    use_loop: train with `training.Loop`, else with `trainer_class` (the
      legacy `Trainer`) in epochs of `eval_frequency` steps.
    additional_train_tasks, additional_eval_tasks, additional_eval_streams:
      more tasks for the loop; `NamedStream`s with the same metrics.
    save_graphs: ignored (Trax wrote HLO dumps); n_weights_shards: k > 1
      splits weights and slots over k devices (Loop's mesh data=D/k,fsdp=k).
  """
  del save_graphs
  inputs, loss_fn, optimizer, lr_schedule_fn = _checked_train_args(
      inputs, loss_fn, optimizer, lr_schedule_fn, n_weights_shards,
      permanent_checkpoint_frequency, permanent_checkpoints_at)
  if not use_loop:
    if n_weights_shards != 1:
      raise ArgumentValueError('n_weights_shards > 1 needs use_loop=True.')
    trainer = trainer_class(
        model, loss_fn, optimizer, lr_schedule_fn(), inputs, output_dir,
        random_seed=random_seed, n_devices=num_devices(), metrics=metrics,
        checkpoints_at=checkpoints_at, checkpoint_lowest=checkpoint_lowest,
        checkpoint_highest=checkpoint_highest, init_checkpoint=init_checkpoint)
    return _run_trainer(trainer, steps, eval_steps, eval_frequency)
  train_task, eval_tasks = _loop_tasks(
      inputs, loss_fn, optimizer, lr_schedule_fn, metrics, eval_steps,
      eval_frequency, permanent_checkpoint_frequency, additional_eval_tasks,
      additional_eval_streams)
  model_train, model_eval = _train_and_eval_models(model, init_checkpoint)
  return _run_loop(training.Loop(
      model_train, [train_task] + list(additional_train_tasks or []),
      eval_model=model_eval, eval_tasks=eval_tasks, output_dir=output_dir,
      checkpoint_at=_in(checkpoints_at),
      checkpoint_low_metric=checkpoint_lowest,
      checkpoint_high_metric=checkpoint_highest,
      permanent_checkpoint_at=_in(permanent_checkpoints_at),
      n_devices=num_devices(), loss_chunk_size=loss_chunk_size,
      use_memory_efficient_trainer=use_memory_efficient_trainer, adasum=adasum,
      random_seed=random_seed, callbacks=callbacks,
      options=training.LoopOptions(
          mesh=sharding.weights_shards_mesh(n_weights_shards))), steps)


def _run_loop(loop, steps):
  """`train`'s `Loop` strategy: runs what is left of `steps`; the loop."""
  steps_to_go = steps - loop.step
  if steps_to_go <= 0:
    _log.info('Stop training, already reached the total training steps %d',
              steps)
    return loop
  loop.run(steps_to_go)
  return loop


def _checked_train_args(inputs, loss_fn, optimizer, lr_schedule_fn,
                        n_weights_shards, permanent_checkpoint_frequency,
                        permanent_checkpoints_at):
  """`train`'s checks: `(Inputs, loss_fn, optimizer, lr_schedule_fn)`, each
  given or the default (an inputs factory called)."""
  if inputs is None:
    # Trax's default, looked up now: under gin it is the configured batcher
    # (`batcher.data_streams = ...`); without gin, batcher says what it needs.
    inputs = data_inputs.batcher
  sharding.weights_shards_mesh(n_weights_shards)  # Checks it.
  if (permanent_checkpoint_frequency is not None and
      permanent_checkpoints_at is not None):
    raise ArgumentValueError('train: give permanent_checkpoint_frequency or '
                             'permanent_checkpoints_at, not both.')
  loss_fn = loss_fn if loss_fn is not None else tl.WeightedCategoryCrossEntropy()
  if callable(inputs) and not hasattr(inputs, 'train_stream'):
    inputs = inputs()
  return (inputs, loss_fn, optimizer or trax_opt.Adafactor,
          lr_schedule_fn or lr_lib.multifactor)


def _run_trainer(trainer, steps, eval_steps, eval_frequency):
  """`train`'s legacy strategy: epochs of the `Trainer`; its final state."""
  epoch_steps: Iterable[int] = [steps]
  if eval_frequency and eval_steps > 0:
    epoch_steps = itertools.chain([1, eval_frequency - 1],
                                  itertools.repeat(eval_frequency))
  trainer.log_step(f'Starting training using {trainer.n_devices} devices')
  trainer.print_n_weights()
  try:
    for n in epochs(steps, trainer.step, epoch_steps):
      trainer.train_epoch(n, eval_steps)
    trainer.log_step('Training done')
  finally:
    trainer.close()
  return trainer.state


def _in(steps):
  """`step -> step in steps`, or None (the loop's default) for None."""
  if steps is None:
    return None
  return lambda step: step in steps


def _train_and_eval_models(model, init_checkpoint):
  model_train = _make_model(model, 'train')
  model_eval = _make_model(model, 'eval')
  if init_checkpoint:
    model_train.init_from_file(init_checkpoint, weights_only=True)
    model_eval.init_from_file(init_checkpoint, weights_only=True)
  return model_train, model_eval


def _loop_tasks(inputs, loss_fn, optimizer, lr_schedule_fn, metrics,
                eval_steps, eval_frequency, permanent_checkpoint_frequency,
                additional_eval_tasks, additional_eval_streams):
  """`train`'s `TrainTask` and `EvalTask`s for the `Loop` strategy."""
  n_devices = num_devices()
  train_task = training.TrainTask(
      inputs.train_stream(n_devices or 1),
      loss_layer=_as_layer(loss_fn, 'loss_fn'),
      optimizer=trax_opt.as_optimizer(optimizer), lr_schedule=lr_schedule_fn(),
      n_steps_per_checkpoint=eval_frequency,
      n_steps_per_permanent_checkpoint=permanent_checkpoint_frequency)
  metrics_dict = metrics if metrics is not None else default_metrics()
  names, metric_layers = zip(*metrics_dict.items())
  eval_tasks = [training.EvalTask(inputs.eval_stream(n_devices or 1),
                                  metric_layers, metric_names=names,
                                  n_eval_batches=eval_steps)]
  eval_tasks += list(additional_eval_tasks or [])
  eval_tasks += [training.EvalTask(s.stream, metric_layers, metric_names=names,
                                   n_eval_batches=eval_steps,
                                   export_prefix=s.name)
                 for s in additional_eval_streams or []]
  return train_task, eval_tasks
