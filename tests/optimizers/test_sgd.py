"""SGD against a NumPy re-implementation of Trax's rule."""

import numpy as np
import pytest

from retrax import optimizers


def sgd_init(w):
  return None


def sgd_update(step, g, w, slots, p):
  return w - p['learning_rate'] * g, None


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=0.1),
    dict(learning_rate=0.1, clip_grad_norm=0.5),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  _, slots = check_optimizer(optimizers.SGD(**kwargs), sgd_init, sgd_update,
                             tree_case)
  assert slots == (None,) * 5


def test_default_learning_rate_and_no_slots(tree_case):
  opt = optimizers.SGD()
  assert float(opt.opt_params['learning_rate']) == pytest.approx(0.01)
  assert opt.slots is None
  slots, _ = opt.tree_init(tree_case.weights)
  assert opt.slots == slots == (None,) * 5
  assert np.shape(tree_case.weights[0]) == (3, 4)
