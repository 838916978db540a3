"""Text runs end to end: held-out eval, tokenizers, `sample --prompt`, `load_run`."""

import json
import os
import pathlib

import numpy as np
import pytest

import retrax
from retrax import checkpoints
from retrax.app import cli
from retrax.runs import config as config_lib
from retrax.app import jobs
from retrax.data import tasks

TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
        '--set', 'd_head=8', '--set', 'batch_size=4', '--set', 'eval_every=4',
        '--set', 'checkpoint_every=4', '--set', 'warmup_steps=2',
        '--set', 'n_samples=2', '--attention', 'local']


def _corpus(path, n_lines=300, seed=0):
  """Lines of random letters: any 16-byte window occurs once in the file."""
  rng = np.random.default_rng(seed)
  letters = np.array(list('abcdefghijklmnopqrstuvwxyz '))
  lines = [''.join(rng.choice(letters, 40)) for _ in range(n_lines)]
  path.write_text('\n'.join(lines) + '\n')
  return path


def _rows(stream, n_batches):
  return [bytes(r.astype(np.uint8)) for _ in range(n_batches)
          for r in next(stream)[0]]


def test_split_is_the_end_of_the_file_from_a_line_start():
  data = b'one\ntwo\nthree\nfour\nfive\n'
  train, held = tasks.split_held_out(data, 0.3)
  assert train + held == data
  assert held == b'five\n'  # Byte 16 is inside 'four': cut after its line.
  with pytest.raises(ValueError, match='eval_fraction'):
    tasks.split_held_out(data, 1.0)


def test_eval_rows_are_held_out_text_only(tmp_path):
  path = _corpus(tmp_path / 'c.txt')
  data = path.read_bytes()
  train_text, held_text = tasks.split_held_out(data, 0.1)
  config = config_lib.load(None, [f'data=text:{path}', 'length=32',
                                     'batch_size=8', f'output_dir={tmp_path}'])
  inputs = jobs.build_inputs(config)
  eval_rows = _rows(inputs.eval_stream(1), 6)
  train_rows = _rows(inputs.train_stream(1), 20)
  assert eval_rows and all(r in held_text and r not in train_text
                           for r in eval_rows)
  assert all(r in train_text and r not in held_text for r in train_rows)
  assert not set(eval_rows) & set(train_rows)
  # The held-out part is walked in order, window by window.
  assert eval_rows[0] == held_text[:32] and eval_rows[1] == held_text[32:64]


def test_a_part_too_short_for_one_row_is_a_clear_error(tmp_path):
  path = tmp_path / 'small.txt'
  path.write_text('a few words\n' * 20)
  with pytest.raises(ValueError, match='held-out part .* fewer than one row'):
    tasks.text_lm_inputs(path, 64, 2, eval_fraction=0.05)


def test_text_run_train_eval_sample_load_run(tmp_path, capsys):
  path = _corpus(tmp_path / 'c.txt')
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '4', '--quiet',
                   '--no-sample', '--data', f'text:{path}', *TINY]) == 0
  text = capsys.readouterr().out
  assert f'retrax sample {out}' in text and 'Saved the run (step 4)' in text
  assert json.loads(pathlib.Path(out, 'run_config.json').read_text())[
      'vocab_size'] == 256  # From the byte tokenizer.
  assert cli.main(['eval', out, '--batches', '2']) == 0
  assert 'WeightedCategoryAccuracy' in capsys.readouterr().out
  assert cli.main(['sample', out, '--prompt', 'abc', '-n', '1',
                   '--max_length', '5']) == 0
  sampled = capsys.readouterr().out.splitlines()[1:]  # After the header.
  assert sampled[0] == '--- sample 1' and sampled[1].startswith('abc')
  assert len(sampled[1].encode('utf-8', 'replace')) >= 4
  assert cli.main(['sample', out, '--prompt', 'x' * 40]) == 2
  assert 'at most 30 tokens' in capsys.readouterr().err
  # load_run rebuilds the model with the saved weights and the tokenizer.
  run = retrax.load_run(out, mode='eval', batch_size=2)
  assert run.tokenizer.decode(run.tokenizer.encode('héllo')) == 'héllo'
  assert run.config.data.source == f'text:{path}'
  native = checkpoints.load_native(run.checkpoint)
  saved = checkpoints.tree_leaves(native.trees['weights'])
  loaded = checkpoints.tree_leaves(run.model.weights)
  assert len(saved) == len(loaded)
  for a, b in zip(saved, loaded):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_text_config_errors_are_one_line(tmp_path, capsys):
  path = _corpus(tmp_path / 'c.txt')
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--set', 'vocab_size=100', '--data',
                   f'text:{path}', '--output_dir', out]) == 2
  assert 'taken from the tokenizer' in capsys.readouterr().err
  assert cli.main(['train', '--tokenizer', 'sentencepiece:/nonexistent.model',
                   '--data', f'text:{path}', '--output_dir', out]) == 2
  assert 'not found' in capsys.readouterr().err
  assert cli.main(['train', '--tokenizer', 'sentencepiece:x.model',
                   '--output_dir', out]) == 2
  assert 'applies to text data' in capsys.readouterr().err
  assert not os.path.exists(out)


@pytest.mark.slow
def test_sentencepiece_tokenizer_run(tmp_path, capsys):
  pytest.importorskip('sentencepiece')
  from retrax import data
  path = _corpus(tmp_path / 'c.txt')
  spm = data.train_sentencepiece(str(path), str(tmp_path / 'spm'),
                                 vocab_size=60, model_type='bpe')
  out = str(tmp_path / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '2', '--quiet',
                   '--no-sample', '--data', f'text:{path}', '--tokenizer',
                   f'sentencepiece:{spm}', *TINY]) == 0
  config = json.loads(pathlib.Path(out, 'run_config.json').read_text())
  assert config['vocab_size'] == 60 and config['tokenizer'].endswith(spm)
  # The run keeps its own copy of the model: it samples after the original
  # is gone.
  os.remove(spm)
  capsys.readouterr()
  assert cli.main(['sample', out, '--prompt', 'ab', '-n', '1',
                   '--max_length', '3']) == 0
  assert capsys.readouterr().out.splitlines()[2].startswith('ab')
  run = retrax.load_run(out)
  assert run.tokenizer.vocab_size == 60
  ids = run.tokenizer.encode('abc def\nghi')
  assert run.tokenizer.decode(ids) == 'abc def\nghi'
