"""A new `Loop` keeps one copy of the weights, state and optimizer slots.

`train_step.init_state` places them on the mesh (a copy, which the training
step donates) and points the model, the eval model and each task's
optimizer at the placed arrays, so that the initial arrays are released:
at long sequence lengths (a positional table of `[length, d_model]` and its
Adam slots) the second copy would cost gigabytes of device memory.
"""

import gc

import jax
import numpy as np

import supervised_toys as toys
from retrax import optimizers
from retrax.supervised import training


def _ids(tree):
  return [id(x) for x in jax.tree_util.tree_leaves(tree)]


def test_models_and_optimizers_hold_the_placed_arrays():
  # Arrays alive before the Loop (other tests' in this process) are not its.
  gc.collect()
  kept = jax.live_arrays()  # Held, so that no new array reuses their ids.
  earlier = {id(x) for x in kept}
  optimizer = optimizers.Adam(0.05)
  model = toys.mlp()
  loop = training.Loop(model, [training.TrainTask(
      toys.copy_batches(0), toys.WeightedCrossEntropy(), optimizer)],
                       random_seed=0)
  state = loop.train_state
  assert _ids(model.weights) == _ids(state.weights)
  assert _ids(loop.eval_model.weights) == _ids(state.weights)
  assert _ids(optimizer.slots) == _ids(state.tasks[0].slots)
  gc.collect()
  live = {id(x) for x in jax.live_arrays()}
  placed = set(_ids((state.weights, state.tasks[0].slots)))
  # No float array of a weight's or slot's shape outside the train state.
  shapes = {np.shape(x) for x in jax.tree_util.tree_leaves(state.weights)
            if np.size(x) > 1}
  others = [x for x in jax.live_arrays()
            if id(x) not in placed | earlier and x.shape in shapes]
  assert placed <= live and not others, [x.shape for x in others]
  before = toys.leaves(state.weights)
  loop.run(1)  # The first step donates the placed arrays; the models follow.
  assert _ids(model.weights) == _ids(loop.train_state.weights)
  assert any(np.any(a != b) for a, b in
             zip(toys.leaves(loop.train_state.weights), before))
