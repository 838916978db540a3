"""`retrax eval` and `retrax sample` of a run directory, whatever made it.

The model comes from `retrax.load_run` (every run records `model.json`); the
data from what the run records (`retrax.runs.data`): a `retrax train` run's
config, a gin run's `config.gin`, or `--data text:FILE` for runs that record
none. Batches are Trax's `(inputs..., targets, weights)`: the model takes
its `n_in` first items and the metrics its outputs, then the rest (as a
`Loop`'s eval task stacks them).
"""

import os
import random

import jax
import numpy as np

from retrax import layers as tl
from retrax.app import hf_runs
from retrax.app import jobs
from retrax.fastmath import xla_cpu
from retrax.run_layout import CONFIG_FILE
from retrax.run_layout import GIN_CONFIG_FILE
from retrax.runs import config as config_lib
from retrax.runs import data as run_data
from retrax.runs import loading
from retrax.supervised import decoding

EVAL_METRICS = ('WeightedCategoryCrossEntropy', 'WeightedCategoryAccuracy')
_TEXT_BATCH = 8  # Rows of a --data text file's eval batches.


def _config(directory):
  """The `RunConfig` of a `retrax train` run, else None."""
  if os.path.exists(os.path.join(directory, CONFIG_FILE)):
    return loading.config_of_run(directory)
  return None


def _recorded_stream(directory, config, seed):
  """The eval batches the run records (its config's or its config.gin's).

  Trax's synthetic tasks draw from numpy's and Python's global generators,
  which are seeded with `seed` for a gin run's data, so that its numbers
  repeat.
  """
  if config is not None:
    return jobs.build_inputs(config).eval_stream(1)
  inputs = run_data.gin_inputs(directory)
  if inputs is None:
    raise run_data.no_data_error(directory)
  random.seed(seed)
  np.random.seed(seed)
  return inputs.eval_stream(1)


def _length(run):
  """The token length of the run's (last) input, as it trained."""
  stored = run.input_signature
  if isinstance(stored, (list, tuple)):
    stored = stored[-1]
  return int(stored.shape[1])


def _stack(model, batch, outputs):
  """The data stack after the model: its outputs, then the batch's rest."""
  outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
  return tuple(outputs) + tuple(batch[model.n_in:])


def _model_inputs(model, batch):
  return batch[0] if model.n_in == 1 else tuple(batch[:model.n_in])


def evaluate(directory, n_batches=8, seed=0, data=None):
  """Scores a run's latest saved weights on `n_batches` of its eval batches.

  The model is loaded from the checkpoint and never re-initialised. Its
  state (LSH attention's hashing key) starts from `PRNGKey(seed)` and batch
  `i` runs with the key `fold_in(PRNGKey(seed), i)`, so a model that draws
  random numbers in eval mode scores the same on every call with the same
  `seed`. `data` ('text:FILE') evaluates on that file instead of the run's
  data (windows of the run's length, its tokenizer or bytes). Returns
  `{metric name: mean over the batches}`, as the training `Loop` averages
  its evals (the metrics in `EVAL_METRICS`).
  """
  if not isinstance(n_batches, int) or n_batches < 1:
    raise config_lib.ConfigError(
        f'the number of eval batches must be an int >= 1; got {n_batches!r}')
  directory = os.fspath(directory)
  config = _config(directory)
  run = loading.load_run(directory, 'eval', seed=seed)
  if data is None:
    stream = _recorded_stream(directory, config, seed)
  else:
    missing = run_data.tokenizer_unavailable(directory, f'--data {data}')
    if missing is not None:
      raise missing
    stream = run_data.text_eval_stream(data, _length(run), _TEXT_BATCH,
                                       run.tokenizer)
  model = run.model
  metrics = [getattr(tl, name)() for name in EVAL_METRICS]

  def scores(batch, weights, state, rng):
    outputs, _ = model.pure_fn(_model_inputs(model, batch), weights, state,
                               rng)
    stack = _stack(model, batch, outputs)
    if len(stack) == 2:  # (logits, targets): every position counts.
      stack += (jax.numpy.ones(stack[1].shape, jax.numpy.float32),)
    stack = stack[:3]
    if model.n_in == 1:  # A converted HF run's logits predict the next token.
      stack = hf_runs.scored_outputs(model, *stack)
    return [m.pure_fn(stack, (), (), rng)[0] for m in metrics]

  step = xla_cpu.jit(scores)
  totals = np.zeros(len(metrics))
  key = jax.random.PRNGKey(seed)
  for i in range(n_batches):
    batch = tuple(next(stream))
    if i == 0:
      _check_ids(model, batch, data)
    totals += [float(v) for v in step(batch, model.weights, model.state,
                                      jax.random.fold_in(key, i))]
  return dict(zip(EVAL_METRICS, (totals / n_batches).tolist()))


def _check_ids(model, batch, data):
  """Refuses token ids the model's output has no logit for (else their
  one-hot targets are all zero: a loss near 0, silently wrong)."""
  outputs = jax.eval_shape(lambda x: model.pure_fn(
      x, model.weights, model.state, model.rng)[0], _model_inputs(model, batch))
  logits = jax.tree_util.tree_leaves(outputs)[0]
  vocab, top = logits.shape[-1], int(np.max(np.asarray(batch[1])))
  if top >= vocab:
    where = f'--data {data}' if data else 'the run\'s data'
    raise run_data.RunDataError(
        f'{where} has token id {top} but the model has {vocab} output ids; '
        'use data of its vocabulary (a run without tokenizer.model reads '
        'text as bytes, ids 0-255).')


def print_eval(directory, n_batches=8, seed=0, data=None):
  """Prints `evaluate(directory, n_batches, seed, data)` on one line; returns it."""
  results = evaluate(directory, n_batches, seed, data)
  print(f'eval over {n_batches} batches: ' + '  '.join(
      f'{name} {value:.6f}' for name, value in results.items()))
  return results


def _ids(text):
  return ' '.join(map(str, np.asarray(text).tolist()))


def _split_example(model, batch, row):
  """`(source or None, prompt, target)` of example `row` of a batch.

  The target is the span of the targets (`batch[1]`) the weights score; a
  language model's prompt is what comes before it (a copy task's `0 w 0`;
  a quarter of the row where every position is scored), an
  encoder-decoder's is empty.
  """
  batch = [np.asarray(a) for a in batch]
  targets = batch[1][row]
  scored = (np.flatnonzero(batch[2][row] > 0) if len(batch) > 2
            else np.arange(len(targets)))
  start = int(scored[0]) if len(scored) else 0
  end = int(scored[-1]) + 1 if len(scored) else len(targets)
  if model.n_in > 1:
    return batch[0][row], np.zeros((0,), np.int32), targets[start:end]
  if start == 0:
    start = max(1, len(targets) // 4)
  return None, batch[0][row][:start], targets[start:max(end, start + 1)]


def _decode(run, source, prompt, n_new, temperature, seed):
  """`n_new` tokens from one example (a fresh decoding state each call)."""
  model = run.model
  fresh = model.state
  start, prompt = hf_runs.decoding_start(
      model, prompt[None] if len(prompt) else None)  # Trax's or HF's way.
  try:
    out = decoding.autoregressive_sample(
        model, inputs=None if source is None else source[None],
        prompt=prompt, batch_size=1, temperature=temperature,
        start_id=start, eos_id=None, max_length=n_new, rng=seed)
  finally:
    model.state = fresh
  return np.asarray(out)[0]


def sample_recorded(directory, n=4, temperature=0.0, seed=0, config=None):
  """`(prompt, output, target)` for the first `n` examples of the run's eval
  data: each continued (one at a time) for as many tokens as its target."""
  run = loading.load_run(directory, 'predict')
  batch = next(_recorded_stream(directory, config, seed))
  rows = []
  for row in range(min(n, len(np.asarray(batch[0])))):
    source, prompt, target = _split_example(run.model, batch, row)
    out = _decode(run, source, prompt, len(target), temperature, seed + row)
    rows.append((prompt if source is None else source, out, target))
  return rows


def _parse_prompt(run, prompt):
  """The prompt's ids: encoded by the run's tokenizer, else read as ids."""
  if run.tokenizer is not None:
    return np.asarray(run.tokenizer.encode(prompt), np.int32)
  missing = run_data.tokenizer_unavailable(run.directory,
                                           f'--prompt {prompt[:40]!r}')
  if missing is not None:
    raise missing
  try:
    return np.asarray([int(t) for t in prompt.split()], np.int32)
  except ValueError:
    raise config_lib.ConfigError(
        f'--prompt {prompt[:40]!r}: this run has no tokenizer, so the '
        'prompt is token ids separated by spaces (e.g. --prompt "3 7 1").'
        ) from None


def sample_free(directory, n=1, temperature=0.0, prompt=None, max_length=None,
                seed=0):
  """`n` continuations of `prompt` (text with the run's tokenizer, else ids;
  None: from the start symbol alone). An encoder-decoder translates it."""
  run = loading.load_run(directory, 'predict')
  ids = _parse_prompt(run, prompt) if prompt is not None else np.zeros(
      (0,), np.int32)
  length = _length(run)
  encdec = run.model.n_in > 1
  room = length - 1 - (0 if encdec else len(ids))
  if room < 1:
    raise config_lib.ConfigError(
        f'the prompt has {len(ids)} tokens; this model sees {length} '
        f'positions, so use a prompt of at most {length - 2} tokens.')
  if encdec and not len(ids):
    raise config_lib.ConfigError('this run is an encoder-decoder: --prompt '
                                 'gives the input to translate.')
  n_new = min(max_length or room, room)
  source = None
  if encdec:  # The source as the model trained on it: zero-padded.
    width = int(run.input_signature[0].shape[1])
    if len(ids) > width:
      raise config_lib.ConfigError(f'the prompt has {len(ids)} tokens; this '
                                   f'model reads at most {width}.')
    source, ids = np.pad(ids, (0, width - len(ids))), ids[:0]
  return [_decode(run, source, ids, n_new, temperature, seed + i)
          for i in range(n)], run.tokenizer


def print_samples(directory, n=None, temperature=None, prompt=None,
                  max_length=None):
  """`retrax sample`: a `retrax train` run's samples (`jobs.print_samples`);
  for other runs, continuations of `prompt`, or without one the run's eval
  examples continued and compared with their targets."""
  directory = os.fspath(directory)
  config = _config(directory)
  if config is not None:
    jobs.print_samples(config, n=n, temperature=temperature, prompt=prompt,
                       max_length=max_length)
    return
  temperature = temperature or 0.0
  words = jobs.temperature_words(temperature)
  if prompt is None and os.path.isfile(os.path.join(directory,
                                                     GIN_CONFIG_FILE)):
    rows = sample_recorded(directory, n or 4, temperature)
    n_ok = 0
    for given, out, target in rows:
      ok = np.array_equal(out, target)
      n_ok += ok
      print(f'input   {_ids(given)}\n  output {_ids(out)}  '
            f'{"= target" if ok else "target " + _ids(target)}')
    print(f'{n_ok}/{len(rows)} outputs equal their targets at {words}')
    return
  outs, tokenizer = sample_free(directory, n or 1, temperature, prompt,
                                max_length)
  print(f'{len(outs)} sample(s) at {words}, continuing '
        f'{"the prompt given" if prompt is not None else "the start symbol"}:')
  for i, out in enumerate(outs):
    text = tokenizer.decode(out) if tokenizer is not None else _ids(out)
    print(f'--- sample {i + 1}\n{text}')
