"""A Loop touches only what it wrote and never silently restarts (issue 16).

Items 2, 3, 6, 7, 9 (training part) and 10: other experiments' logs are left
alone, checkpoints are ordered by their recorded step, unusable checkpoints
stop the run instead of restarting it, the final step is saved, NaN never
reaches a checkpoint, and a resume logs exactly what an uninterrupted run
logs.
"""

import os
import shutil

import numpy as np
import pytest

import resume_worker
import supervised_toys as toys
from retrax.app import cli
from retrax import optimizers
from retrax.checkpoints import CheckpointError
from retrax.checkpoints import CheckpointFormatError
from retrax.checkpoints import native
from retrax.checkpoints import read_trax_checkpoint
from retrax.checkpoints import unflatten_like
from retrax.supervised import callbacks
from retrax.supervised import metrics_log
from retrax.supervised import training
from retrax.supervised.batch_checks import NonFiniteLossError

_TIMING = 'training/steps per second'


def _events(path, n_steps):
  with open(path, 'wb') as f:
    f.write(metrics_log.frame_record(metrics_log.encode_event(
        0.0, 0, file_version='brain.Event:2')))
    for step in range(1, n_steps + 1):
      f.write(metrics_log.frame_record(metrics_log.encode_event(
          0.0, step, scalars=[('metrics/loss', 1.0 / step)])))


def _history(loop):
  values = loop.history.to_dict()['_values']
  values['train'].pop(_TIMING, None)
  return values


def test_other_experiments_logs_are_never_touched(tmp_path):
  """Item 2: training in `runs/` leaves `runs/exp/*` byte for byte."""
  runs = tmp_path / 'runs'
  (runs / 'exp' / 'train').mkdir(parents=True)
  _events(runs / 'exp' / 'train' / 'events.out.tfevents.1.host.1.retrax', 20)
  _events(runs / 'exp' / 'events.out.tfevents.2.host.2', 20)
  (runs / 'exp' / 'metrics.jsonl').write_text(
      '{"step": 20, "mode": "eval", "metric": "x", "value": 1.0, "time": 0}\n')
  before = toys.file_bytes(runs / 'exp')
  resume_worker.run(str(runs), 4)
  assert toys.file_bytes(runs / 'exp') == before
  loop = resume_worker.make_loop(str(runs))  # Resume: cuts its own logs only.
  assert loop.step == 4
  loop.run(2)
  assert toys.file_bytes(runs / 'exp') == before
  own = metrics_log.RunFiles(str(runs)).files()
  assert os.path.join(str(runs), 'metrics.jsonl') in own
  assert all('exp' not in os.path.relpath(p, runs) for p in own)


def test_a_foreign_metrics_file_is_refused_and_kept(tmp_path):
  """Item 2: a metrics.jsonl no retrax run here wrote is neither cut nor
  appended to."""
  (tmp_path / 'metrics.jsonl').write_text('{"step": 7, "mine": true}\n')
  with pytest.raises(FileExistsError, match='metrics.jsonl'):
    resume_worker.make_loop(str(tmp_path))
  assert (tmp_path / 'metrics.jsonl').read_text() == (
      '{"step": 7, "mine": true}\n')


def test_a_renamed_copy_is_refused_not_resumed(tmp_path):
  """Item 3: `ckpt_000000999` holding step 3 neither pins the resume nor
  gets deleted; it is an error naming it."""
  out = str(tmp_path)
  resume_worker.run(out, 6)
  copy = os.path.join(out, 'ckpt_000000999')
  shutil.copytree(os.path.join(out, 'ckpt_000000003'), copy)
  with pytest.raises(CheckpointFormatError, match='ckpt_000000999') as e:
    resume_worker.make_loop(out)
  assert 'records step 3' in str(e.value) and '\n' not in str(e.value)
  assert os.path.isdir(copy)


def _truncate_arrays(path):
  [name] = [n for n in os.listdir(path) if n.endswith('.safetensors')]
  with open(os.path.join(path, name), 'r+b') as f:
    f.truncate(100)


def test_corrupt_newest_named_checkpoints_do_not_evict_fresh_ones(tmp_path):
  """Item 3: with damaged high-numbered checkpoints, each new checkpoint is
  kept and a restart resumes from the newest valid one, not from step 0."""
  out = str(tmp_path)
  resume_worker.run(out, 3)  # ckpt_1, ckpt_3 (keep_checkpoints=2).
  for step in (20, 21):  # Valid metadata of a later step, damaged arrays.
    path = os.path.join(out, f'ckpt_{step:09d}')
    native.save_native(path, {'weights': [np.ones(3)]},
                       {'step': step, 'kind': 'Loop'})
    _truncate_arrays(path)
  loop = resume_worker.make_loop(out)
  assert loop.step == 3
  loop.run(4)  # Saves 6 and the final 7.
  names = sorted(n for n in os.listdir(out) if n.startswith('ckpt_'))
  assert names == ['ckpt_000000006', 'ckpt_000000007', 'ckpt_000000020',
                   'ckpt_000000021']  # Damaged ones kept, never counted.
  assert resume_worker.make_loop(out).step == 7


def test_no_silent_restart_when_no_checkpoint_is_usable(tmp_path):
  """Item 6: every checkpoint damaged -> an error naming each; the logs and
  the run's files stay as they were."""
  out = str(tmp_path)
  resume_worker.run(out, 3)
  for name in os.listdir(out):  # No Trax files to fall back to.
    if name.startswith('model.') or name.startswith('model_') and (
        name.endswith('.gz')):
      os.remove(os.path.join(out, name))
  for name in ('ckpt_000000001', 'ckpt_000000003', 'model_000000001'):
    _truncate_arrays(os.path.join(out, name))
  before = toys.file_bytes(out)
  with pytest.raises(CheckpointError) as e:
    resume_worker.make_loop(out)
  message = str(e.value)
  assert '\n' not in message and 'none is usable' in message
  for name in ('ckpt_000000001', 'ckpt_000000003', 'model_000000001'):
    assert name in message
  assert toys.file_bytes(out) == before  # metrics.jsonl included.


def test_damaged_trax_fallback_is_an_error_not_a_restart(tmp_path):
  """Item 6: only Trax files, and they are damaged: an error, not step 0."""
  out = str(tmp_path)
  resume_worker.run(out, 3)
  for name in os.listdir(out):
    if name.startswith(('ckpt_', 'model_')) and '.' not in name:
      shutil.rmtree(os.path.join(out, name))
  os.remove(os.path.join(out, 'model.opt_slots0.npy.gz'))
  with pytest.raises(CheckpointError, match='model.opt_slots0.npy.gz'):
    resume_worker.make_loop(out)


@pytest.mark.parametrize('n', [5, 10])
def test_final_step_is_checkpointed(tmp_path, n):
  """Item 7: with rolling checkpoints every 3 (permanent every 10), run(n)
  leaves step n as the newest checkpoint, native and Trax."""
  out = str(tmp_path)
  loop = resume_worker.run(out, n)
  path = os.path.join(out, f'ckpt_{n:09d}')
  assert native.load_native(path).metadata['step'] == n
  trax = read_trax_checkpoint(os.path.join(out, 'model.pkl.gz'))
  assert trax['step'] == n
  for a, b in zip(trax['flat_weights'], toys.leaves(loop.model.weights)):
    np.testing.assert_array_equal(a, b)
  assert resume_worker.make_loop(out).step == n


class _Killed(BaseException):
  pass


def test_a_kill_between_the_two_formats_leaves_no_stale_trax_files(
    tmp_path, monkeypatch):
  """Item 7 with item 4: killed after the native checkpoint of the final
  step 5 but before Trax's files; the resumed run rewrites them."""
  from retrax.supervised import checkpointing
  real_write = checkpointing.save_trax_state

  def write_then_die(basename, host_state, *args):
    if host_state.step == 5:
      raise _Killed()
    real_write(basename, host_state, *args)

  monkeypatch.setattr(checkpointing, 'save_trax_state', write_then_die)
  with pytest.raises(_Killed):
    resume_worker.run(str(tmp_path), 5)
  monkeypatch.setattr(checkpointing, 'save_trax_state', real_write)
  loop = resume_worker.run(str(tmp_path), 5)
  assert loop.step == 5
  trax = read_trax_checkpoint(os.path.join(tmp_path, 'model.pkl.gz'))
  assert trax['step'] == 5
  for a, b in zip(trax['flat_weights'], toys.leaves(loop.model.weights)):
    np.testing.assert_array_equal(a, b)


_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=4',
         '--set', 'checkpoint_every=4', '--set', 'warmup_steps=2']


def test_cli_train_saves_its_last_step_and_validates_before_writing(
    tmp_path, capsys):
  """Item 7 through `retrax train` (6 steps, checkpoint_every=4); item 10: a
  start that fails rewrites no run_config.json."""
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '6', '--quiet',
                   '--no-sample', *_TINY]) == 0
  capsys.readouterr()
  assert native.read_metadata(os.path.join(out, 'ckpt_000000006'))[
      'step'] == 6
  for name in os.listdir(out):
    if name.endswith('.gz'):
      os.remove(os.path.join(out, name))
    elif native.is_native_checkpoint(os.path.join(out, name)):
      _truncate_arrays(os.path.join(out, name))
  with open(os.path.join(out, 'run_config.json'), 'rb') as f:
    config = f.read()
  assert cli.main(['train', '--output_dir', out, '--steps', '8', '--quiet',
                   '--no-sample', '--set', 'seed=7', *_TINY]) == 2
  err = capsys.readouterr().err
  assert 'none is usable' in err and 'ckpt_000000006' in err
  with open(os.path.join(out, 'run_config.json'), 'rb') as f:
    assert f.read() == config


def _nan_after(step):
  return lambda n: 0.01 if n < step else float('nan')


def test_nan_learning_rate_stops_before_a_nan_checkpoint(tmp_path):
  """Item 9: a schedule turning NaN at step 3 (a checkpoint step) stops the
  run before that step; no checkpoint holds NaN."""
  task = training.TrainTask(
      toys.copy_batches(0), toys.WeightedCrossEntropy(), optimizers.Adam(0.01),
      lr_schedule=_nan_after(3), n_steps_per_checkpoint=3)
  loop = training.Loop(toys.mlp(), task, output_dir=str(tmp_path),
                       random_seed=0)
  with pytest.raises(NonFiniteLossError,
                     match='Step 3: the learning rate of task 0 is nan'):
    loop.run(6)
  for name in os.listdir(tmp_path):
    path = os.path.join(tmp_path, name)
    if native.is_native_checkpoint(path):
      weights = native.load_native(path).trees['weights']
      assert all(np.all(np.isfinite(w)) for w in toys.leaves(weights)), name
  assert not os.path.exists(os.path.join(tmp_path, 'ckpt_000000003'))


def test_nan_weights_are_never_saved(tmp_path):
  """Item 9: whatever made them NaN, such weights never reach a checkpoint."""
  loop = resume_worker.run(str(tmp_path), 1)
  weights = loop.model.weights
  bad = [np.full_like(w, np.nan) for w in toys.leaves(weights)]
  loop.update_weights_and_state(weights=unflatten_like(bad, weights))
  with pytest.raises(NonFiniteLossError, match='weights hold NaN'):
    loop.save_checkpoint(permanent=True)  # model_000000001 exists: kept.
  saved = native.load_native(os.path.join(tmp_path, 'model_000000001'))
  assert all(np.all(np.isfinite(w))
             for w in toys.leaves(saved.trees['weights']))
  assert all(np.all(np.isfinite(w)) for w in read_trax_checkpoint(
      os.path.join(tmp_path, 'model_1.pkl.gz'))['flat_weights'])


class _Stop(Exception):
  pass


class _StopAt7(callbacks.TrainingStepCallback):

  def call_at(self, step):
    return step == 7

  def on_step_begin(self, step):
    pass

  def on_step_end(self, step):
    raise _Stop()


def _eval_every_4_loop(output_dir, extra_callbacks=()):
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05), n_steps_per_checkpoint=3)
  evals = training.EvalTask(toys.copy_batches(100), [toys.WeightedAccuracy()],
                            n_eval_batches=1)
  return training.Loop(toys.mlp(), task, eval_tasks=evals,
                       output_dir=output_dir, random_seed=0,
                       eval_at=lambda n: n % 4 == 0,
                       callbacks=list(extra_callbacks))


def test_resume_logs_the_same_train_loss_when_evals_and_checkpoints_differ(
    tmp_path):
  """Item 10: the step-8 mean averages steps 5..8 after a resume at 6 too."""
  ref = _eval_every_4_loop(str(tmp_path / 'ref'))
  ref.run(8)
  with pytest.raises(_Stop):
    _eval_every_4_loop(str(tmp_path / 'run'), [_StopAt7]).run(8)
  loop = _eval_every_4_loop(str(tmp_path / 'run'))
  assert loop.step == 6
  loop.run(2)
  assert _history(loop) == _history(ref)


def test_orphan_temp_files_of_killed_writes_are_removed(tmp_path):
  """Item 10: only retrax's own temporary names, only in its directories."""
  out = tmp_path
  resume_worker.run(str(out), 3)
  ours = ['.model.pkl.gz.abcd_123.tmp', '.metrics.jsonl.zz9xk2ab.tmp',
          '.model.weights.npy.gz.a1b2c3d4.tmp',
          '.model.weights.6-0123abcd.npy.gz',
          '.model_6.opt_slots0.6-89abcdef.npy.gz',
          'ckpt_000000003/.arrays.q1w2e3r4.tmp',
          'ckpt_000000003/.metadata.json.q1w2e3r4.tmp']
  theirs = ['.notes.txt.abcdefgh.tmp', 'scratch.tmp', 'sub/.model.pkl.gz.'
            'abcdefgh.tmp', '.model.weights.npy.gz.tmp']
  for name in ours + theirs:
    os.makedirs(os.path.dirname(out / name), exist_ok=True)
    (out / name).write_bytes(b'x')
  events = [os.path.relpath(p, out)
            for p in metrics_log.RunFiles(str(out)).files() if 'tfevents' in p]
  for rel in events:  # A kill while cutting an event file back.
    d, name = os.path.split(rel)
    ours.append(os.path.join(d, f'.{name}.isl09l73.tmp'))
    (out / ours[-1]).write_bytes(b'x')
  loop = resume_worker.make_loop(str(out))
  assert loop.step == 3
  for name in ours:
    assert not (out / name).exists(), name
  for name in theirs:
    assert (out / name).read_bytes() == b'x', name


def test_failed_start_leaves_the_run_files_alone(tmp_path):
  """Item 10: a start that fails validation rewrites no run metadata."""
  out = str(tmp_path)
  resume_worker.run(out, 3)
  for name in ('ckpt_000000001', 'ckpt_000000003', 'model_000000001'):
    _truncate_arrays(os.path.join(out, name))
  for name in os.listdir(out):
    if name.endswith('.gz'):
      os.remove(os.path.join(out, name))
  with open(os.path.join(out, 'model.json'), 'w') as f:
    f.write('{"sentinel": 1}')
  with pytest.raises(CheckpointError):
    resume_worker.make_loop(out)
  with open(os.path.join(out, 'model.json')) as f:
    assert f.read() == '{"sentinel": 1}'
