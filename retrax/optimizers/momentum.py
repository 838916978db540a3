"""Momentum SGD (Nesterov by default) with Trax's weight decay."""

import optax

from retrax.configurable import configurable
from retrax.optimizers import base

__all__ = ['Momentum', 'trace_slot']


def trace_slot(mass, nesterov) -> optax.GradientTransformation:
  r"""``optax.trace`` for one weight array, with the bare velocity as slot.

  .. math::
      v \leftarrow \mu v + g, \qquad
      u = \mu v + g \ \text{(Nesterov)} \ \text{ or } \ u = v

  Args:
    mass: The momentum coefficient ``mu``.
    nesterov: Whether to apply the Nesterov correction.

  Returns:
    An ``optax.GradientTransformation`` whose state is the velocity array.
  """
  inner = optax.trace(decay=mass, nesterov=nesterov)

  def init_fn(params):
    return inner.init(params).trace

  def update_fn(updates, velocity, params=None):
    updates, state = inner.update(
        updates, optax.TraceState(trace=velocity), params)
    return updates, state.trace

  return optax.GradientTransformation(init_fn, update_fn)


@configurable('trax.optimizers')
class Momentum(base.Optimizer):
  r"""Momentum SGD, as in Trax (Sutskever et al. 2013; Bengio et al. 2012).

  .. math::
      v \leftarrow \mu v + g, \qquad
      w \leftarrow (1 - \alpha) w - \epsilon\, (\mu v + g)

  with ``mu = mass``, ``alpha = weight_decay_rate`` (not scaled by the learning
  rate) and ``epsilon = learning_rate``; without Nesterov the last factor is
  ``v``. Slot per weight array: the velocity ``v``.
  """

  def __init__(self, learning_rate=0.01, mass=0.9, weight_decay_rate=1e-5,
               nesterov=True, clip_grad_norm=None):
    """Creates a momentum optimizer.

    Args:
      learning_rate: Step size.
      mass: Momentum coefficient.
      weight_decay_rate: Fraction of each weight subtracted every step.
      nesterov: Whether to use the Nesterov correction.
      clip_grad_norm: Global gradient-norm bound, or None (an addition to
        Trax's arguments).
    """
    super().__init__(learning_rate=learning_rate,
                     clip_grad_norm=clip_grad_norm,
                     mass=mass, weight_decay_rate=weight_decay_rate)
    self._nesterov = bool(nesterov)

  def transform(self, step, opt_params):
    del step
    return base.chain_stateless(
        trace_slot(opt_params['mass'], self._nesterov),
        optax.scale(-opt_params['learning_rate']),
        optax.add_decayed_weights(-opt_params['weight_decay_rate']),
    )
