"""One training step of a `Loop`, top to bottom.

    train_state, loss, stats = train_step(step_fn, train_state, task_index,
                                          batch, task=..., checker=...,
                                          opt_step=..., note=...)

On the host (`train_step`):
  1. the batch is checked against the model (shapes, dtypes, id ranges);
  2. the optimizer's hyperparameters of the step: the task's learning rate
     schedule at `opt_step`;
  3. a fresh PRNG key is split from the loop's.
On the devices (`TrainStep`, one jitted program per task):
  4. the batch is split over the mesh's devices (`devices`, `sharding`);
  5. forward of `Serial(model, loss_layer)` to the loss (the head and loss
     over chunks of positions for long sequences, see `loss_chunks`) and its
     gradients, per device share merged by Adasum with `adasum=True`;
  6. the optimizer's update of the weights and slots.
Back on the host:
  7. the next `TrainState`; the loss and the optimizer's stats stay device
     values, read a step later (`loop_steps.PendingLosses`), so the device
     always has the next step queued.

The state, optax-style:

    TrainState(step, weights, state, eval_state, tasks, rng)
    TaskState(loss_weights, loss_state, slots, opt_params)   one per task

`step` is a Python int (the steps run so far); every other field is a tree
of arrays on the loop's devices (weights and slots replicated or split over
`fsdp`, see `sharding`; the rest replicated). The jitted step donates the
weights, slots and state it is given: only the returned state is valid
afterwards. `init_state` builds the state at step 0 and each task's
`TrainStep`; `checkpointing.save_state` / `restore_state` write and read it.
"""

import math
import typing

import jax
import jax.numpy as jnp
import numpy as np

from retrax import shapes
from retrax.errors import Error
from retrax.fastmath import xla_cpu
from retrax.layers import base
from retrax.optimizers import placement
from retrax.supervised import batch_checks
from retrax.supervised import devices
from retrax.supervised import loss_chunks
from retrax.supervised.batch_checks import BadBatchError
from retrax.supervised.batch_checks import NonFiniteLossError
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


# --- the step -----------------------------------------------------------------


def train_step(step_fn: 'TrainStep', train_state: TrainState, task_index: int,
               batch: typing.Sequence[typing.Any], *, task: TrainTask,
               checker: typing.Optional[batch_checks.BatchChecker],
               opt_step: int, note: typing.Callable[[], str]
               ) -> typing.Tuple[TrainState, typing.Any, typing.Any]:
  """One optimizer step of task `task_index` on `batch` (steps 1-7 above).

  Args:
    step_fn: the task's `TrainStep`.
    train_state: the state after the previous step, its `step` already
      advanced to this one; its arrays are donated.
    task_index: which of the loop's training tasks.
    batch: this host's share of the batch (host or device arrays).
    task: the `TrainTask` (its learning rate schedule).
    checker: the task's `BatchChecker`, or None to skip the host check.
    opt_step: the step count the optimizer and the schedule see.
    note: `() -> str` saying which checkpoint is the run's last (messages).

  Returns:
    `(next TrainState, loss, optimizer stats)`; loss and stats are device
    values.

  Raises:
    BadBatchError: the batch does not fit the model.
    NonFiniteLossError: the scheduled learning rate is NaN/inf.
  """
  step = train_state.step
  if checker is not None:
    checker.check(batch, step)
  opt_params = _opt_params_at(task, task_index,
                              train_state.tasks[task_index].opt_params,
                              opt_step, step, note)
  train_state, rng = new_rng(train_state)
  own = train_state.tasks[task_index]
  try:
    (weights, loss_weights), slots, (state, loss_state), loss, stats = step_fn(
        (train_state.weights, own.loss_weights), own.slots,
        (train_state.state, own.loss_state), batch, rng, opt_step, opt_params)
  except Error as e:
    if not batch_checks.about_the_batch(e):
      raise
    raise BadBatchError(
        f'Step {step}: the training step failed on a batch of signature '
        f'{shapes.signature(tuple(batch))}: {e}') from e
  tasks = list(train_state.tasks)
  tasks[task_index] = own._replace(loss_weights=loss_weights,
                                   loss_state=loss_state, slots=slots)
  return train_state._replace(weights=weights, state=state,
                              tasks=tuple(tasks)), loss, stats


def _opt_params_at(task, task_index, opt_params, opt_step, step, note):
  """`opt_params` with the task's scheduled learning rate at `opt_step` (if
  it has a schedule), in the dtype of the optimizer's own."""
  opt_params = dict(opt_params)
  lr = task.learning_rate(opt_step)
  if lr is None:
    return opt_params
  if not math.isfinite(float(lr)):
    raise NonFiniteLossError(
        f'Step {step}: the learning rate of task {task_index} is {lr}. '
        f'Training stopped before the step ({note()}); '
        'check the learning rate and lr_schedule.')
  opt_params['learning_rate'] = np.asarray(
      lr, np.asarray(opt_params['learning_rate']).dtype)
  return opt_params


class TrainStep:
  """The jitted, buffer-donating step of one model+loss and optimizer:

      (weights, slots, state, batch, rng, step, opt_params)
          -> (new_weights, new_slots, new_state, loss, stats)

  `weights`/`state` are those of `Serial(model, loss_layer)`; `stats` are the
  optimizer's, plus 'loss'. The step runs over the devices of `parallel`:
  batch split across them, weights and slots replicated or split over the
  mesh's `fsdp` axis, everything else replicated; XLA inserts the gradient
  all-reduce, so it computes the same function as on one device.

  Args:
    model: the model layer (already initialized).
    loss_layer: the loss layer (initialized on the model's output signature).
    optimizer: a retrax `Optimizer` (its `tree_update` is traced).
    parallel: a `devices.DataParallel` (mesh and shardings).
    loss_chunk_size: if > 0, compute the final dense + loss in chunks.
    adasum: merge per-device gradients with Adasum.
    shardings: `(weights', slots')` shardings (trees or one each); default
      replicated.
  """

  def __init__(self, model, loss_layer, optimizer, parallel, loss_chunk_size=0,
               adasum=False, shardings=None):
    self._forward = loss_chunks.forward_fn(model, loss_layer, loss_chunk_size)
    self._optimizer = optimizer
    self._parallel = parallel
    self._n_shares = parallel.n_global_devices if adasum else 1
    rep, shard = parallel.replicated, parallel.batch
    w_sh, s_sh = shardings or (rep, rep)
    # On one device the inputs' own shardings are right, and leaving them to
    # jit halves the per-call dispatch cost (~100 arrays in and out).
    in_shardings = (None if parallel.n_global_devices == 1 else
                    (w_sh, s_sh, rep, shard, rep, rep, rep))
    self._jitted = xla_cpu.jit(
        self._step, donate_argnums=(0, 1, 2), in_shardings=in_shardings,
        out_shardings=(w_sh, s_sh, rep, rep, rep))

  def __call__(self, weights, slots, state, batch, rng, step, opt_params):
    """Runs one step (4-6 of the module docstring).

    `batch` is a tuple of host (NumPy) or device arrays: this host's share,
    placed on the devices here (on one device the jitted call copies it).
    """
    batch = (tuple(batch) if self._parallel.n_global_devices == 1 else
             self._parallel.put_batch(batch))
    return self._jitted(weights, slots, state, batch, rng, np.int32(step),
                        opt_params)

  def _step(self, weights, slots, state, batch, rng, step, opt_params):
    """The traced body: loss and gradients, then the optimizer's update."""
    grad_fn = jax.value_and_grad(self._forward, has_aux=True)
    loss, new_state, grads = placement.sharded_value_and_grad(
        lambda b, r: grad_fn(weights, state, b, r), batch, rng,
        self._n_shares)
    new_weights, new_slots, stats = self._optimizer.tree_update(
        step, grads, weights, slots, opt_params, store_slots=False)
    return new_weights, new_slots, new_state, loss, {**stats, 'loss': loss}

  def loss_signature(self, weights, state, batch_signature, rng):
    """Shape/dtype of the loss for a batch signature (no compute)."""
    structs = tuple(jax.ShapeDtypeStruct(s.shape, s.dtype)
                    for s in batch_signature)
    return jax.eval_shape(self._forward, weights, state, structs, rng)[0]


# --- before the first step: the state and each task's step ---------------------

# One dispatch per new key (splitting, then unpacking on the host, takes three).
_split_key = jax.jit(lambda key: tuple(jax.random.split(key)))


def new_rng(train_state: TrainState) -> typing.Tuple[TrainState, jax.Array]:
  """`(train_state with its key advanced, a new single-use PRNG key)`."""
  rng, new = _split_key(train_state.rng)
  return train_state._replace(rng=rng), new


def init_state(model: base.Layer, eval_model: base.Layer,
               tasks: typing.Sequence[TrainTask],
               parallel: devices.DataParallel, rng: jax.Array,
               loss_chunk_size: int = 0, adasum: bool = False
               ) -> typing.Tuple[TrainState, typing.List[TrainStep]]:
  """Initializes the models that have no weights yet (from `tasks[0]`'s
  sample batch, in Trax's order of PRNG use) and each task's step.

  Returns:
    `(TrainState at step 0, [TrainStep per task])`.
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


def init_task(model: base.Layer, task: TrainTask,
              parallel: devices.DataParallel, rng: jax.Array,
              loss_chunk_size: int = 0, adasum: bool = False
              ) -> typing.Tuple[TrainStep, TaskState]:
  """`(TrainStep, TaskState)` of `task`; initializes its loss layer.

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
  step_fn = TrainStep(
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
      loss_weights=loss_layer.weights, loss_state=loss_layer.state,
      slots=slots, opt_params=dict(opt_params)))


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


def _is_empty(x):
  if isinstance(x, (list, tuple)):
    return all(_is_empty(y) for y in x)
  return x is None


def _is_uninitialized(model):
  return all(_is_empty(layer.stacked_weights) for layer in model.walk())


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
