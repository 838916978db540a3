"""A training run for the kill-and-resume test: `python resume_worker.py OUT N RESULT`.

Trains the toy MLP (with dropout, so PRNG keys matter) for N steps in OUT,
resuming from whatever checkpoint OUT holds; prints `step K` after each step;
at the end writes the final weights and the history to RESULT (.npz).

With `RESUME_WORKER_KILL_AT_OP=n` the process SIGKILLs itself just before its
n-th file-system commit operation (fsync, rename/replace, remove, rmtree):
inside a checkpoint or log write, or a rotation. `RESUME_WORKER_COUNT_OPS=1`
prints the number of such operations at the end instead.
`RESUME_WORKER_STEP_SECONDS=s` makes each step last `s` seconds more (the
signal tests stop a step in progress).
"""

import json
import os
import shutil
import signal
import sys
import time

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
    time.sleep(float(os.environ.get('RESUME_WORKER_STEP_SECONDS') or 0))


def make_loop(output_dir, extra_callbacks=(), n_devices=None):
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05), n_steps_per_checkpoint=3,
                            n_steps_per_permanent_checkpoint=10)
  eval_task = training.EvalTask(toys.copy_batches(100),
                                [toys.WeightedAccuracy()], n_eval_batches=1)
  return training.Loop(toys.mlp(dropout=0.2), task, eval_tasks=eval_task,
                       eval_model=toys.mlp(mode='eval'), output_dir=output_dir,
                       random_seed=0,
                       options=training.LoopOptions(keep_checkpoints=2),
                       callbacks=list(extra_callbacks), n_devices=n_devices)


def run(output_dir, n_steps, extra_callbacks=()):
  loop = make_loop(output_dir, extra_callbacks)
  loop.run(n_steps - loop.step)
  return loop


_OPS = [(os, 'fsync'), (os, 'replace'), (os, 'rename'), (os, 'remove'),
        (shutil, 'rmtree')]


def install_kill_switch(kill_at):
  """Counts the file-system commit operations; SIGKILLs before the
  `kill_at`-th (never if None). Returns the counter (a one-item list)."""
  count = [0]

  def wrap(fn):
    def counted(*args, **kwargs):
      count[0] += 1
      if count[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
      return fn(*args, **kwargs)
    return counted

  for module, name in _OPS:
    setattr(module, name, wrap(getattr(module, name)))
  return count


def main():
  output_dir, n_steps, result = sys.argv[1], int(sys.argv[2]), sys.argv[3]
  kill_at = os.environ.get('RESUME_WORKER_KILL_AT_OP')
  count = install_kill_switch(int(kill_at) if kill_at else None)
  loop = run(output_dir, n_steps, [_PrintStep])
  if os.environ.get('RESUME_WORKER_COUNT_OPS'):
    print(f'ops {count[0]}', flush=True)
  np.savez(result, *toys.leaves(loop.model.weights),
           history=json.dumps(loop.history.to_dict()))


if __name__ == '__main__':
  main()
