"""Run by test_sharding.py with 8 forced host devices.

`python mesh_worker.py RESULT`: trains a small TransformerLM with
`LoopOptions(mesh='data=2,fsdp=4')` and the same run on one device; writes both runs'
losses and the mesh run's weights+slots bytes (per device and in all) to
RESULT (.json) for the test to compare.

`python mesh_worker.py --checkpoints DIR`: a mesh run's checkpoint resumes
on one device and a one-device run's on the mesh, with every array equal.
"""

import json
import os
import shutil
import sys

import jax
import numpy as np

import supervised_toys as toys
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax.supervised import sharding
from retrax.supervised import training


def make_loop(output_dir=None, mesh=None, n_devices=None):
  task = training.TrainTask(
      toys.copy_batches(0, batch_size=8, length=16, vocab=32),
      tl.WeightedCategoryCrossEntropy(), optimizers.Adam(0.01),
      n_steps_per_checkpoint=2)
  model = models.TransformerLM(32, d_model=32, d_ff=64, n_layers=2, n_heads=2,
                               max_len=16, dropout=0.0)
  eval_task = training.EvalTask(
      toys.copy_batches(100, batch_size=8, length=16, vocab=32),
      [tl.WeightedCategoryCrossEntropy()], n_eval_batches=1)
  return training.Loop(model, task, eval_tasks=eval_task, eval_at=lambda _: True,
                       output_dir=output_dir, random_seed=0,
                       n_devices=n_devices, options=training.LoopOptions(
                           progress_bar=False, mesh=mesh))


def losses(loop, n_steps):
  """The training and eval losses of steps 1..n_steps."""
  loop.run(n_steps)
  history = loop.history
  return [v for mode in ('train', 'eval') for _, v in history.get(
      mode, 'metrics/WeightedCategoryCrossEntropy')]


def _state_leaves(loop):
  state = loop.train_state
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(
      (state.weights, state.state, state.tasks))]


def _resumed_equal(saved, run_dir, copy, **placement):
  """Opens a copy of `saved`'s run (its checkpoint) placed as `placement`;
  checks every array equals `saved`'s; returns the new loop."""
  shutil.copytree(run_dir, copy)
  loop = make_loop(copy, **placement)
  assert loop.step == saved.step, (loop.step, saved.step)
  for a, b in zip(_state_leaves(saved), _state_leaves(loop), strict=True):
    assert a.dtype == b.dtype and np.array_equal(a, b), (a, b)
  return loop


def check_checkpoints(tmp):
  """8 devices (FSDP) -> 1 device and 1 -> 8, exactly; then both go on."""
  mesh = make_loop(os.path.join(tmp, 'mesh'), mesh='data=2,fsdp=4')
  mesh.run(2)
  one = _resumed_equal(mesh, os.path.join(tmp, 'mesh'),
                       os.path.join(tmp, 'mesh_on_one'), n_devices=1)
  single = make_loop(os.path.join(tmp, 'one'), n_devices=1)
  single.run(2)
  eight = _resumed_equal(single, os.path.join(tmp, 'one'),
                         os.path.join(tmp, 'one_on_mesh'), mesh='data=2,fsdp=4')
  leaf = max(jax.tree_util.tree_leaves(eight.train_state.weights),
             key=lambda x: x.size)
  assert len(leaf.sharding.device_set) == 8 and not (
      leaf.sharding.is_fully_replicated), leaf.sharding
  np.testing.assert_allclose(losses(one, 1), losses(eight, 1), rtol=1e-5)
  assert sharding.weights_shards_mesh(4) == {'data': 2, 'fsdp': 4}


def main():
  if sys.argv[1] == '--checkpoints':
    check_checkpoints(sys.argv[2])
    print('OK')
    return
  assert jax.device_count() == 8, jax.devices()
  mesh = make_loop(mesh='data=2,fsdp=4')
  weights = mesh.train_state.weights
  leaf = max(jax.tree_util.tree_leaves(weights), key=lambda x: x.size)
  assert len(leaf.sharding.device_set) == 8, leaf.sharding
  per_device, total = sharding.bytes_per_device(
      (mesh.train_state.weights, mesh.train_state.tasks[0].slots))
  one = make_loop(n_devices=1)
  result = {'mesh': losses(mesh, 4), 'one': losses(one, 4),
            'per_device': per_device, 'total': total,
            'weights_max_diff': max(
                float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(mesh.model.weights),
                                jax.tree_util.tree_leaves(one.model.weights)))}
  with open(sys.argv[1], 'w') as f:
    json.dump(result, f)
  print('OK')


if __name__ == '__main__':
  main()
