"""Trax's `ReversibleSerialTrainer`: layer-by-layer steps that save memory.

The model is given as blocks `(standard_layers, reversible_layers)` and a final
loss layer; together they compute `tl.Serial(blocks..., loss_layer)`. A step
runs each layer as its own jitted call:

* forward, first to last, keeping only the current data stack, the inputs of
  each block's standard part, and the layers' states;
* the loss layer's gradient and optimizer update;
* backward, last to first: each reversible layer rebuilds its inputs from its
  outputs (`ReversibleLayer.reverse_and_grad`), so no reversible layer's
  activations are kept, and each layer's optimizer updates its weights as
  soon as its gradient exists.

Weights and optimizer slots are kept in host memory between the calls that
use them: a layer's new weights start copying to the host when its update is
done and are collected one layer later, so the accelerator holds the weights
of about two layers at a time (plus the activations of the stack). Each layer
has its own optimizer (made by
`optimizer_fn`); for optimizers that treat each weight array on its own (SGD,
Momentum, Adam, Adafactor, ... without `clip_grad_norm`) the updates equal
those of `optimizers.Trainer` on the whole model.
"""

import logging
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from retrax import fastmath
from retrax.fastmath import xla_cpu
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import reversible
from retrax.optimizers import base as opt_base
from retrax.optimizers import placement
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

__all__ = ['ReversibleSerialTrainer', 'extract_reversible_blocks',
           'init_reversible_blocks']

_log = logging.getLogger('retrax.optimizers')


def _is_empty(tree):
  return not jax.tree_util.tree_leaves(tree)


def _new_optimizer(optimizer_fn, layer):
  """A fresh optimizer from `optimizer_fn`, with slots for `layer`'s weights."""
  if not callable(optimizer_fn) or isinstance(optimizer_fn, opt_base.Optimizer):
    raise ArgumentTypeError(
        'ReversibleSerialTrainer needs optimizer_fn, a class or function making '
        'an optimizer (e.g. optimizers.Adam), since each layer gets its own; '
        f'got {optimizer_fn!r}.')
  optimizer = optimizer_fn()
  optimizer.tree_init(layer.weights)
  optimizer.slots = placement.to_host(optimizer.slots)
  return optimizer


class _Unit:
  """One layer with its optimizer, hyperparameters and jitted functions."""

  def __init__(self, layer, optimizer_fn, kind):
    self.layer = layer
    self.optimizer = _new_optimizer(optimizer_fn, layer)
    self.opt_params = dict(self.optimizer.opt_params)
    self.forward = xla_cpu.jit(
        lambda x, w, s, r: layer.pure_fn(x, w, s, r))
    if kind == 'reversible':
      self.backward = xla_cpu.jit(_reverse_and_update_fn(layer, self.optimizer))
    else:
      self.backward = xla_cpu.jit(
          _grad_and_update_fn(layer, self.optimizer, kind == 'loss'))

  def store(self, weights, slots, state=None):
    """Keeps the new weights, slots (and state) of this layer on the host."""
    self.layer.weights = placement.start_host_copy(weights)
    self.optimizer.slots = placement.start_host_copy(slots)
    if state is not None:
      self.layer.state = state

  def collect(self):
    """Finishes moving this layer's weights and slots to host memory."""
    self.layer.weights = placement.to_host(self.layer.weights)
    self.optimizer.slots = placement.to_host(self.optimizer.slots)


def _update(optimizer, step, grads, weights, slots, opt_params):
  if _is_empty(weights):
    return weights, slots, {}
  new_weights, new_slots, stats = optimizer.tree_update(
      step, grads, weights, slots, opt_params, store_slots=False)
  return new_weights, new_slots, dict(stats)


def _grad_and_update_fn(layer, optimizer, is_loss):
  """Jittable: gradient of a standard layer at its inputs, then its update."""

  def fn(x, weights, state, rng, output_ct, slots, opt_params, step):
    def f(inputs, w):
      return layer.pure_fn(inputs, w, state, rng)
    y, vjp_fn, new_state = jax.vjp(f, x, weights, has_aux=True)
    if is_loss:
      output_ct = jnp.ones_like(y)
    x_ct, w_ct = vjp_fn(output_ct)
    new_weights, new_slots, stats = _update(optimizer, step, w_ct, weights,
                                            slots, opt_params)
    if is_loss:
      stats['loss'] = y
    return new_weights, new_state, new_slots, x_ct, stats
  return fn


def _reverse_and_update_fn(layer, optimizer):
  """Jittable: a reversible layer's inputs and gradients, then its update."""

  def fn(y, weights, state, new_state, rng, y_ct, slots, opt_params, step):
    x, (x_ct, w_ct) = layer.reverse_and_grad(y, y_ct, weights, state,
                                             new_state, rng)
    new_weights, new_slots, stats = _update(optimizer, step, w_ct, weights,
                                            slots, opt_params)
    return new_weights, new_slots, x, x_ct, stats
  return fn


class ReversibleSerialTrainer:
  """Trains `Serial(blocks..., loss_layer)` one layer at a time (see module doc).

  Args:
    blocks: a list of pairs `(standard_layers, reversible_layers)`, each a
      list of initialized layers (the first item may also be one layer).
    loss_layer: an initialized layer ending in a scalar loss.
    optimizer_fn: a class or function returning a new optimizer, e.g.
      `optimizers.Adam`; every layer gets its own.
    n_devices: local devices to split each batch over (default: all).
    memoize_jit: accepted for Trax; retrax compiles each layer's functions for
      that layer (Trax shares them between layers with equal reprs, which
      is wrong when the reprs omit a difference such as a dropout rate).
    free_accelerators_on_step: accepted for Trax, no effect: retrax never
      deletes device buffers it does not own.
    adasum: must be False with several devices (not implemented here).
  """

  def __init__(self, blocks, loss_layer, optimizer_fn, n_devices=None,
               memoize_jit=True, free_accelerators_on_step=False, adasum=False):
    del memoize_jit
    if free_accelerators_on_step:
      _log.warning('ReversibleSerialTrainer: free_accelerators_on_step has no '
                   'effect in retrax.')
    self._mesh = placement.DeviceMesh(n_devices)
    if adasum and self._mesh.n_devices > 1:
      raise ArgumentValueError('ReversibleSerialTrainer does not implement adasum over '
                               'several devices; use adasum=False or optimizers.Trainer.')
    self._blocks = []
    for i, (std_layers, rev_layers) in enumerate(blocks):
      for j, layer in enumerate(rev_layers):
        if not isinstance(layer, reversible.ReversibleLayer):
          raise ArgumentTypeError(f'Block {i}, reversible layer {j} ({layer.name}) is '
                                  'not a ReversibleLayer.')
      self._blocks.append((cb.Serial(std_layers), list(rev_layers)))
    self._loss_layer = loss_layer
    self._optimizer_fn = optimizer_fn
    self._n_layers = 1 + sum(len(revs) + 1 for _, revs in self._blocks)
    self._units = [(_Unit(std, optimizer_fn, 'standard'),
                    [_Unit(layer, optimizer_fn, 'reversible') for layer in revs])
                   for std, revs in self._blocks]
    self._loss_unit = _Unit(loss_layer, optimizer_fn, 'loss')
    # The last updated unit, its weights still moving.
    self._pending: Optional[_Unit] = None

  @property
  def loss_layer(self):
    return self._loss_layer

  @property
  def all_layers(self):
    """Every layer, in order: each block's standard Serial, its reversible
    layers, then the loss layer."""
    layers = []
    for std, revs in self._blocks:
      layers.append(std)
      layers.extend(revs)
    layers.append(self._loss_layer)
    return layers

  @property
  def optimizer_fn(self):
    return self._optimizer_fn

  @property
  def n_devices(self):
    return self._mesh.n_devices

  @property
  def slots(self):
    """`[(standard_slots, [reversible_slots, ...]) per block] + [loss_slots]`."""
    blocks = [(std.optimizer.slots, [u.optimizer.slots for u in revs])
              for std, revs in self._units]
    return blocks + [self._loss_unit.optimizer.slots]

  @slots.setter
  def slots(self, slots):
    if len(slots) != len(self._units) + 1:
      raise ArgumentValueError(f'slots must hold {len(self._units)} block entries and '
                               f'the loss slots; got {len(slots)} entries.')
    for (std, revs), (std_slots, rev_slots) in zip(self._units, slots[:-1]):
      std.optimizer.slots = std_slots
      for unit, s in zip(revs, rev_slots):
        unit.optimizer.slots = s
    self._loss_unit.optimizer.slots = slots[-1]

  def _all_units(self):
    for std, revs in self._units:
      yield std
      yield from revs
    yield self._loss_unit

  def one_step(self, batch, rng, step=0, learning_rate=None):
    """Runs one training step; updates every layer's weights, state and slots.

    Args:
      batch: the inputs of the first block, e.g. `(inputs, targets, weights)`.
      rng: a PRNG key for this step (split over the layers as `Serial` does).
      step: the training step number (the optimizers see it).
      learning_rate: if given, every layer's learning rate from now on.

    Returns:
      `(loss, stats)`; `stats` holds each layer's optimizer statistics as
      `layer<i>/<name>`, layer 0 being the first block's standard layers.
    """
    units = list(self._all_units())
    if learning_rate is not None:
      for unit in units:
        opt_base.set_learning_rate(unit.opt_params, learning_rate)
    rngs = list(fastmath.random.split(rng, self._n_layers))
    step = np.int32(step)
    self._pending = None
    stack, saved = self._forward(self._mesh.put_batch(batch), rngs)
    loss_stats, grad_stack = self._loss_backward(stack, rngs[-1], step)
    stats = [loss_stats]
    for b in reversed(range(len(self._units))):
      stack, grad_stack = self._block_backward(b, stack, grad_stack, saved[b],
                                               rngs, step, stats)
    assert self._pending is not None  # _loss_backward stored the loss layer.
    self._pending.collect()
    joint = {}
    for i, layer_stats in enumerate(reversed(stats)):
      for name, value in layer_stats.items():
        joint[f'layer{i}/{name}'] = value
    return loss_stats['loss'], joint

  def _store(self, unit, weights, slots, state=None):
    """Stores `unit`'s update; moves the previous unit's to host memory."""
    unit.store(weights, slots, state)
    if self._pending is not None:
      self._pending.collect()
    self._pending = unit

  def _rng_index(self, block):
    """Index in the step's rngs of `block`'s standard layer."""
    return sum(len(revs) + 1 for _, revs in self._units[:block])

  def _forward(self, stack, rngs):
    """Runs all blocks forward; returns the stack and, per block, what its
    backward pass needs: the standard part's inputs and state, and the
    reversible layers' states before and after."""
    replicate = self._mesh.replicate
    saved = []
    for b, (std, revs) in enumerate(self._units):
      i = self._rng_index(b)
      layer = std.layer
      std_inputs, std_state = cb.inputs_from_stack(stack, layer.n_in), layer.state
      y, layer.state = std.forward(std_inputs, replicate(layer.weights),
                                   replicate(std_state), rngs[i])
      stack = cb.outputs_onto_stack(y, stack, layer.n_in)
      rev_states = []
      for j, unit in enumerate(revs):
        layer = unit.layer
        old_state = layer.state
        y, layer.state = unit.forward(
            cb.inputs_from_stack(stack, layer.n_in), replicate(layer.weights),
            replicate(old_state), rngs[i + 1 + j])
        rev_states.append((old_state, layer.state))
        stack = cb.outputs_onto_stack(y, stack, layer.n_in)
      saved.append(((std_inputs, std_state), rev_states))
    return stack, saved

  def _loss_backward(self, stack, rng, step):
    """The loss layer's value, gradient and update; returns (stats, grads)."""
    unit, replicate = self._loss_unit, self._mesh.replicate
    layer = unit.layer
    x = cb.inputs_from_stack(stack, layer.n_in)
    new_weights, new_state, new_slots, x_ct, stats = unit.backward(
        x, replicate(layer.weights), replicate(layer.state), rng, None,
        replicate(unit.optimizer.slots), replicate(unit.opt_params), step)
    self._store(unit, new_weights, new_slots, new_state)
    return stats, x_ct

  def _block_backward(self, b, stack, grad_stack, saved, rngs, step, stats):
    """Block `b` backward (reversible layers, then the standard part)."""
    replicate = self._mesh.replicate
    std, revs = self._units[b]
    (std_inputs, std_state), rev_states = saved
    i = self._rng_index(b)
    for j in reversed(range(len(revs))):
      unit, (old_state, new_state) = revs[j], rev_states[j]
      layer = unit.layer
      new_weights, new_slots, x, x_ct, layer_stats = unit.backward(
          cb.inputs_from_stack(stack, layer.n_out), replicate(layer.weights),
          replicate(old_state), replicate(new_state), rngs[i + 1 + j],
          cb.inputs_from_stack(grad_stack, layer.n_out),
          replicate(unit.optimizer.slots), replicate(unit.opt_params), step)
      self._store(unit, new_weights, new_slots)
      stack = cb.outputs_onto_stack(x, stack, layer.n_out)
      grad_stack = cb.outputs_onto_stack(x_ct, grad_stack, layer.n_out)
      stats.append(layer_stats)
    layer = std.layer
    new_weights, _, new_slots, x_ct, layer_stats = std.backward(
        std_inputs, replicate(layer.weights), replicate(std_state), rngs[i],
        cb.inputs_from_stack(grad_stack, layer.n_out),
        replicate(std.optimizer.slots), replicate(std.opt_params), step)
    self._store(std, new_weights, new_slots)
    stack = cb.outputs_onto_stack(std_inputs, stack, layer.n_out)
    grad_stack = cb.outputs_onto_stack(x_ct, grad_stack, layer.n_out)
    stats.append(layer_stats)
    return stack, grad_stack


def _flatten_serials(layers):
  """`layers` (a layer or nested lists of them) with every Serial opened up."""
  if isinstance(layers, (list, tuple)):
    return [x for layer in layers for x in _flatten_serials(layer)]
  if type(layers) is cb.Serial:
    return _flatten_serials(list(layers.sublayers))
  return [layers]


def extract_reversible_blocks(layers, loss_chunk_size=0):
  """Splits a model+loss into `(blocks, loss_layer)` for the trainer above.

  Args:
    layers: a layer or list of layers ending in a loss, e.g. `[model, loss]`;
      Serial combinators are opened up (not ReversibleSerial).
    loss_chunk_size: if > 0, the loss layer runs its final
      `Dense, LogSoftmax, _CrossEntropy, _WeightedMean` in chunks of this many
      positions (`tl.Chunk`), which must follow a `Select` or
      `StripFromConcatenateWithPadding` layer.

  Returns:
    `(blocks, loss_layer)`: blocks `(standard_layers, reversible_layers)` and
    the loss layer, a Serial of the standard layers after the last
    reversible one.

  Raises:
    ValueError: the last layer is reversible, or the loss cannot be chunked.
  """
  blocks, std_layers, rev_layers = [], [], []
  for layer in _flatten_serials(layers):
    if isinstance(layer, reversible.ReversibleLayer):
      rev_layers.append(layer)
    elif not rev_layers:
      std_layers.append(layer)
    else:
      blocks.append((std_layers, rev_layers))
      std_layers, rev_layers = [layer], []
  if rev_layers:
    raise ArgumentValueError('The final layer must be a standard loss, not reversible.')
  if loss_chunk_size > 0:
    return blocks, _chunked_loss(std_layers, loss_chunk_size)
  return blocks, cb.Serial(std_layers)


def _chunked_loss(std_layers, chunk_size):
  """The loss layer with its dense+cross-entropy computed in chunks."""
  starts = [i + 1 for i, layer in enumerate(std_layers)
            if layer.name in ('StripFromConcatenateWithPadding', 'Select')]
  if not starts:
    raise ArgumentValueError(
        'Loss chunking needs the loss to follow a Select or '
        'StripFromConcatenateWithPadding layer; the loss layers are '
        f'{[layer.name for layer in std_layers]}.')
  start = starts[-1]
  if len(std_layers) - start < 4:
    raise ArgumentValueError('Too short loss layer for chunking: it needs Dense, '
                             'LogSoftmax, _CrossEntropy and _WeightedMean.')
  last = [layer.name for layer in std_layers[-3:]]
  if last != ['LogSoftmax', '_CrossEntropy', '_WeightedMean']:
    raise ArgumentValueError('Loss chunking needs the last layers to be LogSoftmax, '
                             f'_CrossEntropy, _WeightedMean; got {last}.')

  def merge(preds, targets):
    return (jnp.reshape(preds, (-1, preds.shape[-1])),
            jnp.reshape(targets, (-1,)), targets)

  def unmerge(xent, targets):
    return jnp.reshape(xent, targets.shape)
  chunked = cb.Serial(
      base.Fn('pre_xent_rebatch', merge, n_out=3),
      cb.Chunk(cb.Serial(std_layers[start:-1]), chunk_size),
      base.Fn('after_xent_rebatch', unmerge))
  return cb.Serial(std_layers[:start] + [chunked], std_layers[-1])


def init_reversible_blocks(blocks, loss_layer, input_signature, rng):
  """Initializes the blocks' layers and the loss layer, weights in host memory.

  Each block splits `rng` into one key for what follows and one per layer.

  Args:
    blocks: `(standard_layers, reversible_layers)` pairs.
    loss_layer: the loss layer.
    input_signature: the signature of the first block's inputs.
    rng: a PRNG key.
  """
  sig_stack = input_signature
  for std_layers, rev_layers in blocks:
    layers = list(std_layers) + list(rev_layers)
    rngs = fastmath.random.split(rng, len(layers) + 1)
    rng = rngs[0]
    for layer, layer_rng in zip(layers, rngs[1:]):
      sig = cb.inputs_from_stack(sig_stack, layer.n_in)
      layer.init(sig, rng=layer_rng)
      layer.weights = placement.to_host(layer.weights)
      layer.state = placement.to_host(layer.state)
      sig_stack = cb.outputs_onto_stack(layer.output_signature(sig), sig_stack,
                                        layer.n_in)
  loss_layer.init(cb.inputs_from_stack(sig_stack, loss_layer.n_in), rng=rng)
  loss_layer.weights = placement.to_host(loss_layer.weights)
  loss_layer.state = placement.to_host(loss_layer.state)
