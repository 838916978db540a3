"""`retrax convert` of a Hugging Face Reformer directory keeps its
SentencePiece tokenizer (`spiece.model` -> the run's `tokenizer.model`), so
`retrax sample --prompt TEXT` and `retrax eval --data text:FILE` take text.

The reference is sentencepiece's own `SentencePieceProcessor` on the model a
test trains in-process (a few lines of text, well under a second).
"""

import io
import json
import pathlib
import shutil

import numpy as np
import pytest

import retrax
from retrax.app import cli
from retrax.app import run_commands
from retrax.runs import data as run_data

spm = pytest.importorskip(
    'sentencepiece', reason='needs the sentencepiece package (retrax[tokenizers]'
    ', in retrax[test]) to train a tokenizer to convert')

HF_FIXTURE = (pathlib.Path(__file__).parents[1] / 'fixtures' / 'hf_reformer' /
              'local_plain')
VOCAB = json.loads((HF_FIXTURE / 'config.json').read_text())['vocab_size']
LINES = ['abc cab ba', 'a b c abc', 'cab cab abba']


def _spiece(pieces=12):
  """A SentencePiece model's bytes, trained on LINES."""
  out = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(LINES * 5), model_writer=out, vocab_size=pieces,
      model_type='bpe', bos_id=-1, minloglevel=2)
  return out.getvalue()


def _hf_dir(tmp_path, spiece=None, extra=()):
  """A copy of the tiny HF fixture, with `spiece` as its spiece.model."""
  hf = tmp_path / 'hf'
  shutil.copytree(HF_FIXTURE, hf)
  if spiece is not None:
    (hf / 'spiece.model').write_bytes(spiece)
  for name in extra:
    (hf / name).write_text('{}')
  return hf


def _main(capsys, *argv):
  rc = cli.main(list(argv))
  out, err = capsys.readouterr()
  return rc, out, err


def _reference_ids(sp, text):
  """sentencepiece's ids for `text`, lines joined by its EOS id."""
  ids = []
  for i, line in enumerate(text.split('\n')):
    ids += ([sp.eos_id()] if i else []) + sp.encode(line)
  return ids


def test_a_spiece_model_becomes_the_run_s_tokenizer(tmp_path, capsys,
                                                   monkeypatch):
  spiece = _spiece()
  sp = spm.SentencePieceProcessor(model_proto=spiece)
  hf, run_dir = _hf_dir(tmp_path, spiece), tmp_path / 'run'
  rc, out, err = _main(capsys, 'convert', str(hf), str(run_dir))
  assert rc == 0, err
  lines = out.splitlines()
  assert len(lines) == 3 and lines[2].startswith(
      'tokenizer: spiece.model copied as tokenizer.model'), out
  assert (run_dir / 'tokenizer.model').read_bytes() == spiece
  run = retrax.load_run(run_dir)
  text = 'cab abc ba'
  assert run.tokenizer.encode(text).tolist() == sp.encode(text)
  # sample --prompt TEXT: encoded, continued, and decoded as sentencepiece does.
  sampled = []
  sample_free = run_commands.sample_free

  def recording(*args, **kwargs):
    sampled.append(sample_free(*args, **kwargs))
    return sampled[-1]
  monkeypatch.setattr(run_commands, 'sample_free', recording)
  rc, out, err = _main(capsys, 'sample', str(run_dir), '--prompt', text,
                       '--max_length', '5', '-n', '1')
  assert rc == 0, err
  (outs, _), = sampled
  assert len(outs) == 1 and len(outs[0]) == 5
  ids = [int(i) for i in outs[0]]
  ids = [sp.unk_id() if i >= sp.get_piece_size() else i for i in ids]
  parts, line = [], []
  for i in ids:  # EOS ends a line.
    if i == sp.eos_id():
      parts.append(line)
      line = []
    else:
      line.append(i)
  expected = '\n'.join(sp.decode(p) for p in parts + [line])
  assert out.split('--- sample 1\n', 1)[1] == expected + '\n'


def test_eval_of_text_encodes_it_with_the_run_s_tokenizer(tmp_path, capsys):
  spiece = _spiece()
  sp = spm.SentencePieceProcessor(model_proto=spiece)
  hf, run_dir = _hf_dir(tmp_path, spiece), tmp_path / 'run'
  assert _main(capsys, 'convert', str(hf), str(run_dir))[0] == 0
  words = tmp_path / 'words.txt'
  text = '\n'.join(LINES * 8)
  words.write_text(text)
  run = retrax.load_run(run_dir, mode='eval')
  length = run.input_signature.shape[1]
  batch = next(run_data.text_eval_stream(f'text:{words}', length, 2,
                                         run.tokenizer))
  np.testing.assert_array_equal(batch[0][0],
                                _reference_ids(sp, text)[:length])
  # As bytes ('a' is 97) the text would have ids the model (20) has not.
  rc, out, err = _main(capsys, 'eval', str(run_dir), '--data',
                       f'text:{words}', '--batches', '1')
  assert rc == 0, err
  assert 'WeightedCategoryCrossEntropy' in out


def test_a_folder_without_a_tokenizer_converts_as_before(tmp_path, capsys):
  hf = _hf_dir(tmp_path, extra=['tokenizer.json'])
  run_dir = tmp_path / 'run'
  rc, out, err = _main(capsys, 'convert', str(hf), str(run_dir))
  assert rc == 0, err
  assert not (run_dir / 'tokenizer.model').exists()
  note = out.splitlines()[2]
  assert note.startswith(f'no tokenizer: {hf} has no spiece.model')
  assert 'tokenizer.json not read' in note and 'token ids' in note
  assert retrax.load_run(run_dir).tokenizer is None
  rc, out, err = _main(capsys, 'sample', str(run_dir), '--prompt', '1 2 3',
                       '--max_length', '3')
  assert rc == 0, err
  assert all(0 <= int(t) < VOCAB for t in out.splitlines()[-1].split())


def test_another_tokenizer_in_the_destination_is_never_replaced(
    tmp_path, capsys):
  run_dir = tmp_path / 'run'
  run_dir.mkdir()
  (run_dir / 'tokenizer.model').write_bytes(b'theirs')
  for spiece in (_spiece(), None):
    hf = _hf_dir(tmp_path / ('with' if spiece else 'without'), spiece)
    rc, _, err = _main(capsys, 'convert', str(hf), str(run_dir), '--force')
    assert rc != 0 and len(err.strip().splitlines()) == 1, err
    assert 'tokenizer.model' in err and 'remove it' in err
    assert sorted(p.name for p in run_dir.iterdir()) == ['tokenizer.model']
    assert (run_dir / 'tokenizer.model').read_bytes() == b'theirs'


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, capsys):
  hf = _hf_dir(tmp_path, _spiece(pieces=VOCAB + 2))
  rc, _, err = _main(capsys, 'convert', str(hf), str(tmp_path / 'run'))
  assert rc != 0 and len(err.strip().splitlines()) == 1, err
  assert f'{VOCAB + 2} pieces' in err and f'vocab_size is {VOCAB}' in err
  assert not (tmp_path / 'run').exists()


def test_without_sentencepiece_text_asks_for_the_extra(
    tmp_path, capsys, monkeypatch):
  hf, run_dir = _hf_dir(tmp_path, _spiece()), tmp_path / 'run'
  monkeypatch.setattr(run_data, 'sentencepiece_installed', lambda: False)
  rc, out, err = _main(capsys, 'convert', str(hf), str(run_dir))
  assert rc == 0, err
  assert "pip install 'retrax[tokenizers]'" in out.splitlines()[2]
  assert (run_dir / 'tokenizer.model').is_file()
  assert retrax.load_run(run_dir).tokenizer is None
  rc, _, err = _main(capsys, 'sample', str(run_dir), '--prompt', 'abc')
  assert rc != 0 and len(err.strip().splitlines()) == 1, err
  assert "pip install 'retrax[tokenizers]'" in err and '--prompt' in err
  words = tmp_path / 'words.txt'
  words.write_text('abc ' * 40)
  rc, _, err = _main(capsys, 'eval', str(run_dir), '--data', f'text:{words}')
  assert rc != 0 and "pip install 'retrax[tokenizers]'" in err, err


def test_written_back_to_hf_the_run_s_tokenizer_is_spiece_model(
    tmp_path, capsys):
  spiece = _spiece()
  hf, run_dir, back = _hf_dir(tmp_path, spiece), tmp_path / 'run', tmp_path / 'back'
  assert _main(capsys, 'convert', str(hf), str(run_dir))[0] == 0
  rc, out, err = _main(capsys, 'convert', str(run_dir), str(back), '--to', 'hf')
  assert rc == 0, err
  assert len(out.splitlines()) == 2  # No tokenizer line for --to hf.
  assert (back / 'spiece.model').read_bytes() == spiece
  (back / 'spiece.model').write_bytes(b'theirs')  # Never replaced.
  rc, _, err = _main(capsys, 'convert', str(run_dir), str(back), '--to', 'hf',
                     '--force')
  assert rc != 0 and 'spiece.model' in err and 'remove it' in err, err
  assert (back / 'spiece.model').read_bytes() == b'theirs'
  plain = _hf_dir(tmp_path / 'plain')  # No tokenizer: none written back.
  assert _main(capsys, 'convert', str(plain), str(tmp_path / 'run2'))[0] == 0
  assert _main(capsys, 'convert', str(tmp_path / 'run2'),
               str(tmp_path / 'back2'), '--to', 'hf')[0] == 0
  assert sorted(p.name for p in (tmp_path / 'back2').iterdir()) == [
      'config.json', 'model.safetensors']
