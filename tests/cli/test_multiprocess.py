"""Multi-process runs on 127.0.0.1: a 2-process CLI run equals a 1-process run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from retrax import checkpoints
from retrax.supervised import checkpointing
from retrax.supervised import devices
from tests.multiprocess_env import cpu_env
from tests.multiprocess_env import free_port

TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
        '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=3',
        '--set', 'checkpoint_every=3', '--set', 'warmup_steps=1',
        '--set', 'trax_files=false', '--steps', '3',  # The default: LSH.
        '--quiet', '--no-sample']

_SAME_BATCHES = '''
import sys
import numpy as np
from retrax.supervised import devices
devices.initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))
parallel = devices.DataParallel(1)
batch = (np.arange(8, dtype=np.int32).reshape(2, 4),)  # The same on both.
try:
  parallel.put_batch(batch)
except ValueError as e:
  print('REFUSED', e)
'''


def _spawn(args):
  return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=cpu_env())


def _pair(make_args):
  port = free_port()
  return [_spawn(make_args(f'127.0.0.1:{port}', i)) for i in range(2)]


def _wait(procs, timeout=900):  # Generous: compiles on a loaded CPU.
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out
  return outs


def _final(run_dir):
  path = checkpointing.find_latest_valid(run_dir)
  weights = checkpoints.tree_leaves(
      checkpoints.load_native(path).trees['weights'])
  with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  losses = [(r['step'], r['metric'], r['value']) for r in records
            if r['metric'].startswith('metrics/')]
  return os.path.basename(path), weights, losses


@pytest.mark.slow
def test_two_process_cli_run_equals_one_process(tmp_path):
  two, one = str(tmp_path / 'two'), str(tmp_path / 'one')
  trainers = _pair(lambda addr, i: [
      '-m', 'retrax', 'train', '--output_dir', two, '--coordinator', addr,
      '--num_processes', '2', '--process_id', str(i), *TINY])
  refusers = _pair(lambda addr, i: ['-c', _SAME_BATCHES, addr, str(i)])
  single = _spawn(['-m', 'retrax', 'train', '--output_dir', one, *TINY])
  _wait(trainers + [single])
  for out in _wait(refusers):
    assert 'REFUSED processes [0, 1] feed identical batches' in out
  name2, weights2, losses2 = _final(two)
  name1, weights1, losses1 = _final(one)
  assert name2 == name1 == 'ckpt_000000003'
  assert len(weights2) == len(weights1)
  for a, b in zip(weights2, weights1):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                               atol=1e-6)
  assert [x[:2] for x in losses2] == [x[:2] for x in losses1]
  np.testing.assert_allclose([x[2] for x in losses2],
                             [x[2] for x in losses1], rtol=1e-5)
  # Only process 0 wrote the run's files.
  assert os.path.exists(os.path.join(two, 'run_config.json'))


@pytest.mark.parametrize('kwargs,env,message', [
    (dict(coordinator='127.0.0.1:1'), {}, 'missing --num_processes, '
     '--process_id'),
    (dict(coordinator='h:1', num_processes=2, process_id=2), {},
     'process_id must be in'),
    ({}, {devices.ENV_NUM_PROCESSES: 'two'}, 'is not an integer'),
])
def test_bad_cluster_settings_are_clear(kwargs, env, message):
  with pytest.raises(ValueError, match=message):
    devices.initialize_distributed(env=env, **kwargs)


def test_single_process_needs_no_cluster():
  assert devices.initialize_distributed(env={}) is False
  assert devices.initialize_distributed('h:1', 1, 0, env={}) is False


def test_host_shard_splits_rows_in_order():
  batch = (np.arange(12).reshape(6, 2), np.arange(6))
  parts = [next(devices.host_shard(iter([batch]), h, 3)) for h in range(3)]
  np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]),
                                batch[0])
  np.testing.assert_array_equal(parts[1][1], [2, 3])
  with pytest.raises(ValueError, match='not divisible by the number of'):
    next(devices.host_shard(iter([batch]), 0, 4))


@pytest.mark.parametrize('env', [
    {'TPU_WORKER_HOSTNAMES': 'localhost'},  # every single-host TPU VM
    {'TPU_WORKER_HOSTNAMES': 'localhost', 'TPU_WORKER_ID': '0'},
    {'SLURM_JOB_ID': '42', 'SLURM_NTASKS': '1'},
    {'SLURM_JOB_ID': '42'},
    {'OMPI_COMM_WORLD_SIZE': '1'},
    {'PMI_SIZE': '1'},
])
def test_one_host_launchers_run_as_one_process(env, monkeypatch):
  def refuse():
    raise AssertionError('jax.distributed.initialize must not be called')
  monkeypatch.setattr(devices.jax.distributed, 'initialize', refuse)
  assert devices.initialize_distributed(env=env) is False


@pytest.mark.parametrize('env,size', [
    ({'TPU_WORKER_HOSTNAMES': 't1v-0,t1v-1,t1v-2,t1v-3'}, 4),
    ({'SLURM_JOB_ID': '42', 'SLURM_NTASKS': '2'}, 2),
    ({'OMPI_COMM_WORLD_SIZE': '8'}, 8),
])
def test_multi_host_launchers_join_through_jax(env, size, monkeypatch):
  calls = []
  monkeypatch.setattr(devices.jax.distributed, 'initialize',
                      lambda: calls.append(1))
  assert devices._cluster_size(env) == size
  devices.initialize_distributed(env=env)
  assert calls == [1]


def test_failed_cluster_detection_is_one_line(monkeypatch):
  def unreachable():
    raise ConnectionError('Failed to resolve metadata.google.internal\nmore')
  monkeypatch.setattr(devices.jax.distributed, 'initialize', unreachable)
  with pytest.raises(devices.ClusterConfigError,
                     match=r'2-process cluster .*ConnectionError: Failed to '
                           r'resolve metadata\.google\.internal\. Give') as e:
    devices.initialize_distributed(env={'TPU_WORKER_HOSTNAMES': 'a,b'})
  assert '\n' not in str(e.value)
