"""Checkpoints: exact resume (also after SIGKILL), corruption fallback, formats."""

import json
import os
import random
import signal
import subprocess
import sys

import numpy as np
import pytest

import resume_worker
import supervised_toys as toys
from retrax import checkpoints
from retrax.checkpoints import CheckpointCorruptedError
from retrax.supervised import callbacks
from retrax.supervised import metrics_log
from tests import multiprocess_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


_TIMING = 'training/steps per second'  # Wall-clock: differs between runs.


def _metrics(output_dir):
  return [(r['step'], r['mode'], r['metric'], r['value'])
          for r in metrics_log.read_jsonl(os.path.join(output_dir,
                                                        'metrics.jsonl'))
          if r['metric'] != _TIMING]


def _history(history_dict):
  values = json.loads(json.dumps(history_dict))['_values']
  values['train'].pop(_TIMING)
  return values


def _assert_same_run(loop, ref):
  for a, b in zip(toys.leaves(loop.model.weights),
                  toys.leaves(ref.model.weights)):
    np.testing.assert_array_equal(a, b)
  assert _history(loop.history.to_dict()) == _history(ref.history.to_dict())
  assert loop.step == ref.step


class _Stop(Exception):
  pass


class _StopAfter8(callbacks.TrainingStepCallback):
  """Stops a run at the end of step 8, as a kill would (no final save)."""

  def call_at(self, step):
    return step == 8

  def on_step_begin(self, step):
    pass

  def on_step_end(self, step):
    raise _Stop()


def test_resume_in_process_continues_exactly(tmp_path, capsys):
  ref = resume_worker.run(str(tmp_path / 'ref'), 14)
  # Stop at step 8 without saving (as if killed): the newest checkpoint is
  # step 6; a new loop resumes there and redoes 7, 8.
  with pytest.raises(_Stop):
    resume_worker.run(str(tmp_path / 'run'), 14, [_StopAfter8])
  second = resume_worker.make_loop(str(tmp_path / 'run'))
  assert second.step == 6
  assert 'Resumed from checkpoint' in capsys.readouterr().out
  second.run(14 - second.step)
  _assert_same_run(second, ref)
  assert _metrics(tmp_path / 'run') == _metrics(tmp_path / 'ref')
  # Rolling checkpoints keep the newest 2 (the final step 14 is one);
  # permanent ones (1, 10) stay, and so do Trax's files of the permanent ones
  # (`model_<step>.pkl.gz`).
  names = os.listdir(tmp_path / 'run')
  assert sorted(n for n in names if n[0] in 'cm' and '.' not in n) == [
      'ckpt_000000012', 'ckpt_000000014', 'model_000000001',
      'model_000000010']
  assert {'model.pkl.gz', 'model_1.pkl.gz', 'model_10.pkl.gz'} <= set(names)


def test_corrupted_checkpoint_is_reported_and_the_previous_one_used(
    tmp_path, capsys):
  out = str(tmp_path)
  resume_worker.run(out, 6)
  arrays = [f for f in os.listdir(os.path.join(out, 'ckpt_000000006'))
            if f.endswith('.safetensors')][0]
  path = os.path.join(out, 'ckpt_000000006', arrays)
  with open(path, 'r+b') as f:  # Truncate the newest checkpoint's arrays.
    f.truncate(os.path.getsize(path) // 2)
  capsys.readouterr()
  loop = resume_worker.make_loop(out)
  report = capsys.readouterr().out
  assert 'Checkpoint of step 6' in report and 'skipped' in report
  assert loop.step == 3
  with pytest.raises(CheckpointCorruptedError):
    loop.load_checkpoint(filename='ckpt_000000006')
  assert loop.step == 3  # Nothing of the damaged checkpoint was loaded.


def test_trax_format_export_and_native_init_from_file(tmp_path):
  out = str(tmp_path)
  loop = resume_worker.run(out, 3)
  pkl = loop.export_trax_checkpoint('model')
  assert pkl.endswith('model.pkl.gz')
  other = resume_worker.make_loop(None)
  other.load_checkpoint(directory=out, filename='model')
  assert other.step == 3
  for a, b in zip(toys.leaves(other.model.weights),
                  toys.leaves(loop.model.weights)):
    np.testing.assert_array_equal(a, b)
  assert other.history.to_dict() == loop.history.to_dict()
  # A native training checkpoint is a layer file too.
  fresh = toys.mlp(mode='eval')
  fresh.init_from_file(os.path.join(out, 'ckpt_000000003'))
  for a, b in zip(toys.leaves(fresh.weights), toys.leaves(loop.model.weights)):
    np.testing.assert_array_equal(a, b)


def _kill_plan(n_kills, seed):
  """`n_kills` kills: ('op', n) SIGKILLs at the n-th file-system commit
  operation (inside a checkpoint/log write or a rotation); ('step', r) after
  `r` steps past where the process resumed, at a random instant."""
  rng = random.Random(seed)
  return [('op', rng.randint(1, 40)) if rng.random() < 0.6 else
          ('step', rng.randint(0, 3)) for _ in range(n_kills)]


def _run_killed(output_dir, n_steps, plan, result, env):
  """Runs the worker once per kill of `plan`, then once to the end."""
  cmd = [sys.executable, os.path.join(_HERE, 'resume_worker.py'), output_dir,
         str(n_steps), result]
  rng = random.Random(len(plan))
  for kind, n in plan:
    proc_env = dict(env, RESUME_WORKER_KILL_AT_OP=str(n) if kind == 'op' else '')
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, env=proc_env,
                          text=True) as proc:
      first = None
      for line in proc.stdout:
        if not line.startswith('step '):
          continue
        step = int(line.split()[1])
        first = step if first is None else first
        if kind == 'step' and step >= first + n:
          for _ in range(rng.randint(0, 30000)):  # Sometimes into the next step.
            pass
          proc.send_signal(signal.SIGKILL)
          break
    assert proc.returncode == -signal.SIGKILL, f'the run ended before {kind} {n}'
  subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def _event_scalars(output_dir):
  """Every (dir, step, tag, value) in the run's TensorBoard files, sorted."""
  out = []
  for path in metrics_log.RunFiles(str(output_dir)).files():
    if 'tfevents' in path and os.path.exists(path):
      where = os.path.relpath(os.path.dirname(path), output_dir)
      out += [(where, e['step'], tag, value)
              for e in metrics_log.read_events(path)
              for tag, value in e['scalars'] if tag != _TIMING]
  return sorted(out)


@pytest.mark.parametrize('n_steps,n_kills', [
    pytest.param(16, 1, id='one-kill'),
    pytest.param(40, 20, id='twenty-kills', marks=pytest.mark.slow),
])
def test_sigkilled_run_resumes_with_the_same_weights_and_history(
    tmp_path, n_steps, n_kills):
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([_HERE, _ROOT,
                                       env.get('PYTHONPATH', '')])
  env['XLA_FLAGS'] = multiprocess_env.xla_flags(1)
  plan = _kill_plan(n_kills, seed=n_kills) if n_kills > 1 else [('op', 23)]
  result = str(tmp_path / 'killed.npz')
  run_dir = tmp_path / 'run'
  _run_killed(str(run_dir), n_steps, plan, result, env)
  ref = resume_worker.run(str(tmp_path / 'ref'), n_steps)
  got = np.load(result)
  assert _history(json.loads(str(got['history']))) == _history(
      ref.history.to_dict())
  for i, want in enumerate(toys.leaves(ref.model.weights)):
    np.testing.assert_array_equal(got[f'arr_{i}'], want)
  assert _metrics(run_dir) == _metrics(tmp_path / 'ref')
  assert _event_scalars(run_dir) == _event_scalars(tmp_path / 'ref')
  trax = checkpoints.read_trax_checkpoint(run_dir / 'model.pkl.gz')
  assert trax['step'] == n_steps
  for a, b in zip(trax['flat_weights'], toys.leaves(ref.model.weights)):
    np.testing.assert_array_equal(a, b)
  leftovers = [os.path.join(root, n) for root, _, names in os.walk(run_dir)
               for n in names if n.endswith('.tmp') or n.startswith('.')]
  assert not leftovers


def test_a_run_killed_before_its_first_checkpoint_leaves_no_stale_logs(
    tmp_path):
  out = tmp_path / 'run'
  out.mkdir()
  metrics_log.RunFiles(str(out)).claim('metrics.jsonl')  # The run's own.
  (out / 'metrics.jsonl').write_text(
      '{"step": 2, "mode": "eval", "metric": "x", "value": 1.0, "time": 0}\n'
      '{"step": 3, "mo')  # An unsaved run's record, and one torn by a kill.
  loop = resume_worker.make_loop(str(out))
  assert loop.step == 0
  loop.run(1)
  steps = [r['step'] for r in metrics_log.read_jsonl(out / 'metrics.jsonl')]
  assert steps and set(steps) == {1}
  assert (out / 'metrics.jsonl').read_text().endswith('}\n')
