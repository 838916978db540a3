"""Reformer paper Figures 3 and 4 at CPU scale: byte-level LMs on real text.

Kitaev et al. 2020 ("Reformer") show that shared-QK attention and reversible
layers train as well as the standard Transformer (Figure 3, enwik8 and
imagenet64) and that LSH attention approaches full attention as the number
of hashes grows, 1 -> 2 -> 4 -> 8 (Figure 4, imagenet64). This script trains
byte-level language models on a real text corpus, with the same data order,
steps and learning-rate schedule for every arm, and reports held-out bits per
byte against steps and against training wall time.

Corpus: the documentation that ships with the running Python, built in a few
seconds and written nowhere: `pydoc_data.topics` (the language reference
topics of `help()`), then the docstrings (`ast.get_docstring` of modules,
classes and functions) of every `*.py` under `sysconfig`'s stdlib, walked
top-down in sorted order (a directory's files before its subdirectories),
skipping test packages and site-packages; UTF-8 bytes joined by blank
lines. CPython 3.11.7 gives 2,271,236 bytes (sha256 88351dc8...; printed and
recorded: it differs between Python versions). The last `--eval_share`
(5%) is held out; eval is `--eval_windows` evenly spaced windows of it, the
same for every arm and evaluation; training batches are seeded random crops
of the rest, the same sequence for every arm.

Arms (one model size; vocab 256 bytes, dropout 0, FastGelu feed-forward):

* `transformer`: `TransformerLM`, standard causal attention (separate Q, K
  and V projections, with biases).
* `residual-full` (also named `transformer-shared-qk`: the same model):
  `ConfigurableTransformerLM`, a plain residual stack of exactly ReformerLM's
  attention and feed-forward layers, with `SelfAttention(share_qk=True,
  chunk_len=None)` (no biases; keys are the length-normalised queries; a
  position does not attend to itself unless nothing else is visible).
* `separate-qk`: `residual-full` with `share_qk=False` (its own key
  projection; a position attends to itself): the one difference shared QK
  makes, where `transformer` differs in more than that (its attention
  layer's biases, among others).
* `reversible-full`: `ReformerLM` with `residual-full`'s attention
  (reversible layers).
* `lsh-N`: `ReformerLM` with `LSHSelfAttention(n_hashes=N,
  chunk_len=--chunk_len)` (32 buckets at length 1024), trained and evaluated
  with N hashes; N = 1, 2, 4, 8.
* `reversible-autodiff` (only when named in `--arms`): `reversible-full`
  trained by plain autodiff (`reversible.plain_autodiff()`: activations
  kept, no reconstruction). Its curve must overlap `reversible-full`'s: a
  gap between the two would be the backward pass's, not the architecture's.

So `separate-qk` (and `transformer`) vs `residual-full` is Figure 3 left
(shared QK), `residual-full` vs `reversible-full` Figure 3 right, and
`reversible-full` vs `lsh-N` Figure 4. Bits per byte = mean cross-entropy
(nats) / ln 2 over every position of the eval windows (the first predicted
from nothing). The script prints a table, a verdict on each claim as issue
43 reads it, at the last eval (shared QK and reversible within 0.02
bits/byte of their baselines, LSH-8 within 0.03 of full attention, LSH-1
worse than LSH-8; with `reversible-autodiff`, reversible-full within 0.01
of it), and each LSH arm's gap to full attention; `--json` and `--plot`
(two panels: bits/byte vs steps and vs training seconds after step 1, i.e.
without compilation and evaluation) write them out.

`--seeds K` trains each arm with seeds `--seed` .. `--seed`+K-1 (weights
and data order): the table and curves show the mean, the JSON keeps each
run and the standard deviation at each eval, and a claim's difference is
the mean over seeds of arm minus baseline (paired by seed) +- their
standard deviation. `--lr separate=5e-3,shared=2e-3,lsh=2e-3` sets the
peak learning rate per family (`separate`: transformer and separate-qk;
`shared`: residual-full and the reversible arms; `lsh`) or per arm; the
others get `--learning_rate`. `--run_dir DIR` checkpoints each arm and seed
in `DIR/<arm>/seed<k>` at every eval with its measurements so far; the same
command resumes there (the first step after a resume compiles and is kept
out of the step times, as step 1 is). With `--max_minutes M` the run stops
after the last eval that leaves time for the next stretch and exits with
status 3: a device run in pieces is `until python ... --run_dir DIR
--max_minutes 9; [ $? != 3 ]; do :; done`, or one call per piece
(`benchmarks/tpu.sh`'s real_text stage). `--from_progress FILE` trains
nothing: it reports the finished runs of the progress file that stage
brings back, given the flags they were run with.

Separate QK does not stop learning because of its learning rate: at length
256 (600 steps, batch 4) transformer and separate-qk end at 3.92-3.96
bits/byte with peak rates 2e-3, 5e-3 and 1e-2 alike, next to the 3.77 bits
of the corpus' byte-bigram entropy, where residual-full reaches 3.07-3.32.
Masking a position's own key in separate-qk changes nothing (3.94);
length-normalised shared keys with self-attention allowed keep most of
shared QK's lead (3.52): at init, shared-QK attention already weighs
positions by the similarity of their inputs, where separate-QK's random
`W_q W_k^T` has to be learned out of a bigram plateau first (docs/benchmarks.md).

Defaults: d_model 128 (ReformerLM: each half of its two-part residual
stream), d_ff 512, 2 heads of 64, 2 layers, length 1024, batch 4, Adam with
`warmup_and_rsqrt_decay(100, 5e-3)`, 800 steps (3.3M tokens, ~1.5 passes
over the training bytes), eval every 100 steps on 64 windows (64K bytes).
The peak rate 5e-3 is the best of 2e-3, 5e-3 and 1e-2 for the shared-QK
and LSH families at length 256 (600 steps; separate QK is flat across the
three, docs/benchmarks.md). The README's results
(`benchmarks/results/real_text.json`) are of `--learning_rate 2e-3` and
these defaults otherwise (at length 1024, 5e-3 learns faster at first:
lsh-2 at 3.85 bits/byte at step 200 against 4.05; not run to the end).
Seconds per step measured on one core of this 2-core AMD EPYC VM (float32,
2026-12-05, two lanes: `taskset -c 0` and `-c 1`, one process each):
transformer 0.56, residual-full 0.78, reversible-full 0.77, lsh-1 0.26,
lsh-2 0.31, lsh-4 0.40, lsh-8 0.67; separate-qk 1.06 (beside a test
suite; ~0.8 alone). All eight arms: ~60 min of training and ~3 min of
evaluation on one core, ~35 min as two lanes (one process per core, each
with `--json`, joined by `--merge`; docs/benchmarks.md has the README's
run). 4 heads of 32 cost 1.5-2x
more (the length x length softmax dominates at this width). All arms run
in float32: the bfloat16 matmul policy (`RETRAX_MATMUL_DTYPE=bfloat16`)
gives lsh-2 the same bits/byte (to 4 decimals after 21 steps) and a 27%
faster step (0.37 vs 0.51 s), but makes transformer's 10% slower (0.80 vs
0.72 s). Shared-QK full attention with its (example, head) units batched
stopped under it on XLA:CPU (jaxlib 0.10.2: "Unsupported element type for
DotThunk::Execute: BF16 x BF16 = F32"); batched units' weight gradients now
multiply float32 copies on CPUs (`retrax.fastmath.precision.vmapped`).

Differences from the paper's setting: d_model 1024, d_ff 4096, 8 heads and
sequences of 64K bytes (enwik8, 100 MB) or 12K pixels (imagenet64, Figure
4's data) there, batch 8, Adafactor, many more steps on 8 accelerators;
here a 2-layer model of 0.56-0.59M parameters, length 1024, Python's
documentation (2.3 MB), 800 steps on a CPU, one seed per arm (the
README's run), in which the separate-QK arms had not left the bigram plateau.
As in the paper, the reversible arms train with the reconstructing backward pass
(`ReversibleSerial` recomputes each block's input from its output; no
activations are stored).

    python benchmarks/real_text.py [--quick] [--arms transformer,lsh-2]
        [--steps N] [--seeds K] [--lr family=rate,...] [--run_dir DIR
        [--max_minutes M]] [--plot curves.png] [--json results.json]
        [--from_progress real_text_progress.json]
"""

import argparse
import ast
import contextlib
import functools
import hashlib
import io
import json
import math
import os
import statistics
import sys
import sysconfig
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from retrax import errors
from retrax import layers as tl
from retrax import lr
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.layers import reversible
from retrax.supervised import training

ARMS = ('transformer', 'separate-qk', 'residual-full', 'reversible-full',
        'lsh-1', 'lsh-2', 'lsh-4', 'lsh-8', 'reversible-autodiff')
# The README's arms; `reversible-autodiff` (the reconstruction check) on request.
DEFAULT_ARMS = ARMS[:-1]
ALIASES = {'transformer-shared-qk': 'residual-full'}
# `--lr` sets a learning rate per family (or per arm).
FAMILIES = {'separate': ('transformer', 'separate-qk'),
            'shared': ('residual-full', 'reversible-full',
                       'reversible-autodiff'),
            'lsh': ('lsh-1', 'lsh-2', 'lsh-4', 'lsh-8')}
DEFAULTS = dict(length=1024, batch=4, steps=800, d_model=128, d_ff=512,
                n_heads=2, n_layers=2, chunk_len=64, learning_rate=5e-3, lr='',
                warmup=100, eval_every=100, eval_windows=64, eval_share=0.05,
                seed=0, seeds=1, arms=','.join(DEFAULT_ARMS), plot='')
QUICK = dict(length=128, batch=2, steps=30, d_model=32, d_ff=64, n_heads=2,
             n_layers=1, chunk_len=16, warmup=5, eval_every=15,
             eval_windows=4, learning_rate=1e-2)
# The reading of the paper's claims, at equal steps (the last eval):
# (claim, arm, baseline, test of arm's minus baseline's bits/byte).
CLAIMS = (
    ('Fig. 3 left: shared QK within 0.02 of separate QK', 'residual-full',
     'separate-qk', lambda d: d <= 0.02),
    ('Fig. 3 left: shared QK within 0.02 of TransformerLM', 'residual-full',
     'transformer', lambda d: d <= 0.02),
    ('Fig. 3 right: reversible within 0.02 of residual', 'reversible-full',
     'residual-full', lambda d: d <= 0.02),
    ('Fig. 4: LSH-8 within 0.03 of full attention', 'lsh-8',
     'reversible-full', lambda d: d <= 0.03),
    ('Fig. 4: LSH-1 worse than LSH-8', 'lsh-1', 'lsh-8', lambda d: d > 0),
    ('reconstructing backward within 0.01 of plain autodiff',
     'reversible-full', 'reversible-autodiff', lambda d: abs(d) <= 0.01),
)
# Exit status of a run that stopped at --max_minutes (run it again).
UNFINISHED = 3
# Test and site-package directories hold code, not documentation.
_SKIPPED_DIRS = {'test', 'tests', 'idle_test', 'site-packages',
                 'dist-packages', '__pycache__'}


def _docstrings(path):
  """The docstrings of a module and of its classes and functions."""
  with open(path, 'rb') as f:
    source = f.read()
  try:
    with warnings.catch_warnings():  # Invalid escapes in old modules.
      warnings.simplefilter('ignore')
      tree = ast.parse(source)
  except (SyntaxError, ValueError):  # Not this Python's syntax: no docs.
    return []
  kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
  docs = (ast.get_docstring(node) for node in ast.walk(tree)
          if isinstance(node, kinds))
  return [doc for doc in docs if doc]


def build_corpus(stdlib=None):
  """Python's own documentation as UTF-8 bytes (see the module docstring)."""
  from pydoc_data import topics  # pylint: disable=import-outside-toplevel
  parts = [topics.topics[key] for key in sorted(topics.topics)]
  stdlib = stdlib or sysconfig.get_paths()['stdlib']
  for root, dirs, files in os.walk(stdlib):
    dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
    for name in sorted(files):
      if name.endswith('.py'):
        parts += _docstrings(os.path.join(root, name))
  return '\n\n'.join(parts).encode('utf-8')


def split_corpus(corpus, cfg):
  """`(train bytes, eval windows [n, length])` as uint8 arrays."""
  tokens = np.frombuffer(corpus, np.uint8)
  n_eval = int(len(tokens) * cfg.eval_share)
  train, held_out = tokens[:-n_eval], tokens[-n_eval:]
  if len(held_out) < cfg.length or len(train) < cfg.length:
    raise ValueError(f'corpus of {len(tokens)} bytes too small for length '
                     f'{cfg.length} with eval_share {cfg.eval_share}.')
  if cfg.eval_windows % cfg.batch:  # Eval runs in batches of the train size.
    raise ValueError(f'--eval_windows ({cfg.eval_windows}) must be a multiple '
                     f'of --batch ({cfg.batch}).')
  starts = np.linspace(0, len(held_out) - cfg.length,
                       cfg.eval_windows).astype(int)
  return train, np.stack([held_out[s:s + cfg.length] for s in starts])


def train_batches(train, cfg, seed=None):
  """Endless `(x, x, weights)` batches of random crops of `train`, seeded by
  `seed` (default `cfg.seed`)."""
  rng = np.random.RandomState(cfg.seed if seed is None else seed)
  while True:
    starts = rng.randint(0, len(train) - cfg.length + 1, size=cfg.batch)
    x = np.stack([train[s:s + cfg.length] for s in starts]).astype(np.int32)
    yield x, x, np.ones(x.shape, np.float32)


def learning_rates(cfg):
  """`{arm: learning rate}` of every arm: `--lr`'s arm, else family, else
  `--learning_rate`."""
  rates = {}
  for item in filter(None, cfg.lr.split(',')):
    key, _, value = item.partition('=')
    key = ALIASES.get(key.strip(), key.strip())
    if key not in FAMILIES and key not in ARMS:
      raise ValueError(f'--lr: {key!r} is neither a family '
                       f'({", ".join(FAMILIES)}) nor an arm; got {cfg.lr!r}.')
    try:
      rates[key] = float(value)
    except ValueError:
      raise ValueError(f'--lr: {item!r} is not name=rate (e.g. '
                       f'separate=5e-3); got {cfg.lr!r}.') from None
  family = {arm: name for name, arms in FAMILIES.items() for arm in arms}
  return {arm: rates.get(arm, rates.get(family[arm], cfg.learning_rate))
          for arm in ARMS}


def canonical(arm):
  arm = ALIASES.get(arm, arm)
  if arm not in ARMS:
    raise ValueError(f'unknown arm {arm!r}: use one of '
                     f'{", ".join(ARMS + tuple(ALIASES))}.')
  return arm


def build_model(arm, cfg, mode):
  """The model of `arm` in `mode` (see the module docstring)."""
  common = dict(vocab_size=256, d_model=cfg.d_model, d_ff=cfg.d_ff,
                n_layers=cfg.n_layers, n_heads=cfg.n_heads, dropout=0.0,
                max_len=cfg.length, ff_activation=tl.FastGelu, mode=mode)
  full = functools.partial(tl.SelfAttention, share_qk=True, chunk_len=None)
  if arm == 'transformer':
    return models.TransformerLM(**common)
  if arm in ('separate-qk', 'residual-full'):
    attention = functools.partial(full, share_qk=arm == 'residual-full')
    return models.ConfigurableTransformerLM(attention_type=attention,
                                            ff_dropout=0.0, **common)
  d_head = cfg.d_model // cfg.n_heads
  if arm in ('reversible-full', 'reversible-autodiff'):
    attention = full
  else:
    attention = functools.partial(tl.LSHSelfAttention, chunk_len=cfg.chunk_len,
                                  n_hashes=int(arm[len('lsh-'):]))
  return models.ReformerLM(d_attention_key=d_head, d_attention_value=d_head,
                           attention_type=attention, **common)


def evaluator(arm, cfg, eval_windows):
  """`weights -> held-out bits per byte` of `arm`'s eval-mode model.

  Batches of `cfg.batch` windows (LSH state is sized for the train batch);
  each batch gets a fixed rng, so LSH hashes are the same at every eval.
  """
  model = build_model(arm, cfg, 'eval')
  batches = eval_windows.astype(np.int32).reshape(-1, cfg.batch, cfg.length)
  model.init(shapes.signature(batches[0]), rng=jax.random.PRNGKey(cfg.seed))
  state = model.state

  @jax.jit
  def nats(weights, x, rng):
    logits, _ = model.pure_fn(x, weights, state, rng)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, x[..., None], axis=-1).mean()

  def bits_per_byte(weights):
    total = sum(float(nats(weights, x, jax.random.PRNGKey(i)))
                for i, x in enumerate(batches))
    return total / len(batches) / math.log(2)
  return bits_per_byte


class Unfinished(Exception):
  """The run stopped at `--max_minutes`; the same command continues it."""


def _write_json(path, value):
  """Writes `value` to `path` whole or not at all (a temporary, then a rename)."""
  with open(path + '.tmp', 'w') as f:
    json.dump(value, f, indent=1)
  os.replace(path + '.tmp', path)


def _read_json(path, default=None):
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def _loop(arm, cfg, train_bytes, seed, run_dir):
  """A `Loop` training `arm` with Adam at its learning rate (see `train`)."""
  rate = learning_rates(cfg)[arm]
  batches = train_batches(train_bytes, cfg, seed)
  first = next(train_batches(train_bytes, cfg, seed))  # For shapes only.
  task = training.TrainTask(
      batches, tl.WeightedCategoryCrossEntropy(), optimizers.Adam(rate),
      lr_schedule=lr.warmup_and_rsqrt_decay(cfg.warmup, rate),
      n_steps_per_checkpoint=None, sample_batch=first)
  # Train loss: the mean since the last log, logged at each eval step. A
  # resumed Loop skips the batches the checkpointed run took.
  return training.Loop(build_model(arm, cfg, 'train'), task,
                       output_dir=run_dir, random_seed=seed,
                       options=training.LoopOptions(
                           progress_bar=False, log_every=cfg.eval_every,
                           keep_checkpoints=1, write_trax_files=False))


def train(arm, cfg, train_bytes, eval_windows, log=print, seed=None,
          run_dir=None, deadline=None):
  """Trains `arm` for `cfg.steps` steps, evaluating every `cfg.eval_every`.

  `seed` (default `cfg.seed`) seeds the weights and the data order. With
  `run_dir`, the run checkpoints there at every eval (and step 1) with its
  measurements so far, and resumes from it; with `deadline` (a `time.time()`)
  it raises `Unfinished` after the last eval that leaves time for the next.
  The reversible-autodiff arm is traced inside `plain_autodiff()`.

  Returns:
    {'curve': [(step, eval bits/byte, train bits/byte, seconds of training
     after step 1)], 'first_step_s': seconds of step 1 (compilation
     included), 'resume_s': seconds of the first step after each resume
     (compilation again), 'step_s': median seconds per step of the other
     stretches, 'per_step': each one's, 'train_s' (all steps), 'eval_s'}.
     Training seconds exclude evaluation; the curve's also exclude the
     compiling steps, so that compilation does not shift it.
  """
  seed = cfg.seed if seed is None else seed
  progress_path = run_dir and os.path.join(run_dir, 'progress.json')
  done = _read_json(progress_path, {}) if run_dir else {}
  if done.get('step') == cfg.steps:
    return done['result']
  loop = _loop(arm, cfg, train_bytes, seed, run_dir)
  result = done.get('result', dict(curve=[], first_step_s=None, per_step=[],
                                   resume_s=[], train_s=0.0, eval_s=0.0))
  if loop.step != done.get('step', 0):
    raise ValueError(
        f'{run_dir}: the checkpoint is at step {loop.step} but the '
        f'measurements at step {done.get("step", 0)} (stopped between the '
        f'two writes); delete {run_dir} to train {arm} afresh.')
  evaluate = evaluator(arm, cfg, eval_windows)
  autodiff = (reversible.plain_autodiff if arm == 'reversible-autodiff'
              else contextlib.nullcontext)
  compiled = False
  while loop.step < cfg.steps:
    # The first step of a process alone (step 1, or the first after a
    # resume), so that its compilation stays out of the step time.
    n = 1 if not compiled else min(
        cfg.eval_every - loop.step % cfg.eval_every, cfg.steps - loop.step)
    stretch_start = start = time.time()
    with autodiff(), contextlib.redirect_stdout(io.StringIO()):  # Its log.
      loop.run(n)
    seconds = time.time() - start
    result['train_s'] += seconds
    if loop.step == 1:
      result['first_step_s'] = seconds
    elif not compiled:
      result['resume_s'].append(seconds)
    else:
      result['per_step'].append(seconds / n)
    compiled = True
    if not loop.step % cfg.eval_every or loop.step == cfg.steps:
      start = time.time()
      bpb = evaluate(loop.model.weights)
      result['eval_s'] += time.time() - start
      loss = loop.history.get('train',
                              'metrics/WeightedCategoryCrossEntropy')
      result['curve'].append([loop.step, bpb, loss[-1][1] / math.log(2),
                              result['train_s'] - result['first_step_s'] -
                              sum(result['resume_s'])])
      log(f'  {arm:>15s} seed {seed} step {loop.step:5d}: eval {bpb:.4f} '
          f'bits/byte, train {result["curve"][-1][2]:.4f} '
          f'({result["train_s"]:.0f} s training, {result["eval_s"]:.0f} s '
          f'eval)')
    result['step_s'] = (statistics.median(result['per_step'])
                        if result['per_step'] else None)
    if run_dir:
      _write_json(progress_path, dict(step=loop.step, result=result))
    # Stops if the next stretch of eval_every steps, as long as this one,
    # would end past the deadline (step 1 is a stretch of its own).
    if (deadline is not None and loop.step > 1 and loop.step < cfg.steps and
        2 * time.time() - stretch_start > deadline):
      raise Unfinished(f'{arm} seed {seed} at step {loop.step}')
  return result


def summarize(runs, rate, seeds):
  """One arm's result over its seeds' `train` results.

  One seed: that run's result. Several: the mean curve, `eval_sd` (the
  standard deviation of eval bits/byte at each eval) and `runs`.
  """
  result = dict(runs[0]) if len(runs) == 1 else dict(
      curve=[[statistics.mean(c) for c in zip(*points)]
             for points in zip(*(r['curve'] for r in runs))],
      eval_sd=[statistics.stdev(points) for points in zip(
          *([c[1] for c in r['curve']] for r in runs))],
      first_step_s=statistics.mean(r['first_step_s'] for r in runs),
      step_s=statistics.median(r['step_s'] for r in runs),
      train_s=statistics.mean(r['train_s'] for r in runs),
      eval_s=statistics.mean(r['eval_s'] for r in runs), runs=runs)
  result.pop('per_step', None)
  result.pop('resume_s', None)
  return dict(result, learning_rate=rate, seeds=seeds)


def _run_config(cfg):
  """What a run directory's results depend on (not which arms, nor where
  the results go)."""
  return {k: v for k, v in vars(cfg).items() if k not in ('arms', 'plot')}


class ProgressError(ValueError):
  """A progress file that does not hold the runs asked for."""


def finished_runs(path, cfg):
  """`(corpus, {(arm, seed): progress})` of the runs in a progress file.

  The file is what `benchmarks/tpu.sh`'s real_text stage brings back from a
  device: `{'config': the run directory's config.json, 'runs': {'<arm>/
  seed<k>': that run's progress.json}}`. Its config must be `cfg`'s (the
  same flags, but for `--seeds`: each seed is looked up on its own), so
  that the report describes what was trained.
  """
  progress = _read_json(path)
  if not isinstance(progress, dict) or 'runs' not in progress:
    raise ProgressError(f'--from_progress {path}: not a progress file of '
                        f'benchmarks/tpu.sh (no "runs").')
  def setting(config):
    return {k: v for k, v in config.items() if k != 'seeds'}
  want, got = _run_config(cfg), progress.get('config', {}).get('config', {})
  if setting(got) != setting(want):
    raise ProgressError(f'--from_progress {path} was run with another '
                        f'config: {got} vs the flags given, {want}.')
  runs = {}
  for key, done in progress['runs'].items():
    arm, seed = key.split('/seed')
    runs[arm, int(seed)] = done
  return progress['config'].get('corpus'), runs


def run(cfg, corpus=None, log=print, run_dir=None, deadline=None,
        finished=None):
  """Trains every arm of `cfg.arms` for `cfg.seeds` seeds on `corpus`
  (default: `build_corpus()`).

  With `run_dir`, each arm and seed trains in `run_dir/<arm>/seed<k>` and
  a rerun of the same config resumes there (see `train`). With `finished`
  (`finished_runs`), nothing trains: each arm and seed's result is taken
  from there, and must have reached `cfg.steps` on this corpus.

  Returns a JSON-able dict: the config, the corpus (bytes, sha256, Python
  version, train/eval sizes), per arm `summarize` of its seeds, and
  `claims`.
  """
  arms = list(dict.fromkeys(canonical(a) for a in cfg.arms.split(',')))
  if cfg.seeds < 1:
    raise ValueError(f'--seeds must be at least 1; got {cfg.seeds}.')
  rates = learning_rates(cfg)
  corpus = build_corpus() if corpus is None else corpus
  train_bytes, eval_windows = split_corpus(corpus, cfg)
  info = dict(bytes=len(corpus), sha256=hashlib.sha256(corpus).hexdigest(),
              python=sys.version.split()[0], train_bytes=len(train_bytes),
              eval_bytes=len(corpus) - len(train_bytes),
              eval_tokens=eval_windows.size)
  log(f'corpus: {info["bytes"]:,} bytes of Python {info["python"]} '
      f'documentation (sha256 {info["sha256"][:16]}...), {info["train_bytes"]:,}'
      f' for training, eval on {len(eval_windows)} windows of the last '
      f'{info["eval_bytes"]:,}')
  if run_dir:
    os.makedirs(run_dir, exist_ok=True)
    setting = dict(config=_run_config(cfg), corpus=info)
    path = os.path.join(run_dir, 'config.json')
    before = _read_json(path)
    if before is None:
      _write_json(path, setting)
    elif before != setting:
      raise ValueError(f'--run_dir {run_dir} holds a run of another config '
                       f'or corpus: {before} vs now {setting}.')
  if finished is not None and finished[0] != info:
    raise ProgressError(f'--from_progress: the runs were trained on another '
                        f'corpus ({finished[0]}) than this Python builds '
                        f'({info}).')
  results = dict(config=vars(cfg), corpus=info, arms={})
  seeds = [cfg.seed + k for k in range(cfg.seeds)]
  for arm in arms:
    if finished is not None:
      runs = []
      for seed in seeds:
        step = finished[1].get((arm, seed), {}).get('step', 0)
        if step != cfg.steps:
          raise ProgressError(f'--from_progress: {arm} seed {seed} is at '
                              f'step {step} of {cfg.steps}; leave it out of '
                              f'--arms or finish it.')
        runs.append(finished[1][arm, seed]['result'])
    else:
      runs = [train(arm, cfg, train_bytes, eval_windows, log, seed,
                    run_dir and os.path.join(run_dir, arm, f'seed{seed}'),
                    deadline) for seed in seeds]
    results['arms'][arm] = summarize(runs, rates[arm], seeds)
  results['claims'] = claims(results)
  return results


def format_table(results):
  """Eval bits/byte at a few steps (the last included), step and wall times."""
  curves = {arm: r['curve'] for arm, r in results['arms'].items()}
  steps = sorted({c[0] for curve in curves.values() for c in curve})
  shown = sorted({steps[len(steps) // 4], steps[len(steps) // 2], steps[-1]})
  lines = ['held-out bits per byte at step ' + ', '.join(map(str, shown)) +
           ' (the mean over seeds; sd: at the last step); learning rate; '
           'median s/step after step 1; s of step 1 (compile); seconds of '
           'training and of evaluation',
           f'{"arm":>19s} ' + ' '.join(f'{s:>7d}' for s in shown) +
           f' {"sd":>6s} {"seeds":>5s} {"lr":>7s} {"s/step":>7s} '
           f'{"step 1":>7s} {"train s":>8s} {"eval s":>7s}']
  for arm, r in results['arms'].items():
    at = {c[0]: c[1] for c in r['curve']}
    sd = f'{r["eval_sd"][-1]:>6.4f}' if 'eval_sd' in r else f'{"-":>6s}'
    rate = r.get('learning_rate',
                 results.get('config', {}).get('learning_rate'))
    rate = f'{rate:>7.1e}' if rate is not None else f'{"-":>7s}'
    lines.append(f'{arm:>19s} ' + ' '.join(
        f'{at[s]:>7.4f}' if s in at else f'{"-":>7s}' for s in shown) +
        f' {sd} {len(r.get("seeds", [0])):>5d} {rate} '
        f'{r["step_s"] or 0:>7.3f} {r["first_step_s"] or 0:>7.1f} '
        f'{r["train_s"]:>8.0f} {r["eval_s"]:>7.0f}')
  return '\n'.join(lines)


def _finals(result):
  """Last eval bits/byte of each seed's run of an arm."""
  return [r['curve'][-1][1] for r in result.get('runs', [result])]


def claims(results):
  """`[{claim, arm, baseline, difference, sd, n_seeds, holds}]` for the arms
  that ran: `difference` is the mean over seeds of arm minus baseline at the
  last eval (paired by seed), `sd` their standard deviation (None for one
  seed); the claim's test is applied to the mean."""
  arms = results['arms']
  found = []
  for claim, arm, base, test in CLAIMS:
    if arm not in arms or base not in arms:
      continue
    a, b = _finals(arms[arm]), _finals(arms[base])
    paired = ([x - y for x, y in zip(a, b)] if len(a) == len(b) else
              [statistics.mean(a) - statistics.mean(b)])
    difference = statistics.mean(paired)
    found.append(dict(claim=claim, arm=arm, baseline=base,
                      difference=difference,
                      sd=statistics.stdev(paired) if len(paired) > 1 else None,
                      n_seeds=len(paired), holds=bool(test(difference))))
  return found


# A parity claim whose arm is this far ahead compares against a baseline
# that has not learned what the arm has (issue 54: separate QK on the
# bigram plateau), not two trained models.
FAR_AHEAD = 0.1


def format_claims(results):
  """The claims' verdicts, and every LSH arm's gap to full attention."""
  lines = [f'{c["claim"]}: {c["arm"]} - {c["baseline"]} = '
           f'{c["difference"]:+.4f}'
           + (f' +- {c["sd"]:.4f} ({c["n_seeds"]} seeds)' if c.get('sd')
              is not None else '') +
           f' bits/byte: {"holds" if c["holds"] else "does not hold"}'
           + (f' (but {c["arm"]} is ahead by more than {FAR_AHEAD}: the '
              f'baseline has not learned as far; not a parity test)'
              if c['holds'] and 'within' in c['claim'] and
              c['difference'] < -FAR_AHEAD
              else '')
           for c in results['claims']]
  arms = results['arms']
  if 'reversible-full' in arms:
    full = arms['reversible-full']['curve'][-1][1]
    gaps = [f'{arm} {r["curve"][-1][1] - full:+.4f}'
            for arm, r in arms.items() if arm.startswith('lsh-')]
    if gaps:
      lines.append('LSH minus full attention (reversible-full) at the last '
                   'eval: ' + ', '.join(gaps))
  return '\n'.join(lines)


def merge(paths):
  """One result from runs of different arms with the same config and corpus.

  Lets the arms be split over cores (one `taskset -c K` process per lane);
  the claims are recomputed over all of them.
  """
  runs = []
  for path in paths:
    with open(path) as f:
      runs.append(json.load(f))
  def setting(r):  # All but the arms must agree.
    return dict(r['config'], arms=None), r['corpus']
  arms, source = {}, {}
  for path, r in zip(paths, runs):
    if setting(r) != setting(runs[0]):
      raise ValueError(f'--merge: {path} was run with another config or '
                       f'corpus than {paths[0]}: {setting(r)} vs '
                       f'{setting(runs[0])}.')
    for arm, result in r['arms'].items():
      if arm in arms:
        raise ValueError(f'--merge: arm {arm} is in {source[arm]} and {path}.')
      arms[arm], source[arm] = result, path
  order = [arm for arm in ARMS if arm in arms]
  results = dict(config=dict(runs[0]['config'], arms=','.join(order)),
                 corpus=runs[0]['corpus'],
                 arms={arm: arms[arm] for arm in order})
  results['claims'] = claims(results)
  return results


def plot(results, path):
  """Writes eval bits/byte vs step and vs training seconds as a PNG.

  Raises `MissingPackageError` (one line) where matplotlib is not installed.
  """
  try:
    import matplotlib  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise errors.missing_package('matplotlib', 'real_text.py --plot',
                                 'plots') from None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  for arm, r in results['arms'].items():
    steps, bpb, _, seconds = zip(*r['curve'])
    style = dict(marker='.', label=arm, ls='--' if arm.startswith('lsh')
                 else '-')
    axes[0].plot(steps, bpb, **style)
    axes[1].plot(seconds, bpb, **style)
  corpus = results['corpus']
  axes[0].set(xlabel='training step', ylabel='held-out bits per byte',
              title=f'Python {corpus["python"]} docs ({corpus["bytes"]:,} '
              f'bytes), length {results["config"]["length"]}')
  axes[1].set(xlabel='training seconds after step 1 (compilation and '
              'evaluation excluded)')
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def parse_args(argv=None):
  """`(config namespace, {json, merge})`: what runs, and where results go."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='smoke run: ' + ', '.join(
                          f'{k} {v}' for k, v in QUICK.items()))
  for key, value in DEFAULTS.items():
    parser.add_argument(f'--{key}', type=type(value), default=None,
                        help=f'default {value}')
  parser.add_argument('--json', default=None, help='write results here')
  parser.add_argument('--merge', default=None, metavar='A.json,B.json',
                      help='train nothing: merge the --json results of runs '
                      'of different arms (e.g. one per core) and report them')
  parser.add_argument('--from_progress', default=None, metavar='FILE',
                      help='train nothing: report the finished runs of a '
                      'progress file (benchmarks/tpu.sh real_text stage) '
                      'run with the same flags')
  parser.add_argument('--run_dir', default=None,
                      help='checkpoint each arm and seed here at every eval; '
                      'the same command resumes from it')
  parser.add_argument('--max_minutes', type=float, default=None,
                      help=f'with --run_dir: stop after the last eval that '
                      f'leaves time for the next, exit status {UNFINISHED}')
  args = parser.parse_args(argv)
  for key, value in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  if args.max_minutes is not None and not args.run_dir:
    parser.error('--max_minutes needs --run_dir (where the next run resumes)')
  # What to do with the results is not part of the config they record.
  options = dict(json=args.json, merge=args.merge, run_dir=args.run_dir,
                 max_minutes=args.max_minutes,
                 from_progress=args.from_progress)
  del (args.json, args.merge, args.quick, args.run_dir, args.max_minutes,
       args.from_progress)
  return args, options


def report(results, plot_path, json_path):
  """Prints the table and the claims; writes the JSON and the PNG if asked.

  The JSON first: a run's results outlive a plot that cannot be drawn (no
  matplotlib: one line on stderr instead, the run still succeeds).
  """
  print()
  print(format_table(results))
  print(format_claims(results))
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(results, f, indent=1)
    print(f'wrote {json_path}')
  if plot_path:
    try:
      plot(results, plot_path)
    except errors.MissingPackageError as e:
      print(f'real_text.py: no plot: {e}', file=sys.stderr)
    else:
      print(f'wrote {plot_path}')


def main(argv=None):
  """Runs (or merges) and reports; returns the exit status (`UNFINISHED`
  when `--max_minutes` stopped the run)."""
  start = time.time()
  cfg, options = parse_args(argv)
  if options['merge']:
    results = merge(options['merge'].split(','))
    report(results, cfg.plot, options['json'])
    return 0
  rates = learning_rates(cfg)
  arms = [canonical(a) for a in cfg.arms.split(',')]
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}; d_model '
        f'{cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_heads} heads, {cfg.n_layers} '
        f'layers, length {cfg.length}, batch {cfg.batch}, {cfg.steps} steps, '
        f'{cfg.seeds} seed(s) from {cfg.seed}, Adam warmup_and_rsqrt_decay('
        f'{cfg.warmup}, lr) with lr ' + ', '.join(
            f'{arm} {rates[arm]:g}' for arm in dict.fromkeys(arms)) +
        f'; LSH chunk_len {cfg.chunk_len}', flush=True)
  deadline = (start + 60 * options['max_minutes']
              if options['max_minutes'] is not None else None)
  try:
    results = run(cfg, log=functools.partial(print, flush=True),
                  run_dir=options['run_dir'], deadline=deadline,
                  finished=options['from_progress'] and finished_runs(
                      options['from_progress'], cfg))
  except ProgressError as e:
    print(f'real_text.py: {e}', file=sys.stderr)
    return 2
  except Unfinished as e:
    print(f'unfinished ({e}) after {options["max_minutes"]} minutes: run the '
          f'same command again to continue from {options["run_dir"]}.')
    return UNFINISHED
  report(results, cfg.plot, options['json'])
  return 0


if __name__ == '__main__':
  sys.exit(main())
