"""One run directory, one writer, nothing outside it touched (issue 29, items 1-2).

A second process on a run directory is refused with its holder's pid and host
(a killed holder's lock is taken over); within a process the newest Loop
takes the directory over. `run_files.json` entries and symlinks never lead a
write, truncation or delete outside the run directory.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

import resume_worker
import supervised_toys as toys
from retrax.app import cli
from retrax import run_layout
from retrax.checkpoints import native
from retrax.checkpoints import ownership
from retrax.supervised import metrics_log
from tests.multiprocess_env import cpu_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=4',
         '--set', 'checkpoint_every=4', '--set', 'warmup_steps=2']
# Builds the test's Loop in another process and keeps it (and the lock).
_HOLDER = ('import sys, time, resume_worker\n'
           'loop = resume_worker.make_loop(sys.argv[1])\n'
           'loop.run(2)\n'
           'print("ready", flush=True)\n'
           'time.sleep(300)\n')


@pytest.fixture
def holder(tmp_path):
  """A live process whose Loop owns `tmp_path/run` (at step 2)."""
  out = str(tmp_path / 'run')
  proc = subprocess.Popen([sys.executable, '-c', _HOLDER, out],
                          stdout=subprocess.PIPE, text=True,
                          env=cpu_env(1, pythonpath=[_HERE, _ROOT]))
  try:
    for line in proc.stdout:  # After the Loop's own log lines.
      if line.strip() == 'ready':
        break
    assert proc.poll() is None, 'the holder ended early'
    yield out, proc
  finally:
    if proc.poll() is None:
      proc.kill()
    proc.wait()
    proc.stdout.close()


def test_a_second_writer_is_refused_and_a_killed_ones_lock_taken_over(
    holder, capsys):
  out, proc = holder
  before = toys.file_bytes(out)
  with pytest.raises(ownership.RunDirInUseError) as e:
    resume_worker.make_loop(out)
  message = str(e.value)
  assert f'process {proc.pid} on host {socket.gethostname()}' in message
  assert '\n' not in message
  assert cli.main(['train', '--output_dir', out, '--steps', '2', '--quiet',
                   '--no-sample', *_TINY]) == 2
  err = capsys.readouterr().err.strip()
  assert f'process {proc.pid}' in err and '\n' not in err
  # No run_config.json, logs or checkpoints.
  assert toys.file_bytes(out) == before
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  loop = resume_worker.make_loop(out)  # The dead process's lock is taken over.
  assert loop.step == 2
  with open(os.path.join(out, run_layout.LOCK_FILE)) as f:
    assert json.load(f)['pid'] == os.getpid()


def test_the_newest_loop_of_a_process_takes_the_directory_over(tmp_path):
  out = str(tmp_path)
  old = resume_worker.run(out, 3)
  new = resume_worker.make_loop(out)
  with pytest.raises(ownership.RunDirInUseError, match='newer Loop'):
    old.run(1)
  with pytest.raises(ownership.RunDirInUseError, match='newer Loop'):
    old.save_checkpoint()
  new.run(1)
  assert resume_worker.make_loop(out).step == 4


def test_a_stale_lock_file_of_a_dead_process_is_taken_over(tmp_path):
  out = str(tmp_path)
  with open(os.path.join(out, run_layout.LOCK_FILE), 'w') as f:
    json.dump({'pid': 2 ** 22 + 12345, 'host': socket.gethostname()}, f)
  resume_worker.run(out, 1)
  with open(os.path.join(out, run_layout.LOCK_FILE)) as f:
    assert json.load(f)['pid'] == os.getpid()


def _outside_files(outside):
  """An outside event file, metrics file and a user file named like a
  retrax temporary; returns their bytes."""
  outside.mkdir()
  (outside / 'train').mkdir()
  events = outside / 'train' / 'events.out.tfevents.1.h.1.retrax'
  with open(events, 'wb') as f:
    for step in range(10):
      f.write(metrics_log.frame_record(metrics_log.encode_event(
          0.0, step, scalars=[('metrics/loss', 1.0)])))
  (outside / 'metrics.jsonl').write_text('{"step": 99, "value": 1.0}\n')
  (outside / '.metrics.jsonl.abcdefgh.tmp').write_text('user data')
  (outside / 'train' / '.events.out.tfevents.1.h.1.retrax.abcdefgh.tmp'
   ).write_text('user data')
  return toys.file_bytes(outside)


@pytest.mark.parametrize('entry', ['../outside/metrics.jsonl',
                                   '../outside/train/events.out.tfevents.1.h.'
                                   '1.retrax', 'ABSOLUTE'])
def test_run_files_entries_never_lead_outside(tmp_path, entry):
  out = tmp_path / 'run'
  resume_worker.run(str(out), 3)
  before = _outside_files(tmp_path / 'outside')
  if entry == 'ABSOLUTE':
    entry = str(tmp_path / 'outside' / 'metrics.jsonl')
  path = out / run_layout.RUN_FILES
  doc = json.loads(path.read_text())
  doc['files'].append(entry)
  path.write_text(json.dumps(doc))
  with pytest.raises(ownership.OutsideRunDirError) as e:
    resume_worker.make_loop(str(out))
  assert 'run_files.json' in str(e.value) and '\n' not in str(e.value)
  assert toys.file_bytes(tmp_path / 'outside') == before


def test_a_log_file_behind_a_symlink_is_neither_cut_nor_cleaned(tmp_path):
  out = tmp_path / 'run'
  resume_worker.run(str(out), 3)
  before = _outside_files(tmp_path / 'outside')
  shutil.rmtree(out / 'train')
  os.symlink(tmp_path / 'outside' / 'train', out / 'train')
  path = out / run_layout.RUN_FILES
  doc = json.loads(path.read_text())
  doc['files'].append('train/events.out.tfevents.1.h.1.retrax')
  path.write_text(json.dumps(doc))
  with pytest.raises(ownership.OutsideRunDirError, match='outside'):
    resume_worker.make_loop(str(out))
  assert toys.file_bytes(tmp_path / 'outside') == before


def test_new_event_files_are_not_written_through_a_symlink(tmp_path):
  out = tmp_path / 'run'
  out.mkdir()
  (tmp_path / 'elsewhere').mkdir()
  os.symlink(tmp_path / 'elsewhere', out / 'eval')
  loop = resume_worker.make_loop(str(out))
  with pytest.raises(ownership.OutsideRunDirError, match='eval'):
    loop.run(1)
  assert not os.listdir(tmp_path / 'elsewhere')


def test_rotation_never_deletes_through_a_symlinked_checkpoint(tmp_path):
  out = tmp_path / 'run'
  resume_worker.run(str(out), 3)  # ckpt_1, ckpt_3 (keep_checkpoints=2).
  target = tmp_path / 'kept_elsewhere'
  shutil.move(str(out / 'ckpt_000000001'), target)
  os.symlink(target, out / 'ckpt_000000001')
  before = toys.file_bytes(target)
  loop = resume_worker.make_loop(str(out))
  loop.run(6)  # Rotation at steps 6 and 9 would delete ckpt_1.
  assert toys.file_bytes(target) == before
  assert native.verify_native(str(target))['step'] == 1
  assert os.path.islink(out / 'ckpt_000000001')
  names = sorted(n for n in os.listdir(out) if n.startswith('ckpt_'))
  assert names == ['ckpt_000000001', 'ckpt_000000006', 'ckpt_000000009']


def test_a_save_is_not_written_outside_through_a_symlink(tmp_path):
  out = tmp_path / 'run'
  resume_worker.run(str(out), 1)
  (tmp_path / 'elsewhere').mkdir()
  os.symlink(tmp_path / 'elsewhere', out / 'ckpt_000000003')
  loop = resume_worker.make_loop(str(out))
  with pytest.raises(ownership.OutsideRunDirError, match='ckpt_000000003'):
    loop.run(2)
  assert not os.listdir(tmp_path / 'elsewhere')
  with pytest.raises(ownership.OutsideRunDirError, match='outside'):
    loop.save_checkpoint('../elsewhere/named')
  assert not os.listdir(tmp_path / 'elsewhere')
  assert loop.step == 3


@pytest.mark.parametrize('kind', ['symlink', 'fifo', 'directory'])
def test_a_lock_file_that_is_no_regular_file_is_refused(tmp_path, kind):
  run, victim = tmp_path / 'run', tmp_path / 'victim.txt'
  run.mkdir()
  victim.write_text('user data')
  lock = run / run_layout.LOCK_FILE
  if kind == 'symlink':
    lock.symlink_to(os.path.join('..', 'victim.txt'))
  elif kind == 'fifo':
    os.mkfifo(lock)
  else:
    lock.mkdir()
  with pytest.raises(ownership.BadLockFileError, match='not a regular file'):
    ownership.RunLock(str(run))
  assert victim.read_text() == 'user data'  # Not written through the link.
