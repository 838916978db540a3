"""RMSProp, as in Trax (second moment starts at one)."""

import optax

from retrax.configurable import configurable
from retrax.optimizers import base

__all__ = ['RMSProp', 'scale_by_trax_rms']


def scale_by_trax_rms(gamma, eps) -> optax.GradientTransformation:
  r"""``optax.scale_by_rms`` for one weight array, with the bare average as slot.

  .. math::
      a \leftarrow \gamma a + (1 - \gamma) g^2, \qquad
      u = g / (\sqrt{a} + \epsilon)

  with ``a`` starting at one and ``eps`` outside the square root.

  Args:
    gamma: Decay rate of the squared-gradient average.
    eps: Added to the square root.

  Returns:
    An ``optax.GradientTransformation`` whose state is the average ``a``.
  """
  inner = optax.scale_by_rms(decay=gamma, eps=eps, initial_scale=1.0,
                             eps_in_sqrt=False)

  def init_fn(params):
    return inner.init(params).nu

  def update_fn(updates, avg_sq_grad, params=None):
    updates, state = inner.update(
        updates, optax.ScaleByRmsState(nu=avg_sq_grad), params)
    return updates, state.nu

  return optax.GradientTransformation(init_fn, update_fn)


@configurable('trax.optimizers')
class RMSProp(base.Optimizer):
  r"""RMSProp: ``w <- w - learning_rate * g / (sqrt(a) + eps)``.

  ``a`` is the exponential moving average of ``g**2`` with decay ``gamma``,
  starting at one; it is the slot of each weight array.
  """

  def __init__(self, learning_rate=0.001, gamma=0.9, eps=1e-8,
               clip_grad_norm=None):
    """Creates an RMSProp optimizer.

    Args:
      learning_rate: Step size.
      gamma: Decay rate of the squared-gradient average.
      eps: Added to the square root of the average.
      clip_grad_norm: Global gradient-norm bound, or None for no clipping.
    """
    super().__init__(learning_rate=learning_rate,
                     clip_grad_norm=clip_grad_norm, gamma=gamma, eps=eps)

  def transform(self, step, opt_params):
    del step
    return base.chain_stateless(
        scale_by_trax_rms(opt_params['gamma'], opt_params['eps']),
        optax.scale(-opt_params['learning_rate']),
    )
