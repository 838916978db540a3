"""SIGTERM and Ctrl-C stop a run with its last completed step saved (issue 29,
item 5).

The stopped run's checkpoint holds the last step it completed, and resuming
from it ends bit for bit where an uninterrupted run ends (weights, history,
metrics.jsonl). A second signal ends the process at once; the handlers are
the loop's only while it runs.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import resume_worker
import supervised_toys as toys
from retrax.checkpoints import native
from retrax.supervised import callbacks
from retrax.supervised import interrupts
from retrax.supervised import metrics_log
from tests.multiprocess_env import cpu_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_TIMING = 'training/steps per second'  # Wall-clock: differs between runs.
_N_STEPS = 14


def _env(**extra):
  # The test process's platform: it resumes the child's run and compares
  # the result bit for bit with its own uninterrupted run.
  return cpu_env(1, pythonpath=[_HERE, _ROOT], platform=None, **extra)


@pytest.fixture(autouse=True)
def _sigint_as_in_a_terminal():
  """Ctrl-C as a terminal delivers it, however the test runner started: a
  runner started in the background (`nohup`, `cmd &` in a script) inherits
  an ignored SIGINT, which retrax rightly leaves ignored (see
  `test_an_ignored_sigint_stays_ignored`), and so would its children."""
  if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    yield
    return
  signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _metrics(output_dir):
  return [(r['step'], r['mode'], r['metric'], r['value'])
          for r in metrics_log.read_jsonl(os.path.join(output_dir,
                                                        'metrics.jsonl'))
          if r['metric'] != _TIMING]


def _history(history_dict):
  values = json.loads(json.dumps(history_dict))['_values']
  values['train'].pop(_TIMING, None)
  return values


def _newest_step(output_dir):
  steps = [native.read_metadata(os.path.join(output_dir, n))['step']
           for n in os.listdir(output_dir) if n.startswith('ckpt_')]
  return max(steps)


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """An uninterrupted run of `_N_STEPS` steps."""
  out = str(tmp_path_factory.mktemp('reference'))
  loop = resume_worker.run(out, _N_STEPS)
  return loop, _metrics(out)


def _assert_same_as(loop, output_dir, reference):
  ref, ref_metrics = reference
  assert loop.step == ref.step
  for a, b in zip(toys.leaves(loop.model.weights),
                  toys.leaves(ref.model.weights)):
    np.testing.assert_array_equal(a, b)
  assert _history(loop.history.to_dict()) == _history(ref.history.to_dict())
  assert _metrics(output_dir) == ref_metrics


class _SignalAt(callbacks.TrainingStepCallback):
  """Sends this process `signum` at the end of step `step` (mid-step: the
  evals and saves of the step are still to come)."""
  signum, step = signal.SIGTERM, 5

  def call_at(self, step):
    return step == self.step

  def on_step_begin(self, step):
    pass

  def on_step_end(self, step):
    os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize('signum,cls,code', [
    (signal.SIGTERM, interrupts.Terminated, 143),
    (signal.SIGINT, interrupts.Interrupted, 130),
])
def test_a_signal_saves_the_step_in_progress_and_resume_is_exact(
    tmp_path, reference, signum, cls, code):
  out = str(tmp_path)
  at = type('At', (_SignalAt,), {'signum': signum, 'step': 5})
  with pytest.raises(cls) as e:
    resume_worker.run(out, _N_STEPS, [at])  # Step 5 is no checkpoint step.
  assert (e.value.step, interrupts.EXIT_CODES[e.value.signum]) == (5, code)
  assert e.value.checkpoint == os.path.join(out, 'ckpt_000000005')
  assert _newest_step(out) == 5
  assert max(r['step'] for r in metrics_log.read_jsonl(
      os.path.join(out, 'metrics.jsonl'))) <= 5  # Flushed, nothing later.
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  loop = resume_worker.make_loop(out)
  assert loop.step == 5
  loop.run(_N_STEPS - loop.step)
  _assert_same_as(loop, out, reference)


def test_a_programs_own_handler_is_left_alone(tmp_path):
  seen = []
  previous = signal.signal(signal.SIGTERM, lambda *a: seen.append(a[0]))
  try:
    loop = resume_worker.run(str(tmp_path), 7, [_SignalAt])
    assert loop.step == 7 and seen == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
  finally:
    signal.signal(signal.SIGTERM, previous)


def _start_worker(out, **env):
  cmd = [sys.executable, os.path.join(_HERE, 'resume_worker.py'), out,
         str(_N_STEPS), os.path.join(out, 'result.npz')]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=_env(**env))


def _steps_until(proc, step):
  """Reads the worker's `step k` lines up to `step`; returns the last one."""
  last = None
  for line in proc.stdout:
    if line.startswith('step '):
      last = int(line.split()[1])
      if last >= step:
        return last
  return last


def test_sigterm_in_a_process_exits_143_and_resumes_exactly(tmp_path,
                                                            reference):
  out = str(tmp_path / 'run')
  proc = _start_worker(out, RESUME_WORKER_STEP_SECONDS='0.2')
  _steps_until(proc, 4)
  proc.send_signal(signal.SIGTERM)  # During step 4's pause, or step 5's.
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 143, stderr
  steps = [int(l.split()[1]) for l in stdout.splitlines()
           if l.startswith('step ')]
  last = max([4] + steps)  # The last step the worker completed.
  assert _newest_step(out) == last
  assert f'Stopped by SIGTERM after step {last}' in stdout
  assert 'Traceback' not in stderr
  loop = resume_worker.make_loop(out)
  assert loop.step == last
  loop.run(_N_STEPS - loop.step)
  _assert_same_as(loop, out, reference)


def test_a_second_signal_ends_the_process_at_once(tmp_path):
  out = str(tmp_path / 'run')
  proc = _start_worker(out, RESUME_WORKER_STEP_SECONDS='2')
  _steps_until(proc, 2)
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.5)  # The first is handled during the step's pause.
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGTERM, stderr
  assert 'signal again to stop at once' in stderr


_TINY = ['--set', 'model=TransformerLM', '--set', 'd_model=16', '--set',
         'd_ff=32', '--set', 'n_layers=1', '--set', 'd_head=8', '--set',
         'batch_size=4', '--set', 'eval_every=50', '--set',
         'checkpoint_every=50', '--set', 'warmup_steps=2', '--quiet',
         '--no-sample']


def test_an_ignored_sigint_stays_ignored(tmp_path, reference):
  # A run under `nohup` (SIGINT ignored) trains on through a SIGINT, as any
  # program that leaves its inherited dispositions alone.
  at = type('At', (_SignalAt,), {'signum': signal.SIGINT, 'step': 5})
  previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
  try:
    loop = resume_worker.run(str(tmp_path), _N_STEPS, [at])
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, previous)
  _assert_same_as(loop, str(tmp_path), reference)


def test_ctrl_c_in_retrax_train_exits_130_with_one_line(tmp_path):
  out = str(tmp_path / 'run')
  cmd = [sys.executable, '-m', 'retrax', 'train', '--output_dir', out,
         '--steps', '100000', *_TINY]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=_env())
  for line in proc.stdout:  # The first eval is logged at step 1.
    if 'eval' in line:
      break
  time.sleep(1)
  proc.send_signal(signal.SIGINT)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130, stderr
  lines = [l for l in stderr.splitlines() if l.strip()]
  assert 'Traceback' not in stderr and lines[-1].startswith(
      'retrax train: stopped by SIGINT after step '), stderr
  step = int(lines[-1].split('after step ')[1].split(';')[0])
  assert f'ckpt_{step:09d}' in lines[-1] and _newest_step(out) == step
