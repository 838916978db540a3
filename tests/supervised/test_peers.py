"""A dead peer: the other process of a 2-process CLI run stops with one line."""

import os
import signal
import subprocess
import sys
import time

import pytest

from retrax.supervised import checkpointing
from retrax.supervised import peers
from tests.multiprocess_env import cpu_env
from tests.multiprocess_env import free_port

_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=50',
         '--set', 'checkpoint_every=2', '--set', 'warmup_steps=1',
         '--set', 'trax_files=false', '--steps', '100000', '--quiet',
         '--no-sample']


def _spawn(run_dir, addr, i):
  return subprocess.Popen(
      [sys.executable, '-m', 'retrax', 'train', '--output_dir', run_dir,
       '--coordinator', addr, '--num_processes', '2', '--process_id', str(i),
       *_TINY], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=cpu_env())


def _wait_for_checkpoint(run_dir, procs, timeout=600):
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(p.poll() is not None for p in procs):
      raise AssertionError([p.communicate()[0][-3000:] for p in procs])
    # A step >= 4, not ckpt_000000004 itself: rotation deletes that one,
    # and a fast run can save and delete it between two looks.
    names = os.listdir(run_dir) if os.path.isdir(run_dir) else []
    if any(n.startswith('ckpt_') and n[5:].isdigit() and int(n[5:]) >= 4
           for n in names):
      return
    time.sleep(0.5)
  raise AssertionError('no checkpoint in time')


@pytest.mark.slow
@pytest.mark.parametrize('victim', [1, 0])
def test_a_killed_peer_stops_the_other_with_one_line(tmp_path, victim):
  run_dir = str(tmp_path / 'run')
  addr = f'127.0.0.1:{free_port()}'
  procs = [_spawn(run_dir, addr, i) for i in range(2)]
  try:
    _wait_for_checkpoint(run_dir, procs)
    procs[victim].send_signal(signal.SIGKILL)
    killed_at = time.time()
    survivor = procs[1 - victim]
    out = survivor.communicate(timeout=120)[0]
    elapsed = time.time() - killed_at
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
      if not p.stdout.closed:
        p.communicate()  # Reads and closes the pipe.
  # Besides the training log (steps, evals) only the one line of the error.
  lines = [l for l in out.splitlines() if l.strip() and not l.startswith(
      ('[Gloo]', 'Step '))]
  assert survivor.returncode == 2, out[-3000:]
  assert elapsed < 60, (elapsed, out[-2000:])
  assert len(lines) == 1, out[-3000:]
  assert lines[0].startswith('retrax train: error: ') and (
      f'process {victim} of the 2 in this run was lost' in lines[0]), lines[0]
  assert 'The last checkpoint is ' in lines[0], lines[0]
  # The newest checkpoint is whole (atomic writes): it verifies and loads.
  assert checkpointing.find_latest_valid(run_dir) is not None


def test_peer_failures_are_recognised_only_in_multi_process_runs():
  error = ValueError('UNKNOWN: Gloo all-reduce failed: [pair.cc:547] '
                     'Connection closed by peer [127.0.0.1]:6034')
  assert not peers.is_peer_failure(error)  # One process: a bug, not a peer.
