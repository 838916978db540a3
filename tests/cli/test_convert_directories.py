"""`retrax convert DIR OUT` where DIR holds no checkpoint itself: one line
naming what convert takes and the run's own checkpoints."""

import os

import numpy as np

from retrax import checkpoints
from retrax.app import cli


def _error(argv, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and 'Traceback' not in err and 'Errno' not in err, err
  return err


def test_a_run_directory_names_its_newest_checkpoint(tmp_path, capsys):
  run = tmp_path / 'run'
  run.mkdir()
  (run / 'run_config.json').write_text('{}')
  for step in (4, 12):
    checkpoints.save_native(str(run / f'ckpt_{step:09d}'),
                            {'weights': [np.zeros(2, np.float32)]},
                            {'step': step})
  (run / 'model.pkl.gz').write_bytes(b'')
  err = _error(['convert', str(run), str(tmp_path / 'out')], capsys)
  newest = os.path.join(str(run), 'ckpt_000000012')
  assert err.startswith(f'retrax convert: error: {run} is a retrax run '
                        'directory; convert takes one checkpoint'), err
  assert f'retrax convert {newest} OUT' in err
  assert os.path.join(str(run), 'model.pkl.gz') in err
  assert not os.path.exists(tmp_path / 'out')
  # The command it names works.
  assert cli.main(['convert', newest, str(tmp_path / 'out')]) == 0


def test_another_directory_says_what_convert_takes(tmp_path, capsys):
  empty = tmp_path / 'empty'
  empty.mkdir()
  err = _error(['convert', str(empty), str(tmp_path / 'out')], capsys)
  assert 'is a directory but not a native checkpoint' in err
  assert 'a Trax .pkl.gz file' in err and 'in it' not in err
