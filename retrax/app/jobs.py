"""The CLI's jobs: build data from a RunConfig, train, sample, evaluate.

The default job trains a small ReformerLM with LSH attention on the Reformer
paper's duplication task (`0 w 0 w`) and then shows sampled copies. A run's
model is rebuilt by `retrax.runs.loading` (`retrax.load_run`); `retrax eval`
and `sample` of any run are `retrax.app.run_commands`'.
"""

import json
import os
import shlex
import sys

import jax
import numpy as np

from retrax import data
from retrax import layers as tl
from retrax import lr
from retrax import optimizers
from retrax.checkpoints.atomic import atomic_write
from retrax.data import tasks
from retrax.fastmath import precision
from retrax.run_layout import CONFIG_FILE
from retrax.run_layout import TOKENIZER_FILE
from retrax.runs import config as config_lib
from retrax.runs import loading
from retrax.supervised import decoding
from retrax.supervised import devices
from retrax.supervised import reporters
from retrax.supervised import training


def build_inputs(config):
  """The `Inputs` of a RunConfig: the duplication task or a text file.

  A text file's last `eval_fraction` (from a line start) is held out for
  evaluation; see `retrax.data.tasks.text_lm_inputs`.
  """
  m, d = config.model, config.data
  if d.source == 'duplication':
    return data.duplication_inputs(m.vocab_size, m.length, d.batch_size,
                                   seed=config.train.seed)
  return tasks.text_lm_inputs(
      d.source[len('text:'):], m.length, d.batch_size,
      loading.tokenizer_of_run(config), d.eval_fraction, seed=config.train.seed)


def n_params_estimate(config):
  """About how many weights the model of `config` has (embeddings, each
  layer's attention and feed-forward, the output layer; the small terms
  left out)."""
  m = config.model
  d, v, f = m.d_model, m.vocab_size, m.d_ff
  width = m.d_model if m.name == 'TransformerLM' else m.n_heads * m.d_head
  per_layer = 4 * d * width + 2 * d * f
  d_out = d if m.name == 'TransformerLM' else 2 * d  # Reformer: 2 halves.
  return v * d + m.length * d + m.n_layers * per_layer + d_out * v


def _machine_bytes():
  """This machine's memory (None where the system does not say)."""
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (ValueError, OSError, AttributeError):
    return None


def check_memory(config, machine_bytes=None):
  """Refuses, before anything is built, a model whose training state alone
  (float32 weights, gradients and Adam's two slots: 16 bytes a weight)
  exceeds the machine's memory: it would grow until the kernel kills it."""
  machine_bytes = machine_bytes or _machine_bytes()
  n = n_params_estimate(config)
  need = 16 * n
  if machine_bytes and need > machine_bytes:
    raise config_lib.ConfigError(
        f'the model has about {n:.3g} weights: training needs about '
        f'{need / 2 ** 30:.3g} GiB (weights, gradients and Adam\'s two slots '
        f'in float32) before any activation, more than this machine\'s '
        f'{machine_bytes / 2 ** 30:.3g} GiB; lower d_model, d_ff, n_layers or '
        'vocab_size.')


def _check_run_dir(config):
  """Refuses to train into a directory that holds a run of another model."""
  path = os.path.join(config.train.output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    return
  old = loading.read_config_file(path)
  model_keys = [k.name for k in config_lib.KEYS.values()
                if k.section == 'model' and k.name != 'dropout']
  model_keys.append('tokenizer')
  defaults = config_lib.RunConfig()
  diff = [k for k in model_keys
          if old.get(k, defaults.get(k)) != config.get(k)]
  if diff:
    raise config_lib.ConfigError(
        f'{config.train.output_dir} holds a run of another model (differs in '
        f'{", ".join(diff)}); choose another --output_dir.')


def _is_chief():
  return jax.process_index() == 0


def _write_run_files(config):
  """Writes run_config.json and a copy of the SentencePiece model (chief only)."""
  run_dir = config.train.output_dir
  os.makedirs(run_dir, exist_ok=True)
  tokenizer = loading.tokenizer_of_run(config)
  if not _is_chief():
    return
  with atomic_write(os.path.join(run_dir, CONFIG_FILE)) as f:
    f.write(json.dumps(config.to_dict(), indent=1).encode())
  source = tokenizer.model_file if tokenizer is not None else None
  copy = os.path.join(run_dir, TOKENIZER_FILE)
  if source is None or os.path.abspath(source) == os.path.abspath(copy):
    return
  with open(source, 'rb') as f:
    data = f.read()
  if os.path.exists(copy):
    with open(copy, 'rb') as f:
      if f.read() != data:
        raise config_lib.ConfigError(
            f'{copy} (the tokenizer this run was trained with) differs from '
            f'{source}; choose another --output_dir.')
    return
  with atomic_write(copy) as f:
    f.write(data)


def _streams(config):
  """(train, eval) batch iterators: this process's rows of the global batches."""
  inputs = build_inputs(config)
  train_stream, eval_stream = inputs.train_stream(1), inputs.eval_stream(1)
  n_hosts = jax.process_count()
  if n_hosts > 1:
    if config.data.batch_size % n_hosts:
      raise config_lib.ConfigError(
          f'batch_size ({config.data.batch_size}) must be a multiple of the number '
          f'of processes ({n_hosts}): each feeds its share of every batch.')
    train_stream = devices.host_shard(train_stream)
    eval_stream = devices.host_shard(eval_stream)
  return train_stream, eval_stream


def train(config, quiet=False, mesh=None):
  """Trains (resuming if `output_dir` holds a checkpoint); returns the Loop.

  In a multi-process run (`jax.distributed` initialized) every process feeds
  its rows of each global batch; process 0 writes the run's files. `mesh`
  ('data=2,fsdp=4'): see `training.Loop`.
  """
  t = config.train
  reporters.parse(t.report_to)  # An unknown name fails before any work.
  check_memory(config)  # Before building: a huge model would not fail fast.
  _check_run_dir(config)
  train_stream, eval_stream = _streams(config)
  factors = 'constant * linear_warmup' if t.warmup_steps else 'constant'
  schedule = lr.multifactor(factors=factors, constant=t.learning_rate,
                            warmup_steps=t.warmup_steps)
  train_task = training.TrainTask(
      labeled_data=train_stream,
      loss_layer=tl.WeightedCategoryCrossEntropy(),
      optimizer=optimizers.Adam(t.learning_rate),
      lr_schedule=schedule,
      n_steps_per_checkpoint=t.checkpoint_every)
  eval_task = training.EvalTask(
      labeled_data=eval_stream,
      metrics=[tl.WeightedCategoryCrossEntropy(),
               tl.WeightedCategoryAccuracy()],
      n_eval_batches=4)
  loop = training.Loop(
      loading.build_model(config, 'train'), [train_task],
      eval_model=loading.build_model(config, 'eval'), eval_tasks=[eval_task],
      output_dir=t.output_dir, random_seed=t.seed,
      eval_at=lambda step: step == 1 or step % t.eval_every == 0,
      options=training.LoopOptions(
          # A bar only on a terminal (never drawn into a redirected log).
          progress_bar=False if quiet else None,
          write_trax_files=t.trax_files, mesh=mesh or None,
          log_every=t.log_every or None, report_to=t.report_to or None,
          # The trackers record the run's settings as its parameters.
          report_config=config.to_dict() if t.report_to else None))
  _write_run_files(config)  # Only once the Loop has validated the run dir.
  remaining = t.steps - loop.step
  if remaining > 0:
    with precision.matmul_precision(t.matmul_dtype):
      loop.run(remaining)
  loop.close_reporters()  # The W&B / MLflow run ends with the job.
  return loop


def print_next_steps(output_dir, step, text=False):
  """Says where a run was saved and which commands use it (every trainer
  ends with these lines); `text`: a text run, sampled from a prompt."""
  d = shlex.quote(os.fspath(output_dir))
  prompt = ' --prompt "..."' if text else ''
  print(f'Saved the run (step {step}) in {os.fspath(output_dir)}\n'
        f'Next: retrax sample {d}{prompt}  |  retrax eval {d}  |  '
        f'retrax plot {d}  |  tensorboard --logdir {d}')


def sample_copies(config, n=4, temperature=0.0, seed=0):
  """Prompts `0 w 0` from the eval stream and the model's continuations; returns rows."""
  model = loading.load_run(config.train.output_dir, 'predict').model
  rng = np.random.default_rng(seed + 12345)
  half = config.model.length // 2
  w = rng.integers(1, config.model.vocab_size, size=(n, half - 1))
  prompt = np.concatenate([np.zeros((n, 1), np.int32), w,
                           np.zeros((n, 1), np.int32)], axis=1).astype(np.int32)
  out = decoding.autoregressive_sample(
      model, batch_size=n, temperature=temperature, start_id=0,
      eos_id=-1, max_length=half - 1, prompt=prompt)
  return [(wi, oi) for wi, oi in zip(w, np.asarray(out))]


def sample_text(run_dir, prompt='', n=1, temperature=0.0, max_length=None,
                seed=0):
  """`n` continuations of `prompt` from a text run (via `retrax.load_run`).

  At most `length - 1 - len(prompt ids)` new tokens fit the model's positions;
  `max_length` (default: all that fit) caps them. Returns a list of str.
  """
  run = _text_run(run_dir, n, '--prompt applies')
  ids = run.tokenizer.encode(prompt)
  prompt_ids = np.tile(ids[None], (n, 1)) if len(ids) else None
  return _continue(run, prompt_ids, n, temperature, max_length, seed)


def _text_run(run_dir, n, what):
  run = loading.load_run(run_dir, mode='predict', batch_size=n)
  if run.tokenizer is None:
    raise config_lib.ConfigError(f'{run_dir} is not a text run; {what} to '
                                 'runs of --data text:FILE.')
  return run


def _continue(run, prompt_ids, n, temperature, max_length, seed):
  """The decoded continuations of `prompt_ids` (`[n, k]` or None)."""
  used = 0 if prompt_ids is None else prompt_ids.shape[1]
  length = run.config.model.length
  room = length - 1 - used
  if room < 1:
    raise config_lib.ConfigError(
        f'the prompt has {used} tokens; this model sees {length} '
        f'positions, so use a prompt of at most {length - 2} tokens.')
  out = decoding.autoregressive_sample(
      run.model, batch_size=n, temperature=temperature, start_id=0,
      eos_id=None, max_length=min(max_length or room, room),
      prompt=prompt_ids, rng=seed)
  return [run.tokenizer.decode(row) for row in np.asarray(out)]


def held_out_prompts(config, tokenizer, n):
  """`n` prompts of `length // 4` ids from a text run's held-out text, or None.

  They start at evenly spaced places of the held-out part (`split_held_out`;
  byte runs: evenly spaced word starts), so they differ where the text does.
  None when the data file is gone or its held-out part is too short.
  """
  try:
    with open(config.data.source[len('text:'):], 'rb') as f:
      _, held = tasks.split_held_out(f.read(), config.data.eval_fraction)
  except OSError:
    return None
  ids = tokenizer.encode(held.decode('utf-8', 'replace'))
  k = max(1, config.model.length // 4)
  if len(ids) < k:
    return None
  starts = np.arange(len(ids) - k + 1)
  if tokenizer.spec == 'bytes':  # Word starts (the part begins a line).
    after_space = np.isin(ids[:len(ids) - k], (9, 10, 32))
    starts = np.concatenate([[0], np.flatnonzero(after_space) + 1])
  picks = starts[np.linspace(0, len(starts) - 1, n).astype(int)]
  return np.stack([ids[s:s + k] for s in picks])


def sample_held_out(run_dir, n=4, temperature=0.0, max_length=None, seed=0):
  """`n` `(prompt, continuation)` str pairs of a text run, the prompts from
  its held-out text (`held_out_prompts`; empty if the data file is gone)."""
  run = _text_run(run_dir, n, 'held-out prompts apply')
  prompts = held_out_prompts(run.config, run.tokenizer, n)
  texts = _continue(run, prompts, n, temperature, max_length, seed)
  shown = [''] * n if prompts is None else [run.tokenizer.decode(p)
                                           for p in prompts]
  return list(zip(shown, texts))


def temperature_words(temperature):
  return f'temperature {temperature}' + (' (greedy)' if temperature == 0 else '')


# Around the model's text in a printed sample, after its prompt: plain
# characters, so that a terminal, a redirected log and a notebook all show
# where the prompt ends (colours would be escape codes in a log).
CONTINUATION_MARKS = ('⟦', '⟧')
ASCII_CONTINUATION_MARKS = ('[[', ']]')


def continuation_marks(stream=None):
  """`CONTINUATION_MARKS`, or `ASCII_CONTINUATION_MARKS` where `stream`'s
  encoding (default: stdout's) cannot write them."""
  stream = sys.stdout if stream is None else stream
  try:
    ''.join(CONTINUATION_MARKS).encode(getattr(stream, 'encoding', None) or
                                       'utf-8')
  except (UnicodeEncodeError, LookupError):
    return ASCII_CONTINUATION_MARKS
  return CONTINUATION_MARKS


def format_sample(prompt, continuation, marks=CONTINUATION_MARKS):
  """`prompt`, then the model's `continuation` between `marks`."""
  return f'{prompt}{marks[0]}{continuation}{marks[1]}'


def _print_text_samples(config, n, temperature, prompt, max_length):
  n = n or config.sample.n_samples or 1
  run_dir = config.train.output_dir
  if prompt is None:
    pairs = sample_held_out(run_dir, n, temperature, max_length)
    source = ('prompts from the held-out text' if any(p for p, _ in pairs)
              else 'no prompt (the data file is gone)')
  else:
    pairs = [(prompt, text) for text in sample_text(
        run_dir, prompt, n, temperature, max_length)]
    source = 'the prompt given'
  marks = continuation_marks()
  print(f'{n} sample(s) at {temperature_words(temperature)}, continuing '
        f'{source} (the model\'s text between {marks[0]} and {marks[1]}):')
  for i, (p, text) in enumerate(pairs):
    print(f'--- sample {i + 1}\n{format_sample(p, text, marks)}')


def print_samples(config, n=None, temperature=None, prompt=None,
                  max_length=None):
  """Text runs: prints continuations of `prompt` (default: of held-out text).
  Duplication: the copies of `w` for a few prompts `0 w 0`. `temperature`
  (default: the config's) is printed with them."""
  if temperature is None:
    temperature = config.sample.temperature
  if config.data.source.startswith('text:'):
    _print_text_samples(config, n, temperature, prompt, max_length)
    return
  if prompt is not None:
    raise config_lib.ConfigError('--prompt applies to text runs (--data '
                                 'text:FILE); this run is the duplication '
                                 'task.')
  rows = sample_copies(config, n or config.sample.n_samples, temperature)
  n_ok = 0
  for w, out in rows:
    ok = np.array_equal(w, out[:len(w)])
    n_ok += ok
    print(f'prompt 0 {" ".join(map(str, w))} 0\n'
          f'  copy   {" ".join(map(str, out[:len(w)]))}  '
          f'{"correct" if ok else "WRONG"}')
  print(f'{n_ok}/{len(rows)} copies correct at '
        f'{temperature_words(temperature)}')
