"""Adafactor (https://arxiv.org/abs/1804.04235), as in Trax."""

import jax.numpy as jnp
import optax

from retrax.configurable import configurable
from retrax.optimizers import base

__all__ = ['Adafactor', 'scale_by_trax_factored_rms']


def _decay_rate_pow(step, exponent):
  """Adafactor's second-moment decay at ``step``: ``1 - (step + 1)**-exponent``."""
  t = jnp.asarray(step).astype(jnp.float32) + 1.0
  return 1.0 - t**(-exponent)


def scale_by_trax_factored_rms(step, decay_rate, epsilon1, factored):
  r"""Adafactor's second-moment scaling for one array, with Trax's slots.

  With ``d = 1 - (step + 1)**-decay_rate``, an array of rank >= 2 (when
  ``factored``) keeps row and column averages of ``g**2`` over its last two
  axes:

  .. math::
      r \leftarrow d\, r + (1 - d)\, \text{mean}_{-1}(g^2), \quad
      c \leftarrow d\, c + (1 - d)\, \text{mean}_{-2}(g^2), \\
      u = g \cdot \sqrt{\frac{\text{mean}(r)}{r + \epsilon_1}}
          \cdot (c + \epsilon_1)^{-1/2}

  and any other array a full average ``v`` with ``u = g (v + eps1)**-1/2``.
  Unlike ``optax.scale_by_factored_rms``, arrays are factored whatever their
  size, always over the last two axes, and ``eps1`` is added to the averages.

  Args:
    step: Training step.
    decay_rate: The exponent of the decay schedule.
    epsilon1: Added to the averages of squared gradients.
    factored: Whether to factor arrays of rank >= 2.

  Returns:
    An ``optax.GradientTransformation`` whose state is the list
    ``[v_row, v_col]`` (float32) or ``[v]``.
  """

  def is_factored(params):
    return factored and jnp.ndim(params) >= 2

  def init_fn(params):
    shape = jnp.shape(params)
    if is_factored(params):
      return [jnp.zeros(shape[:-1], jnp.float32),
              jnp.zeros(shape[:-2] + shape[-1:], jnp.float32)]
    return [jnp.zeros_like(params)]

  def update_fn(grads, slots, params=None):
    decay = _decay_rate_pow(step, decay_rate)
    mixing = 1.0 - decay
    grads_sqr = grads * grads
    if is_factored(grads):
      v_row, v_col = slots
      new_v_row = decay * v_row + mixing * jnp.mean(grads_sqr, axis=-1)
      new_v_col = decay * v_col + mixing * jnp.mean(grads_sqr, axis=-2)
      row_mean = jnp.mean(new_v_row, axis=-1, keepdims=True)
      row_factor = (row_mean / (new_v_row + epsilon1))**0.5
      col_factor = (new_v_col + epsilon1)**-0.5
      updates = (grads * jnp.expand_dims(row_factor, axis=-1)
                 * jnp.expand_dims(col_factor, axis=-2))
      return updates, [new_v_row, new_v_col]
    (v,) = slots
    new_v = decay * v + mixing * grads_sqr
    return grads * (new_v + epsilon1)**-0.5, [new_v]

  return optax.GradientTransformation(init_fn, update_fn)


def _weight_decay_at(step, weight_decay_rate, weight_decay_n_steps):
  """Trax's Adafactor weight decay, fading to zero over n_steps if n_steps>=1."""
  n_steps = jnp.asarray(weight_decay_n_steps).astype(jnp.float32)
  step = jnp.asarray(step).astype(jnp.float32)
  fading = (weight_decay_rate * jnp.maximum(n_steps - step, 0.0)
            / jnp.maximum(n_steps, 1.0))
  return jnp.where(n_steps < 1, weight_decay_rate, fading)


@configurable('trax.optimizers')
class Adafactor(base.Optimizer):
  r"""Adafactor optimizer, as in Trax.

  Per weight array ``w`` with gradient ``g``:

  1. ``y`` = ``g`` scaled by factored (or full) second moments
     (:func:`scale_by_trax_factored_rms`);
  2. if ``do_clipping``: ``y /= max(1, rms(y) / clipping_threshold)``;
  3. ``s = learning_rate * y``, times ``max(rms(w), epsilon2)`` if
     ``multiply_by_parameter_scale``;
  4. if ``do_momentum``: ``m <- beta1 m + (1 - beta1) s`` and ``s = m``;
  5. ``w <- (1 - weight_decay) w - s``, where the weight decay fades linearly
     to zero over ``weight_decay_n_steps`` steps when that is >= 1.

  Slots per array: ``[v_row, v_col]`` for factored arrays, else ``[v]``, then
  ``m`` when ``do_momentum``.
  """

  def __init__(self,
               learning_rate=0.05,
               factored=True,
               multiply_by_parameter_scale=True,
               do_clipping=True,
               do_momentum=False,
               momentum_in_bfloat16=False,
               beta1=0.0,
               decay_rate=0.8,
               clipping_threshold=1.0,
               weight_decay_rate=1e-5,
               weight_decay_n_steps=0,
               epsilon1=1e-16,
               epsilon2=1e-3,
               clip_grad_norm=None):
    """Creates an Adafactor optimizer.

    Args:
      learning_rate: Step size (relative to the parameter scale when
        ``multiply_by_parameter_scale``).
      factored: Whether to factor second moments of arrays of rank >= 2.
      multiply_by_parameter_scale: Whether to scale steps by the weights' RMS.
      do_clipping: Whether to clip each array's update by its RMS.
      do_momentum: Whether to keep a momentum slot (uses ``beta1``).
      momentum_in_bfloat16: Whether to store momentum in bfloat16.
      beta1: Momentum coefficient.
      decay_rate: Exponent of the second-moment decay schedule.
      clipping_threshold: RMS bound for update clipping.
      weight_decay_rate: Fraction of each weight subtracted every step.
      weight_decay_n_steps: If >= 1, the weight decay fades to zero over this
        many steps.
      epsilon1: Added to the averages of squared gradients.
      epsilon2: Lower bound of the parameter scale.
      clip_grad_norm: Global gradient-norm bound, or None (an addition to
        Trax's arguments).
    """
    self._factored = bool(factored)
    self._multiply_by_parameter_scale = bool(multiply_by_parameter_scale)
    self._do_clipping = bool(do_clipping)
    self._do_momentum = bool(do_momentum)
    self._momentum_in_bfloat16 = bool(momentum_in_bfloat16)
    super().__init__(
        learning_rate=learning_rate,
        clip_grad_norm=clip_grad_norm,
        beta1=beta1,
        decay_rate=decay_rate,
        clipping_threshold=clipping_threshold,
        weight_decay_rate=weight_decay_rate,
        weight_decay_n_steps=weight_decay_n_steps,
        epsilon1=epsilon1,
        epsilon2=epsilon2,
    )

  def transform(self, step, opt_params):
    second_moments = scale_by_trax_factored_rms(
        step, opt_params['decay_rate'], opt_params['epsilon1'], self._factored)
    scaling = []
    if self._do_clipping:
      scaling.append(optax.clip_by_block_rms(opt_params['clipping_threshold']))
    if self._multiply_by_parameter_scale:
      scaling.append(optax.scale_by_param_block_rms(opt_params['epsilon2']))
    scaling.append(optax.scale(opt_params['learning_rate']))
    weight_decay = _weight_decay_at(step, opt_params['weight_decay_rate'],
                                    opt_params['weight_decay_n_steps'])
    finish = [optax.scale(-1.0), optax.add_decayed_weights(-weight_decay)]
    do_momentum = self._do_momentum
    momentum_dtype = jnp.bfloat16 if self._momentum_in_bfloat16 else None
    beta1 = opt_params['beta1']

    def init_fn(params):
      slots = second_moments.init(params)
      if do_momentum:
        slots.append(jnp.zeros_like(params, dtype=momentum_dtype))
      return slots

    def update_fn(grads, slots, params=None):
      n_moment_slots = len(slots) - 1 if do_momentum else len(slots)
      y, new_slots = second_moments.update(
          grads, list(slots[:n_moment_slots]), params)
      subtrahend = base.apply_stateless(scaling, y, params)
      if do_momentum:
        m = slots[-1]
        new_m = beta1 * m.astype(subtrahend.dtype) + (1.0 - beta1) * subtrahend
        subtrahend = new_m
        new_slots.append(new_m.astype(m.dtype))
      return base.apply_stateless(finish, subtrahend, params), new_slots

    return optax.GradientTransformation(init_fn, update_fn)
