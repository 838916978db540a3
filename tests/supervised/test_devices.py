"""Data parallelism over 8 forced host devices (in a subprocess) equals one device."""

import json
import os
import subprocess
import sys

import numpy as np

import resume_worker
import supervised_toys as toys
from tests import multiprocess_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def test_eight_devices_give_one_device_losses_and_divisibility_errors(tmp_path):
  env = dict(os.environ)
  env['XLA_FLAGS'] = multiprocess_env.xla_flags(8)
  env['PYTHONPATH'] = os.pathsep.join([_HERE, _ROOT,
                                       env.get('PYTHONPATH', '')])
  result = str(tmp_path / 'eight.npz')
  proc = subprocess.run(
      [sys.executable, os.path.join(_HERE, 'multidevice_worker.py'), result],
      env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-3000:] + proc.stderr[-5000:])
  one = resume_worker.make_loop(None)  # The same run on this process's device.
  one.run(6)
  eight = np.load(result)
  history = json.loads(str(eight['history']))['_values']
  for mode, metric in (('train', 'metrics/WeightedCrossEntropy'),
                       ('eval', 'metrics/WeightedAccuracy')):
    want = one.history.get(mode, metric)
    got = history[mode][metric]
    assert [s for s, _ in got] == [s for s, _ in want] == [1, 3, 6]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want],
                               rtol=1e-5)
  for i, want in enumerate(toys.leaves(one.model.weights)):
    np.testing.assert_allclose(eight[f'arr_{i}'], want, rtol=1e-4, atol=1e-6)
