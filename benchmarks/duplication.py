"""Reformer paper Table 2 at CPU scale: the duplication task, LSH vs full attention.

Kitaev et al. 2020 ("Reformer", Table 2) train a 1-layer model (d_model 256,
4 heads) on sequences `0 w 0 w` (`w` random symbols, vocab 128, loss on the
second copy) with full attention and with LSH attention of 1, 2 and 4 hashes,
then evaluate each trained model with every attention type. Full attention
there means shared-QK causal full attention, whose weights
`(w_q, w_v, w_o)` are the same tree as `LSHSelfAttention`'s, so one set of
trained weights runs under any of them.

This script does the same with `ReformerLM(n_layers=1)` trained through
`retrax.supervised.training.Loop` on `retrax.data.duplication_inputs`:
attention `full` is `tl.SelfAttention(share_qk=True, causal=True,
chunk_len=None)` and `lsh-N` is `tl.LSHSelfAttention(n_hashes=N,
chunk_len=--chunk_len, n_chunks_before=1)`. It prints a table (rows: trained
with, columns: evaluated with) of the per-token accuracy on the second copy
over `--eval_batches` fresh eval batches, and optionally writes it as JSON.

The paper trains at length 1024 for 150K steps on accelerators. Copying is
learnt after a long plateau at chance (loss ~ln(vocab)), whose length grows
with the sequence length: on the 2-core CPU this was written on, full
attention left it after ~1000 steps at length 64 (lr 3e-3 or 1e-2) but not
within 1500 steps (11 minutes) at length 256, and LSH-2 had not left it
after 4000 steps at length 64. So the default is length 64 (chunk_len 8, 16
buckets), 1500 steps of batch 8 per model, about 10-15 minutes for the three
rows; the paper's setting needs `--length 256 --chunk_len 32` (or more) and
many more `--steps`, on faster hardware. `--quick` is a 1-2 minute smoke run (length
32, 150 steps) that checks the pipeline, not the accuracies.

    python benchmarks/duplication.py [--quick] [--steps N] [--batch B]
        [--length L] [--train full,lsh-2,lsh-4] [--eval full,lsh-1,...]
        [--json results.json]
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
from retrax import data  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax import layers as tl  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax import lr  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax import models  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax import optimizers  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax import shapes  # pylint: disable=g-import-not-at-top,wrong-import-position
from retrax.supervised import training  # pylint: disable=g-import-not-at-top,wrong-import-position

DEFAULTS = dict(length=64, batch=8, steps=1500, vocab=128, d_model=256,
                d_ff=512, n_heads=4, chunk_len=8, learning_rate=3e-3,
                warmup=200, eval_batch=16, eval_batches=8, log_every=250,
                seed=0, train='full,lsh-2,lsh-4',
                eval='full,lsh-1,lsh-2,lsh-4,lsh-8')
QUICK = dict(length=32, steps=150, eval_batches=2, log_every=50)


def attention_type(name, chunk_len):
  """`full` (shared-QK causal full attention) or `lsh-N` (N hashes)."""
  if name == 'full':
    return functools.partial(tl.SelfAttention, share_qk=True, chunk_len=None)
  if name.startswith('lsh-') and name[4:].isdigit() and int(name[4:]) > 0:
    return functools.partial(tl.LSHSelfAttention, chunk_len=chunk_len,
                             n_chunks_before=1, n_hashes=int(name[4:]))
  raise ValueError(f'unknown attention {name!r}: use "full" or "lsh-N" with '
                   f'N >= 1 hashes.')


def build_model(attention, cfg, mode):
  """The 1-layer ReformerLM of the experiment with `attention`, in `mode`."""
  d_head = cfg.d_model // cfg.n_heads
  return models.ReformerLM(
      vocab_size=cfg.vocab, d_model=cfg.d_model, d_ff=cfg.d_ff,
      d_attention_key=d_head, d_attention_value=d_head, n_layers=1,
      n_heads=cfg.n_heads, dropout=0.0, max_len=cfg.length,
      attention_type=attention_type(attention, cfg.chunk_len), mode=mode)


def _inputs(cfg):
  return data.duplication_inputs(cfg.vocab, cfg.length, cfg.batch,
                                 eval_batch_size=cfg.eval_batch, seed=cfg.seed)


def train(attention, cfg, log=print):
  """Trains with `attention`.

  Returns:
    (weights, [(step, train loss, eval accuracy)], training seconds).
  """
  inputs = _inputs(cfg)
  task = training.TrainTask(
      inputs.train_stream(1), tl.WeightedCategoryCrossEntropy(),
      optimizers.Adam(cfg.learning_rate),
      lr_schedule=lr.multifactor('constant * linear_warmup',
                                 constant=cfg.learning_rate,
                                 warmup_steps=cfg.warmup),
      n_steps_per_checkpoint=None)
  # Accuracy on 2 eval batches, with the training attention, as it trains.
  # The Loop (as Trax's) sizes the eval model's state (LSH buckets) for the
  # train batch, so these batches have the train batch size.
  monitor_inputs = data.duplication_inputs(cfg.vocab, cfg.length, cfg.batch,
                                           seed=cfg.seed)
  monitor = training.EvalTask(monitor_inputs.eval_stream(1),
                              [tl.WeightedCategoryAccuracy()],
                              n_eval_batches=2)
  loop = training.Loop(
      build_model(attention, cfg, 'train'), task,
      eval_model=build_model(attention, cfg, 'eval'), eval_tasks=monitor,
      eval_at=lambda step: step % cfg.log_every == 0 or step == cfg.steps,
      random_seed=cfg.seed, progress_bar=False)
  start, curve = time.time(), []
  while loop.step < cfg.steps:
    with contextlib.redirect_stdout(io.StringIO()):  # The Loop's own log.
      loop.run(min(cfg.log_every, cfg.steps - loop.step))
    history = loop.history
    loss = history.get('train', 'metrics/WeightedCategoryCrossEntropy')[-1][1]
    acc = history.get('eval', 'metrics/WeightedCategoryAccuracy')[-1][1]
    curve.append((loop.step, loss, acc))
    log(f'  {attention:>6s} step {loop.step:5d}: train loss {loss:.3f}, '
        f'eval accuracy {acc:.3f} ({time.time() - start:.0f} s)')
  seconds = time.time() - start
  log(f'  {attention:>6s} trained {cfg.steps} steps in {seconds:.0f} s')
  return loop.model.weights, curve, seconds


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
    return ((logits.argmax(-1) == y) * w).sum()

  correct = sum(float(n_correct(model.weights, model.state, x, y, w,
                                jax.random.PRNGKey(i)))
                for i, (x, y, w) in enumerate(batches))
  return correct / sum(float(w.sum()) for _, _, w in batches)


def run(cfg, log=print):
  """Trains each `cfg.train` attention, evaluates with each `cfg.eval` one.

  Returns a JSON-able dict: the config, `table[trained][evaluated]`
  accuracies, training curves and seconds.
  """
  trained, evaluated = cfg.train.split(','), cfg.eval.split(',')
  for name in trained + evaluated:
    attention_type(name, cfg.chunk_len)  # Fails early on a bad name.
  results = dict(config=vars(cfg), table={}, curves={}, train_seconds={})
  for name in trained:
    weights, curve, seconds = train(name, cfg, log)
    results['curves'][name] = curve
    results['train_seconds'][name] = seconds
    results['table'][name] = {e: evaluate(weights, e, cfg) for e in evaluated}
    log('  ' + format_row(name, results['table'][name], evaluated))
  return results


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
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}; 1-layer '
        f'ReformerLM d_model {cfg.d_model}, d_ff {cfg.d_ff}, {cfg.n_heads} '
        f'heads, vocab {cfg.vocab}, dropout 0; duplication task length '
        f'{cfg.length}; LSH chunk_len {cfg.chunk_len} (n_buckets '
        f'{2 * max(1, cfg.length // cfg.chunk_len)}); train {cfg.steps} steps '
        f'of batch {cfg.batch}, Adam lr {cfg.learning_rate} (warmup '
        f'{cfg.warmup}); eval {cfg.eval_batches} x {cfg.eval_batch} sequences',
        flush=True)
  results = run(cfg, log=functools.partial(print, flush=True))
  print()
  print(format_table(results))
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(results, f, indent=1)
    print(f'wrote {json_path}')


if __name__ == '__main__':
  main()
