"""Any ``optax.GradientTransformation`` behind Trax's optimizer interface.

``as_optimizer`` is what a training loop calls on whatever it is given as an
optimizer: a retrax :class:`~retrax.optimizers.base.Optimizer` (instance or
class) or an optax transformation. ``from_optax`` builds one explicitly, and
from a factory such as ``optax.adam`` plus hyperparameters it makes those
hyperparameters settable per step through ``opt_params`` (so learning-rate
schedules drive it like a Trax optimizer).
"""

import inspect
from typing import Type, Union

import jax
import jax.numpy as jnp
import numpy as np
import optax

from retrax.optimizers import base
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

__all__ = ['OptaxOptimizer', 'as_optimizer', 'from_optax']


class OptaxOptimizer(base.Optimizer):
  """Wraps an ``optax.GradientTransformation`` as an :class:`Optimizer`.

  The transformation sees the whole weight tree at once, so tree-wide
  transformations (``optax.clip_by_global_norm`` ...) work; its state is the
  optimizer's ``slots``, as optax lays it out. The ``step`` argument is not
  used: optax transformations keep their own step count.

  ``opt_params`` are the transformation's injectable hyperparameters: those
  of an ``optax.inject_hyperparams`` transformation (for one built by
  :func:`from_optax`, known at once; otherwise after ``tree_init``), else
  none. Values passed in ``opt_params`` to
  ``tree_update`` replace them for that step; passing a name the
  transformation cannot take raises a ``ValueError``.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from retrax import optimizers
    >>> opt = optimizers.from_optax(optax.adam, learning_rate=1e-3)
    >>> weights = (jnp.zeros((2,)), ())
    >>> slots, opt_params = opt.tree_init(weights)
    >>> sorted(opt_params)
    ['b1', 'b2', 'eps', 'eps_root', 'learning_rate']
  """

  def __init__(self, transformation, clip_grad_norm=None, opt_params=None):
    """Wraps ``transformation``.

    Args:
      transformation: An ``optax.GradientTransformation``.
      clip_grad_norm: If not None, gradients are clipped to this global norm
        (Trax's way) before the transformation sees them.
      opt_params: Initial hyperparameters, for a transformation made with
        ``optax.inject_hyperparams``.
    """
    if not isinstance(transformation, optax.GradientTransformation):
      raise ArgumentTypeError(
          'OptaxOptimizer expects an optax.GradientTransformation (e.g. '
          f'optax.adam(1e-3)); got {type(transformation).__name__}.')
    super().__init__(clip_grad_norm=clip_grad_norm)
    self._transformation = transformation
    self._init_opt_params = {
        name: jnp.asarray(value) for name, value in (opt_params or {}).items()}

  @property
  def transformation(self) -> optax.GradientTransformation:
    """The wrapped optax transformation."""
    return self._transformation

  def init(self, weights):
    return self._transformation.init(weights)

  def update(self, step, grads, weights, slots, opt_params):
    del step
    return self._apply(grads, weights, slots, opt_params)

  def tree_init(self, weight_tree):
    """Initializes the transformation's state on the whole weight tree.

    Args:
      weight_tree: The model's weights.

    Returns:
      ``(slots, opt_params)``: the optax state and the injectable numeric
      hyperparameters (a dict, empty for a plain transformation).
    """
    self._slots = self._transformation.init(weight_tree)
    injected = _settable_hyperparams(self._slots)
    if injected is not None:
      self._init_opt_params = dict(injected)
    return self._slots, self._init_opt_params

  def tree_update(self, step, grad_tree, weight_tree, slots, opt_params,
                  store_slots=True):
    """Applies the transformation to the whole tree; see ``Optimizer``."""
    del step
    grads_flat = base.tree_flatten(grad_tree)
    weights_flat = base.tree_flatten(weight_tree)
    if len(grads_flat) != len(weights_flat):
      raise ArgumentValueError(
          f'grad_tree has {len(grads_flat)} arrays but weight_tree has '
          f'{len(weights_flat)}; gradients must have the structure of the '
          'weights.')
    grads_norm = base.l2_norm(grads_flat)
    weights_norm = base.l2_norm(weights_flat)
    if self._clip_grad_norm is not None:
      grad_tree = base.clip_grads(grad_tree, self._clip_grad_norm)
    new_weights, new_slots = self._apply(grad_tree, weight_tree, slots,
                                         opt_params)
    if store_slots:
      self._slots = new_slots
    stats = {'gradients_l2': grads_norm, 'weights_l2': weights_norm}
    return new_weights, new_slots, stats

  def _apply(self, grads, weights, state, opt_params):
    state = _with_hyperparams(state, opt_params)
    # optax's transformations mix dtypes (an int32 count with float decay
    # rates, float32 moments with bfloat16 weights) by JAX's standard rules.
    with jax.numpy_dtype_promotion('standard'):
      updates, new_state = self._transformation.update(grads, state, weights)
      return optax.apply_updates(weights, updates), new_state


def _settable_hyperparams(state):
  """The numeric hyperparameters of an inject_hyperparams state, else None."""
  hyperparams = getattr(state, 'hyperparams', None)
  if not isinstance(hyperparams, dict):
    return None
  scheduled = getattr(state, 'hyperparams_states', None) or {}
  return {name: value for name, value in hyperparams.items()
          if name not in scheduled}


def _with_hyperparams(state, opt_params):
  """Returns ``state`` with its injected hyperparameters set from opt_params."""
  if not opt_params:
    return state
  settable = _settable_hyperparams(state)
  if settable is None:
    raise ArgumentValueError(
        f'opt_params {sorted(opt_params)} cannot be applied: this optax '
        'transformation has no injectable hyperparameters. Build it with '
        'optax.inject_hyperparams(...) or retrax.optimizers.from_optax('
        'optax.adam, learning_rate=...), or pass empty opt_params.')
  unknown = sorted(set(opt_params) - set(settable))
  if unknown:
    raise ArgumentValueError(
        f'opt_params {unknown} are not settable hyperparameters of this optax '
        f'transformation; settable: {sorted(settable)} (hyperparameters given '
        'as optax schedules are driven by the schedule).')
  hyperparams = dict(state.hyperparams)
  for name, value in opt_params.items():
    dtype = jnp.result_type(hyperparams[name])
    hyperparams[name] = jnp.asarray(value).astype(dtype)
  return state._replace(hyperparams=hyperparams)


def from_optax(transformation, *, clip_grad_norm=None, **hyperparams):
  """Makes an :class:`Optimizer` from an optax transformation or factory.

  Args:
    transformation: An ``optax.GradientTransformation`` (e.g.
      ``optax.adamw(1e-3)``), or a factory returning one (e.g. ``optax.adam``)
      to be called with ``hyperparams`` through ``optax.inject_hyperparams``,
      which makes them ``opt_params`` a schedule can set each step.
    clip_grad_norm: Global gradient-norm bound, or None.
    **hyperparams: Arguments for the factory; boolean ones are passed as
      static arguments, numeric ones are kept in float32.

  Returns:
    An :class:`OptaxOptimizer`.

  Raises:
    TypeError: if ``transformation`` is neither, or if hyperparameters are
      given with an already built transformation.

  Examples:
    >>> import optax
    >>> from retrax import optimizers
    >>> opt = optimizers.from_optax(optax.sgd, learning_rate=0.1)
    >>> sorted(opt.opt_params)
    ['learning_rate']
  """
  if isinstance(transformation, optax.GradientTransformation):
    if hyperparams:
      raise ArgumentTypeError(
          f'Hyperparameters {sorted(hyperparams)} can only be given with a '
          'factory such as optax.adam, not with a built transformation.')
    return OptaxOptimizer(transformation, clip_grad_norm=clip_grad_norm)
  if not callable(transformation):
    raise ArgumentTypeError(
        'from_optax expects an optax.GradientTransformation or a factory '
        f'returning one (e.g. optax.adam); got {type(transformation).__name__}.')
  try:
    arguments = inspect.signature(transformation).bind(**hyperparams)
  except TypeError as error:
    raise ArgumentTypeError(
        f'Cannot call {getattr(transformation, "__name__", transformation)} '
        f'with {sorted(hyperparams)}: {error}.') from None
  arguments.apply_defaults()
  static = tuple(name for name, value in arguments.arguments.items()
                 if isinstance(value, bool))
  # float32 hyperparameters: in bfloat16, b2=0.999 would round to 1.
  built = optax.inject_hyperparams(
      transformation, static_args=static, hyperparam_dtype=jnp.float32)(
          **hyperparams)
  numeric = {
      name: jnp.asarray(value, jnp.float32)
      if isinstance(value, float) else value
      for name, value in arguments.arguments.items()
      if name not in static
      and isinstance(value, (int, float, np.ndarray, jax.Array))}
  return OptaxOptimizer(built, clip_grad_norm=clip_grad_norm,
                        opt_params=numeric)


# What `as_optimizer` (and so `TrainTask`) takes as an optimizer.
OptimizerLike = Union[base.Optimizer, Type[base.Optimizer],
                      optax.GradientTransformation]


def as_optimizer(optimizer: OptimizerLike) -> base.Optimizer:
  """Returns an :class:`Optimizer` for anything accepted as an optimizer.

  Args:
    optimizer: An ``Optimizer`` instance (returned as is), an ``Optimizer``
      subclass (instantiated with its defaults, as Trax's legacy trainer
      does), or an ``optax.GradientTransformation`` (wrapped in
      :class:`OptaxOptimizer`).

  Returns:
    An ``Optimizer``.

  Raises:
    TypeError: for anything else.
  """
  if isinstance(optimizer, base.Optimizer):
    return optimizer
  if isinstance(optimizer, optax.GradientTransformation):
    return OptaxOptimizer(optimizer)
  if isinstance(optimizer, type) and issubclass(optimizer, base.Optimizer):
    return optimizer()
  hint = ''
  if callable(optimizer):
    hint = (' For an optax factory such as optax.adam, call it (optax.adam'
            '(1e-3)) or use retrax.optimizers.from_optax(optax.adam, '
            'learning_rate=1e-3).')
  raise ArgumentTypeError(
      'Expected a retrax Optimizer (instance or class) or an '
      f'optax.GradientTransformation; got {optimizer!r}.{hint}')
