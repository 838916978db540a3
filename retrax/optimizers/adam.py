"""Adam with Trax's epsilon and decoupled weight decay."""

import jax.numpy as jnp
import optax

from retrax.configurable import configurable
from retrax.optimizers import base

__all__ = ['Adam', 'scale_by_trax_adam']


def scale_by_trax_adam(step, b1, b2, eps) -> optax.GradientTransformation:
  r"""Adam's direction for one weight array, with Trax's ``(m, v)`` slot.

  .. math::
      m \leftarrow \beta_1 m + (1 - \beta_1) g, \quad
      v \leftarrow \beta_2 v + (1 - \beta_2) g^2, \\
      u = \frac{m / (1 - \beta_1^{t+1})}{\sqrt{v / (1 - \beta_2^{t+1})}
          + \epsilon}

  with ``t = step``. This is ``optax.scale_by_adam`` (``eps`` outside the
  square root, applied to the bias-corrected ``v``, as in Trax) with its step
  count taken from ``step`` instead of being kept in the state.

  Args:
    step: Training step ``t`` (bias correction uses ``t + 1``).
    b1: Decay rate of the first moment.
    b2: Decay rate of the second moment.
    eps: Added to the square root of the second moment.

  Returns:
    An ``optax.GradientTransformation`` whose state is the tuple ``(m, v)``.
  """
  inner = optax.scale_by_adam(b1=b1, b2=b2, eps=eps)

  def init_fn(params):
    return (jnp.zeros_like(params), jnp.zeros_like(params))

  def update_fn(updates, slots, params=None):
    del params
    m, v = slots
    # A float count: `b1 ** count` then stays float arithmetic (an int32
    # exponent fails under strict dtype promotion).
    state = optax.ScaleByAdamState(
        count=jnp.asarray(step).astype(jnp.float32), mu=m, nu=v)
    updates, state = inner.update(updates, state)
    return updates, (state.mu, state.nu)

  return optax.GradientTransformation(init_fn, update_fn)


@configurable('trax.optimizers')
class Adam(base.Optimizer):
  r"""Adam optimizer (https://arxiv.org/abs/1412.6980), as in Trax.

  .. math::
      w \leftarrow (1 - \text{weight\_decay\_rate})\, w
          - \text{learning\_rate} \cdot u

  where ``u`` is Adam's bias-corrected direction (see
  :func:`scale_by_trax_adam`). The weight decay is decoupled and, unlike
  ``optax.adamw``, not multiplied by the learning rate. Slots per weight array:
  ``(m, v)``.
  """

  def __init__(self, learning_rate=0.0001, weight_decay_rate=1e-5, b1=0.9,
               b2=0.999, eps=1e-5, clip_grad_norm=None):
    """Creates an Adam optimizer.

    Args:
      learning_rate: Step size.
      weight_decay_rate: Fraction of each weight subtracted every step.
      b1: Decay rate of the first-moment estimate.
      b2: Decay rate of the second-moment estimate.
      eps: Added to the square root of the second moment.
      clip_grad_norm: Global gradient-norm bound, or None for no clipping.
    """
    super().__init__(learning_rate=learning_rate,
                     clip_grad_norm=clip_grad_norm,
                     weight_decay_rate=weight_decay_rate,
                     b1=b1, b2=b2, eps=eps)

  def transform(self, step, opt_params):
    return base.chain_stateless(
        scale_by_trax_adam(step, opt_params['b1'], opt_params['b2'],
                           opt_params['eps']),
        optax.scale(-opt_params['learning_rate']),
        optax.add_decayed_weights(-opt_params['weight_decay_rate']),
    )
