"""Data parallelism over 8 forced host devices, in a subprocess."""

import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def test_eight_devices_match_one_device_adasum_and_batch_errors():
  env = dict(os.environ)
  env['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'
  env['PYTHONPATH'] = os.pathsep.join([_HERE, _ROOT,
                                       env.get('PYTHONPATH', '')])
  proc = subprocess.run(
      [sys.executable, os.path.join(_HERE, 'multidevice_worker.py')],
      env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-3000:] + proc.stderr[-5000:])
