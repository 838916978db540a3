"""Damaged run files are one-line errors with exit code 2 (issue 29, item 3).

`run_config.json` and `run_files.json` are read by `retrax train` (resuming),
`eval` and `sample`; whatever they hold, the command ends with one line
naming the file, never a traceback.
"""

import os

import pytest

from retrax.app import cli

_RUN = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
        '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=2',
        '--set', 'checkpoint_every=2', '--set', 'warmup_steps=1',
        '--steps', '2', '--quiet', '--no-sample']


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('run_files') / 'run')
  assert cli.main(['train', '--output_dir', out, *_RUN]) == 0
  return out


def _one_line(capsys, *fragments):
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and 'Traceback' not in err, err
  for fragment in fragments:
    assert fragment in err, err


@pytest.mark.parametrize('name,content', [
    ('run_config.json', b'{"steps": 2,'),
    ('run_config.json', b'[1, 2]'),
    ('run_config.json', b'\xff\xfe'),
    ('run_config.json', b'{"steps": ' + b'9' * 5000 + b'}'),
    ('run_files.json', b'{"format": "retrax-run-files", "files": [[1]]}'),
    ('run_files.json', b'[]'),
    ('run_files.json', b'[' * 100_000),  # Too deep: RecursionError.
], ids=['config-truncated', 'config-not-an-object', 'config-not-utf8',
        'config-5000-digits', 'files-bad-entry', 'files-not-an-object',
        'files-too-deep'])
def test_damaged_run_files_are_one_line(run, tmp_path, capsys, name, content):
  path = os.path.join(run, name)
  with open(path, 'rb') as f:
    good = f.read()
  try:
    with open(path, 'wb') as f:
      f.write(content)
    commands = [['train', '--output_dir', run, *_RUN]]
    if name == 'run_config.json':
      commands.append(['eval', run, '--batches', '1'])
    for argv in commands:
      capsys.readouterr()
      assert cli.main(argv) == 2
      _one_line(capsys, f'retrax {argv[0]}: error:', name)
  finally:
    with open(path, 'wb') as f:
      f.write(good)
