"""Momentum against a NumPy re-implementation of Trax's rule."""

import numpy as np
import pytest

from retrax import optimizers


def momentum_init(w):
  return np.zeros_like(w)


def momentum_rule(nesterov):

  def update(step, g, w, v, p):
    v = p['mass'] * v + g
    direction = p['mass'] * v + g if nesterov else v
    w = (1 - p['weight_decay_rate']) * w - p['learning_rate'] * direction
    return w, v

  return update


def test_defaults_are_trax_defaults():
  params = optimizers.Momentum().opt_params
  assert {k: float(v) for k, v in params.items()} == pytest.approx(
      dict(learning_rate=0.01, mass=0.9, weight_decay_rate=1e-5))


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=0.05),
    dict(learning_rate=0.05, nesterov=False),
    dict(learning_rate=0.05, mass=0.5, weight_decay_rate=0.05,
         clip_grad_norm=1.0),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  nesterov = kwargs.get('nesterov', True)
  _, slots = check_optimizer(optimizers.Momentum(**kwargs), momentum_init,
                             momentum_rule(nesterov), tree_case)
  # One velocity array per weight array.
  assert [np.shape(s) for s in slots] == [(3, 4), (4,), (2, 3, 5), (2, 2), ()]
