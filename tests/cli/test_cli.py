"""The `retrax` command line: a tiny train/sample run and its one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from retrax.app import cli
from retrax.runs import config as config_lib

TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
        '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=4',
        '--set', 'checkpoint_every=4', '--set', 'warmup_steps=2',
        '--set', 'n_samples=2']


def test_train_then_sample_and_resume(tmp_path, capsys):
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '4', '--quiet',
                   *TINY]) == 0
  text = capsys.readouterr().out
  assert 'copies correct' in text
  with open(os.path.join(out, 'run_config.json')) as f:
    assert json.load(f)['steps'] == 4
  assert os.path.exists(os.path.join(out, 'metrics.jsonl'))
  # Pointing at the same dir with more steps resumes from step 4.
  assert cli.main(['train', '--output_dir', out, '--steps', '8', '--quiet',
                   '--no-sample', *TINY]) == 0
  text = capsys.readouterr().out
  assert 'Resumed from checkpoint' in text
  assert 'Step      8' in text and 'Step      1:' not in text
  assert cli.main(['sample', out, '-n', '2']) == 0
  assert 'copies correct' in capsys.readouterr().out
  # A run found elsewhere (moved, or named from another directory) samples
  # from where it is, not from the output_dir it was trained with.
  moved = str(tmp_path / 'moved')
  os.rename(out, moved)
  assert cli.main(['sample', moved, '-n', '2']) == 0
  assert 'copies correct' in capsys.readouterr().out


def test_no_progress_bar_in_redirected_stderr(tmp_path, capsys,
                                               monkeypatch):
  from retrax.supervised import progress
  settings = []
  init = progress.Progress.__init__

  def recording_init(self, n_steps, enabled=None, min_steps=100, initial=0):
    settings.append(enabled)
    init(self, n_steps, enabled, min_steps=1, initial=initial)  # Any length.
  monkeypatch.setattr(progress.Progress, '__init__', recording_init)
  assert cli.main(['train', '--output_dir', str(tmp_path / 'run'),
                   '--steps', '2', '--no-sample', *TINY]) == 0
  # Not --quiet: the CLI leaves the choice to the terminal test (None) and
  # stderr, captured here, is no terminal.
  assert None in settings and True not in settings
  captured = capsys.readouterr()
  assert '%|' not in captured.err and 'compiling' not in captured.err


def test_version(capsys):
  import retrax
  with pytest.raises(SystemExit) as e:
    cli.main(['--version'])
  assert e.value.code == 0
  assert capsys.readouterr().out == f'retrax {retrax.__version__}\n'


def test_bfloat16_matmuls_train_and_the_policy_ends_with_the_run(
    tmp_path, monkeypatch):
  from retrax.fastmath import precision
  from retrax.supervised import training
  seen = []
  run = training.Loop.run

  def recording_run(self, n_steps=1):
    seen.append(precision.matmul_dtype())
    return run(self, n_steps)
  monkeypatch.setattr(training.Loop, 'run', recording_run)
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '4', '--quiet',
                   '--no-sample', '--matmul_dtype', 'bfloat16', *TINY]) == 0
  assert seen == ['bfloat16'] and precision.matmul_dtype() == 'float32'
  with open(os.path.join(out, 'run_config.json')) as f:
    assert json.load(f)['matmul_dtype'] == 'bfloat16'
  with open(os.path.join(out, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  losses = [r['value'] for r in rows if r['mode'] == 'train' and
            r['metric'] == 'metrics/WeightedCategoryCrossEntropy']
  assert len(losses) == 2 and 0 < losses[1] < losses[0] < 10


@pytest.mark.parametrize('argv,message', [
    (['train', '--set', 'bogus=1'], "unknown config key 'bogus'"),
    (['train', '--set', 'steps=many'], 'steps'),
    (['train', '--config', '/nonexistent.toml'], 'does not exist'),
    (['train', '--data', 'text:/nonexistent'], 'does not exist'),
    (['sample', '/nonexistent-run'], "'/nonexistent-run' does not exist"),
    (['train', '--set', 'length=30'], 'multiple of chunk_len'),
    (['train', '--matmul_dtype', 'fp16'], "matmul_dtype must be 'float32'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and '\n' not in err


def test_output_dir_of_another_model_is_refused(tmp_path, capsys):
  out = tmp_path / 'run'
  out.mkdir()
  other = config_lib.RunConfig().replace(output_dir=str(out), d_model=999)
  (out / 'run_config.json').write_text(json.dumps(other.to_dict()))
  before = sorted(os.listdir(out))
  assert cli.main(['train', '--output_dir', str(out), '--steps', '1']) == 2
  assert 'another model' in capsys.readouterr().err
  assert sorted(os.listdir(out)) == before
  assert json.loads((out / 'run_config.json').read_text())['d_model'] == 999


def test_unknown_option_exits_2():
  proc = subprocess.run([sys.executable, '-m', 'retrax', 'train', '--bogus'],
                        capture_output=True, text=True, check=False)
  assert proc.returncode == 2
  assert 'unrecognized arguments: --bogus' in proc.stderr


def test_config_file(tmp_path):
  path = tmp_path / 'c.toml'
  path.write_text('n_layers = 3\nattention = "local"\nlearning_rate = 1\n')
  config = config_lib.load(str(path), ['n_layers=4'])
  assert (config.model.n_layers, config.model.attention,
          config.train.learning_rate) == (
      4, 'local', 1.0)


def test_info(capsys):
  assert cli.main(['info']) == 0
  assert 'jax' in capsys.readouterr().out


def test_trainer_entry_point(tmp_path, capsys):
  from retrax.app import trainer
  path = tmp_path / 'c.toml'
  path.write_text('steps = 2\nd_model = 16\nd_ff = 32\nn_layers = 1\n'
                  'd_head = 8\nbatch_size = 4\nn_samples = 0\n')
  assert trainer.main([f'--config_file={path}',
                       f'--output_dir={tmp_path / "run"}']) == 0
  assert os.path.exists(tmp_path / 'run' / 'run_config.json')
  assert trainer.main(['--config_file=x.gin', '--output_dir=o']) == 2
  assert '--config_file x.gin: no such file' in capsys.readouterr().err


def test_eval_command(tmp_path, capsys):
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '2', '--quiet',
                   '--no-sample', *TINY]) == 0
  assert cli.main(['eval', out, '--batches', '2']) == 0
  assert 'WeightedCategoryAccuracy' in capsys.readouterr().out
