"""SIGTERM to a 2-process FSDP run, the processes signalled seconds apart (as
a scheduler signals hosts) or only one of them: both stop after the same
step, save it, exit 143, and the run resumes bit for bit (issue 53, item 1).

Each process decided alone before: both printed that they would stop, and
the stop's save (a collective) waited forever for the other.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.multiprocess_env import cpu_env
from tests.multiprocess_env import free_port

_TINY = ['--set', 'model=TransformerLM', '--set', 'd_model=16',
         '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=8', '--set', 'eval_every=4',
         '--set', 'checkpoint_every=50', '--set', 'warmup_steps=1',
         '--set', 'trax_files=false', '--mesh', 'fsdp=2', '--quiet',
         '--no-sample']
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_FINAL = 40  # Steps of the resumed and the reference runs.
_TIMING = 'training/steps per second'


def _pair(run_dir, steps, *, command=('-m', 'retrax'), **env):
  addr = f'127.0.0.1:{free_port()}'
  return [subprocess.Popen(
      [sys.executable, *command, 'train', '--output_dir', run_dir,
       '--coordinator', addr, '--num_processes', '2', '--process_id', str(i),
       '--steps', str(steps), *_TINY], stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True, env=cpu_env(pythonpath=[_ROOT], **env))
      for i in range(2)]


def _finish(procs, timeout=600):
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]


def _metrics(run_dir):
  with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
    return [(r['step'], r['mode'], r['metric'], r['value'])
            for r in map(json.loads, f) if r['metric'] != _TIMING]


def _wait_for_eval(run_dir, procs, step=4, timeout=600):
  """Waits until the run has logged the evals of `step` (compiled, running)."""
  path = os.path.join(run_dir, 'metrics.jsonl')
  deadline = time.time() + timeout
  while time.time() < deadline:
    if any(p.poll() is not None for p in procs):
      raise AssertionError([p.communicate()[0][-3000:] for p in procs])
    if os.path.exists(path) and any(
        r[0] >= step for r in _metrics(run_dir)):
      return
    time.sleep(0.2)
  raise AssertionError('the run did not reach its evals in time')


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  run_dir = str(tmp_path_factory.mktemp('reference'))
  _finish(_pair(run_dir, _FINAL))
  return _metrics(run_dir)


def _signal(proc):
  try:
    proc.send_signal(signal.SIGTERM)
  except ProcessLookupError:  # Stopped at its peer's signal and gone.
    pass


def _kill_left(procs):
  """Kills (and reaps) the processes a failed test left running."""
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.communicate()


@pytest.mark.slow
@pytest.mark.parametrize('skew', [0.0, 0.3, 2.0, None])  # None: only p0.
def test_skewed_sigterm_stops_both_processes_at_one_saved_step(
    tmp_path, reference, skew):
  run_dir = str(tmp_path / 'run')
  procs = _pair(run_dir, 100000)
  try:
    _wait_for_eval(run_dir, procs)
    signalled = time.time()
    _signal(procs[0])
    if skew is not None:
      time.sleep(skew)
      _signal(procs[1])
    outs = [p.communicate(timeout=120)[0] for p in procs]
    took = time.time() - signalled
  finally:
    _kill_left(procs)
  codes = [p.returncode for p in procs]
  last = [o.strip().splitlines()[-1] for o in outs]
  print(f'skew {skew}: exit codes {codes}, {took:.1f} s; {last}')
  assert codes == [143, 143], outs[0][-2000:] + outs[1][-2000:]
  assert took < 60
  for out in outs:
    assert 'Traceback' not in out, out[-3000:]
  steps = [int(l.split('after step ')[1].split(';')[0]) for l in last]
  assert steps[0] == steps[1] and steps[0] < _FINAL, last
  ckpt = f'ckpt_{steps[0]:09d}'
  assert ckpt in last[0] and os.path.isfile(
      os.path.join(run_dir, ckpt, 'metadata.json'))
  _finish(_pair(run_dir, _FINAL))
  assert _metrics(run_dir) == reference  # Bit for bit, every logged value.


@pytest.mark.slow
def test_a_peer_that_never_reaches_the_stop_is_lost_with_one_line(tmp_path):
  run_dir = str(tmp_path / 'run')
  procs = _pair(run_dir, 100000, RETRAX_STOP_WAIT_SECONDS='5')
  try:
    _wait_for_eval(run_dir, procs)
    procs[1].send_signal(signal.SIGSTOP)  # Hung: neither trains nor dies.
    signalled = time.time()
    _signal(procs[0])
    out = procs[0].communicate(timeout=60)[0]
    took = time.time() - signalled
  finally:
    _kill_left(procs)
  print(f'hung peer: exit code {procs[0].returncode}, {took:.1f} s')
  lines = [l for l in out.splitlines() if l.startswith('retrax')]
  assert procs[0].returncode == 2, out[-3000:]
  assert 'Traceback' not in out, out[-3000:]
  assert took < 30 and 'a peer process is hung' in lines[-1], lines
  assert 'restart every process' in lines[-1], lines


class _Peers:
  """`peers.agree_on_stop` of a run whose other process sends `theirs`."""

  def __init__(self, theirs=0):
    self.theirs, self.calls = theirs, []

  def __call__(self, signum, note=None):
    self.calls.append(signum)
    return max(signum, self.theirs)


def test_a_peers_signal_stops_this_process_and_its_own_is_no_second(
    monkeypatch):
  from retrax.supervised import interrupts
  from retrax.supervised import peers
  monkeypatch.setattr(peers, 'agree_on_stop', _Peers(signal.SIGTERM))
  stop = interrupts.StopOnSignal()
  assert stop.agreed() and stop.signum == signal.SIGTERM
  assert stop.received is None
  stop.install()
  try:  # Its own SIGTERM, after the peer's: noted, not a kill at once.
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.received == signal.SIGTERM and stop.signum == signal.SIGTERM
  finally:
    stop.restore()


def test_one_process_stops_on_its_own_signal_only(monkeypatch):
  from retrax.supervised import interrupts
  from retrax.supervised import peers
  agree = _Peers()
  monkeypatch.setattr(peers, 'agree_on_stop', agree)
  stop = interrupts.StopOnSignal()
  assert not stop.agreed()
  stop.received = signal.SIGINT
  assert stop.agreed() and stop.signum == signal.SIGINT
  assert agree.calls == [0, signal.SIGINT]
  assert peers.agree_on_stop is agree
  monkeypatch.undo()
  assert peers.agree_on_stop(signal.SIGTERM) == signal.SIGTERM  # 1 process.


@pytest.mark.slow
def test_a_peer_killed_inside_a_sharded_save_leaves_one_line(tmp_path):
  run_dir = str(tmp_path / 'run')
  procs = _pair(run_dir, 8, command=[os.path.join(_HERE,
                                                  'save_death_worker.py')])
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert procs[1].returncode == 9, outs[1][-3000:]
  lines = [l for l in outs[0].splitlines() if l.startswith('retrax')]
  assert procs[0].returncode == 2, outs[0][-3000:]
  assert 'Traceback' not in outs[0], outs[0][-3000:]
  assert 'process 1 of the 2 in this run was lost' in lines[-1], lines
  assert 'last checkpoint is from step 1' in lines[-1], lines


@pytest.mark.slow
def test_agreements_carry_a_peers_signal_and_notice_a_dead_peer():
  addr = f'127.0.0.1:{free_port()}'
  procs = [subprocess.Popen(
      [sys.executable, os.path.join(_HERE, 'stop_agreement_worker.py'), addr,
       str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      env=cpu_env(pythonpath=[_ROOT])) for i in range(2)]
  outs = [p.communicate(timeout=120)[0] for p in procs]
  lines = [l for l in outs[0].splitlines() if l.startswith(('agree', 'lost'))]
  assert lines[:2] == ['agreement 0: 0', 'agreement 1: 15'], outs[0][-3000:]
  assert lines[2].startswith('lost after') and (
      'process 1 of the 2 in this run was lost' in lines[2]), lines
  assert float(lines[2].split()[2]) < 20, lines
  assert procs[0].returncode == 2 and procs[1].returncode == 9
