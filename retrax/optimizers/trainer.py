"""Trax's `optimizers.Trainer`: one jitted optimizer step of a model+loss layer.

    loss_layer = tl.Serial(tl.Dense(1), tl.L2Loss())
    loss_layer.init(batch)
    optimizer = optimizers.SGD(0.01)
    optimizer.tree_init(loss_layer.weights)
    trainer = optimizers.Trainer(loss_layer, optimizer)
    loss, stats = trainer.one_step(batch, rng)

`one_step` computes the gradient of the layer's output (a scalar loss) with
respect to its weights, runs the optimizer, and writes the new weights and
state back into the layer and the new slots into the optimizer. With several
devices the batch is split across them along its first dimension (see
`placement`). `ReversibleSerialTrainer` (same interface, per-layer steps that
save memory) is defined in `reversible_trainer` and exported here as in Trax.
"""

import jax
import jax.numpy as jnp
import numpy as np

from retrax import layers as tl
from retrax.fastmath import xla_cpu
from retrax.optimizers import base as opt_base
from retrax.optimizers import placement
from retrax.optimizers.reversible_trainer import ReversibleSerialTrainer
from retrax.optimizers.reversible_trainer import extract_reversible_blocks
from retrax.optimizers.reversible_trainer import init_reversible_blocks
from retrax.validation import ArgumentValueError

__all__ = ['ReversibleSerialTrainer', 'Trainer', 'extract_reversible_blocks',
           'init_reversible_blocks']


def _is_empty(tree):
  return not jax.tree_util.tree_leaves(tree)


class Trainer:
  """One-step optimizer updates of a model+loss layer, jitted, on n devices.

  Args:
    model_with_loss: an initialized layer whose output is a scalar loss (e.g.
      `tl.Serial(model, tl.CrossEntropyLoss())`), called on whole batches.
    optimizer: a retrax `Optimizer`; its slots are created with
      `optimizer.tree_init(model_with_loss.weights)` if it has none.
    n_devices: local devices to split each batch over (default: all).
    adasum: merge the devices' gradients with Adasum instead of averaging.

  Differences from Trax: with several devices `one_step` returns the mean loss
  over the devices (Trax: one loss per device), and dropout draws one random
  mask for the whole batch (Trax: one per device's share).
  """

  def __init__(self, model_with_loss, optimizer, n_devices=None, adasum=False):
    if _is_empty(model_with_loss.weights) and _is_empty(model_with_loss.state):
      raise ArgumentValueError(
          f'Trainer needs an initialized model_with_loss; {model_with_loss.name}'
          ' has no weights. Call model_with_loss.init(batch_signature) first.')
    self._model_with_loss = model_with_loss
    self._optimizer = optimizer
    self._mesh = placement.DeviceMesh(n_devices)
    self._n_devices = self._mesh.n_devices
    self._adasum = adasum
    if optimizer.slots is None:
      # Slots like the weights the step updates: stacked blocks stay stacked.
      optimizer.tree_init(model_with_loss.stacked_weights)
    self._slots = optimizer.slots
    self._opt_params = dict(optimizer.opt_params)
    self._checked_signature = None
    self._accelerated = None
    self._update = xla_cpu.jit(self._update_fn)

  @property
  def model_with_loss(self):
    """The model+loss layer whose weights and state `one_step` updates."""
    return self._model_with_loss

  @property
  def accelerated_model_with_loss(self):
    """`tl.Accelerate(model_with_loss)` holding the current weights and state.

    The step itself does not use it (it places the arrays over the devices
    itself); it is built on first use and brought up to date at each access.
    """
    if self._accelerated is None:
      self._accelerated = tl.Accelerate(self._model_with_loss,
                                        n_devices=self._n_devices)
    self._accelerated.replicate_weights(self._model_with_loss.weights)
    self._accelerated.replicate_state(self._model_with_loss.state)
    return self._accelerated

  @property
  def optimizer(self):
    return self._optimizer

  @property
  def n_devices(self):
    return self._n_devices

  @property
  def slots(self):
    """The optimizer slots (one entry per weight array)."""
    return self._optimizer.slots

  @slots.setter
  def slots(self, slots):
    self._optimizer.slots = slots
    self._slots = slots

  def _update_fn(self, weights, slots, state, batch, rng, step, opt_params):
    def loss_fn(w, b, r):
      return self._model_with_loss.pure_fn(b, w, state, r)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    loss, new_state, grads = placement.sharded_value_and_grad(
        lambda b, r: grad_fn(weights, b, r), batch, rng,
        self._n_devices if self._adasum else 1)
    new_weights, new_slots, stats = self._optimizer.tree_update(
        step, grads, weights, slots, opt_params, store_slots=False)
    return new_weights, new_slots, new_state, {**stats, 'loss': loss}

  def _check_loss_shape(self, batch, weights, state, rng):
    signature = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)), batch)
    if signature == self._checked_signature:
      return
    out = jax.eval_shape(
        lambda b: self._model_with_loss.pure_fn(b, weights, state, rng)[0],
        signature)
    if isinstance(out, (tuple, list)) or out.shape:
      got = (f'{len(out)} outputs' if isinstance(out, (tuple, list))
             else f'shape {out.shape}')
      raise ArgumentValueError(
          f'Trainer needs model_with_loss ({self._model_with_loss.name}) to '
          f'return one scalar loss; on this batch it returns {got}.')
    self._checked_signature = signature

  def one_step(self, batch, rng, step=0, learning_rate=None):
    """Runs one training step; updates the weights, state and slots.

    Args:
      batch: the model+loss layer's inputs, e.g. `(inputs, targets, weights)`.
      rng: a PRNG key for this step.
      step: the training step number (the optimizer sees it).
      learning_rate: if given, the learning rate from now on.

    Returns:
      `(loss, stats)`: the loss and the optimizer's statistics (with 'loss').
    """
    if learning_rate is not None:
      opt_base.set_learning_rate(self._opt_params, learning_rate)
    mesh = self._mesh
    model = self._model_with_loss
    weights = mesh.replicate(model.stacked_weights)
    state = mesh.replicate(model.state)
    self._check_loss_shape(batch, weights, state, rng)
    new_weights, new_slots, new_state, stats = self._update(
        weights, mesh.replicate(self._slots), state, mesh.put_batch(batch),
        mesh.replicate(rng), np.int32(step), mesh.replicate(self._opt_params))
    model.weights, model.state = new_weights, new_state
    self._slots = new_slots
    self._optimizer.slots = new_slots
    return stats['loss'], stats
