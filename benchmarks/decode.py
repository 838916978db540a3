"""Decoding speed: compiled `autoregressive_sample` vs the blog's per-token Python loop.

Claim: decoding whole sequences in one compiled loop (`lax.while_loop` over
positions, one dispatch per call) is at least 20x faster than the Trax-style
loop of the blog post, which calls the predict-mode model eagerly once per
token (`logits = model(cur_inputs)`) and samples in numpy.

For a 6-layer d_model-512 TransformerLM and ReformerLM, at batch 1 and 8, it
generates 512 tokens with `decoding.autoregressive_sample` (timed after a
compiling warm-up call) and runs the blog loop on the same model and weights
for a few tokens after a warm-up token (its per-token cost is nearly flat:
each call dispatches every op of the model and copies every cache it
updates). Throughput is tokens per second summed over the batch, by wall
clock and by process CPU time; the speedup is given for both. Each side is
timed --repeats times and its best run counts, as other jobs sharing the
CPUs slow the Python-bound loop and the compiled loop by different factors.

ReformerLM's attention is chosen with --reformer-attention: 'causal'
(`tl.CausalAttention`, a key/value cache), 'self' (the default
`tl.SelfAttention`, its predict memory sized to the decode) or 'lsh'
(`tl.LSHSelfAttention`, causal). Predict-mode `SelfAttention` caches the
projected keys and values of its memory (Trax recomputes them at every
token), so a step projects only the new position.

Measured on the 2-core CPU (load ~1), default arguments:

  model               batch  compiled tok/s  loop tok/s  speedup  CPU-time
  ReformerLM-causal       1           217.6       10.80    20.1x     15.6x
  ReformerLM-causal       8           468.4       36.40    12.9x     12.1x
  TransformerLM           1           271.4       14.82    18.3x     14.5x
  TransformerLM           8           475.8       38.69    12.3x     11.8x

ReformerLM-self over 128 tokens (--reformer-attention self --tokens 128
--repeats 2, load 1.5-3.4): 72.3x / 23.5x wall, 70.8x / 23.4x CPU time
(batch 1 / 8); before the key/value cache 27.7x / 10.7x.

Causal attention reads only the filled power-of-two prefix of its
2048-slot cache on CPU (`attention._cache_prefix_sizes`): a batch-8
TransformerLM step over 256 tokens went from 64 to 27 ms of CPU (whole cache
vs prefixes, same load; 15 ms without attention). The rest of a compiled
step is mostly the dense layers' matmuls (alone about 4 ms at batch 1 and
6-12 ms at batch 8: every token streams all weights), against 85-230 ms per
token for the loop in a quiet moment, which bounds the speedup near 20x at
batch 1 and 10-15x at batch 8 on this machine. `ReversibleSerial` skips its
weight-to-data tie in predict mode (it halved ReformerLM's batch-1 step).
The loop slows more than the compiled program under load (a run at load
7-13: loop 2.3 tok/s, 29.6x at batch 1).

Usage: python benchmarks/decode.py [--quick] [--tokens 512] [--loop-tokens 8]
         [--repeats 3] [--batches 1,8] [--models TransformerLM,ReformerLM]
         [--reformer-attention causal|self|lsh]
"""

import functools

import argparse
import time

import numpy as np


def _model(kind, d_model, n_layers, vocab, max_len, attention, n_tokens):
  from retrax import layers as tl  # pylint: disable=g-import-not-at-top
  from retrax import models  # pylint: disable=g-import-not-at-top
  if kind == 'TransformerLM':
    return models.TransformerLM(vocab, d_model=d_model, d_ff=4 * d_model,
                                n_layers=n_layers, n_heads=8, max_len=max_len,
                                mode='predict')
  attention_type = {
      'causal': tl.CausalAttention,
      'self': functools.partial(tl.SelfAttention, predict_mem_len=n_tokens,
                                predict_drop_len=n_tokens),
      'lsh': functools.partial(tl.LSHSelfAttention, predict_mem_len=n_tokens,
                               predict_drop_len=n_tokens, chunk_len=64),
  }[attention]
  return models.ReformerLM(vocab, d_model=d_model, d_ff=4 * d_model,
                           d_attention_key=d_model // 8,
                           d_attention_value=d_model // 8, n_layers=n_layers,
                           n_heads=8, max_len=max_len,
                           attention_type=attention_type, mode='predict')


class _Clock:
  """Wall and process CPU seconds since creation."""

  def __init__(self):
    self._wall, self._cpu = time.perf_counter(), time.process_time()

  def elapsed(self):
    return (time.perf_counter() - self._wall, time.process_time() - self._cpu)


def _best(runs):
  """Best (largest) wall and CPU-time rates of `[(wall rate, cpu rate), ...]`."""
  return max(r[0] for r in runs), max(r[1] for r in runs)


def _compiled_tokens_per_s(model, initial_state, batch, n_tokens, repeats):
  from retrax.supervised import decoding  # pylint: disable=g-import-not-at-top
  kwargs = dict(batch_size=batch, max_length=n_tokens, eos_id=None,
                temperature=1.0, rng=0)
  model.state = initial_state
  clock = _Clock()
  decoding.autoregressive_sample(model, **kwargs)
  compile_s = clock.elapsed()[0]
  runs = []
  for _ in range(repeats):
    model.state = initial_state
    clock = _Clock()
    out = decoding.autoregressive_sample(model, **kwargs)
    wall, cpu = clock.elapsed()
    assert out.shape == (batch, n_tokens), out.shape
    runs.append((batch * n_tokens / wall, batch * n_tokens / cpu))
  return _best(runs) + (compile_s,)


def _blog_loop_tokens_per_s(model, initial_state, batch, n_tokens, repeats):
  """The blog's loop: one eager model call per token, numpy sampling."""
  rng = np.random.RandomState(0)
  model.state = initial_state
  cur = np.zeros((batch, 1), np.int32)

  def step(cur):
    logits = np.asarray(model(cur))[:, 0].astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.array([[rng.choice(probs.shape[-1], p=p)] for p in probs],
                    np.int32)

  cur = step(cur)  # Warm-up: the first eager call compiles every op.
  runs = []
  for _ in range(repeats):
    clock = _Clock()
    for _ in range(n_tokens):
      cur = step(cur)
    wall, cpu = clock.elapsed()
    runs.append((batch * n_tokens / wall, batch * n_tokens / cpu))
  return _best(runs)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='2 layers, d_model 128, 64 tokens, 3 loop tokens')
  parser.add_argument('--tokens', type=int, default=512)
  parser.add_argument('--loop-tokens', type=int, default=8)
  parser.add_argument('--repeats', type=int, default=3,
                      help='timed runs of each side; the best one counts')
  parser.add_argument('--batches', default='1,8')
  parser.add_argument('--models', default='TransformerLM,ReformerLM')
  parser.add_argument('--reformer-attention', default='causal',
                      choices=['causal', 'self', 'lsh'])
  args = parser.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  from retrax.shapes import ShapeDtype  # pylint: disable=g-import-not-at-top

  d_model, n_layers, n_tokens, loop_tokens = 512, 6, args.tokens, args.loop_tokens
  if args.quick:
    d_model, n_layers, n_tokens, loop_tokens = 128, 2, 64, 3
  vocab, max_len = 256, max(1024, n_tokens + 1)
  print(f'devices: {jax.devices()}')
  print(f'{n_layers} layers, d_model {d_model}, vocab {vocab}, max_len '
        f'{max_len}; {n_tokens} compiled tokens, {loop_tokens} loop tokens')
  print(f'{"model":22s} {"batch":>5s} {"compiled tok/s":>15s} '
        f'{"blog loop tok/s":>16s} {"speedup":>8s} {"CPU-time speedup":>17s} '
        f'{"compile s":>10s}')
  ratios = []
  for kind in args.models.split(','):
    for batch in [int(b) for b in args.batches.split(',')]:
      model = _model(kind, d_model, n_layers, vocab, max_len,
                     args.reformer_attention, n_tokens)
      model.init(ShapeDtype((batch, 1), np.int32), rng=jax.random.PRNGKey(0))
      initial_state = model.state
      fast, fast_cpu, compile_s = _compiled_tokens_per_s(
          model, initial_state, batch, n_tokens, args.repeats)
      slow, slow_cpu = _blog_loop_tokens_per_s(model, initial_state, batch,
                                               loop_tokens, args.repeats)
      ratios.append((fast / slow, fast_cpu / slow_cpu))
      name = kind if kind == 'TransformerLM' else (
          f'{kind}-{args.reformer_attention}')
      print(f'{name:22s} {batch:5d} {fast:15.1f} {slow:16.2f} '
            f'{fast / slow:7.1f}x {fast_cpu / slow_cpu:16.1f}x '
            f'{compile_s:10.1f}', flush=True)
  print(f'min speedup {min(r[0] for r in ratios):.1f}x wall, '
        f'{min(r[1] for r in ratios):.1f}x CPU time (target >= 20x)')


if __name__ == '__main__':
  main()
