"""The CLI's jobs: build a model and data from a RunConfig, train, sample, evaluate.

The default job trains a small ReformerLM with LSH attention on the Reformer
paper's duplication task (`0 w 0 w`) and then shows sampled copies.
"""

import functools
import json
import os

import numpy as np

from retrax import config as config_lib
from retrax.checkpoints.atomic import atomic_write
from retrax import layers as tl

CONFIG_FILE = 'run_config.json'


def build_model(config, mode='train'):
  """The model a RunConfig describes, in `mode`."""
  from retrax import models  # pylint: disable=g-import-not-at-top
  if config.model == 'TransformerLM':
    return models.TransformerLM(
        vocab_size=config.vocab_size, d_model=config.d_model, d_ff=config.d_ff,
        n_layers=config.n_layers, n_heads=config.n_heads,
        max_len=config.length, dropout=config.dropout, mode=mode)
  if config.attention == 'lsh':
    attention = functools.partial(
        tl.LSHSelfAttention, chunk_len=config.chunk_len,
        n_hashes=config.n_hashes, n_chunks_before=1,
        predict_mem_len=config.length, predict_drop_len=config.length)
  elif config.attention == 'local':
    attention = functools.partial(
        tl.SelfAttention, chunk_len=config.chunk_len, n_chunks_before=1,
        predict_mem_len=config.length, predict_drop_len=config.length)
  else:
    attention = tl.CausalAttention
  return models.ReformerLM(
      vocab_size=config.vocab_size, d_model=config.d_model, d_ff=config.d_ff,
      d_attention_key=config.d_head, d_attention_value=config.d_head,
      n_layers=config.n_layers, n_heads=config.n_heads, dropout=config.dropout,
      max_len=config.length, attention_type=attention, mode=mode)


def build_inputs(config):
  """The `Inputs` of a RunConfig: the duplication task or bytes of a text file."""
  from retrax import data  # pylint: disable=g-import-not-at-top
  if config.data == 'duplication':
    return data.duplication_inputs(config.vocab_size, config.length,
                                   config.batch_size, seed=config.seed)
  path = config.data[len('text:'):]
  encoder = data.ByteTextEncoder(num_reserved_ids=0)

  def stream(_, seed):
    rng = np.random.default_rng(seed)
    chunks = data.TextChunks(path, config.length, repeat=True,
                             drop_remainder=True)()
    buf = []
    for chunk in chunks:
      ids = np.asarray(encoder.encode(chunk)[:config.length], np.int32)
      if len(ids) < config.length:
        ids = np.pad(ids, (0, config.length - len(ids)))
      buf.append(ids)
      if len(buf) == config.batch_size:
        x = np.stack(buf)
        buf = []
        rng.shuffle(x)
        yield x, x, (x != 0).astype(np.float32)
  return data.Inputs(lambda n: stream(n, config.seed),
                     lambda n: stream(n, config.seed + 1))


def _check_run_dir(config):
  """Refuses to train into a directory that holds a run of another model."""
  path = os.path.join(config.output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    old = json.load(f)
  model_keys = ('model', 'attention', 'vocab_size', 'length', 'd_model',
                'd_ff', 'n_layers', 'n_heads', 'd_head', 'n_hashes',
                'chunk_len')
  diff = [k for k in model_keys if old.get(k) != getattr(config, k)]
  if diff:
    raise config_lib.ConfigError(
        f'{config.output_dir} holds a run of another model (differs in '
        f'{", ".join(diff)}); choose another --output_dir.')


def train(config, quiet=False):
  """Trains (resuming if `output_dir` holds a checkpoint); returns the Loop."""
  from retrax import optimizers  # pylint: disable=g-import-not-at-top
  from retrax import lr  # pylint: disable=g-import-not-at-top
  from retrax.supervised import training  # pylint: disable=g-import-not-at-top
  _check_run_dir(config)
  os.makedirs(config.output_dir, exist_ok=True)
  with atomic_write(os.path.join(config.output_dir, CONFIG_FILE)) as f:
    f.write(json.dumps(config.to_dict(), indent=1).encode())
  inputs = build_inputs(config)
  schedule = lr.multifactor(factors='constant * linear_warmup',
                            constant=config.learning_rate,
                            warmup_steps=config.warmup_steps)
  train_task = training.TrainTask(
      labeled_data=inputs.train_stream(1),
      loss_layer=tl.WeightedCategoryCrossEntropy(),
      optimizer=optimizers.Adam(config.learning_rate),
      lr_schedule=schedule,
      n_steps_per_checkpoint=config.checkpoint_every)
  eval_task = training.EvalTask(
      labeled_data=inputs.eval_stream(1),
      metrics=[tl.WeightedCategoryCrossEntropy(),
               tl.WeightedCategoryAccuracy()],
      n_eval_batches=4)
  loop = training.Loop(
      build_model(config, 'train'), [train_task],
      eval_model=build_model(config, 'eval'), eval_tasks=[eval_task],
      output_dir=config.output_dir, random_seed=config.seed,
      eval_at=lambda step: step == 1 or step % config.eval_every == 0,
      progress_bar=not quiet, write_trax_files=config.trax_files)
  remaining = config.steps - loop.step
  if remaining > 0:
    loop.run(remaining)
  return loop


def config_of_run(output_dir):
  """The RunConfig saved in a run directory (its `output_dir` set to that directory).

  The saved `output_dir` may be relative to where training ran; the run is
  found where it is now (moved, or named from another working directory).
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{output_dir} is not a retrax run directory (no '
                            f'{CONFIG_FILE}); train one with `retrax train '
                            f'--output_dir {output_dir}`.')
  with open(path) as f:
    values = json.load(f)
  unknown = set(values) - set(config_lib.FIELDS)
  if unknown:
    raise config_lib.ConfigError(f'{path} has unknown keys {sorted(unknown)}.')
  values['output_dir'] = os.fspath(output_dir)
  return config_lib.RunConfig(**values)


def load_model(config, mode='predict', batch_size=1):
  """A model in `mode` with the run's latest weights."""
  from retrax import shapes  # pylint: disable=g-import-not-at-top
  from retrax.supervised import checkpointing  # pylint: disable=g-import-not-at-top
  path = checkpointing.find_latest_valid(config.output_dir)
  if path is None:
    raise FileNotFoundError(f'{config.output_dir} holds no valid checkpoint; '
                            'train first with `retrax train`.')
  model = build_model(config, mode)
  length = 1 if mode == 'predict' else config.length
  model.init_from_file(path, weights_only=True, input_signature=shapes.ShapeDtype(
      (batch_size, length), np.int32))
  return model


def sample_copies(config, n=4, temperature=0.0, seed=0):
  """Prompts `0 w 0` from the eval stream and the model's continuations; returns rows."""
  from retrax.supervised import decoding  # pylint: disable=g-import-not-at-top
  model = load_model(config, 'predict')
  rng = np.random.default_rng(seed + 12345)
  half = config.length // 2
  w = rng.integers(1, config.vocab_size, size=(n, half - 1))
  prompt = np.concatenate([np.zeros((n, 1), np.int32), w,
                           np.zeros((n, 1), np.int32)], axis=1).astype(np.int32)
  out = decoding.autoregressive_sample(
      model, batch_size=n, temperature=temperature, start_id=0,
      eos_id=-1, max_length=half - 1, prompt=prompt)
  return [(wi, oi) for wi, oi in zip(w, np.asarray(out))]


EVAL_METRICS = ('WeightedCategoryCrossEntropy', 'WeightedCategoryAccuracy')


def evaluate(config, n_batches=8):
  """Scores a run's latest saved weights on the first `n_batches` of its eval stream.

  The model is loaded from the checkpoint and never re-initialised. Returns
  `{metric name: mean over the batches}`, as the training `Loop` averages its
  evals (the metrics in `EVAL_METRICS`).
  """
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(n_batches, int) or n_batches < 1:
    raise config_lib.ConfigError(
        f'the number of eval batches must be an int >= 1; got {n_batches!r}')
  model = load_model(config, 'eval', config.batch_size)
  metrics = [getattr(tl, name)() for name in EVAL_METRICS]

  def scores(batch, weights, state, rng):
    x, y, w = batch
    logits, _ = model.pure_fn(x, weights, state, rng)
    return [m.pure_fn((logits, y, w), (), (), rng)[0] for m in metrics]

  step = jax.jit(scores)
  stream = build_inputs(config).eval_stream(1)
  totals = np.zeros(len(metrics))
  for _ in range(n_batches):
    totals += [float(v) for v in step(tuple(next(stream)), model.weights,
                                      model.state, model.rng)]
  return dict(zip(EVAL_METRICS, (totals / n_batches).tolist()))


def print_eval(config, n_batches=8):
  """Prints `evaluate(config, n_batches)` on one line; returns it."""
  results = evaluate(config, n_batches)
  print(f'eval over {n_batches} batches: ' + '  '.join(
      f'{name} {value:.6f}' for name, value in results.items()))
  return results


def print_samples(config, n=None, temperature=0.0):
  """Prints `w` and the model's copy of it for a few prompts `0 w 0`."""
  if config.data != 'duplication':
    print('(sampling prints copies for the duplication task only)')
    return
  rows = sample_copies(config, n or config.n_samples, temperature)
  n_ok = 0
  for w, out in rows:
    ok = np.array_equal(w, out[:len(w)])
    n_ok += ok
    print(f'prompt 0 {" ".join(map(str, w))} 0\n'
          f'  copy   {" ".join(map(str, out[:len(w)]))}  '
          f'{"correct" if ok else "WRONG"}')
  print(f'{n_ok}/{len(rows)} copies correct')


BENCH_SCRIPTS = {
    'train_step.py': ['--blog'],
    'reversible_memory.py': ['--quick'],
    'attention_scaling.py': ['--quick'],
    'decode.py': ['--quick'],
    'data_throughput.py': ['--size-mb', '16', '--tokenizers', 'bytes'],
}


def quick_bench():
  """Runs a quick setting of each benchmark script; returns the failed ones."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  bench_dir = os.path.join(root, 'benchmarks')
  if not os.path.isdir(bench_dir):
    raise FileNotFoundError('retrax bench runs the scripts in benchmarks/ of a '
                            'source checkout; install with `pip install -e .` '
                            'from a clone.')
  failed = []
  for name, flags in BENCH_SCRIPTS.items():
    path = os.path.join(bench_dir, name)
    if not os.path.exists(path):
      continue
    print(f'== {name} {" ".join(flags)}', flush=True)
    if subprocess.run([sys.executable, path, *flags], check=False).returncode:
      failed.append(name)
  return failed
