"""Trax's optimizer interface: per-weight slots, whole-tree updates, clipping.

An optimizer says how to treat ONE weight array: ``init(weights) -> slots``
and ``update(step, grads, weights, slots, opt_params) -> (new_weights,
new_slots)``. ``tree_init`` / ``tree_update`` apply that to every array of a
model's weight tree, exactly as Trax does, so that optimizer slots are laid out
like Trax's (one slot structure per weight leaf, in Trax's flattening order;
Adam: ``(m, v)`` per leaf) and Trax's ``opt_slots`` checkpoint files map one to
one.

Weight trees are nested tuples / lists / dicts of arrays. Empty tuples ``()``
(layers without weights) and marker dicts such as
``{'__marker_for_cached_weights_': ()}`` (a shared layer's second use) hold no
arrays and are carried through unchanged. ``tree_flatten`` and
``tree_unflatten`` (Trax's leaf order and its exact inverse) are
``retrax.fastmath.tree``'s ``tree_flatten`` and ``unflatten_like``.

The retrax optimizers implement ``transform(step, opt_params)``: an
``optax.GradientTransformation`` for one weight array whose state is that
array's Trax slot and whose output update is added to the weights. The base
class builds ``init`` and ``update`` from it. A subclass may instead override
``init`` and ``update`` directly, as in Trax.

Everything here is pure given its inputs and runs under ``jax.jit``; inside a
jitted step call ``tree_update(..., store_slots=False)`` so no tracer is stored
on the object.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from retrax.configurable import configurable
from retrax.fastmath.tree import tree_flatten
from retrax.fastmath.tree import unflatten_like as tree_unflatten
from retrax import validation
from retrax.validation import ArgumentValueError

__all__ = [
    'Optimizer',
    'SGD',
    'apply_stateless',
    'chain_stateless',
    'clip_grads',
    'l2_norm',
    'set_learning_rate',
    'tree_flatten',
    'tree_unflatten',
]


# Norms and clipping.


def _flat_l2_norm(flat: list[Any]) -> jax.Array:
  """The L2 norm of all elements of all arrays in ``flat``, as one vector."""
  # A float32 sum of squares, not vdot: a dot may run in TF32 on GPUs.
  squares = (jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in flat)
  return jnp.sqrt(sum(squares, jnp.float32(0.0)))


def l2_norm(tree: Any) -> jax.Array:
  """Returns the L2 norm of all elements of all arrays in ``tree``.

  Args:
    tree: A weight or gradient tree.

  Returns:
    A scalar: the norm of the vector that concatenates every array.
  """
  return _flat_l2_norm(tree_flatten(tree))


def _clip_flat(flat, norm, max_norm):
  scale = max_norm / norm
  return [jnp.where(norm < max_norm, g, g * scale.astype(g.dtype)) for g in flat]


def clip_grads(grad_tree: Any, max_norm: float) -> Any:
  """Scales all gradients down together so that their global norm <= max_norm.

  Args:
    grad_tree: A gradient tree.
    max_norm: The bound on the L2 norm of all gradients taken together.

  Returns:
    A tree like ``grad_tree``; unchanged when its norm is below ``max_norm``,
    else every array multiplied by ``max_norm / norm``.
  """
  flat = tree_flatten(grad_tree)
  return tree_unflatten(_clip_flat(flat, _flat_l2_norm(flat), max_norm),
                        grad_tree)


# Composition of optax transformations for one weight array.


def chain_stateless(
    first: optax.GradientTransformation,
    *rest: optax.GradientTransformation) -> optax.GradientTransformation:
  """Runs ``first`` then the stateless transformations ``rest``.

  Unlike ``optax.chain`` the combined state is ``first``'s state alone, which
  keeps the slot layout of a Trax optimizer (``rest`` are things like
  ``optax.scale`` whose state is empty).

  Args:
    first: The transformation that owns the state.
    *rest: Transformations with empty state, applied in order.

  Returns:
    An ``optax.GradientTransformation``.
  """

  def update_fn(updates, state, params=None):
    updates, state = first.update(updates, state, params)
    updates = apply_stateless(rest, updates, params)
    return updates, state

  return optax.GradientTransformation(first.init, update_fn)


def apply_stateless(transforms, updates, params):
  """Applies stateless optax transformations in order and returns the updates."""
  for transform in transforms:
    updates, _ = transform.update(updates, transform.init(params), params)
  return updates


def _no_slots() -> optax.GradientTransformation:
  """The identity, with Trax's ``None`` slot."""
  return optax.GradientTransformation(
      lambda params: None, lambda updates, state, params=None: (updates, None))


# The optimizer base class.


class Optimizer:
  """Base class for optimizers that update Trax-style weight trees.

  Hyperparameters given to the constructor become ``opt_params``, a dict of
  scalars passed to every update; a training loop may change them per step
  (e.g. ``opt_params['learning_rate']`` from a schedule, possibly a traced
  value inside ``jax.jit``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from retrax import optimizers
    >>> opt = optimizers.Momentum(0.1)
    >>> weights = (jnp.ones((2,)), (), {'__marker_for_cached_weights_': ()})
    >>> slots, opt_params = opt.tree_init(weights)
    >>> grads = (jnp.ones((2,)), (), {'__marker_for_cached_weights_': ()})
    >>> new_weights, slots, stats = opt.tree_update(
    ...     0, grads, weights, slots, opt_params)
    >>> sorted(stats)
    ['gradients_l2', 'weights_l2']
  """

  def __init__(self, learning_rate=0.01, clip_grad_norm=None,
               **init_opt_params):
    """Sets the initial hyperparameter values.

    Args:
      learning_rate: Learning rate; a schedule may change it every step.
      clip_grad_norm: If not None, before each update all gradients are scaled
        down together so that their global L2 norm does not exceed this value.
      **init_opt_params: Initial values of further hyperparameters.
    """
    owner = type(self).__name__
    validation.check_real(owner, 'clip_grad_norm', clip_grad_norm, 0.0,
                          include_min=False, allow_none=True)
    validation.check_real(owner, 'learning_rate', learning_rate)
    for name, value in init_opt_params.items():  # A NaN would train to NaN.
      if validation.is_real_scalar(value):
        validation.check_real(owner, name, value)
    init_opt_params['learning_rate'] = learning_rate
    self._init_opt_params = {
        name: jnp.asarray(value) for name, value in init_opt_params.items()}
    self._clip_grad_norm = clip_grad_norm
    self._slots = None

  # What a subclass defines: either `transform`, or `init` and `update`.

  def transform(self, step, opt_params) -> optax.GradientTransformation:
    """The optax transformation for one weight array at this step.

    Its state is the array's slot; its output is added to the weights.

    Args:
      step: The training step (a Python int or a traced integer).
      opt_params: The hyperparameters for this step.

    Returns:
      An ``optax.GradientTransformation``.
    """
    raise NotImplementedError(
        f'{type(self).__name__} must define either `transform(step, '
        'opt_params)` or both `init(weights)` and `update(step, grads, '
        'weights, slots, opt_params)`.')

  def init(self, weights):
    """Creates the optimizer slots for one weight array.

    Args:
      weights: One weight array.

    Returns:
      The slots for that array (``None`` when the optimizer keeps none).
    """
    return self.transform(0, self.opt_params).init(weights)

  def update(self, step, grads, weights, slots, opt_params):
    """Computes one step's new weights and slots for one weight array.

    Args:
      step: Training step number.
      grads: The gradient of the loss for this array.
      weights: The current values of this array.
      slots: This array's current optimizer slots.
      opt_params: Hyperparameters for this step (same for all arrays).

    Returns:
      ``(new_weights, new_slots)``; ``new_weights`` keeps the dtype of
      ``weights``.
    """
    grads, weights = jnp.asarray(grads), jnp.asarray(weights)
    # The rules mix dtypes as Trax's did (float32 hyperparameters and
    # moments with bfloat16 weights): JAX's standard promotion, stated here.
    with jax.numpy_dtype_promotion('standard'):
      updates, new_slots = self.transform(step, opt_params).update(
          grads, slots, weights)
      return (weights + updates).astype(weights.dtype), new_slots

  # Properties.

  @property
  def slots(self):
    """The slots stored by the last ``tree_init`` or ``tree_update``."""
    return self._slots

  @slots.setter
  def slots(self, slots):
    self._slots = slots

  @property
  def opt_params(self) -> dict[str, Any]:
    """The initial hyperparameters, as a dict of scalars."""
    return self._init_opt_params

  @opt_params.setter
  def opt_params(self, opt_params):
    self._init_opt_params = opt_params

  @property
  def clip_grad_norm(self):
    """The global gradient-norm bound, or None."""
    return self._clip_grad_norm

  # Whole-tree operations.

  def tree_init(self, weight_tree):
    """Creates slots for every array of a model's weight tree.

    Args:
      weight_tree: The model's weights (nested tuples/lists/dicts of arrays).

    Returns:
      ``(slots, opt_params)``: a tuple with one slot structure per weight array
      in Trax's flattening order, and the initial hyperparameters. The slots
      are also stored in ``self.slots``.
    """
    self._slots = tuple(self.init(w) for w in tree_flatten(weight_tree))
    return self._slots, self._init_opt_params

  def tree_update(self, step, grad_tree, weight_tree, slots, opt_params,
                  store_slots=True):
    """Updates every array of a weight tree and its slots.

    Args:
      step: Training step number (a Python int or a traced integer).
      grad_tree: Gradients, a tree shaped like ``weight_tree``.
      weight_tree: The current weights.
      slots: The slots from ``tree_init`` or the previous ``tree_update``.
      opt_params: Hyperparameters for this step.
      store_slots: Whether to also store the new slots in ``self.slots``;
        pass False inside ``jax.jit``.

    Returns:
      ``(new_weights, new_slots, stats)``: new weights shaped like
      ``weight_tree``, the new slots, and ``{'gradients_l2': ...,
      'weights_l2': ...}`` (global L2 norms; the gradient norm is taken
      before clipping).
    """
    grads_flat = tree_flatten(grad_tree)
    weights_flat = tree_flatten(weight_tree)
    _check_tree_update_inputs(grads_flat, weights_flat, slots)
    grads_norm = _flat_l2_norm(grads_flat)
    if self._clip_grad_norm is not None:
      grads_flat = _clip_flat(grads_flat, grads_norm, self._clip_grad_norm)
    weights_norm = _flat_l2_norm(weights_flat)
    new_weights_flat, new_slots_flat = [], []
    for index, (g, w, s) in enumerate(zip(grads_flat, weights_flat, slots)):
      new_w, new_s = self.update(step, g, w, s, opt_params)
      _check_new_weights(index, w, new_w)
      new_weights_flat.append(new_w)
      new_slots_flat.append(new_s)
    new_weights = tree_unflatten(new_weights_flat, weight_tree)
    new_slots = tuple(new_slots_flat)
    if store_slots:
      self._slots = new_slots
    stats = {'gradients_l2': grads_norm, 'weights_l2': weights_norm}
    return new_weights, new_slots, stats


def _check_tree_update_inputs(grads_flat, weights_flat, slots):
  if len(grads_flat) != len(weights_flat):
    raise ArgumentValueError(
        f'grad_tree has {len(grads_flat)} arrays but weight_tree has '
        f'{len(weights_flat)}; gradients must have the structure of the '
        'weights.')
  if slots is None or len(slots) != len(weights_flat):
    got = 'None' if slots is None else f'{len(slots)} entries'
    raise ArgumentValueError(
        f'slots must hold one entry per weight array ({len(weights_flat)}); '
        f'got {got}. Create them with tree_init(weight_tree).')
  for index, (g, w) in enumerate(zip(grads_flat, weights_flat)):
    if jnp.shape(g) != jnp.shape(w):
      raise ArgumentValueError(
          f'Gradient {index} has shape {jnp.shape(g)} but weight array '
          f'{index} has shape {jnp.shape(w)}.')


def _check_new_weights(index, weights, new_weights):
  if not hasattr(new_weights, 'dtype'):
    raise ValueError(
        f'New weight array {index} should be an array; got '
        f'{type(new_weights).__name__}.')
  if jnp.result_type(new_weights) != jnp.result_type(weights):
    raise ValueError(
        f'New weight array {index} has dtype {jnp.result_type(new_weights)} '
        f'but the old one has dtype {jnp.result_type(weights)}.')


def set_learning_rate(opt_params, learning_rate):
  """Sets ``opt_params['learning_rate']``, keeping the dtype it had there.

  Args:
    opt_params: an optimizer's hyperparameter dict (changed in place).
    learning_rate: the new value (a number or a scalar array).
  """
  old = opt_params.get('learning_rate')
  dtype = np.asarray(old).dtype if old is not None else np.float32
  opt_params['learning_rate'] = jnp.asarray(learning_rate, dtype)


@configurable('trax.optimizers')
class SGD(Optimizer):
  """Stochastic gradient descent: ``w <- w - learning_rate * g``; no slots."""

  def transform(self, step, opt_params):
    del step
    return chain_stateless(_no_slots(),
                           optax.scale(-opt_params['learning_rate']))

