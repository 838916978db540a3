"""Terraformer vs ReformerLM vs TransformerLM at long lengths: time and memory.

    python benchmarks/long_models.py [--lengths 4096,16384] [--steps 3]
        [--memory-budget-gb 12] [--tiny] [--json out.json]

What a user picks these models for is long sequences, so each is trained on
L tokens per example, batch 1, with the sizes of issue 22's benchmark (d_model
256, d_ff 1024, 4 heads of 64, vocab 256, 6 layers, dropout 0, Adam):

* `TransformerLM`: full causal attention, residuals stored for the backward.
* `ReformerLM`: reversible layers, `LSHSelfAttention(n_hashes=2,
  chunk_len=64)`.
* `ConfigurableTerraformer`: encoder-decoder, 6 + 6 reversible layers with
  LSH attention in both (the decoder runs over the concatenation of source
  and target), source L/2 + target L/2 tokens: L tokens in all.

The step is the one `training.Loop` compiles (with its XLA:CPU options,
`fastmath.xla_cpu`): the loss of `Serial(model, loss)` as
`supervised.loss_chunks.forward_fn` computes it, so a long
sequence's head and loss (ReformerLM's `Concatenate, LayerNorm, Dense` and
the cross-entropy) run over chunks of positions as in training; `--plain-loss`
differentiates `Serial(model, loss).pure_fn` whole instead (at 1M tokens the
ReformerLM step's plan is then 15.6 KB per token, not 10.3: the head's
`[L, 512]` LayerNorm activations and the `[L, vocab]` logits at once).

Printed per model and length: XLA's memory plan of the compiled training step
(`memory_analysis()`: temporaries, i.e. activations and workspace, and the
arguments), compile time, the median step time (after two untimed steps), and each column's ratio to
TransformerLM measured in the same run. A model whose planned temporaries
exceed `--memory-budget-gb` is compiled (for its plan) but not run.
"""

import argparse
import functools
import json
import statistics
import time

import jax
import numpy as np

from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.fastmath import xla_cpu
from retrax.supervised import loss_chunks

FULL = dict(vocab=256, d_model=256, d_ff=1024, n_heads=4, d_head=64,
            n_layers=6, n_hashes=2, chunk_len=64)
TINY = dict(vocab=32, d_model=32, d_ff=64, n_heads=2, d_head=16, n_layers=1,
            n_hashes=2, chunk_len=8)
MODELS = ('TransformerLM', 'ReformerLM', 'Terraformer')


def build(name, cfg, length):
  """`(model, n_inputs)`: the model in train mode and how many token inputs."""
  lsh = functools.partial(tl.LSHSelfAttention, n_hashes=cfg['n_hashes'],
                          chunk_len=cfg['chunk_len'])
  common = dict(d_model=cfg['d_model'], d_ff=cfg['d_ff'],
                n_heads=cfg['n_heads'], dropout=0.0, max_len=length)
  heads = dict(d_attention_key=cfg['d_head'], d_attention_value=cfg['d_head'])
  if name == 'TransformerLM':
    return models.TransformerLM(cfg['vocab'], n_layers=cfg['n_layers'],
                                **common), 1
  if name == 'ReformerLM':
    return models.ReformerLM(cfg['vocab'], n_layers=cfg['n_layers'],
                             attention_type=lsh, **heads, **common), 1
  if name == 'Terraformer':
    terraformer = models.research.terraformer.ConfigurableTerraformer(
        cfg['vocab'], n_encoder_layers=cfg['n_layers'],
        n_decoder_layers=cfg['n_layers'], encoder_attention_type=lsh,
        encoder_decoder_attention_type=lsh, **heads, **common)
    # (logits, target) -> logits: the loss takes the batch's own targets.
    return tl.Serial(terraformer, tl.Select([0], n_in=2)), 2
  raise ValueError(f'model {name!r}: expected one of {MODELS}.')


def batch_for(cfg, length, n_inputs, seed=0):
  """Random tokens: `(tokens..., targets, weights)`, L tokens in all."""
  rng = np.random.RandomState(seed)
  part = length // n_inputs
  tokens = [rng.randint(1, cfg['vocab'], size=(1, part)).astype(np.int32)
            for _ in range(n_inputs)]
  return (*tokens, tokens[-1], np.ones((1, part), np.float32))


def train_step_of(model, plain_loss=False):
  """`(init, step)`: a jitted Adam step of `Serial(model, CrossEntropyLoss)`.

  The loss as the training loop computes it (`loss_chunks.forward_fn`: the
  head and loss over chunks of positions for long sequences), or with
  `plain_loss` as `Serial(model, loss).pure_fn`.
  """
  loss_layer = tl.WeightedCategoryCrossEntropy()
  net = tl.Serial(model, loss_layer)
  opt = optimizers.Adam(1e-4)
  forward = (None if plain_loss else
             loss_chunks.forward_fn(model, loss_layer))

  def step(weights, state, opt_state, batch, rng):
    def loss(w):
      if forward is None:
        return net.pure_fn(batch, w, state, rng)
      return forward(w, state, batch, rng)
    (value, new_state), grads = jax.value_and_grad(loss, has_aux=True)(weights)
    slots, opt_params = opt_state
    weights, slots, _ = opt.tree_update(0, grads, weights, slots, opt_params,
                                        store_slots=False)
    return weights, new_state, (slots, opt_params), value

  def init(batch):
    # The weights as the training loop holds them (`stacked_weights`: the
    # reversible blocks' stack, not Trax's per-layer tree, which the
    # program would restack, one more copy of the weights and gradients).
    # Traced (`jax.eval_shape(init, ...)`, step_peak's --tpu plans) a
    # ReversibleSerial keeps the per-layer tree it was given, so those plans
    # still restack the blocks' weights: 6 MiB a weight matrix for the
    # default model, next to GiBs of activations at 1M tokens.
    _, state = net.init(shapes.signature(batch), rng=jax.random.PRNGKey(0))
    weights = net.stacked_weights
    return weights, state, opt.tree_init(weights)
  return init, xla_cpu.jit(step, donate_argnums=(0, 1, 2))


def measure(name, cfg, length, steps, budget_bytes, plain_loss=False):
  """Memory plan, compile time and step times of one model at one length."""
  model, n_inputs = build(name, cfg, length)
  batch = batch_for(cfg, length, n_inputs)
  init, step = train_step_of(model, plain_loss)
  weights, state, opt_state = init(batch)
  rng = jax.random.PRNGKey(1)
  start = time.perf_counter()
  compiled = step.lower(weights, state, opt_state, batch, rng).compile()
  result = dict(compile_s=time.perf_counter() - start)
  plan = compiled.memory_analysis()
  result.update(temp_bytes=plan.temp_size_in_bytes,
                argument_bytes=plan.argument_size_in_bytes)
  if plan.temp_size_in_bytes > budget_bytes:
    result['skipped'] = (f'planned temporaries {plan.temp_size_in_bytes / 1e9:.1f}'
                         f' GB > budget {budget_bytes / 1e9:.1f} GB')
    return result
  # Two untimed calls: the first compiles the jitted step, and the
  # Terraformer's state changes shape once (its concatenation marker).
  for _ in range(2):
    weights, state, opt_state, loss = step(weights, state, opt_state, batch,
                                           rng)
  float(loss)  # Waits for them (dispatch is asynchronous).
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    weights, state, opt_state, loss = step(weights, state, opt_state, batch,
                                           rng)
    loss = float(loss)  # Waits for the step.
    times.append(time.perf_counter() - start)
  result.update(step_s=times, loss=loss)
  return result


def _ratio(value, base):
  return f'{value / base:.2f}x' if value and base else '—'


def format_table(results, lengths):
  """Markdown: one row per model and length, ratios to TransformerLM."""
  lines = ['| model | L | temporaries GB | vs Transformer | step s (median) '
           '| vs Transformer | compile s |', '|' + '---|' * 7]
  for length in lengths:
    row = results[str(length)]
    base = row.get('TransformerLM', {})
    base_step = (statistics.median(base['step_s']) if 'step_s' in base
                 else None)
    for name in MODELS:
      if name not in row:
        continue
      r = row[name]
      step = statistics.median(r['step_s']) if 'step_s' in r else None
      lines.append(
          f"| {name} | {length} | {r['temp_bytes'] / 1e9:.2f} | "
          f"{_ratio(r['temp_bytes'], base.get('temp_bytes'))} | "
          f"{f'{step:.2f}' if step else r.get('skipped', '—')} | "
          f"{_ratio(step, base_step)} | {r['compile_s']:.1f} |")
  return '\n'.join(lines)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--lengths', default='4096,16384')
  p.add_argument('--steps', type=int, default=3)
  p.add_argument('--memory-budget-gb', type=float, default=12.0)
  p.add_argument('--models', default=','.join(MODELS))
  p.add_argument('--tiny', action='store_true', help='toy sizes (for the test)')
  p.add_argument('--plain-loss', action='store_true',
                 help='differentiate Serial(model, loss) whole (no head and '
                 'loss chunks)')
  p.add_argument('--json', help='also write the results here')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  cfg = TINY if args.tiny else FULL
  lengths = [int(n) for n in args.lengths.split(',')]
  names = [n for n in args.models.split(',') if n]
  results = {}
  for length in lengths:
    results[str(length)] = {}
    for name in names:
      r = measure(name, cfg, length, args.steps, args.memory_budget_gb * 1e9,
                  args.plain_loss)
      results[str(length)][name] = r
      print(f'{name} L={length}: {r}', flush=True)
  print(format_table(results, lengths))
  if args.json:
    with open(args.json, 'x', encoding='utf-8') as f:  # Never overwrites.
      json.dump(dict(cfg=cfg, results=results), f, indent=1)
  return results


if __name__ == '__main__':
  main()
