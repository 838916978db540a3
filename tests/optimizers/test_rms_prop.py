"""RMSProp against a NumPy re-implementation of Trax's rule."""

import numpy as np
import pytest

from retrax import optimizers


def rms_init(w):
  return np.ones_like(w)


def rms_update(step, g, w, avg, p):
  avg = avg * p['gamma'] + g**2 * (1 - p['gamma'])
  return w - p['learning_rate'] * g / (np.sqrt(avg) + p['eps']), avg


def test_defaults_are_trax_defaults():
  params = optimizers.RMSProp().opt_params
  assert {k: float(v) for k, v in params.items()} == pytest.approx(
      dict(learning_rate=0.001, gamma=0.9, eps=1e-8))


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=0.01),
    dict(learning_rate=0.01, gamma=0.5, eps=1e-4, clip_grad_norm=1.0),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  check_optimizer(optimizers.RMSProp(**kwargs), rms_init, rms_update,
                  tree_case)


def test_second_moment_starts_at_one(tree_case):
  slots, _ = optimizers.RMSProp().tree_init(tree_case.weights)
  assert all(np.all(np.asarray(s) == 1.0) for s in slots)
