"""SM3 (https://arxiv.org/abs/1901.11150), as in Trax."""

import enum

import jax.numpy as jnp
import optax

from retrax.configurable import configurable
from retrax.optimizers import base
from retrax.optimizers import momentum as momentum_lib
from retrax.validation import ArgumentValueError

__all__ = ['MomentumType', 'SM3', 'momentum_slot', 'scale_by_trax_sm3']

_TINY = 1e-16


class MomentumType(enum.IntEnum):
  """How SM3 accumulates momentum ``m`` from the preconditioned gradient ``p``.

  ``EMA``: ``m <- b m + (1 - b) p``, step ``m``; ``HEAVY_BALL``:
  ``m <- p + b m``, step ``m``; ``NESTEROV``: ``m <- p + b m``, step
  ``p + b m``.
  """
  EMA = 1
  HEAVY_BALL = 2
  NESTEROV = 3


def momentum_slot(beta1, momentum_type) -> optax.GradientTransformation:
  """Momentum of one weight array with the bare momentum array as slot.

  Built on ``optax.ema`` (without debiasing) or ``optax.trace``.

  Args:
    beta1: The momentum coefficient.
    momentum_type: A :class:`MomentumType`.

  Returns:
    An ``optax.GradientTransformation`` whose state is the momentum array.

  Raises:
    ValueError: for an unknown momentum type.
  """
  momentum_type = _check_momentum_type(momentum_type)
  if momentum_type != MomentumType.EMA:
    return momentum_lib.trace_slot(
        beta1, nesterov=momentum_type == MomentumType.NESTEROV)
  inner = optax.ema(decay=beta1, debias=False)

  def init_fn(params):
    return inner.init(params).ema

  def update_fn(updates, m, params=None):
    state = optax.EmaState(count=jnp.zeros([], jnp.int32), ema=m)
    updates, state = inner.update(updates, state, params)
    return updates, state.ema

  return optax.GradientTransformation(init_fn, update_fn)


def _check_momentum_type(momentum_type):
  try:
    return MomentumType(momentum_type)
  except ValueError:
    raise ArgumentValueError(
        f'momentum_type must be one of {[t.name for t in MomentumType]} '
        f'(values {[int(t) for t in MomentumType]}); got {momentum_type!r}.'
    ) from None


def _preconditioned(g, acc):
  """``g / (sqrt(acc) + 1e-16)``, zero where ``acc`` is zero."""
  inverse_root = jnp.where(acc > 0.0, 1.0 / (jnp.sqrt(acc) + _TINY),
                           jnp.zeros_like(acc))
  return inverse_root * g


def _cover_minimum(accumulators, shape):
  """The min over axes i of accumulator i broadcast along axis i of shape."""
  rank = len(shape)
  result = None
  for axis, acc in enumerate(accumulators):
    expanded = jnp.reshape(acc, [1] * axis + [shape[axis]]
                           + [1] * (rank - axis - 1))
    result = expanded if result is None else jnp.minimum(result, expanded)
  return result


def _cover_maxima(acc):
  """For each axis i, the max of acc over all axes but i."""
  rank = acc.ndim
  return [jnp.amax(acc, axis=tuple(a for a in range(rank) if a != axis))
          for axis in range(rank)]


def scale_by_trax_sm3(beta2, graft) -> optax.GradientTransformation:
  r"""SM3's preconditioning of one weight array, with Trax's accumulators.

  With ``c = 1`` if ``beta2 == 1`` (AdaGrad sums) else ``1 - beta2``: an array
  of rank <= 1 keeps a full accumulator ``a <- beta2 a + c g^2``; an array of
  rank k >= 2 keeps one vector per axis (its cover) and uses
  ``a = beta2 min_i(v_i) + c g^2``, then stores ``v_i = max over the other
  axes of a``. The output is ``p = g / (sqrt(a) + 1e-16)`` (0 where
  ``a == 0``). With ``graft``, a second AdaGrad accumulator ``a2`` (same
  layout, never decayed) rescales ``p`` to the norm of
  ``g / (sqrt(a2) + 1e-16)``.

  Args:
    beta2: Second-moment averaging (1.0 sums like AdaGrad).
    graft: Whether to keep the grafting accumulators.

  Returns:
    An ``optax.GradientTransformation`` whose state is ``(v1s, v2s)``, two
    lists of accumulators (``v2s`` empty without grafting).
  """

  def accumulators(params):
    shape = jnp.shape(params)
    if len(shape) <= 1:
      return [jnp.zeros(shape, dtype=params.dtype)]
    return [jnp.zeros(size, dtype=params.dtype) for size in shape]

  def init_fn(params):
    return accumulators(params), (accumulators(params) if graft else [])

  def update_fn(g, state, params=None):
    del params
    v1s, v2s = state
    is_beta2_1 = jnp.asarray(beta2 == 1).astype(g.dtype)
    one_minus_beta2 = is_beta2_1 + (1.0 - beta2) * (1.0 - is_beta2_1)
    diagonal = g.ndim <= 1
    if diagonal:
      acc = beta2 * v1s[0] + one_minus_beta2 * g * g
    else:
      acc = (beta2 * _cover_minimum(v1s, g.shape)
             + one_minus_beta2 * g * g)
    pg = _preconditioned(g, acc)
    new_v2s: list = []
    if graft:
      previous = v2s[0] if diagonal else _cover_minimum(v2s, g.shape)
      acc_graft = previous + g * g
      pg_graft = _preconditioned(g, acc_graft)
      pg = pg * (jnp.linalg.norm(pg_graft) / (jnp.linalg.norm(pg) + _TINY))
      new_v2s = [acc_graft] if diagonal else _cover_maxima(acc_graft)
    new_v1s = [acc] if diagonal else _cover_maxima(acc)
    return pg, (new_v1s, new_v2s)

  return optax.GradientTransformation(init_fn, update_fn)


@configurable('trax.optimizers')
class SM3(base.Optimizer):
  r"""SM3 optimizer, as in Trax.

  Per weight array: ``p`` = the SM3-preconditioned gradient
  (:func:`scale_by_trax_sm3`), ``p += weight_decay * w``, then momentum of
  kind ``momentum_type`` (none if ``momentum == 0``), and
  ``w <- w - learning_rate * step``. Slots per array: ``(m, v1s, v2s)``,
  where ``m`` is ``[]`` without momentum and ``v2s`` is ``[]`` unless
  ``second_moment_averaging != 1``.

  Scalar weights, which Trax's SM3 rejects, get one scalar accumulator.
  """

  def __init__(self,
               learning_rate=0.01,
               momentum=0.9,
               second_moment_averaging=1.0,
               weight_decay=0.0,
               momentum_type=MomentumType.EMA,
               clip_grad_norm=None):
    """Creates an SM3 optimizer.

    Args:
      learning_rate: Step size.
      momentum: Momentum coefficient; 0 for no momentum slot.
      second_moment_averaging: Decay of the second-moment accumulators; 1.0
        sums them from the start like AdaGrad, any other value also enables
        AdaGrad grafting.
      weight_decay: Coupled L2 weight decay, added to the preconditioned
        gradient.
      momentum_type: ``MomentumType.EMA`` (default), ``HEAVY_BALL`` or
        ``NESTEROV``.
      clip_grad_norm: Global gradient-norm bound, or None (an addition to
        Trax's arguments).
    """
    self._has_momentum = momentum > 0.0
    self._momentum_type = _check_momentum_type(momentum_type)
    self._graft = second_moment_averaging != 1.0
    super().__init__(
        learning_rate=learning_rate,
        clip_grad_norm=clip_grad_norm,
        momentum=momentum,
        second_moment_averaging=second_moment_averaging,
        weight_decay=weight_decay,
    )

  def transform(self, step, opt_params):
    del step
    preconditioner = scale_by_trax_sm3(opt_params['second_moment_averaging'],
                                       self._graft)
    decay = optax.add_decayed_weights(opt_params['weight_decay'])
    has_momentum = self._has_momentum
    momentum = momentum_slot(opt_params['momentum'], self._momentum_type)
    learning_rate = optax.scale(-opt_params['learning_rate'])

    def init_fn(params):
      m = momentum.init(params) if has_momentum else []
      v1s, v2s = preconditioner.init(params)
      return (m, v1s, v2s)

    def update_fn(grads, slots, params=None):
      m, v1s, v2s = slots
      pg, (v1s, v2s) = preconditioner.update(grads, (v1s, v2s), params)
      pg = base.apply_stateless([decay], pg, params)
      if has_momentum:
        pg, m = momentum.update(pg, m, params)
      updates = base.apply_stateless([learning_rate], pg, params)
      return updates, (m, v1s, v2s)

    return optax.GradientTransformation(init_fn, update_fn)
