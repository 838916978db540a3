"""Run by test_devices.py with 8 forced host devices: `python multidevice_worker.py RESULT`.

Trains the kill/resume test's run on all 8 devices, writes its history and
weights to RESULT (.npz) for the test to compare with a one-device run, and
checks that a batch that does not split over the devices is a clear error.
"""

import json
import sys

import jax
import numpy as np

import resume_worker
import supervised_toys as toys
from retrax.supervised.batch_checks import BadBatchError


def main():
  assert jax.device_count() == 8, jax.devices()
  loop = resume_worker.make_loop(None, n_devices=8)
  leaf = jax.tree_util.tree_leaves(loop.train_state.weights)[0]
  assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated
  loop.run(6)
  np.savez(sys.argv[1], *toys.leaves(loop.model.weights),
           history=json.dumps(loop.history.to_dict()))

  three = resume_worker.make_loop(None, n_devices=3)
  try:
    three.run(1)
  except BadBatchError as e:
    assert 'Step 1' in str(e) and 'not divisible' in str(e), str(e)
  else:
    raise AssertionError('a batch of 8 on 3 devices was accepted')
  print('OK')


if __name__ == '__main__':
  main()
