"""`retrax bench`: a few speed figures measured with the installed package alone.

Each line is one measurement on this machine's default JAX backend:

* train: steps/s of `training.Loop` on the CLI's default job (a small
  ReformerLM with LSH attention, batch 32, length 32), after the compile;
* train-1K: s/step of a ReformerLM with LSH attention at length 1024
  (d_model 256, d_ff 1024, 6 layers, 4 heads, chunk 128, batch 1) (full run
  only);
* decode: ms/token of greedy decoding (`autoregressive_sample`) from the
  default job's model in predict mode, after the compile;
* data: MB/s of byte tokenization plus windowing of a text file
  (`retrax.data.tasks.text_lm_inputs`).

`--quick` measures fewer steps and skips the 1K model (well under 2 minutes
on a 2-core CPU). The scripts in the source tree's `benchmarks/` measure more,
against Trax.
"""

import functools
import os
import tempfile
import time
from typing import Any, Callable, List

import jax
import numpy as np

from retrax import data
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.data import tasks
from retrax.runs import config as config_lib
from retrax.runs import loading
from retrax.supervised import decoding
from retrax.supervised import training
import retrax


def _timed(fn, repeats):
  """Seconds per call of `fn` over `repeats` calls after one warm-up call."""
  fn()
  start = time.perf_counter()
  for _ in range(repeats):
    fn()
  return (time.perf_counter() - start) / repeats


def _loop(model, length, batch_size, vocab_size):
  inputs = data.duplication_inputs(vocab_size, length, batch_size)
  task = training.TrainTask(inputs.train_stream(1),
                            tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(1e-3))
  return training.Loop(model, [task], random_seed=0,
                       options=training.LoopOptions(progress_bar=False))


def _default_model(mode):
  return loading.build_model(config_lib.RunConfig(), mode)


def bench_train(quick):
  """Steps/s of the default job's Loop (batch 32, length 32)."""
  loop = _loop(_default_model('train'), 32, 32, 32)
  n = 20 if quick else 100
  seconds = _timed(functools.partial(loop.run, n), 1) / n
  return f'train     default job (ReformerLM-LSH, batch 32 x 32): ' \
         f'{1 / seconds:7.1f} steps/s'


def bench_train_1k():
  """Seconds per step of a 6-layer ReformerLM-LSH at length 1024."""
  attention = functools.partial(tl.LSHSelfAttention, chunk_len=128,
                                n_hashes=2, n_chunks_before=1)
  model = models.ReformerLM(vocab_size=256, d_model=256, d_ff=1024,
                            n_layers=6, n_heads=4, max_len=1024, dropout=0.0,
                            attention_type=attention, mode='train')
  loop = _loop(model, 1024, 1, 256)
  seconds = _timed(functools.partial(loop.run, 3), 1) / 3
  return f'train-1K  ReformerLM-LSH 6x256, length 1024, batch 1: ' \
         f'{seconds:7.2f} s/step'


def bench_decode(quick):
  """Milliseconds per greedy token of the default job's model."""
  model = _default_model('predict')
  model.init(shapes.ShapeDtype((1, 1), np.int32))
  fresh = model.state
  n_tokens = 31

  def decode():
    model.state = fresh  # Empty caches: each call decodes from position 0.
    decoding.autoregressive_sample(model, batch_size=1, temperature=0.0,
                                   eos_id=None, max_length=n_tokens)
  seconds = _timed(decode, 2 if quick else 10)
  return f'decode    default job model, greedy, batch 1: ' \
         f'{1000 * seconds / n_tokens:7.2f} ms/token'


def bench_data(quick):
  """MB/s of byte-level text windows from a generated text file."""
  size = (4 if quick else 32) << 20
  rng = np.random.default_rng(0)
  words = np.array(['the', 'quick', 'brown', 'fox', 'jumps', 'over', 'a',
                    'lazy', 'dog', 'and', 'runs', 'far', 'away\n'])
  text = ' '.join(rng.choice(words, size // 4))[:size]
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, 'bench.txt')
    with open(path, 'w') as f:
      f.write(text)
    start = time.perf_counter()
    inputs = tasks.text_lm_inputs(path, 1024, 16)
    stream = inputs.train_stream(1)
    n_batches = (size // (1024 * 16))
    for _ in range(n_batches):
      next(stream)
    seconds = time.perf_counter() - start
  return f'data      bytes tokenizer + 16 x 1024 windows: ' \
         f'{size / seconds / 1e6:7.1f} MB/s'


def main(quick=False):
  """Prints each measurement as it finishes; returns the lines."""
  print(f'retrax {retrax.__version__}, jax {jax.__version__}, '
        f'{jax.default_backend()} x {jax.device_count()}'
        f'{" (quick)" if quick else ""}', flush=True)
  steps: List[Callable[[], Any]] = [
      functools.partial(bench_train, quick),
      functools.partial(bench_decode, quick),
      functools.partial(bench_data, quick)]
  if not quick:
    steps.insert(1, bench_train_1k)
  lines = []
  start = time.perf_counter()
  for step in steps:
    lines.append(step())
    print(lines[-1], flush=True)
  print(f'({time.perf_counter() - start:.0f} s in all)')
  return lines
