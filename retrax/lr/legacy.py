"""Trax 1.2's history-based schedules (``trax.learning_rate``).

These are factories ``history -> (step -> {'learning_rate': lr})``, as Trax
1.2's legacy ``Trainer`` expects for its ``lr_schedule`` argument.
"""

import jax.numpy as jnp
import numpy as np

from retrax.lr import schedules
from retrax.validation import ArgumentTypeError

__all__ = ['EvalAdjustingSchedule', 'MultifactorSchedule']

_LEGACY_FACTOR_NAMES = ('constant', 'linear_warmup', 'rsqrt_decay',
                        'rsqrt_normalized_decay', 'decay_every',
                        'cosine_decay')


def MultifactorSchedule(history=None,
                        factors='constant * linear_warmup * rsqrt_decay',
                        constant=0.1,
                        warmup_steps=400,
                        decay_factor=0.5,
                        steps_per_decay=20000,
                        steps_per_cycle=100000):
  """Factor-based schedule of Trax 1.2, returning ``{'learning_rate': lr}``.

  The factors are those of :func:`retrax.lr.multifactor` except
  ``two_constants``; ``cosine_decay`` is clipped at 0 and the result is a
  float32 scalar, as in Trax 1.2.

  Args:
    history: The training history; unused.
    factors: The factor names joined by ``*``.
    constant: The constant factor.
    warmup_steps: Warm-up length, also the start of decays.
    decay_factor: Multiplier applied every ``steps_per_decay`` steps.
    steps_per_decay: Period of ``decay_every``.
    steps_per_cycle: Period of ``cosine_decay``.

  Returns:
    A function ``step -> {'learning_rate': float32 scalar}``.

  Raises:
    ValueError: for an unknown factor name, or a zero period or warm-up that
      a chosen factor divides by.
  """
  del history
  names = schedules.parse_factors(factors, known=_LEGACY_FACTOR_NAMES)
  schedules.check_factor_params(names, warmup_steps, steps_per_decay,
                                steps_per_cycle)
  params = dict(constant=constant, warmup_steps=warmup_steps,
                decay_factor=decay_factor, steps_per_decay=steps_per_decay,
                steps_per_cycle=steps_per_cycle)

  def learning_rate(step):
    xp = schedules.array_module(step)
    value = schedules.factor_product(names, step, xp, params,
                                     clip_cosine=True)
    if xp is np:
      return {'learning_rate': np.asarray(value, dtype=np.float32)}
    return {'learning_rate': jnp.asarray(value, dtype=jnp.float32)}

  return learning_rate


def EvalAdjustingSchedule(history,
                          constant=0.1,
                          steps_to_decrease=20,
                          improvement_margin=0.001,
                          decrease_rate=1.5,
                          history_mode='eval',
                          metric='metrics/accuracy'):
  """Trax 1.2's schedule that lowers the constant when a metric stalls.

  Walking the recorded values of ``metric`` from the newest back (the oldest
  one is never compared, as in Trax), each value that fails to beat the best
  so far by ``improvement_margin`` counts as a step without improvement;
  after ``steps_to_decrease`` of them the constant is divided by
  ``decrease_rate`` and the count restarts. The result is
  ``MultifactorSchedule(history, constant=adjusted)``.

  Args:
    history: An object whose ``get(mode, metric)`` returns the recorded
      ``(step, value)`` pairs, oldest first.
    constant: The starting constant.
    steps_to_decrease: Evaluations without improvement before a decrease.
    improvement_margin: Relative improvement needed to count as improved.
    decrease_rate: Divisor applied to the constant at each decrease.
    history_mode: The history mode to read (e.g. ``'eval'``).
    metric: The metric to watch.

  Returns:
    A function ``step -> {'learning_rate': float32 scalar}``.

  Raises:
    TypeError: if ``history`` has no ``get`` method.
  """
  if not callable(getattr(history, 'get', None)):
    raise ArgumentTypeError(
        'EvalAdjustingSchedule needs a history with get(mode, metric); got '
        f'{type(history).__name__}.')
  values = [value for _, value in history.get(history_mode, metric)]
  adjusted = constant
  if len(values) < 2:
    return MultifactorSchedule(history, constant=adjusted)
  steps_without_improvement = 0
  current = values.pop()
  while len(values) > 1:
    previous = values.pop()
    if current < previous * (1 + improvement_margin):
      steps_without_improvement += 1
    else:
      current = previous
      steps_without_improvement = 0
    if steps_without_improvement >= steps_to_decrease:
      adjusted /= decrease_rate
      current = previous
      steps_without_improvement = 0
  return MultifactorSchedule(history, constant=adjusted)
