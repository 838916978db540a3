"""Every model family trains in 2 processes exactly as in 1 with the same
global batches: state and caches (LSH hash keys, a Terraformer's encoder
state, RNN carries) are sized for the global batch, not a process's share."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from model_families_worker import FAMILIES  # (conftest's sys.path)
from tests.multiprocess_env import cpu_env
from tests.multiprocess_env import free_port

_WORKER = os.path.join(os.path.dirname(__file__), 'model_families_worker.py')


def _env():
  return cpu_env(PYTHONPATH=os.pathsep.join(
      [os.path.dirname(__file__), os.environ.get('PYTHONPATH', '')]))


@pytest.mark.slow  # ~2-4 minutes on 2 cores: 3 processes compile 5 models.
def test_two_processes_train_every_family_like_one(tmp_path):
  two, one = tmp_path / 'two.json', tmp_path / 'one.json'
  address = f'127.0.0.1:{free_port()}'
  procs = [subprocess.Popen(
      [sys.executable, _WORKER, str(two), address, str(i)],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=_env()) for i in range(2)]
  procs.append(subprocess.Popen([sys.executable, _WORKER, str(one)],
                                stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                env=_env()))
  for p in procs:
    out = p.communicate(timeout=1200)[0]
    assert p.returncode == 0, out[-3000:]
  got, want = json.loads(two.read_text()), json.loads(one.read_text())
  assert list(got) == list(want) == list(FAMILIES)
  for name in FAMILIES:
    assert len(got[name]) == len(want[name]) == 4, name  # 2 train, 2 eval.
    np.testing.assert_allclose(got[name], want[name], rtol=2e-5,
                               err_msg=name)
