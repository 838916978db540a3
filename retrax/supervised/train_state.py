"""A `Loop`'s training state as pytrees, optax-style.

    TrainState(step, weights, state, eval_state, tasks, rng)
    TaskState(loss_weights, loss_state, slots, opt_params)   one per task

`Loop` holds one `TrainState`: `train_step` takes it with a batch and
returns the next one (the jitted step donates the buffers passed in),
`checkpointing.save_state` / `restore_state` write and read it. `step` is a
Python int (the steps run so far); every other field is a tree of arrays
on the loop's devices (weights and slots replicated or split over `fsdp`,
see `sharding`; the rest replicated). `LossSums` are the host-side sums of
the checked losses since the last log, saved beside the state so that a
resumed run logs the same means.
"""

import collections
import typing

import jax
import jax.numpy as jnp

from retrax import shapes
from retrax.layers import base
from retrax.supervised import devices
from retrax.supervised import engine
from retrax.supervised.tasks import TrainTask
from retrax.validation import ArgumentValueError


class TaskState(typing.NamedTuple):
  """The arrays of one training task: its loss layer's and its optimizer's."""
  loss_weights: typing.Any
  loss_state: typing.Any
  slots: typing.Any
  opt_params: typing.Any


class TrainState(typing.NamedTuple):
  """Everything a training step reads and writes, plus the step count."""
  step: int
  weights: typing.Any
  state: typing.Any
  eval_state: typing.Any
  tasks: typing.Tuple[TaskState, ...]
  rng: typing.Any


# One dispatch per new key (splitting, then unpacking on the host, takes three).
_split_key = jax.jit(lambda key: tuple(jax.random.split(key)))


def replicate(parallel: devices.DataParallel,
              train_state: TrainState) -> TrainState:
  """`train_state` with its arrays copied to all of `parallel`'s devices (the
  PRNG key stays a plain device array, as the host splits it)."""
  step, weights, state, eval_state, tasks, rng = train_state
  tasks = tuple(place_task(parallel, t) for t in tasks)
  state, eval_state = parallel.replicate((state, eval_state))
  return TrainState(step, parallel.place_weights(weights), state, eval_state,
                    tasks, jnp.asarray(rng))


def place_task(parallel: devices.DataParallel, task: TaskState) -> TaskState:
  """`task` (a TaskState) on `parallel`'s mesh: weights and slots as the mesh
  places them (replicated, or split over `fsdp`), the rest replicated."""
  return TaskState(parallel.place_weights(task.loss_weights),
                   parallel.replicate(task.loss_state),
                   parallel.place_weights(task.slots),
                   parallel.replicate(task.opt_params))


def init_task(model: base.Layer, task: TrainTask,
              parallel: devices.DataParallel, rng: jax.Array,
              loss_chunk_size: int = 0, adasum: bool = False
              ) -> typing.Tuple[engine.TrainStep, TaskState]:
  """`(engine.TrainStep, TaskState)` of `task`; initializes its loss layer.

  Raises:
    ValueError: the task has a schedule but its optimizer no learning rate,
      or the model and loss do not make a scalar loss of the task's batches.
  """
  loss_layer = task.loss_layer
  batch_signature = devices.global_signature(
      shapes.signature(tuple(task.sample_batch)))
  loss_layer.init(model.output_signature(batch_signature))
  weights = (model.stacked_weights, loss_layer.weights)
  slots, opt_params = task.optimizer.tree_init(weights)
  step_fn = engine.TrainStep(
      model, loss_layer, task.optimizer, parallel, loss_chunk_size, adasum,
      shardings=(parallel.weight_shardings(weights),
                 parallel.weight_shardings(slots)))
  if task.lr_schedule is not None and 'learning_rate' not in opt_params:
    raise ArgumentValueError(
        f'The task has an lr_schedule but its optimizer '
        f'{type(task.optimizer).__name__} has no learning_rate '
        'hyperparameter to set; for optax use '
        'retrax.optimizers.from_optax(optax.adam, learning_rate=...).')
  loss_sig = step_fn.loss_signature(
      weights, (model.state, loss_layer.state), batch_signature, rng)
  if isinstance(loss_sig, (tuple, list)):
    raise ArgumentValueError(
        f'The model and loss layer {loss_layer.name} leave '
        f'{len(loss_sig)} items on the stack for a batch of '
        f'{len(task.sample_batch)} items; the batch must hold the model\'s '
        f'{model.n_in} input(s) plus the {loss_layer.n_in - 1} '
        'other input(s) of the loss (targets, weights).')
  if loss_sig.shape:
    raise ArgumentValueError(
        f'The loss layer {loss_layer.name} must return a scalar; it returns '
        f'shape {loss_sig.shape}.')
  return step_fn, place_task(parallel, TaskState(
      loss_layer.weights, loss_layer.state, slots, dict(opt_params)))


def _is_empty(x):
  if isinstance(x, (list, tuple)):
    return all(_is_empty(y) for y in x)
  return x is None


def _is_uninitialized(model):
  return all(_is_empty(layer.stacked_weights) for layer in model.walk())


def init_state(model: base.Layer, eval_model: base.Layer,
               tasks: typing.Sequence[TrainTask],
               parallel: devices.DataParallel, rng: jax.Array,
               loss_chunk_size: int = 0, adasum: bool = False
               ) -> typing.Tuple[TrainState, typing.List[engine.TrainStep]]:
  """Initializes the models that have no weights yet (from `tasks[0]`'s
  sample batch, in Trax's order of PRNG use) and each task's step.

  Returns:
    `(TrainState at step 0, [engine.TrainStep per task])`.
  """
  # The global batch's: the step runs on all processes' rows at once.
  batch_signature = devices.global_signature(
      shapes.signature(tuple(tasks[0].sample_batch)))
  for layer in (model, eval_model):
    rng, layer.rng = _split_key(rng)
    if _is_uninitialized(layer):
      layer.init(batch_signature)
  steps_and_states = [init_task(model, t, parallel, rng, loss_chunk_size,
                                adasum) for t in tasks]
  replicate = parallel.replicate
  train_state = TrainState(
      0, parallel.place_weights(model.stacked_weights), replicate(model.state),
      replicate(eval_model.state), tuple(s for _, s in steps_and_states),
      rng)
  _hold_placed(model, eval_model, tasks, train_state)
  return train_state, [step_fn for step_fn, _ in steps_and_states]


def _hold_placed(model, eval_model, tasks, train_state):
  """Points the models and optimizers at the placed arrays of `train_state`.

  The arrays they held (the initial weights, state and optimizer slots) are
  then released unless the caller keeps them: a second copy of everything,
  as large as the training step's arguments (3.5 GB at 1M tokens of the
  default ReformerLM, whose positional table grows with the length), would
  otherwise stay on the device through the first `run` (the models) or for
  good (`optimizer.slots`, which the Loop does not update). Between runs
  the Loop puts its current arrays into the models anyway (`_sync_model`).
  """
  model.weights, model.state = train_state.weights, train_state.state
  if eval_model is not model:
    eval_model.weights = train_state.weights
    eval_model.state = train_state.eval_state
  for task, placed in zip(tasks, train_state.tasks):
    task.optimizer.slots = placed.slots


def new_rng(train_state: TrainState) -> typing.Tuple[TrainState, jax.Array]:
  """`(train_state with its key advanced, a new single-use PRNG key)`."""
  rng, new = _split_key(train_state.rng)
  return train_state._replace(rng=rng), new


def train_step(step_fn: engine.TrainStep, train_state: TrainState,
               task_index: int, batch: typing.Sequence[typing.Any],
               rng: jax.Array, opt_step: int, opt_params: typing.Any
               ) -> typing.Tuple[TrainState, typing.Any, typing.Any]:
  """One optimizer step of task `task_index`: `(new TrainState, loss, stats)`.

  `step_fn` is the task's `engine.TrainStep`; the arrays of `train_state` it
  updates are donated (only the returned state is valid afterwards).
  """
  task = train_state.tasks[task_index]
  weights, slots, new_state, loss, stats = step_fn(
      (train_state.weights, task.loss_weights), task.slots,
      (train_state.state, task.loss_state), batch, rng, opt_step, opt_params)
  tasks = list(train_state.tasks)
  tasks[task_index] = task._replace(loss_weights=weights[1],
                                    loss_state=new_state[1], slots=slots)
  return train_state._replace(weights=weights[0], state=new_state[0],
                              tasks=tuple(tasks)), loss, stats


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
