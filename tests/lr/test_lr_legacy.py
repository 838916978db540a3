"""Trax 1.2's history-based schedules against closed forms."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import lr


def legacy_reference(factors='constant * linear_warmup * rsqrt_decay',
                     constant=0.1, warmup_steps=400, decay_factor=0.5,
                     steps_per_decay=20000, steps_per_cycle=100000):
  names = [n.strip() for n in factors.split('*')]

  def reference(step):
    value = 1.0
    for name in names:
      if name == 'constant':
        value *= constant
      elif name == 'linear_warmup':
        value *= min(1.0, step / warmup_steps)
      elif name == 'rsqrt_decay':
        value /= math.sqrt(max(step, warmup_steps))
      elif name == 'rsqrt_normalized_decay':
        value *= math.sqrt(warmup_steps / max(step, warmup_steps))
      elif name == 'decay_every':
        value *= decay_factor**(step // steps_per_decay)
      elif name == 'cosine_decay':
        progress = max(0.0, (step - warmup_steps) / steps_per_cycle)
        value *= max(0.0, 0.5 * (1 + math.cos(math.pi * (progress % 1.0))))
    return value

  return reference


STEPS = np.unique(np.concatenate([np.arange(0, 1001), np.arange(1001, 100001,
                                                                97)]))


@pytest.mark.parametrize('kwargs', [
    {},
    dict(factors='constant * linear_warmup * rsqrt_normalized_decay',
         warmup_steps=1000),
    dict(factors='constant * decay_every', steps_per_decay=9000),
    dict(factors='constant * linear_warmup * cosine_decay',
         steps_per_cycle=25000),
])
def test_multifactor_schedule(kwargs):
  schedule = lr.MultifactorSchedule(None, **kwargs)
  reference = legacy_reference(**kwargs)
  expected = np.array([reference(int(s)) for s in STEPS])
  ours = [schedule(int(s)) for s in STEPS[::13]]
  assert all(set(o) == {'learning_rate'} for o in ours)
  assert all(o['learning_rate'].dtype == np.float32 for o in ours)
  np.testing.assert_allclose([o['learning_rate'] for o in ours],
                             expected[::13], rtol=1e-6)
  traced = jax.jit(jax.vmap(schedule))(jnp.asarray(STEPS, jnp.int32))
  assert traced['learning_rate'].dtype == jnp.float32
  np.testing.assert_allclose(traced['learning_rate'], expected, rtol=1e-5,
                             atol=1e-6 * expected.max())


def test_multifactor_schedule_has_no_two_constants():
  with pytest.raises(ValueError, match="Unknown factor 'two_constants'"):
    lr.MultifactorSchedule(factors='two_constants')


class FakeHistory:

  def __init__(self, values):
    self._values = [(10 * i, v) for i, v in enumerate(values)]

  def get(self, mode, metric):
    assert (mode, metric) == ('eval', 'metrics/accuracy')
    return list(self._values)


@pytest.mark.parametrize('values, n_decreases', [
    ([0.5], 0),                                  # too short to judge
    ([0.1 * i for i in range(45)], 0),           # always improving
    ([0.7] * 45, 2),                             # 43 stalls: 2 decreases
    # 19 stalls, then 0.7 beats the older 0.5 (reset), then 20 stalls.
    ([0.7] * 24 + [0.5] + [0.7] * 20, 1),
    # 0.7 fails to beat the older 0.9: the 20th stall, then 20 more.
    ([0.7] * 24 + [0.9] + [0.7] * 20, 2),
])
def test_eval_adjusting_schedule(values, n_decreases):
  schedule = lr.EvalAdjustingSchedule(FakeHistory(values))
  expected = lr.MultifactorSchedule(constant=0.1 / 1.5**n_decreases)
  for step in (1, 400, 5000):
    assert schedule(step)['learning_rate'] == pytest.approx(
        expected(step)['learning_rate'], rel=1e-6)


def test_eval_adjusting_schedule_needs_a_history():
  with pytest.raises(TypeError, match='needs a history with get'):
    lr.EvalAdjustingSchedule(None)
