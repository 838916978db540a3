"""The plots of docs/benchmarks.md: memory vs length, memory vs depth, Reformer vs Transformer.

Writes three PNGs (log-log axes) and prints the numbers they show:

1. `memory_vs_length.png`: compiled temp memory of one forward+backward of
   each attention layer of `attention_scaling.py` (dense full causal
   attention, chunked SelfAttention, LSH with 1/2/4 hashes; d_model 256, 4
   heads of 64, batch 1) at L = 1K..16K.
2. `memory_vs_depth.png`: compiled temp memory of `value_and_grad` through
   the reversible stack vs the plain residual stack of
   `reversible_memory.py` (d_model 512, d_ff 2048, length 4096) at 2..32
   blocks.
3. `reformer_vs_transformer.png`: ReformerLM with LSH attention (chunk 128,
   1 hash) vs TransformerLM, the 6-layer models of `train_step.py` (d_model
   256, d_ff 1024, 4 heads, vocab 256, batch 1): compiled temp memory of a
   forward+backward at L = 1K..16K, and its median time where the compiled
   step fits in a fraction of free memory and L <= --time_max_length.

Memory is XLA's compile-time analysis
(`jax.jit(f).lower(...).compile().memory_analysis().temp_size_in_bytes`), so
it costs no execution; only the times of plot 3 run the step.

Usage: python benchmarks/plots.py [--out docs/img] [--quick]
       [--time_max_length 4096] [--only length,depth,models]
"""

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use('Agg')
import matplotlib.pyplot as plt
from matplotlib import ticker

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                '..'))
import attention_scaling
import reversible_memory
import train_step
from retrax.shapes import ShapeDtype

MIB = 2**20


def compiled_step(loss, *args):
  """`jit(value_and_grad(loss, argnums=all))` compiled for `args`."""
  grad = jax.value_and_grad(loss, argnums=tuple(range(len(args))))
  return jax.jit(grad).lower(*args).compile()


def temp_mib(compiled):
  return compiled.memory_analysis().temp_size_in_bytes / MIB


def attention_memory(lengths):
  """{layer name: [temp MiB per length]} for attention_scaling's layers."""
  out = {}
  for layer in attention_scaling.layers():
    out[layer.name] = []
    for length in lengths:
      shape = (attention_scaling.BATCH, length, attention_scaling.D_MODEL)
      x = jax.ShapeDtypeStruct(shape, jnp.float32)
      weights, state = layer.init(x)

      def loss(x, weights, layer=layer, state=state):
        y, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(0))
        return jnp.sum(y * y)
      out[layer.name].append(temp_mib(compiled_step(loss, x, weights)))
      print(f'  {layer.name:28s} L={length:6d}: '
            f'{out[layer.name][-1]:10.1f} MiB', flush=True)
  return out


def depth_memory(depths, d_model=512, d_ff=2048, length=4096):
  """{stack kind: [temp MiB per depth]} for reversible_memory's stacks."""
  out = {}
  sig = ShapeDtype((1, length, d_model))
  for kind in ('reversible', 'plain'):
    out[kind] = []
    for depth in depths:
      model = reversible_memory._build(kind, depth, d_model, d_ff)
      _, state = model.init((sig, sig), rng=jax.random.PRNGKey(0))
      weights = model.stacked_weights  # As the training step holds them.
      x = (jax.ShapeDtypeStruct(sig.shape, jnp.float32),) * 2

      def loss(weights, x, model=model, state=state):
        y1, y2 = model.pure_fn(x, weights, state, jax.random.PRNGKey(1))[0]
        return jnp.mean(y1 * y1) + jnp.mean(y2 * y2)
      out[kind].append(temp_mib(compiled_step(loss, weights, x)))
      print(f'  {kind:10s} {depth:3d} blocks: {out[kind][-1]:9.1f} MiB',
            flush=True)
  return out


def model_memory_and_time(lengths, time_max_length, repeats=2):
  """{model label: ([temp MiB], [seconds or None])} per length."""
  free = attention_scaling.available_bytes()
  out = {}
  for key in ('ReformerLM-LSH', 'TransformerLM'):
    label, make_model = train_step.BIG_MODELS[key]
    mems, times = [], []
    for length in lengths:
      model = make_model(length)
      sig = ShapeDtype((1, length), np.int32)
      _, state = model.init(sig, rng=jax.random.PRNGKey(0))
      weights = model.stacked_weights  # As the training step holds them.
      tokens = jax.random.randint(jax.random.PRNGKey(1), (1, length), 1, 256)

      def loss(weights, model=model, state=state, tokens=tokens):
        logits, _ = model.pure_fn(tokens, weights, state,
                                  jax.random.PRNGKey(2))
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, tokens[..., None], -1))
      compiled = compiled_step(loss, weights)
      mems.append(temp_mib(compiled))
      seconds = None
      # XLA:CPU was seen to peak at ~2x its temp estimate: keep a margin.
      if length <= time_max_length and mems[-1] * MIB < 0.25 * free:
        jax.block_until_ready(compiled(weights))  # Warm-up.
        runs = []
        for _ in range(repeats):
          start = time.perf_counter()
          jax.block_until_ready(compiled(weights))
          runs.append(time.perf_counter() - start)
        seconds = float(np.median(runs))
      times.append(seconds)
      shown = 'not run' if seconds is None else f'{seconds * 1e3:9.1f} ms'
      print(f'  {label:30s} L={length:6d}: {mems[-1]:10.1f} MiB  {shown}',
            flush=True)
    out[label] = (mems, times)
  return out


def _axes(ax, title, xlabel, ylabel, xticks, xticklabels):
  ax.set_xscale('log', base=2)
  ax.set_yscale('log')
  ax.set_xticks(xticks)
  ax.set_xticklabels(xticklabels)
  ax.minorticks_off()
  ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
  ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
  ax.set_title(title)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, which='major', alpha=0.3)
  ax.legend()


def _k(lengths):
  return [f'{n // 1024}K' if n % 1024 == 0 else str(n) for n in lengths]


def plot_length(lengths, mems, path):
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for name, values in mems.items():
    ax.plot(lengths, values, marker='o', label=name)
  _axes(ax, 'Attention forward+backward memory vs length\n'
        '(d_model 256, 4 heads, batch 1; XLA compiled temp)',
        'sequence length', 'temp memory (MiB)', lengths, _k(lengths))
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_depth(depths, mems, path):
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  labels = {'reversible': 'ReversibleSerial (reversible residual)',
            'plain': 'Serial (plain residual)'}
  for kind, values in mems.items():
    ax.plot(depths, values, marker='o', label=labels[kind])
  _axes(ax, 'Forward+backward memory vs depth\n'
        '(d_model 512, d_ff 2048, length 4096; XLA compiled temp)',
        'blocks (attention-free: 2 feed-forward half-residuals each)',
        'temp memory (MiB)', depths, [str(d) for d in depths])
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def plot_models(lengths, results, path):
  fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(11, 4.4))
  for label, (mems, times) in results.items():
    ax_mem.plot(lengths, mems, marker='o', label=label)
    timed = [(n, t) for n, t in zip(lengths, times) if t is not None]
    if timed:
      ax_time.plot(*zip(*timed), marker='o', label=label)
  _axes(ax_mem, 'Forward+backward memory', 'sequence length',
        'XLA compiled temp memory (MiB)', lengths, _k(lengths))
  _axes(ax_time, 'Forward+backward time', 'sequence length',
        f'seconds per step ({jax.devices()[0].platform.upper()})', lengths,
        _k(lengths))
  fig.suptitle('ReformerLM (LSH attention) vs TransformerLM '
               '(6 layers, d_model 256, 4 heads, batch 1)')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default=os.path.join(root, 'docs', 'img'))
  parser.add_argument('--quick', action='store_true',
                      help='lengths 1K-4K, depths 2-8, no times above 2K')
  parser.add_argument('--time_max_length', type=int, default=4096,
                      help='longest length whose step time is measured')
  parser.add_argument('--only', default='length,depth,models',
                      help='comma-separated subset of length,depth,models')
  args = parser.parse_args(argv)
  lengths = [1024, 2048, 4096] if args.quick else [
      1024, 2048, 4096, 8192, 16384]
  depths = [2, 4, 8] if args.quick else [2, 4, 8, 16, 32]
  time_max = min(args.time_max_length, 2048) if args.quick else (
      args.time_max_length)
  os.makedirs(args.out, exist_ok=True)
  print(f'jax {jax.__version__} on {jax.devices()[0].platform}; memory = '
        'compiled temp of jit(value_and_grad(loss)), MiB')
  only = args.only.split(',')
  if 'length' in only:
    print('attention memory vs length:')
    path = os.path.join(args.out, 'memory_vs_length.png')
    plot_length(lengths, attention_memory(lengths), path)
    print(f'wrote {path}')
  if 'depth' in only:
    print('memory vs depth:')
    path = os.path.join(args.out, 'memory_vs_depth.png')
    plot_depth(depths, depth_memory(depths), path)
    print(f'wrote {path}')
  if 'models' in only:
    print(f'ReformerLM vs TransformerLM (times up to L={time_max}):')
    path = os.path.join(args.out, 'reformer_vs_transformer.png')
    plot_models(lengths, model_memory_and_time(lengths, time_max), path)
    print(f'wrote {path}')


if __name__ == '__main__':
  main()
