r"""Learning-rate schedules, as in Trax: functions ``step -> learning_rate``.

Every schedule accepts a Python or NumPy number (or a NumPy array of steps)
and then computes in NumPy float64, the way Trax's training loop runs its
schedules, returning a Python float (an array for an array of steps). Given a
JAX array, including a value traced inside ``jax.jit``, it computes with
``jax.numpy`` and returns a JAX scalar, so a schedule can run inside a jitted
training step.

Examples:
  >>> from retrax import lr
  >>> schedule = lr.warmup_and_rsqrt_decay(n_warmup_steps=99, max_value=0.01)
  >>> schedule(50), schedule(100), schedule(400)
  (0.005, 0.01, 0.005)
"""

import jax
import jax.numpy as jnp
import numpy as np

from retrax import validation
from retrax.configurable import configurable
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError

__all__ = [
    'FACTOR_NAMES',
    'constant',
    'multifactor',
    'warmup',
    'warmup_and_rsqrt_decay',
]

FACTOR_NAMES = ('constant', 'two_constants', 'linear_warmup', 'rsqrt_decay',
                'rsqrt_normalized_decay', 'decay_every', 'cosine_decay')
"""The factor names :func:`multifactor` understands."""


# Evaluating on either backend.


def array_module(step):
  """``jax.numpy`` for JAX arrays (traced or not), else ``numpy``."""
  return jnp if isinstance(step, jax.Array) else np


def as_float(step, xp):
  """``step`` as a float array of the backend's default float type."""
  return xp.asarray(step).astype(float if xp is np else jnp.result_type(float))


def finish(value, xp):
  """A Python float (NumPy scalar) or an array (NumPy array or JAX)."""
  if xp is np:
    value = np.asarray(value, dtype=np.float64)
    return float(value) if value.ndim == 0 else value
  return jnp.asarray(value, dtype=jnp.result_type(float))


# Body-and-tail curves.


def _check_n_warmup_steps(owner, n_warmup_steps):
  validation.check_int(owner, 'n_warmup_steps', n_warmup_steps, 0)


@configurable('trax.supervised.lr_schedules')
def constant(value):
  """Returns a schedule that is ``value`` from step 1 on.

  As in Trax, step 0 lies on the warm-up line from (0, 0) and gives 0.

  Args:
    value: The learning rate.

  Returns:
    A function ``step -> learning_rate``.
  """
  validation.check_real('lr.constant', 'value', value)
  return _BodyAndTail(value, body_start=1)


@configurable('trax.supervised.lr_schedules')
def warmup(n_warmup_steps, max_value):
  """Returns a schedule with linear warm-up followed by a constant value.

  Args:
    n_warmup_steps: Number of steps during which the learning rate rises on
      the line from (0, 0) to (n_warmup_steps + 1, max_value).
    max_value: The learning rate after warm-up.

  Returns:
    A function ``step -> learning_rate``.
  """
  _check_n_warmup_steps('lr.warmup', n_warmup_steps)
  validation.check_real('lr.warmup', 'max_value', max_value)
  return _BodyAndTail(max_value, body_start=n_warmup_steps + 1)


@configurable('trax.supervised.lr_schedules')
def warmup_and_rsqrt_decay(n_warmup_steps, max_value):
  r"""Returns a schedule with linear warm-up then reciprocal-sqrt decay.

  With ``s = n_warmup_steps + 1``: ``max_value * step / s`` below ``s``, then
  ``max_value * sqrt(s / step)``.

  Args:
    n_warmup_steps: Number of warm-up steps.
    max_value: The peak learning rate, reached at step ``n_warmup_steps + 1``.

  Returns:
    A function ``step -> learning_rate``.
  """
  _check_n_warmup_steps('lr.warmup_and_rsqrt_decay', n_warmup_steps)
  validation.check_real('lr.warmup_and_rsqrt_decay', 'max_value', max_value)
  return _BodyAndTail(max_value, tail_start=n_warmup_steps + 1,
                      tail_fn=_rsqrt)


class _BodyAndTail:
  """A curve made of a linear ramp, a constant body and an optional tail.

  The ramp follows the line from (0, 0) to (body_start, body_value); the body
  is ``body_value``; from ``tail_start`` on, ``tail_fn(xp, step, tail_start,
  body_value)`` gives the value.
  """

  def __init__(self, body_value, body_start=None, tail_start=None,
               tail_fn=None):
    if body_start is None and tail_start is None:
      raise ArgumentValueError('BodyAndTail: body_start and tail_start are both None.')
    if tail_start is not None and tail_fn is None:
      raise ArgumentValueError(
          f'BodyAndTail: tail_start is {tail_start} but tail_fn is None.')
    self._body_value = body_value
    self._body_start = tail_start if body_start is None else body_start
    self._tail_start = tail_start
    self._tail_fn = tail_fn

  def __call__(self, step):
    xp = array_module(step)
    step = as_float(step, xp)
    ramp = (step / self._body_start) * self._body_value
    value = xp.where(step < self._body_start, ramp, self._body_value)
    if self._tail_start is not None:
      tail = self._tail_fn(xp, step, self._tail_start, self._body_value)
      value = xp.where(step >= self._tail_start, tail, value)
    return finish(value, xp)


def _rsqrt(xp, step, tail_start, body_value):
  """``body_value * sqrt(tail_start / step)``: joins the body at tail_start."""
  # Steps below 1 are never in a tail (tail_start >= 1); the clamp only keeps
  # the unused branch of `where` finite.
  return body_value * (xp.sqrt(tail_start) / xp.sqrt(xp.maximum(step, 1.0)))


# Factor products.


def parse_factors(factors, known=FACTOR_NAMES):
  """Splits ``'a * b * c'`` into names, rejecting names not in ``known``.

  Args:
    factors: A string of factor names separated by ``*``.
    known: The accepted names.

  Returns:
    The list of names.

  Raises:
    TypeError: if ``factors`` is not a string.
    ValueError: for an unknown name.
  """
  if not isinstance(factors, str):
    raise ArgumentTypeError(
        f"factors must be a string such as 'constant * linear_warmup'; got "
        f'{type(factors).__name__}.')
  names = [name.strip() for name in factors.split('*')]
  for name in names:
    if name not in known:
      raise ArgumentValueError(
          f'Unknown factor {name!r} in factors={factors!r}; known factors: '
          f'{", ".join(known)}.')
  return names


def check_factor_params(names, warmup_steps, steps_per_decay, steps_per_cycle):
  """Rejects parameters that the chosen factors would divide by."""
  divisors = (('linear_warmup', 'warmup_steps', warmup_steps),
              ('decay_every', 'steps_per_decay', steps_per_decay),
              ('cosine_decay', 'steps_per_cycle', steps_per_cycle))
  for factor, param, value in divisors:
    if factor in names and not value > 0:
      raise ArgumentValueError(
          f'Factor {factor!r} needs {param} > 0; got {value!r}.')


def factor_product(names, step, xp, params, clip_cosine=False):
  """The product of the named factors at ``step``, computed with ``xp``.

  Args:
    names: Factor names (see :data:`FACTOR_NAMES`).
    step: The step: a number or array of the backend ``xp``.
    xp: ``numpy`` or ``jax.numpy``.
    params: A dict with ``constant``, ``warmup_steps``, ``decay_factor``,
      ``steps_per_decay``, ``steps_per_cycle``, and for ``two_constants``
      ``second_constant`` and ``second_constant_step``.
    clip_cosine: Whether to clip the cosine factor at 0 (Trax 1.2's
      ``MultifactorSchedule`` did).

  Returns:
    The learning rate, before any minimum is applied.
  """
  step_int = xp.asarray(step)
  step = as_float(step, xp)
  warmup_steps = params['warmup_steps']
  value = 1.0
  for name in names:
    if name == 'constant':
      value *= params['constant']
    elif name == 'two_constants':
      value *= xp.where(step < params['second_constant_step'],
                        params['constant'], params['second_constant'])
    elif name == 'linear_warmup':
      value *= xp.minimum(1.0, step / warmup_steps)
    elif name == 'rsqrt_decay':
      value /= xp.sqrt(xp.maximum(step, warmup_steps))
    elif name == 'rsqrt_normalized_decay':
      value *= xp.sqrt(warmup_steps)
      value /= xp.sqrt(xp.maximum(step, warmup_steps))
    elif name == 'decay_every':
      n_decays = as_float(step_int // params['steps_per_decay'], xp)
      value *= params['decay_factor']**n_decays
    elif name == 'cosine_decay':
      progress = xp.maximum(
          0.0, (step - warmup_steps) / float(params['steps_per_cycle']))
      cosine = 0.5 * (1.0 + xp.cos(xp.pi * (progress % 1.0)))
      value *= xp.maximum(0.0, cosine) if clip_cosine else cosine
    else:
      raise ArgumentValueError(f'Unknown factor {name!r}.')
  return value


def _check_real_params(params, minimum):
  """The real-valued multifactor arguments are finite reals."""
  for name in ('constant', 'decay_factor', 'second_constant'):
    validation.check_real('lr.multifactor', name, params[name])
  validation.check_real('lr.multifactor', 'minimum', minimum)


@configurable('trax.supervised.lr_schedules')
def multifactor(factors='constant * linear_warmup * rsqrt_decay',
                constant=0.1,
                warmup_steps=400,
                decay_factor=0.5,
                steps_per_decay=20000,
                steps_per_cycle=100000,
                second_constant=0.01,
                second_constant_step=10000,
                minimum=0):
  """Returns a schedule that multiplies named factors, as Trax's multifactor.

  Factors (separated by ``*``):

  * ``constant``: ``constant``;
  * ``two_constants``: ``constant`` before ``second_constant_step``, then
    ``second_constant``;
  * ``linear_warmup``: ``min(1, step / warmup_steps)``;
  * ``rsqrt_decay``: ``1 / sqrt(max(step, warmup_steps))``;
  * ``rsqrt_normalized_decay``: ``sqrt(warmup_steps / max(step,
    warmup_steps))``;
  * ``decay_every``: ``decay_factor ** (step // steps_per_decay)``;
  * ``cosine_decay``: ``0.5 * (1 + cos(pi * (p % 1)))`` with
    ``p = max(0, (step - warmup_steps) / steps_per_cycle)``.

  Values at or below ``minimum`` become ``minimum``.

  Args:
    factors: The factor names joined by ``*``.
    constant: The constant factor.
    warmup_steps: Warm-up length, also the start of decays.
    decay_factor: Multiplier applied every ``steps_per_decay`` steps.
    steps_per_decay: Period of ``decay_every``.
    steps_per_cycle: Period of ``cosine_decay``.
    second_constant: The constant after ``second_constant_step``.
    second_constant_step: Where ``two_constants`` switches.
    minimum: Lower bound of the learning rate.

  Returns:
    A function ``step -> learning_rate``.

  Raises:
    ValueError: for an unknown factor name, or a zero period or warm-up that
      a chosen factor divides by.
  """
  names = parse_factors(factors)
  check_factor_params(names, warmup_steps, steps_per_decay, steps_per_cycle)
  params = dict(constant=constant, warmup_steps=warmup_steps,
                decay_factor=decay_factor, steps_per_decay=steps_per_decay,
                steps_per_cycle=steps_per_cycle,
                second_constant=second_constant,
                second_constant_step=second_constant_step)
  _check_real_params(params, minimum)

  def learning_rate(step):
    xp = array_module(step)
    value = factor_product(names, step, xp, params)
    return finish(xp.where(value <= minimum, minimum, value), xp)

  return learning_rate
