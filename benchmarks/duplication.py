"""Reformer paper Table 2 at CPU scale: the duplication task, LSH vs full attention.

Kitaev et al. 2020 ("Reformer", Table 2) train a 1-layer model (d_model 256,
4 heads) on sequences `0 w 0 w` (`w` random symbols, vocab 128, loss on the
second copy) with full attention and with LSH attention of 1, 2 and 4 hashes,
then evaluate each trained model with every attention type. Full attention
there is Trax 1.2's shared-QK causal dot-product attention (the projected
queries duplicated as keys: not normalised, and a position may attend to
itself), whose weights `(w_q, w_v, w_o)` are the same tree as
`LSHSelfAttention`'s, so one set of trained weights runs under any of them.

This script does the same with `ReformerLM(n_layers=1)` trained through
`retrax.supervised.training.Loop` on `retrax.data.duplication_inputs`:
attention `full` is `tl.SharedQKDotProductAttention(causal=True)` (the
paper's), `full-norm` is `tl.SelfAttention(share_qk=True, chunk_len=None)`
(Trax 1.4.1's shared-QK full attention: normalised keys, own key masked as
in LSH) and `lsh-N` is `tl.LSHSelfAttention(n_hashes=N,
chunk_len=--chunk_len, n_chunks_before=1)`. It prints a table (rows: trained
with, columns: evaluated with) of the per-token accuracy on the second copy
over `--eval_batches` fresh eval batches, and optionally writes it as JSON.

The paper trains at length 1024 for 150K steps on accelerators. Here the
default is length 64 with the recipe of issue 20: batch 16, Adam with
`warmup_and_rsqrt_decay(400, 1e-3)`, d_ff 256, LSH chunk_len 16 (8 buckets);
each row trains until its monitored accuracy (2 batches, its own attention)
reaches `--stop_at` 0.99, at most 2000 steps. Copying is learnt after a
plateau at chance (loss ~ln 127) that ends abruptly: full attention left it
after 700-800 steps, LSH-2 and LSH-4 after 1200-1300 (measured at seed 0).

`--curriculum 64:2500,128:2500,256:3000` trains one model through several
lengths with the same weights (a fresh Adam and schedule per stage; the
learned positional table has the longest length from the start; a stage ends
at `--stop_at`), so the copy learnt at 64 is reused at 128 and 256 (issue
20 reports that this recipe trained from scratch at 128 was still at chance
after 2000 steps); the table is then evaluated at the
last length and `reached` reports the step and seconds at which the
monitored accuracy first reached `--target` there.
`--n_buckets 8` hashes every length into 8 buckets (the chunk grows with
the length); with it and `--learning_rate 2e-3`, the curriculum
`64:2000,128:2000,256:6000` reached 0.99 at length 256 in 13.4 minutes here
(README). `--plot` writes the
accuracy curves as a PNG. `--quick` is a smoke run (length 32, 150 steps)
that checks the pipeline, not the accuracies.

    python benchmarks/duplication.py [--quick] [--steps N] [--batch B]
        [--length L] [--train full,lsh-2,lsh-4] [--eval full,lsh-1,...]
        [--curriculum 64:2500,128:2500,256:3000] [--n_buckets 8] [--stop_at 0.99]
        [--plot curves.png] [--json results.json]
"""

import argparse
import contextlib
import functools
import io
import json
import os
import sys
import time

import jax

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from retrax import data
from retrax import layers as tl
from retrax import lr
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.supervised import training

DEFAULTS = dict(length=64, batch=16, steps=2000, vocab=128, d_model=256,
                d_ff=256, n_heads=4, chunk_len=16, learning_rate=1e-3,
                warmup=400, eval_batch=16, eval_batches=8, log_every=100,
                seed=0, train='full,lsh-2,lsh-4',
                eval='full,lsh-1,lsh-2,lsh-4,lsh-8', curriculum='',
                stop_at=0.99, target=0.99, plot='', n_buckets=0)
QUICK = dict(length=32, steps=150, eval_batches=2, log_every=50)


def attention_type(name, chunk_len):
  """`full` (the paper's), `full-norm` (Trax 1.4.1's) or `lsh-N` (N hashes)."""
  if name == 'full':
    return tl.SharedQKDotProductAttention
  if name == 'full-norm':
    return functools.partial(tl.SelfAttention, share_qk=True, chunk_len=None)
  if name.startswith('lsh-') and name[4:].isdigit() and int(name[4:]) > 0:
    return functools.partial(tl.LSHSelfAttention, chunk_len=chunk_len,
                             n_chunks_before=1, n_hashes=int(name[4:]))
  raise ValueError(f'unknown attention {name!r}: use "full", "full-norm" or '
                   f'"lsh-N" with N >= 1 hashes.')


def stages(cfg):
  """`[(length, max steps)]`: `--curriculum` ("64:2000,256:4000") or one stage."""
  if not cfg.curriculum:
    return [(cfg.length, cfg.steps)]
  result = []
  for item in cfg.curriculum.split(','):
    length, _, steps = item.partition(':')
    if not (length.isdigit() and steps.isdigit() and int(steps) > 0):
      raise ValueError(f'--curriculum: expected LENGTH:STEPS items separated '
                       f'by commas (e.g. "64:2000,256:4000"), got {item!r}.')
    result.append((int(length), int(steps)))
  return result


def max_len(cfg):
  """Positional-table size: the longest length of any stage."""
  return max(length for length, _ in stages(cfg))


def chunk_len_at(cfg, length):
  """LSH chunk length at `length`: `--chunk_len`, or `2 * length / n_buckets`.

  With `--n_buckets` set, every length hashes into that many buckets, so a
  query sees the same share of the sequence at every curriculum stage.
  """
  if cfg.n_buckets:
    return max(1, 2 * length // cfg.n_buckets)
  return cfg.chunk_len


def build_model(attention, cfg, mode, length=None):
  """The 1-layer ReformerLM of the experiment with `attention`, in `mode`.

  `length` (default: the last stage's) sets the LSH chunk length.
  """
  chunk_len = chunk_len_at(cfg, length or stages(cfg)[-1][0])
  d_head = cfg.d_model // cfg.n_heads
  return models.ReformerLM(
      vocab_size=cfg.vocab, d_model=cfg.d_model, d_ff=cfg.d_ff,
      d_attention_key=d_head, d_attention_value=d_head, n_layers=1,
      n_heads=cfg.n_heads, dropout=0.0, max_len=max_len(cfg),
      attention_type=attention_type(attention, chunk_len), mode=mode)


def _inputs(cfg, length=None):
  return data.duplication_inputs(cfg.vocab, length or stages(cfg)[-1][0],
                                 cfg.batch, eval_batch_size=cfg.eval_batch,
                                 seed=cfg.seed)


def _stage_loop(attention, cfg, length, n_steps, stage, weights):
  """A Loop training at `length` (fresh Adam and schedule), from `weights`."""
  task = training.TrainTask(
      _inputs(cfg, length).train_stream(1), tl.WeightedCategoryCrossEntropy(),
      optimizers.Adam(cfg.learning_rate),
      lr_schedule=lr.warmup_and_rsqrt_decay(cfg.warmup, cfg.learning_rate),
      n_steps_per_checkpoint=None)
  # Accuracy on 2 eval batches, with the training attention, as it trains.
  # The Loop (as Trax's) sizes the eval model's state (LSH buckets) for the
  # train batch, so these batches have the train batch size.
  monitor_inputs = data.duplication_inputs(cfg.vocab, length, cfg.batch,
                                           seed=cfg.seed)
  monitor = training.EvalTask(monitor_inputs.eval_stream(1),
                              [tl.WeightedCategoryAccuracy()],
                              n_eval_batches=2)
  loop = training.Loop(
      build_model(attention, cfg, 'train', length), task,
      eval_model=build_model(attention, cfg, 'eval', length),
      eval_tasks=monitor,
      eval_at=lambda step: step % cfg.log_every == 0 or step == n_steps,
      random_seed=cfg.seed + stage,
      options=training.LoopOptions(progress_bar=False))
  if weights is not None:  # Weights do not depend on the length.
    loop.update_weights_and_state(weights=weights)
  return loop


def train(attention, cfg, log=print):
  """Trains with `attention` through the stages of `stages(cfg)`.

  A stage ends after its steps, or once the monitored accuracy reaches
  `cfg.stop_at` (if > 0).

  Returns:
    (weights, [(step, length, train loss, eval accuracy, seconds)],
    training seconds, (step, seconds) when the accuracy first reached
    `cfg.target` at the last length, or None).
  """
  start, curve, weights, offset, reached = time.time(), [], None, 0, None
  plan = stages(cfg)
  for stage, (length, n_steps) in enumerate(plan):
    loop = _stage_loop(attention, cfg, length, n_steps, stage, weights)
    while loop.step < n_steps:
      n = min(cfg.log_every - loop.step % cfg.log_every, n_steps - loop.step)
      with contextlib.redirect_stdout(io.StringIO()):  # The Loop's own log.
        loop.run(n)
      history, seconds = loop.history, time.time() - start
      loss = history.get('train', 'metrics/WeightedCategoryCrossEntropy')
      acc = history.get('eval', 'metrics/WeightedCategoryAccuracy')[-1][1]
      curve.append((offset + loop.step, length, loss[-1][1], acc, seconds))
      log(f'  {attention:>6s} step {offset + loop.step:5d} (length {length}):'
          f' train loss {loss[-1][1]:.3f}, eval accuracy {acc:.3f} '
          f'({seconds:.0f} s)')
      if stage == len(plan) - 1 and reached is None and acc >= cfg.target:
        reached = (offset + loop.step, seconds)
      if 0 < cfg.stop_at <= acc:
        break
    offset += loop.step
    weights = loop.model.weights
  seconds = time.time() - start
  log(f'  {attention:>6s} trained {offset} steps in {seconds:.0f} s')
  return weights, curve, seconds, reached


def evaluate(weights, attention, cfg):
  """Per-token accuracy on the second copy of `weights` run with `attention`."""
  model = build_model(attention, cfg, 'eval')
  stream = _inputs(cfg).eval_stream(1)
  batches = [next(stream) for _ in range(cfg.eval_batches)]
  model.init(shapes.signature(batches[0][0]), rng=jax.random.PRNGKey(cfg.seed))
  model.weights = weights

  @jax.jit
  def n_correct(weights, state, x, y, w, rng):
    logits, _ = model.pure_fn(x, weights, state, rng)
    return ((logits.argmax(-1) == y).astype(w.dtype) * w).sum()

  correct = sum(float(n_correct(model.weights, model.state, x, y, w,
                                jax.random.PRNGKey(i)))
                for i, (x, y, w) in enumerate(batches))
  return correct / sum(float(w.sum()) for _, _, w in batches)


def run(cfg, log=print):
  """Trains each `cfg.train` attention, evaluates with each `cfg.eval` one.

  Returns a JSON-able dict: the config, `table[trained][evaluated]`
  accuracies (at the last stage's length), training curves, seconds and
  `reached[trained]`: `[step, seconds]` at `cfg.target` accuracy, or None.
  """
  trained, evaluated = cfg.train.split(','), cfg.eval.split(',')
  for name in trained + evaluated:
    attention_type(name, cfg.chunk_len)  # Fails early on a bad name.
  stages(cfg)  # Fails early on a bad --curriculum.
  results = dict(config=vars(cfg), table={}, curves={}, train_seconds={},
                 reached={})
  for name in trained:
    weights, curve, seconds, reached = train(name, cfg, log)
    results['curves'][name] = curve
    results['train_seconds'][name] = seconds
    results['reached'][name] = reached
    results['table'][name] = {e: evaluate(weights, e, cfg) for e in evaluated}
    log('  ' + format_row(name, results['table'][name], evaluated))
  return results


def plot(results, path):
  """Writes the monitored eval accuracy vs step of each trained row as a PNG."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 3.6))
  for name, curve in results['curves'].items():
    ax.plot([c[0] for c in curve], [c[3] for c in curve], marker='.',
            label=f'trained with {name}')
    for prev, cur in zip(curve, curve[1:]):
      if cur[1] != prev[1]:  # A curriculum stage starts: mark its length.
        ax.axvline(prev[0], color='grey', lw=0.5, ls=':')
        ax.text(prev[0], 0.5, f' L={cur[1]}', fontsize=7, color='grey')
  lengths = sorted({c[1] for curve in results['curves'].values()
                    for c in curve})
  ax.set(xlabel='training step', ylabel='eval accuracy (second copy)',
         ylim=(0, 1.02), title='duplication task, length ' +
         '->'.join(map(str, lengths)) + ' (1-layer ReformerLM)')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def format_row(name, row, columns):
  return f'{name:>14s} ' + ' '.join(f'{row[c]:>7.3f}' for c in columns)


def format_table(results):
  columns = results['config']['eval'].split(',')
  lines = ['per-token accuracy on the second copy (rows: trained with, '
           'columns: evaluated with)',
           f'{"":>14s} ' + ' '.join(f'{c:>7s}' for c in columns)]
  lines += [format_row(name, row, columns)
            for name, row in results['table'].items()]
  return '\n'.join(lines)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='smoke run: ' + ', '.join(
                          f'{k} {v}' for k, v in QUICK.items()))
  for key, value in DEFAULTS.items():
    parser.add_argument(f'--{key}', type=type(value), default=None,
                        help=f'default {value}')
  parser.add_argument('--json', default=None, help='write results here')
  args = parser.parse_args(argv)
  for key, value in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  return args


def main(argv=None):
  cfg = parse_args(argv)
  json_path = cfg.json
  del cfg.json, cfg.quick
  plan = stages(cfg)
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}; 1-layer '
        f'ReformerLM d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_heads} '
        f'heads, vocab {cfg.vocab}, dropout 0; duplication task, '
        + ', then '.join(f'length {n} for <= {s} steps' for n, s in plan) +
        f'; LSH chunk_len {chunk_len_at(cfg, plan[-1][0])} (n_buckets '
        f'{2 * max(1, plan[-1][0] // chunk_len_at(cfg, plan[-1][0]))} at the '
        f'last length); '
        f'batch {cfg.batch}, Adam, warmup_and_rsqrt_decay({cfg.warmup}, '
        f'{cfg.learning_rate}) per stage'
        + (f'; a stage ends at monitored accuracy {cfg.stop_at}' if cfg.stop_at
           else '') +
        f'; eval {cfg.eval_batches} x {cfg.eval_batch} sequences', flush=True)
  results = run(cfg, log=functools.partial(print, flush=True))
  print()
  print(format_table(results))
  for name, reached in results['reached'].items():
    print(f'{name}: ' + (f'monitored accuracy >= {cfg.target} at step '
                         f'{reached[0]} ({reached[1]:.0f} s)' if reached else
                         f'monitored accuracy never reached {cfg.target}'))
  if cfg.plot:
    plot(results, cfg.plot)
    print(f'wrote {cfg.plot}')
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(results, f, indent=1)
    print(f'wrote {json_path}')


if __name__ == '__main__':
  main()
