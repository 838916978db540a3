"""One run-directory contract: every origin's run works with every command.

A run is `model.json` + checkpoints (`retrax.run_layout`), whoever wrote it;
`load_run`, `retrax sample`, `eval` and `plot` read it. Here: runs written
by hand (the model's fresh weights in a native checkpoint), by a
`training.Loop` and by `retrax convert` of a Hugging Face directory; the
runs of `retrax train` and of gin configs are in
tests/cli/test_run_origins.py (they train, so they are slower).
"""

import functools
import json
import os
import pathlib
import re

import jax
import numpy as np
import pytest

import retrax
from retrax.app import cli
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax.app import run_commands
from retrax import shapes
from retrax.checkpoints import native
from retrax.checkpoints.tree import tree_leaves
from retrax.models import registry
from retrax.supervised import checkpointing
from retrax.supervised import decoding
from retrax.supervised import training

HF_FIXTURE = pathlib.Path(__file__).parent / 'fixtures' / 'hf_reformer'


def _hand_run(path, model, signature):
  """A run directory of `model`'s fresh weights: what every writer leaves."""
  os.makedirs(path, exist_ok=True)
  assert registry.write_model_file(path, model) is not None
  weights, _ = model.init(signature, rng=jax.random.PRNGKey(7))
  native.save_native(checkpointing.permanent_path(path, 0),
                     {'weights': tree_leaves(weights),
                      'input_signature': signature}, {'step': 0})
  return str(path)


def _lsh_lm():
  attention = functools.partial(tl.LSHSelfAttention, chunk_len=4, n_hashes=2,
                                n_buckets=4, n_chunks_before=1,
                                predict_mem_len=16, predict_drop_len=16)
  return models.ReformerLM(vocab_size=12, d_model=16, d_ff=32,
                           d_attention_key=8, d_attention_value=8, n_layers=1,
                           n_heads=2, max_len=16, dropout=0.0,
                           attention_type=attention)


def _tokens(shape, seed=0, high=12):
  return np.random.default_rng(seed).integers(1, high, shape).astype(np.int32)


def test_a_loaded_lsh_model_takes_any_batch_row_by_row(tmp_path):
  run_dir = _hand_run(tmp_path / 'run', _lsh_lm(),
                      shapes.ShapeDtype((4, 16), np.int32))
  x = _tokens((3, 16))
  run = retrax.load_run(run_dir, mode='eval')
  fresh = run.model.state
  batch = np.asarray(run.model(x))
  for i in range(3):
    run.model.state = fresh
    np.testing.assert_allclose(batch[i], np.asarray(run.model(x[i:i + 1]))[0],
                               rtol=1e-6, atol=1e-6)

  # Predict mode, fed one position at a time: each row is its example alone
  # (to rounding: XLA's matmuls of one row and of two may round apart).
  run = retrax.load_run(run_dir, mode='predict')
  fresh = run.model.state
  steps = [np.asarray(run.model(x[:2, t:t + 1])) for t in range(3)]
  for i in range(2):
    run.model.state = fresh
    alone = [np.asarray(run.model(x[i:i + 1, t:t + 1])) for t in range(3)]
    for t in range(3):
      np.testing.assert_allclose(steps[t][i], alone[t][0], rtol=1e-6,
                                 atol=1e-6)


def _terraformer(mode='train'):
  # terraformer_copy.gin's model: LSH attention, whose chunks must divide
  # n_hashes * length (a source cut to one position fails), in the encoder
  # and decoder; batches (source, target, weights).
  lsh = functools.partial(tl.LSHSelfAttention, chunk_len=8, n_hashes=2,
                          n_buckets=4, n_chunks_before=1, n_chunks_after=0,
                          predict_mem_len=32, predict_drop_len=32)
  return models.ConfigurableTerraformer(
      input_vocab_size=12, d_model=16, d_ff=32, d_attention_key=8,
      d_attention_value=8, n_encoder_layers=1, n_decoder_layers=1, n_heads=2,
      dropout=0.0, max_len=32, encoder_attention_type=lsh,
      encoder_decoder_attention_type=lsh, n_decoder_attention_layers=1,
      pos_type='fixed-base', mode=mode)


@pytest.mark.slow
def test_a_terraformer_run_loads_to_predict(tmp_path):
  signature = (shapes.ShapeDtype((4, 16), np.int32),) * 2
  run_dir = _hand_run(tmp_path / 'run', _terraformer(), signature)
  run = retrax.load_run(run_dir, mode='predict', seed=3)
  source = np.zeros((1, 16), np.int32)
  source[0, :6] = _tokens((6,), seed=1)
  kwargs = dict(inputs=source, temperature=0.0, eos_id=None, max_length=4)
  tokens = np.asarray(decoding.autoregressive_sample(run.model, **kwargs))
  # As Trax initialises a Terraformer to decode: the whole source, one
  # target position.
  reference = _terraformer('predict')
  reference.rng = jax.random.PRNGKey(3)  # The LSH layers' hashing keys.
  reference.init_from_file(
      run.checkpoint, weights_only=True,
      input_signature=(shapes.ShapeDtype((1, 16), np.int32),
                       shapes.ShapeDtype((1, 1), np.int32)))
  np.testing.assert_array_equal(
      tokens, decoding.autoregressive_sample(reference, **kwargs))


def _batches(seed=0):
  rng = np.random.default_rng(seed)
  while True:
    x = rng.integers(97, 123, size=(4, 16)).astype(np.int32)  # a-z bytes
    yield x, x, np.ones((4, 16), np.float32)


@pytest.fixture(scope='module')
def loop_run(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('loop') / 'run')
  model = models.TransformerLM(vocab_size=256, d_model=16, d_ff=32,
                               n_layers=1, n_heads=2, max_len=16, dropout=0.0)
  task = training.TrainTask(_batches(), tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(1e-2), n_steps_per_checkpoint=2)
  eval_task = training.EvalTask(_batches(1), [tl.WeightedCategoryAccuracy()])
  loop = training.Loop(model, [task], eval_tasks=[eval_task], output_dir=out,
                       random_seed=0, options=training.LoopOptions(
                           progress_bar=False, write_trax_files=False))
  loop.run(2)
  return out


def _command(capsys, *argv):
  capsys.readouterr()
  rc = cli.main(list(argv))
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


def _metrics(text):
  return {k: float(v) for k, v in re.findall(r'(\w+) ([0-9.]+)', text)
          if k.startswith('Weighted')}


def _reference_eval(run_dir, text, n_batches, rows=8, length=16):
  """Mean cross-entropy and accuracy over consecutive `length`-byte windows
  of `text`, from the eval model's logits and numpy."""
  model = retrax.load_run(run_dir, mode='eval').model
  ids = np.frombuffer(text.encode(), np.uint8).astype(np.int32)
  windows = ids[:len(ids) // length * length].reshape(-1, length)
  losses, accs = [], []
  for b in range(n_batches):
    x = windows[[(b * rows + k) % len(windows) for k in range(rows)]]
    logits = np.asarray(model(x), np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, x[..., None], -1)[..., 0]
    losses.append(-picked.mean())
    accs.append((logits.argmax(-1) == x).mean())
  return np.mean(losses), np.mean(accs)


@pytest.mark.slow
def test_every_command_on_a_loop_run(loop_run, tmp_path, capsys):
  text = 'the quick brown fox jumps over the lazy dog. ' * 12
  data = tmp_path / 'text.txt'
  data.write_text(text)
  rc, out, err = _command(capsys, 'eval', loop_run, '--batches', '2',
                          '--data', f'text:{data}')
  assert rc == 0, err
  loss, acc = _reference_eval(loop_run, text, 2)
  got = _metrics(out)
  assert got['WeightedCategoryCrossEntropy'] == pytest.approx(loss, abs=1e-5)
  assert got['WeightedCategoryAccuracy'] == pytest.approx(acc, abs=1e-6)
  # Without data: a Loop's streams are the program's, so it is asked for.
  rc, out, err = _command(capsys, 'eval', loop_run)
  assert rc == 2 and '--data text:FILE' in err and len(err.splitlines()) == 1

  # Samples: token ids (no tokenizer), greedy = the argmax of eval mode.
  rc, out, err = _command(capsys, 'sample', loop_run, '-n', '2', '--prompt',
                          '97 98 99', '--max_length', '3')
  assert rc == 0, err
  samples = [line for line in out.splitlines()[1:] if '---' not in line]
  assert len(samples) == 2 and samples[0] == samples[1]
  tokens = [int(t) for t in samples[0].split()]
  model, seq = retrax.load_run(loop_run, mode='eval').model, [97, 98, 99]
  for _ in range(3):
    logits = np.asarray(model(np.asarray([seq + [0]], np.int32)))
    seq.append(int(np.argmax(logits[0, len(seq)])))
  assert tokens == seq[3:]
  rc, _, err = _command(capsys, 'sample', loop_run, '--prompt', 'abc')
  assert rc == 2 and 'token ids' in err

  rc, out, err = _command(capsys, 'plot', loop_run)
  assert rc == 0, err
  assert os.path.getsize(out.strip()) > 0
  run = retrax.load_run(loop_run, mode='eval')
  assert run.config is None and run.tokenizer is None
  assert run.checkpoint.endswith('ckpt_000000002')


def test_every_command_on_a_converted_hugging_face_run(tmp_path, capsys):
  run_dir = str(tmp_path / 'run')
  rc, _, err = _command(capsys, 'convert', str(HF_FIXTURE / 'lsh_axial'),
                        run_dir)
  assert rc == 0, err
  vocab = json.loads((HF_FIXTURE / 'lsh_axial' / 'config.json').read_text())[
      'vocab_size']
  rc, out, err = _command(capsys, 'sample', run_dir, '-n', '1', '--prompt',
                          '1 2 3', '--max_length', '4')
  assert rc == 0, err
  sample = out.splitlines()[-1].split()
  assert len(sample) == 4 and all(0 <= int(t) < vocab for t in sample)
  # Text read as bytes has ids the model has no logits for: refused.
  words = tmp_path / 'words.txt'
  words.write_text('plain words ' * 100)
  rc, _, err = _command(capsys, 'eval', run_dir, '--data', f'text:{words}')
  assert rc == 2 and f'{vocab} output ids' in err, err
  small = tmp_path / 'small.txt'  # Bytes 1..vocab-1: ids the model has.
  small.write_text(''.join(chr(i) for i in range(1, vocab)) * 60)
  rc, out, err = _command(capsys, 'eval', run_dir, '--data', f'text:{small}',
                          '--batches', '1')
  assert rc == 0, err
  assert set(_metrics(out)) == set(run_commands.EVAL_METRICS)
  # A converted run has trained nowhere: plot says so in one line.
  rc, _, err = _command(capsys, 'plot', run_dir)
  assert rc == 2 and 'records no training' in err and len(err.splitlines()) == 1
  run = retrax.load_run(run_dir, mode='eval')
  length = run.input_signature.shape[1]
  assert run.model(np.ones((2, length), np.int32)).shape == (2, length, vocab)
