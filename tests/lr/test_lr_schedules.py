"""Learning-rate schedules against closed forms of Trax's definitions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import lr
from retrax.supervised import lr_schedules


def sample_steps(*boundaries):
  """Every step to 2000, every 37th to 100000, and each boundary +-1."""
  extra = [b + d for b in boundaries for d in (-1, 0, 1) if b + d >= 0]
  return np.unique(np.concatenate([
      np.arange(2001), np.arange(2001, 100001, 37), [100000], extra]))


def check_schedule(schedule, reference, steps):
  """Python ints, a NumPy array of steps and jitted JAX steps all match."""
  expected = np.array([reference(int(s)) for s in steps])
  python_ints = np.array([schedule(int(s)) for s in steps[::7]])
  np.testing.assert_allclose(python_ints, expected[::7], rtol=1e-12)
  assert isinstance(schedule(int(steps[-1])), float)
  np.testing.assert_allclose(schedule(steps), expected, rtol=1e-12)
  traced = jax.jit(jax.vmap(schedule))(jnp.asarray(steps, jnp.int32))
  assert traced.dtype == jnp.float32
  np.testing.assert_allclose(traced, expected, rtol=1e-5,
                             atol=1e-6 * np.abs(expected).max())


def body_and_tail(value, body_start, tail_start=None):
  def reference(step):
    if step < body_start:
      return step / body_start * value
    if tail_start is not None and step >= tail_start:
      return value * math.sqrt(tail_start) / math.sqrt(step)
    return value
  return reference


def test_constant_is_zero_at_step_zero_then_constant():
  check_schedule(lr.constant(0.3), body_and_tail(0.3, 1), sample_steps(1))


@pytest.mark.parametrize('n_warmup_steps', [0, 1, 400])
def test_warmup(n_warmup_steps):
  check_schedule(lr.warmup(n_warmup_steps, 0.02),
                 body_and_tail(0.02, n_warmup_steps + 1),
                 sample_steps(n_warmup_steps))


@pytest.mark.parametrize('n_warmup_steps', [0, 1000])
def test_warmup_and_rsqrt_decay(n_warmup_steps):
  start = n_warmup_steps + 1
  check_schedule(lr.warmup_and_rsqrt_decay(n_warmup_steps, 0.01),
                 body_and_tail(0.01, start, start), sample_steps(start))


def multifactor_reference(factors, constant=0.1, warmup_steps=400,
                          decay_factor=0.5, steps_per_decay=20000,
                          steps_per_cycle=100000, second_constant=0.01,
                          second_constant_step=10000, minimum=0):
  names = [n.strip() for n in factors.split('*')]

  def reference(step):
    value = 1.0
    for name in names:
      if name == 'constant':
        value *= constant
      elif name == 'two_constants':
        value *= constant if step < second_constant_step else second_constant
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
        value *= 0.5 * (1 + math.cos(math.pi * (progress % 1.0)))
    return minimum if value <= minimum else value

  return reference


@pytest.mark.parametrize('factors, kwargs', [
    ('constant * linear_warmup * rsqrt_decay', {}),
    ('constant * linear_warmup * rsqrt_normalized_decay',
     dict(constant=1e-3, warmup_steps=1000)),
    ('two_constants * linear_warmup', dict(second_constant_step=5000)),
    ('constant * decay_every', dict(steps_per_decay=7000, decay_factor=0.7)),
    ('constant * linear_warmup * cosine_decay',
     dict(steps_per_cycle=30000, minimum=1e-3)),
    ('constant*rsqrt_decay', dict(warmup_steps=0, minimum=2e-4)),
])
def test_multifactor(factors, kwargs):
  boundaries = [400, 1000, 5000, 7000, 10000, 14000, 21000, 30400, 60400,
                90400]
  check_schedule(lr.multifactor(factors, **kwargs),
                 multifactor_reference(factors, **kwargs),
                 sample_steps(*boundaries)[1:] if 'rsqrt_decay' in factors
                 and kwargs.get('warmup_steps') == 0
                 else sample_steps(*boundaries))


def test_multifactor_knows_every_trax_factor():
  assert set(lr.FACTOR_NAMES) == {
      'constant', 'two_constants', 'linear_warmup', 'rsqrt_decay',
      'rsqrt_normalized_decay', 'decay_every', 'cosine_decay'}
  schedule = lr.multifactor(' * '.join(lr.FACTOR_NAMES))
  reference = multifactor_reference(' * '.join(lr.FACTOR_NAMES))
  for step in (1, 399, 400, 12345, 99999):
    assert schedule(step) == pytest.approx(reference(step), rel=1e-12)


def test_unknown_factor_is_a_clear_error():
  with pytest.raises(ValueError, match="Unknown factor 'linear_warmpu' in "
                     "factors='constant \\* linear_warmpu'; known factors: "
                     'constant, two_constants'):
    lr.multifactor('constant * linear_warmpu')
  with pytest.raises(TypeError, match='factors must be a string'):
    lr.multifactor(['constant'])
  with pytest.raises(ValueError, match="'linear_warmup' needs warmup_steps > "
                     '0; got 0'):
    lr.multifactor('constant * linear_warmup', warmup_steps=0)
  with pytest.raises(ValueError, match='lr.warmup: n_warmup_steps must be an '
                     'int >= 0; got -1'):
    lr.warmup(-1, 0.1)


def test_schedule_inside_a_jitted_step():

  @jax.jit
  def sgd_step(step, w, g):
    return w - lr.multifactor()(step) * g

  w = sgd_step(jnp.int32(1600), jnp.ones(2), jnp.ones(2))
  np.testing.assert_allclose(w, 1 - 0.1 / 40.0, rtol=1e-6)


def test_trax_module_path_re_exports_retrax_lr():
  for name in ('constant', 'warmup', 'warmup_and_rsqrt_decay', 'multifactor',
               'MultifactorSchedule', 'EvalAdjustingSchedule'):
    assert getattr(lr_schedules, name) is getattr(lr, name)
