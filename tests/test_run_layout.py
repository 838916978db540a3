"""One module names every file of a run directory (`retrax.run_layout`).

A CLI run and a `Loop` run write only entries `run_layout` lists, and no
other module of retrax spells one of those names itself.
"""

import ast
import os
import pathlib

from retrax.app import cli
from retrax import run_layout

_RETRAX = pathlib.Path(run_layout.__file__).parent
_NAMES = {run_layout.LOCK_FILE, run_layout.CONFIG_FILE,
          run_layout.TOKENIZER_FILE, run_layout.MODEL_FILE,
          run_layout.METRICS_FILE, run_layout.RUN_FILES,
          run_layout.HF_CONFIG_COPY, run_layout.GIN_CONFIG_FILE,
          run_layout.EVENTS_PREFIX,
          run_layout.ROLLING_PREFIX, run_layout.PERMANENT_PREFIX,
          run_layout.MLFLOW_STORE}


def _unlisted(directory):
  """Entries of a run directory that run_layout does not describe."""
  bad = []
  for entry in os.scandir(directory):
    if entry.is_dir():
      if run_layout.is_checkpoint(entry.name):
        continue
      for root, _, files in os.walk(entry.path):  # TensorBoard folders.
        bad += [os.path.join(root, f) for f in files
                if not f.startswith(run_layout.EVENTS_PREFIX)]
    elif not run_layout.is_run_file(entry.name):
      bad.append(entry.path)
  return bad


def test_a_cli_run_writes_only_listed_entries(tmp_path):
  out = tmp_path / 'run'
  assert cli.main([
      'train', '--output_dir', str(out), '--steps', '2', '--quiet',
      '--no-sample', '--set', 'd_model=16', '--set', 'd_ff=32', '--set',
      'n_layers=1', '--set', 'd_head=8', '--set', 'batch_size=2', '--set',
      'eval_every=1', '--set', 'checkpoint_every=1', '--set',
      'warmup_steps=0', '--attention', 'local', '--length', '16',
      '--trax_files', 'true']) == 0
  names = set(os.listdir(out))
  assert {run_layout.CONFIG_FILE, run_layout.MODEL_FILE,
          run_layout.METRICS_FILE, run_layout.RUN_FILES,
          'model.pkl.gz'} <= names, names
  assert any(run_layout.is_checkpoint(n) for n in names), names
  assert _unlisted(out) == []
  (out / 'notes.txt').write_text('mine')  # A user's file is not the run's.
  assert _unlisted(out) == [str(out / 'notes.txt')]


def test_the_names_are_spelled_only_in_run_layout():
  spelled = []
  for path in _RETRAX.rglob('*.py'):
    if path.name == 'run_layout.py':
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and node.value in _NAMES:
        spelled.append(f'{path.relative_to(_RETRAX)}:{node.lineno} '
                       f'{node.value!r}')
  assert spelled == []
