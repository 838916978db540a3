"""A training run for the kill-and-resume test: `python resume_worker.py OUT N RESULT`.

Trains the toy MLP (with dropout, so PRNG keys matter) for N steps in OUT,
resuming from whatever checkpoint OUT holds; prints `step K` after each step;
at the end writes the final weights and the history to RESULT (.npz).
"""

import json
import sys

import numpy as np

import supervised_toys as toys
from retrax import optimizers
from retrax.supervised import callbacks
from retrax.supervised import training


class _PrintStep(callbacks.TrainingStepCallback):

  def call_at(self, step):
    return True

  def on_step_begin(self, step):
    pass

  def on_step_end(self, step):
    print(f'step {step}', flush=True)


def make_loop(output_dir, extra_callbacks=(), n_devices=None):
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05), n_steps_per_checkpoint=3,
                            n_steps_per_permanent_checkpoint=10)
  eval_task = training.EvalTask(toys.copy_batches(100),
                                [toys.WeightedAccuracy()], n_eval_batches=1)
  return training.Loop(toys.mlp(dropout=0.2), task, eval_tasks=eval_task,
                       eval_model=toys.mlp(mode='eval'), output_dir=output_dir,
                       random_seed=0, keep_checkpoints=2,
                       callbacks=list(extra_callbacks), n_devices=n_devices)


def run(output_dir, n_steps, extra_callbacks=()):
  loop = make_loop(output_dir, extra_callbacks)
  loop.run(n_steps - loop.step)
  return loop


def main():
  output_dir, n_steps, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  loop = run(output_dir, n_steps, [_PrintStep])
  np.savez(result, history=json.dumps(loop.history.to_dict()),
           *toys.leaves(loop.model.weights))


if __name__ == '__main__':
  main()
