"""A text run's samples after training: distinct prompts from held-out text,
at a printed temperature that is the one decoding used, each printed with
marks where the prompt ends."""

import io
import re

import numpy as np
import pytest

from retrax.app import cli
from retrax.app import jobs
from retrax.runs import config as config_lib
from retrax.runs import loading
from retrax.supervised import decoding

TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
        '--set', 'd_head=8', '--set', 'batch_size=2', '--set', 'eval_every=1',
        '--set', 'checkpoint_every=1', '--set', 'warmup_steps=0',
        '--attention', 'local', '--length', '16', '--trax_files', 'false']


def _corpus(path):
  """Lines of random five-letter words."""
  rng = np.random.default_rng(1)
  words = [''.join(rng.choice(list('abcdefghij'), 5)) for _ in range(400)]
  path.write_text('\n'.join(' '.join(words[i:i + 6])
                            for i in range(0, 400, 6)) + '\n')
  return path


@pytest.fixture(scope='module')
def text_run(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('samples')
  path = _corpus(tmp / 'c.txt')
  out = str(tmp / 'run')
  assert cli.main(['train', '--output_dir', out, '--steps', '1', '--quiet',
                   '--no-sample', '--data', f'text:{path}', *TINY]) == 0
  return path, out


def _recording(monkeypatch):
  used = []
  real = decoding.autoregressive_sample

  def record(*args, **kwargs):
    used.append(kwargs['temperature'])
    return real(*args, **kwargs)
  monkeypatch.setattr(decoding, 'autoregressive_sample', record)
  return used


def _samples(out):
  lines = out.splitlines()
  return lines[0], [lines[i + 1] for i, line in enumerate(lines)
                    if line.startswith('--- sample ')]


@pytest.mark.parametrize('temperature', [None, 0.7])
def test_end_of_run_samples_differ_at_the_printed_temperature(
    text_run, temperature, monkeypatch, capsys):
  path, out = text_run
  config = loading.config_of_run(out).replace(n_samples=3)
  if temperature is not None:
    config = config.replace(temperature=temperature)
  used = _recording(monkeypatch)
  capsys.readouterr()
  jobs.print_samples(config)  # What `retrax train` calls at the end.
  header, samples = _samples(capsys.readouterr().out)
  expected = 0.0 if temperature is None else temperature
  assert used == [expected]
  assert f'at temperature {expected}' in header
  assert ('(greedy)' in header) == (expected == 0)
  assert 'held-out text' in header
  assert len(samples) == 3 and len(set(samples)) == 3, samples
  # Each begins with a piece of the held-out part (the file's last lines).
  held = path.read_text().splitlines()[-8:]
  for sample in samples:
    assert any(sample[:4] in line for line in held), sample


def test_held_out_prompts_come_from_the_held_out_part(text_run):
  path, out = text_run
  config = loading.config_of_run(out)
  tokenizer = loading.tokenizer_of_run(config)
  prompts = jobs.held_out_prompts(config, tokenizer, 4)
  assert prompts.shape == (4, config.model.length // 4)
  data = path.read_bytes()
  # The held-out part, found independently: the end of the file, from the
  # first line start at or after 90% of it.
  cut = data.index(b'\n', int(len(data) * 0.9)) + 1
  texts = [bytes(p.astype(np.uint8)) for p in prompts]
  assert len(set(texts)) == 4
  held = data[cut:]
  for text in texts:  # Each occurs in the held-out part at a word start.
    starts = [i for i in range(len(held)) if held.startswith(text, i)]
    assert any(i == 0 or held[i - 1:i] in (b' ', b'\n') for i in starts), text


def test_sample_command_uses_held_out_prompts_and_given_temperature(
    text_run, monkeypatch, capsys):
  _, out = text_run
  used = _recording(monkeypatch)
  capsys.readouterr()
  assert cli.main(['sample', out, '-n', '2', '--temperature', '1.5',
                   '--max_length', '4']) == 0
  header, samples = _samples(capsys.readouterr().out)
  assert used == [1.5] and 'at temperature 1.5' in header
  assert len(set(samples)) == 2


def test_bad_temperature_key_is_a_config_error():
  with pytest.raises(config_lib.ConfigError, match='temperature'):
    config_lib.load(overrides=['temperature=-1'])


def _blocks(out):
  """The text of each printed sample (all its lines)."""
  return [block[:-1] for block in re.split(r'^--- sample \d+\n', out,
                                           flags=re.M)[1:]]


def test_samples_mark_where_the_prompt_ends(text_run, capsys):
  path, out = text_run
  config = loading.config_of_run(out).replace(n_samples=2)
  tokenizer = loading.tokenizer_of_run(config)
  prompts = [tokenizer.decode(p)
             for p in jobs.held_out_prompts(config, tokenizer, 2)]
  capsys.readouterr()
  jobs.print_samples(config)
  printed = capsys.readouterr().out
  assert "(the model's text between ⟦ and ⟧):" in printed.splitlines()[0]
  blocks = _blocks(printed)
  assert len(blocks) == 2
  for prompt, block in zip(prompts, blocks):
    assert block.startswith(prompt + '⟦') and block.endswith('⟧'), block
    assert len(block) > len(prompt) + 2  # A continuation between the marks.
  assert cli.main(['sample', out, '--prompt', 'abc', '-n', '1',
                   '--max_length', '3']) == 0
  (block,) = _blocks(capsys.readouterr().out)
  assert block.startswith('abc⟦') and block.endswith('⟧'), block
  # A stream whose encoding lacks the marks gets ASCII ones.
  ascii_out = io.TextIOWrapper(io.BytesIO(), encoding='ascii')
  assert jobs.continuation_marks(ascii_out) == ('[[', ']]')
  assert jobs.format_sample('ab', 'cd', ('[[', ']]')) == 'ab[[cd]]'
