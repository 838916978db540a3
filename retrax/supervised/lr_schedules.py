"""Trax's module path ``trax.supervised.lr_schedules``: re-exports :mod:`retrax.lr`.

It also has Trax's body-and-tail building blocks with Trax's tail protocol
(``tail_fn(step_number, tail_start, body_value)``), under their public names
and Trax's (``_BodyAndTail``, ``_CosineSawtoothTail``).
"""

import math

import numpy as np

from retrax.lr import EvalAdjustingSchedule as EvalAdjustingSchedule
from retrax.lr import FACTOR_NAMES as FACTOR_NAMES
from retrax.lr import MultifactorSchedule as MultifactorSchedule
from retrax.lr import constant as constant
from retrax.lr import multifactor as multifactor
from retrax.lr import warmup as warmup
from retrax.lr import warmup_and_rsqrt_decay as warmup_and_rsqrt_decay
from retrax.validation import ArgumentValueError


class BodyAndTail:
  """A linear ramp from (0, 0), a constant body, then an optional tail.

  Args:
    body_value: the body's learning rate (the ramp's end, the tail's scale).
    body_start: first step of the body (default `tail_start`: no body);
      steps before it ramp linearly.
    tail_start: first step of the tail, or None for a body to the end.
    tail_fn: `(step_number, tail_start, body_value) -> learning rate`.
  """

  def __init__(self, body_value, body_start=None, tail_start=None,
               tail_fn=None):
    if body_start is None and tail_start is None:
      raise ArgumentValueError('BodyAndTail: body_start and tail_start are both None.')
    if tail_start is not None and tail_fn is None:
      raise ArgumentValueError(f'BodyAndTail: tail_start is {tail_start} but tail_fn '
                               'is None.')
    self._body_value = body_value
    self._body_start = tail_start if body_start is None else body_start
    self._tail_start = tail_start
    self._tail_fn = tail_fn

  def __call__(self, step_number):
    if step_number < self._body_start:
      return (step_number / self._body_start) * self._body_value
    if self._tail_start is not None and step_number >= self._tail_start:
      return self._tail_fn(step_number, self._tail_start, self._body_value)
    return self._body_value


class CosineSawtoothTail:
  """A tail of half-cosine cycles from `body_value` down to `min_value`.

  Each cycle of `steps_per_cycle` steps restarts at the body value (warm
  restarts, https://arxiv.org/abs/1608.03983).
  """

  def __init__(self, steps_per_cycle, min_value=1e-5):
    if not steps_per_cycle > 0:
      raise ArgumentValueError(f'CosineSawtoothTail: steps_per_cycle must be > 0; '
                               f'got {steps_per_cycle!r}.')
    self._steps_per_cycle = steps_per_cycle
    self._min_value = min_value

  def __call__(self, step_number, tail_start, body_value):
    position = ((step_number - tail_start) / self._steps_per_cycle) % 1.0
    cosine = np.cos(math.pi * position)
    return self._min_value + (body_value - self._min_value) * .5 * (1 + cosine)


_BodyAndTail = BodyAndTail
_CosineSawtoothTail = CosineSawtoothTail
