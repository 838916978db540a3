"""Which errors the CLI prints as one line with exit 2, and which keep their traceback."""

import gzip
import os
import pickle

import numpy as np

import pytest

import retrax
from retrax.app import cli
from retrax import errors
from retrax.checkpoints import errors as checkpoint_errors
from retrax import validation
from retrax.supervised import batch_checks


def _one_line(capsys, *fragments):
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and 'Traceback' not in err, err
  for fragment in fragments:
    assert fragment in err, err
  return err


class _Evil:

  def __reduce__(self):
    return (os.system, ('echo should-not-run',))


def test_unsafe_checkpoint_is_one_line_exit_2(tmp_path, capsys):
  path = tmp_path / 'model.pkl.gz'
  path.write_bytes(gzip.compress(pickle.dumps(_Evil())))
  assert cli.main(['convert', str(path), str(tmp_path / 'out')]) == 2
  _one_line(capsys, 'retrax convert: error:', 'refused global')
  assert not os.path.exists(tmp_path / 'out')


def test_corrupted_checkpoint_is_one_line_exit_2(tmp_path, capsys):
  path = tmp_path / 'model.pkl.gz'
  path.write_bytes(b'\x1f\x8b' + b'\x00' * 40)
  assert cli.main(['convert', str(path), str(tmp_path / 'out')]) == 2
  _one_line(capsys, 'retrax convert: error:')


@pytest.mark.parametrize('error', [
    checkpoint_errors.CheckpointError('ckpt_000000004: bad\nheader'),
    validation.ArgumentValueError('Dense: n_units must be an int >= 1'),
    batch_checks.BadBatchError('train task: token id 40 >= vocab_size 32'),
    errors.InputValueError('PositionalEncoding encodes 64 positions; got 80'),
    FileNotFoundError('no such run'),
])
def test_user_errors_from_the_library_exit_2(monkeypatch, capsys, error):
  def fail(*args, **kwargs):
    raise error
  monkeypatch.setattr(cli, 'cmd_eval', fail)
  assert cli.main(['eval', 'some-run']) == 2
  _one_line(capsys, 'retrax eval: error:', str(error).split('\n')[0])


@pytest.mark.parametrize('error', [ValueError('a library bug'),
                                   TypeError('another bug'),
                                   KeyError('weights')])
def test_library_bugs_keep_their_traceback(monkeypatch, error):
  def fail(*args, **kwargs):
    raise error
  monkeypatch.setattr(cli, 'cmd_eval', fail)
  with pytest.raises(type(error)):
    cli.main(['eval', 'some-run'])


def _layer_error(cause):
  """What a layer whose function raises `cause` raises when called."""
  from retrax import layers as tl

  def fail(x):
    raise cause
  with pytest.raises(tl.LayerError) as e:
    tl.Fn('Fail', fail)(np.ones(2, np.float32))
  return e.value


def test_a_layer_error_around_a_bug_keeps_its_traceback(monkeypatch):
  error = _layer_error(TypeError('unsupported operand'))
  assert isinstance(error, retrax.Error)  # Caught, then raised again.

  def fail(*args, **kwargs):
    raise error
  monkeypatch.setattr(cli, 'cmd_eval', fail)
  with pytest.raises(type(error)) as e:
    cli.main(['eval', 'some-run'])
  assert isinstance(e.value.__cause__, TypeError)


def test_a_layer_error_around_a_check_is_one_line(monkeypatch, capsys):
  error = _layer_error(errors.InputValueError('Fail expects rank 2; got 1'))

  def fail(*args, **kwargs):
    raise error
  monkeypatch.setattr(cli, 'cmd_eval', fail)
  assert cli.main(['eval', 'some-run']) == 2
  _one_line(capsys, 'retrax eval: error:', 'Fail expects rank 2; got 1')


@pytest.mark.parametrize('argv', [
    ['eval', 'run', '--batches', '0'],
    ['sample', 'run', '-n', '0'],
    ['sample', 'run', '--temperature', '-1'],
    ['train', '--steps', '0'],
])
def test_bad_counts_are_usage_errors(argv, capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  assert 'error' in capsys.readouterr().err


@pytest.mark.parametrize('sets,fragment', [
    (['model=TransformerLM', 'n_heads=3'], 'n_heads'),
    (['dropout=1.5'], 'dropout'),
    (['learning_rate=NaN'], 'learning_rate'),
    (['learning_rate=-1'], 'learning_rate'),
])
def test_bad_model_settings_exit_2_before_training(sets, fragment, tmp_path,
                                                    capsys):
  argv = ['train', '--output_dir', str(tmp_path / 'run'), '--steps', '1',
          '--quiet']
  for item in sets:
    argv += ['--set', item]
  assert cli.main(argv) == 2
  _one_line(capsys, fragment)
  assert not os.path.exists(tmp_path / 'run')


def test_no_warmup_trains(tmp_path, capsys):
  # warmup_steps=0 is a valid config (no warm-up), not a traceback.
  assert cli.main(['train', '--output_dir', str(tmp_path / 'run'), '--steps',
                   '1', '--quiet', '--no-sample', '--set', 'warmup_steps=0',
                   '--set', 'd_model=16', '--set', 'd_ff=32', '--set',
                   'n_layers=1', '--set', 'd_head=8', '--set',
                   'batch_size=4']) == 0
  capsys.readouterr()
