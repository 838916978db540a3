"""A full, read-only or unwritable disk: one line, exit 2, nothing half-written
(issue 29, item 4).

The disk errors are simulated (tests may run as root, where chmod does not
stop writes): safetensors' own I/O error as it reports ENOSPC, `os.write`
failing half-way, `fsync` reporting ENOSPC, `tempfile.mkstemp` refused as
on a read-only mount, the lock file refused (EACCES).
"""

import errno
import json
import os
import shutil
import tempfile

import pytest
import safetensors
import safetensors.numpy

from retrax.app import cli
from retrax.checkpoints import native
from retrax.supervised import metrics_log
from tests.cli.test_cli_errors import _one_line  # The CLI's one-line check.

_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=2',
         '--set', 'checkpoint_every=2', '--set', 'warmup_steps=1', '--quiet',
         '--no-sample']




def _hidden_files(directory):
  return [os.path.join(root, n) for root, _, names in os.walk(directory)
          for n in names if n.startswith('.')]


def test_a_full_disk_during_train_is_one_line_and_the_run_resumes(
    tmp_path, capsys, monkeypatch):
  out = str(tmp_path / 'run')
  real, calls = safetensors.numpy.save_file, []

  def full_at_second_save(arrays, filename, *args, **kwargs):
    calls.append(filename)
    if len(calls) == 2:  # As safetensors reports a full disk.
      with open(filename, 'wb') as f:
        f.write(b'\0' * 100)  # Half-written, as a full disk leaves it.
      raise safetensors.SafetensorError(
          'Error while serializing: I/O error: No space left on device (os '
          'error 28)')
    return real(arrays, filename, *args, **kwargs)

  monkeypatch.setattr(safetensors.numpy, 'save_file', full_at_second_save)
  assert cli.main(['train', '--output_dir', out, '--steps', '4',
                   *_TINY]) == 2
  _one_line(capsys, 'retrax train: error:', 'ENOSPC', 'ckpt_000000002',
            'up to step 1', 'run the same command again')
  assert not os.path.exists(os.path.join(out, 'ckpt_000000002'))
  assert not _hidden_files(out)
  monkeypatch.setattr(safetensors.numpy, 'save_file', real)
  assert cli.main(['train', '--output_dir', out, '--steps', '4',
                   *_TINY]) == 0
  assert 'Resumed from checkpoint' in capsys.readouterr().out
  assert native.read_metadata(os.path.join(out, 'ckpt_000000004'))[
      'step'] == 4


def _half_then_full(monkeypatch):
  real = os.write

  def write(fd, data):
    real(fd, bytes(data)[:len(data) // 2])
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(os, 'write', write)


def _contents(*paths):
  out = {}
  for path in paths:
    with open(path, 'rb') as f:
      out[path] = f.read()
  return out


def test_log_records_are_appended_whole_or_not_at_all(tmp_path, monkeypatch):
  jsonl = metrics_log.JsonlWriter(str(tmp_path / 'metrics.jsonl'))
  jsonl.write(1, 'train', 'loss', 1.0)
  jsonl.flush()
  events = metrics_log.EventWriter(str(tmp_path / 'train'))
  events.scalar('loss', 1.0, 1)
  events.flush()
  before = _contents(jsonl.path, events.path)
  jsonl.write(2, 'train', 'loss', 0.5)
  events.scalar('loss', 0.5, 2)
  _half_then_full(monkeypatch)
  for writer in (jsonl, events):
    with pytest.raises(OSError) as e:
      writer.flush()
    assert e.value.errno == errno.ENOSPC and e.value.filename == writer.path
  monkeypatch.undo()
  assert _contents(*before) == before


def _read_only(monkeypatch):
  def mkstemp(*args, dir=None, prefix='', suffix='', **kwargs):
    raise OSError(errno.EROFS, 'Read-only file system',
                  os.path.join(dir or '.', f'{prefix}xxxxxxxx{suffix}'))
  monkeypatch.setattr(tempfile, 'mkstemp', mkstemp)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('disk') / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '2',
                   *_TINY]) == 0
  return out


@pytest.mark.parametrize('to', ['trax', 'native'])
def test_convert_onto_a_read_only_disk(trained, tmp_path, capsys,
                                       monkeypatch, to):
  capsys.readouterr()
  src = os.path.join(trained, 'ckpt_000000002' if to == 'trax' else
                     'model.pkl.gz')
  dst = str(tmp_path / 'converted')
  _read_only(monkeypatch)
  assert cli.main(['convert', src, dst]) == 2
  _one_line(capsys, 'retrax convert: error:', 'EROFS', 'converted',
            f'{src} is unchanged')
  assert os.listdir(tmp_path) == []


def test_plot_onto_a_read_only_or_full_disk(trained, tmp_path, capsys,
                                            monkeypatch):
  pytest.importorskip('matplotlib')
  capsys.readouterr()
  png = str(tmp_path / 'metrics.png')
  _read_only(monkeypatch)
  assert cli.main(['plot', trained, '--out', png]) == 2
  _one_line(capsys, 'retrax plot: error:', 'EROFS', png, 'no PNG')
  monkeypatch.undo()

  def fsync(fd):  # Where a full disk shows on delayed allocation (NFS, ext4).
    raise OSError(errno.ENOSPC, 'No space left on device')
  monkeypatch.setattr(os, 'fsync', fsync)
  assert cli.main(['plot', trained, '--out', png]) == 2
  _one_line(capsys, 'retrax plot: error:', 'ENOSPC', png)
  monkeypatch.undo()
  assert os.listdir(tmp_path) == []


def test_an_unwritable_run_directory_is_one_line(trained, capsys,
                                                 monkeypatch, tmp_path):
  # A copy: this process may still hold the trained run's lock (a finished
  # Loop keeps it until collected), and then no lock file is opened.
  trained = str(shutil.copytree(trained, tmp_path / 'run'))
  capsys.readouterr()
  real_open = os.open

  def refuse(path, flags, *args, **kwargs):
    if str(path).endswith('retrax.lock'):
      raise PermissionError(errno.EACCES, 'Permission denied', path)
    return real_open(path, flags, *args, **kwargs)
  monkeypatch.setattr(os, 'open', refuse)
  with open(os.path.join(trained, 'run_config.json')) as f:
    steps = json.load(f)['steps']
  assert cli.main(['train', '--output_dir', trained, '--steps',
                   str(steps + 2), *_TINY]) == 2
  _one_line(capsys, 'retrax train: error:', 'EACCES', 'retrax.lock',
            'up to step 2')
