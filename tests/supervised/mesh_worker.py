"""Run by test_sharding.py with 8 forced host devices: `python mesh_worker.py RESULT`.

Trains a small TransformerLM with `mesh='data=2,fsdp=4'` and the same run on
one device; writes both runs' losses and the mesh run's weights+slots bytes
(per device and in all) to RESULT (.json) for the test to compare.
"""

import json
import sys

import jax
import numpy as np

import supervised_toys as toys
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax.supervised import sharding
from retrax.supervised import training


def make_loop(output_dir=None, **placement):
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
                       progress_bar=False, **placement)


def losses(loop, n_steps):
  """The training and eval losses of steps 1..n_steps."""
  loop.run(n_steps)
  history = loop.history
  return [v for mode in ('train', 'eval') for _, v in history.get(
      mode, 'metrics/WeightedCategoryCrossEntropy')]


def main():
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
