"""SM3 against a NumPy re-implementation of Trax's rule."""

import numpy as np
import pytest

from retrax import optimizers
from retrax.optimizers import MomentumType


def _inverse_root(acc):
  return np.where(acc > 0, 1.0 / (np.sqrt(np.maximum(acc, 0)) + 1e-16), 0.0)


def _cover_min(vs, shape):
  acc = None
  for axis, v in enumerate(vs):
    shaped = v.reshape([-1 if a == axis else 1 for a in range(len(shape))])
    acc = shaped if acc is None else np.minimum(acc, shaped)
  return np.broadcast_to(acc, shape)


def _cover_max(acc):
  return [acc.max(axis=tuple(a for a in range(acc.ndim) if a != axis))
          for axis in range(acc.ndim)]


def sm3_rule(momentum_type=MomentumType.EMA, has_momentum=True, graft=False):
  """Trax's SM3 for one array, in NumPy float64 (rank <= 1: diagonal)."""

  def accumulators(w):
    return [np.zeros(w.shape)] if w.ndim <= 1 else [np.zeros(n)
                                                    for n in w.shape]

  def init(w):
    return (np.zeros_like(w) if has_momentum else [], accumulators(w),
            accumulators(w) if graft else [])

  def update(step, g, w, slots, p):
    m, v1, v2 = slots
    b2 = p['second_moment_averaging']
    c = 1.0 if b2 == 1 else 1.0 - b2
    diagonal = w.ndim <= 1
    acc = b2 * (v1[0] if diagonal else _cover_min(v1, w.shape)) + c * g * g
    pg = _inverse_root(acc) * g
    new_v2 = []
    if graft:
      acc2 = (v2[0] if diagonal else _cover_min(v2, w.shape)) + g * g
      pg_graft = _inverse_root(acc2) * g
      pg = pg * np.linalg.norm(pg_graft) / (np.linalg.norm(pg) + 1e-16)
      new_v2 = [acc2] if diagonal else _cover_max(acc2)
    pg = pg + w * p['weight_decay']
    b1 = p['momentum']
    if not has_momentum:
      step_dir = pg
    elif momentum_type == MomentumType.EMA:
      m = (1 - b1) * pg + b1 * m
      step_dir = m
    elif momentum_type == MomentumType.HEAVY_BALL:
      m = pg + b1 * m
      step_dir = m
    else:
      m = pg + b1 * m
      step_dir = pg + b1 * m
    new_v1 = [acc] if diagonal else _cover_max(acc)
    return w - p['learning_rate'] * step_dir, (m, new_v1, new_v2)

  return init, update


def test_defaults_are_trax_defaults():
  params = optimizers.SM3().opt_params
  assert {k: float(v) for k, v in params.items()} == pytest.approx(
      dict(learning_rate=0.01, momentum=0.9, second_moment_averaging=1.0,
           weight_decay=0.0))


@pytest.mark.parametrize('kwargs', [
    dict(learning_rate=0.05),
    dict(learning_rate=0.05, momentum_type=MomentumType.HEAVY_BALL),
    dict(learning_rate=0.05, momentum_type=MomentumType.NESTEROV,
         weight_decay=0.05),
    dict(learning_rate=0.05, momentum=0.0),
    dict(learning_rate=0.05, second_moment_averaging=0.9, weight_decay=0.05,
         clip_grad_norm=1.0),
])
def test_four_steps_match_trax_rule(kwargs, tree_case, check_optimizer):
  init, update = sm3_rule(
      momentum_type=kwargs.get('momentum_type', MomentumType.EMA),
      has_momentum=kwargs.get('momentum', 0.9) > 0,
      graft=kwargs.get('second_moment_averaging', 1.0) != 1.0)
  check_optimizer(optimizers.SM3(**kwargs), init, update, tree_case)


def test_slot_layout(tree_case):
  slots, _ = optimizers.SM3(momentum=0.0).tree_init(tree_case.weights)
  m, v1s, v2s = slots[2]  # the (2, 3, 5) array
  assert m == [] and v2s == []
  assert [v.shape for v in v1s] == [(2,), (3,), (5,)]
  m, v1s, v2s = optimizers.SM3(second_moment_averaging=0.5).tree_init(
      tree_case.weights)[0][1]  # the (4,) array
  assert m.shape == (4,) and [v.shape for v in v1s] == [(4,)]
  assert [v.shape for v in v2s] == [(4,)]


def test_unknown_momentum_type_is_rejected():
  with pytest.raises(ValueError, match='momentum_type must be one of'):
    optimizers.SM3(momentum_type=7)
