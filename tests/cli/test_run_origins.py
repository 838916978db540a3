"""Runs that trained, from each trainer, work with every command.

`retrax train`, and `python -m retrax.trainer` on configs laid out as Trax's
`reformer_copy.gin` and `terraformer_copy.gin` are (tests/fixtures/gin), end
with the same lines and leave runs that `retrax sample`, `eval`, `plot` and
`retrax.load_run` read; so does `retrax convert` of a Trax trainer's run
directory (the Loop's and Hugging Face's runs: tests/test_run_contract.py).
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import retrax
from retrax.app import cli

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
_GIN_DIR = os.path.join(_ROOT, 'tests', 'fixtures', 'gin')
_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=4', '--set',
         'eval_every=2', '--set', 'checkpoint_every=2', '--set',
         'warmup_steps=1', '--attention', 'lsh', '--length', '16',
         '--chunk_len', '4', '--vocab_size', '8', '--steps', '2', '--quiet']


def _next_lines(text, run_dir, step):
  assert f'Saved the run (step {step}) in {run_dir}' in text, text[-2000:]
  assert f'Next: retrax sample {run_dir}' in text


def _eval_numbers(text):
  found = dict(re.findall(r'(WeightedCategory\w+) ([0-9.]+)', text))
  assert set(found) == {'WeightedCategoryCrossEntropy',
                        'WeightedCategoryAccuracy'}, text
  return found


@pytest.mark.slow
def test_a_retrax_train_run_with_every_command(tmp_path, capsys):
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--no-sample', *_TINY]) == 0
  _next_lines(capsys.readouterr().out, out, 2)
  assert cli.main(['sample', out, '-n', '2']) == 0
  assert '/2 copies correct' in capsys.readouterr().out
  assert cli.main(['eval', out, '--batches', '1']) == 0
  _eval_numbers(capsys.readouterr().out)
  assert cli.main(['plot', out]) == 0
  assert os.path.isfile(capsys.readouterr().out.strip())
  # The CLI's own LSH run, loaded for eval, takes any batch (row by row).
  run = retrax.load_run(out, mode='eval')
  fresh = run.model.state
  x = np.random.default_rng(0).integers(1, 8, (3, 16)).astype(np.int32)
  batch = np.asarray(run.model(x))
  run.model.state = fresh
  np.testing.assert_allclose(batch[2:], np.asarray(run.model(x[2:])),
                             rtol=1e-6, atol=1e-6)


# Every command on a gin run, in one process (reading the run's data parses
# its config.gin into gin's config): the lines they print, then decoding.
_COMMANDS = '''
import sys
import numpy as np
import retrax
from retrax.app import cli
from retrax.supervised import decoding
run_dir = sys.argv[1]
for argv in (['sample', run_dir, '-n', '2'], ['eval', run_dir, '--batches',
             '1'], ['eval', run_dir, '--batches', '1'], ['plot', run_dir]):
  print('RC', argv[0], cli.main(argv), flush=True)
run = retrax.load_run(run_dir, mode='predict')
source = np.zeros((1, 16), np.int32)
source[0, :5] = [3, 1, 4, 1, 5]
if run.model.n_in == 2:
  out = decoding.autoregressive_sample(run.model, inputs=source,
                                       temperature=0.0, max_length=3,
                                       eos_id=None)
else:
  out = decoding.autoregressive_sample(run.model, prompt=source[:, :5],
                                       batch_size=1, temperature=0.0,
                                       max_length=3, eos_id=None)
print('DECODED', np.asarray(out).shape)
'''


def _gin_run(tmp_path, config, *bindings):
  out_dir = str(tmp_path / 'run')
  bindings = ['train.steps = 2', 'train.eval_frequency = 2',
              'ReformerLM.n_layers = 1', 'sequence_copy_inputs.batch_size = 4',
              *bindings]
  train = subprocess.run(
      [sys.executable, '-m', 'retrax.trainer',
       f'--config_file={os.path.join(_GIN_DIR, config)}',
       *[f'--config={b}' for b in bindings], f'--output_dir={out_dir}'],
      cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
  assert train.returncode == 0, train.stderr[-3000:]
  _next_lines(train.stdout, out_dir, 2)
  commands = subprocess.run(
      [sys.executable, '-c', _COMMANDS, out_dir], cwd=_ROOT,
      capture_output=True, text=True, timeout=900, check=False)
  assert commands.returncode == 0, commands.stderr[-3000:]
  text = commands.stdout
  for name in ('sample', 'eval', 'plot'):
    assert f'RC {name} 0' in text, (text[-3000:], commands.stderr[-3000:])
  assert 'DECODED (1, 3)' in text
  assert os.path.isfile(os.path.join(out_dir, 'metrics.png'))
  first, again = re.findall(r'eval over 1 batches: .*', text)
  assert first == again  # The data's generators are seeded: it repeats.
  _eval_numbers(first)
  return text


def _samples(text):
  """`(input, output, target)` ids of the sample lines."""
  found = re.findall(r'input   ([\d ]+)\n  output ([\d ]+?)  '
                     r'(= target|target [\d ]+)\n', text)
  rows = []
  for given, out, target in found:
    out = out.split()
    target = out if target == '= target' else target.split()[1:]
    rows.append((given.split(), out, target))
  assert len(rows) == 2 and '/2 outputs equal their targets' in text, text
  return rows


# A run of Trax's trainer (its checkpoint files and config.gin, as
# `python -m trax.trainer` leaves them; here the gin run's own Trax files)
# converted to a retrax run: the same model and weights, and its data.
_CONVERTED = '''
import sys
import numpy as np
import retrax
from retrax.app import cli
trax_dir, run_dir = sys.argv[1:]
print('RC convert', cli.main(['convert', trax_dir, run_dir]), flush=True)
for argv in (['sample', run_dir, '-n', '1'], ['eval', run_dir, '--batches',
             '1']):
  print('RC', argv[0], cli.main(argv), flush=True)
x = np.random.default_rng(0).integers(1, 9, (2, 16)).astype(np.int32)
gin_run = retrax.load_run(trax_dir + '/../run', mode='eval', seed=0)
converted = retrax.load_run(run_dir, mode='eval', seed=0)
print('SAME', np.array_equal(np.asarray(gin_run.model(x)),
                             np.asarray(converted.model(x))))
'''


@pytest.mark.slow
def test_a_reformer_copy_gin_run_with_every_command(tmp_path):
  text = _gin_run(tmp_path, 'copy_lsh.gin')
  for given, out, target in _samples(text):
    # The prompt is the example up to its scored half (`0 w 0`); the copy
    # is as long as `w`.
    assert given[0] == '0' and given[-1] == '0'
    assert len(out) == len(target) == len(given) - 2

  trax_dir = tmp_path / 'trax_run'
  trax_dir.mkdir()
  for name in os.listdir(tmp_path / 'run'):
    if name.startswith('model.') or name == 'config.gin':
      shutil.copy(tmp_path / 'run' / name, trax_dir / name)
  out = subprocess.run(
      [sys.executable, '-c', _CONVERTED, str(trax_dir),
       str(tmp_path / 'converted')], cwd=_ROOT, capture_output=True,
      text=True, timeout=900, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  for name in ('convert', 'sample', 'eval'):
    assert f'RC {name} 0' in out.stdout, (out.stdout[-3000:], out.stderr)
  assert 'SAME True' in out.stdout
  assert sorted(os.listdir(tmp_path / 'converted')) == [
      'config.gin', 'model.json', 'model_000000002']


@pytest.mark.slow
def test_a_terraformer_copy_gin_run_with_every_command(tmp_path):
  text = _gin_run(tmp_path, 'terraformer_copy_lsh.gin')
  for given, out, target in _samples(text):
    # The input is the source `w` padded; the output as long as `w`.
    assert len(out) == len(target) == len([t for t in given if t != '0'])
