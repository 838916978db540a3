"""Decoding speed: compiled `autoregressive_sample` vs the blog's per-token Python loop.

Compares decoding whole sequences in one compiled loop (`lax.while_loop`
over positions, one dispatch per call) with the Trax-style loop of the blog
post, which calls the predict-mode model eagerly once per token (`logits =
model(cur_inputs)`) and samples in numpy. Both are retrax's: the compiled
loop should win by a wide margin, and the eager loop should not waste time
of its own (op dispatch only).

For a 6-layer d_model-512 TransformerLM and ReformerLM, and the
encoder-decoder Transformer (6 + 6 layers, a 32-token source: the
translator of trax/intro.ipynb), at batch 1 and 8, it generates 512 tokens
with `decoding.autoregressive_sample` (timed after a compiling warm-up call;
the first timed call continues from the state the warm-up left, the others
reset it; the `recompiles` column counts XLA compilations after the
warm-up, which must be 0) and runs the blog loop on the same model and weights
at --loop-tokens positions spread over those 512 (a jitted step advances the
state between them; each eager call copies the cache segment it writes, so
later positions cost more). Throughput is tokens per second summed over the
batch, by wall clock and by process CPU time; the speedup is given for both.
Each side is timed --repeats times and its best run counts, as other jobs
sharing the CPUs slow the Python-bound loop and the compiled loop by
different factors.

ReformerLM's attention is chosen with --reformer-attention: 'causal'
(`tl.CausalAttention`, a key/value cache), 'self' (the default
`tl.SelfAttention`, its predict memory sized to the decode) or 'lsh'
(`tl.LSHSelfAttention`, causal). Predict-mode `SelfAttention` caches the
projected keys and values of its memory (Trax recomputes them at every
token), so a step projects only the new position.

Measured on the 2-core CPU (2026-12-07, load ~1-2), default arguments:

  model               batch  compiled tok/s  loop tok/s  speedup  CPU-time
  TransformerLM           1           251.4       15.98    15.7x     13.6x
  TransformerLM           8           597.6       95.91     6.2x      6.4x
  ReformerLM-causal       1           303.1       13.85    21.9x     18.4x
  ReformerLM-causal       8           621.5       77.85     8.0x      7.7x

With ReformerLM's default SelfAttention and with LSHSelfAttention (128
tokens, --repeats 2, same load), batch 1 / 8:

  model               batch  compiled tok/s  loop tok/s  speedup  CPU-time
  ReformerLM-self         1           300.1       32.65     9.2x      8.7x
  ReformerLM-self         8           772.8      189.83     4.1x      4.5x
  ReformerLM-lsh          1           335.3       29.64    11.3x     10.4x
  ReformerLM-lsh          8           923.0      187.49     4.9x      5.3x

The loop ran 2-3x slower before its eager calls stopped copying weights
and dispatching per key (loop tok/s at batch 1 / 8: TransformerLM 10.29 /
65.06, causal 6.19 / 43.98, self 10.61 / 85.10, LSH 10.45 / 91.92): a
reversible stack held its blocks' weights stacked and each eager call
sliced every block's rows out (~40 ms of a ~90 ms call); every combinator
split its key and indexed the keys one dispatch each. A predict-mode stack
now holds each layer's own weights, and concrete keys are split into a
tuple in one dispatch. The compiled programs did not change: their rows
vary between runs on this CPU (causal at batch 1 / 8: 303 / 622 in the
table, 248-262 / 523-591 in two later runs the same evening).
(ReformerLM's compiled rows were 119 and 480 tok/s from a1ff00f, which
held the stacked weights in the decoding programs, to the fix that gives
them each layer's own arrays: a predict-mode stack now holds them.)

The encoder-decoder Transformer (6 + 6 layers, a 32-token source), same
sizes, --repeats 2, same load (on 12-02, at load 7-8 with other jobs on the
2 cores: 60.2 / 188.7 compiled, 1.67 / 13.96 loop):

  model               batch  compiled tok/s  loop tok/s  speedup  CPU-time
  Transformer             1           217.5       10.02    21.7x     19.1x
  Transformer             8           483.6       63.64     7.6x      7.4x

with 0 recompiles. Before `Decoder.settle` ran the first step on its own,
the first timed call (continuing from the warm-up's state, whose
`tl.Cache` layers then hold the encoder's outputs: another tree structure)
compiled the whole decoding loop again: seconds per call instead of ms.

Their loops are fast because an efficient-attention layer called eagerly
runs one program compiled per input shape (`EfficientAttentionBase.forward`);
before, each eager call dispatched every op and compiled its `lax.scan` and
`lax.cond`: the same loops ran at 1.68 / 11.49 tok/s (self) and 0.21 / 1.33
tok/s (LSH), 102x / 33x and 270x / 59x slower than the compiled decoder.

On CPU the causal key/value cache is a tuple of segments (slots [0, 128),
[128, 256), [256, 512), ...; `retrax.layers.attention.kv_cache`): a step writes its
position in place and attends to the filled segments straight from their
buffers. A single cache array read by prefix made XLA copy the prefix first:
the batch-8 TransformerLM step went from 23 to 16.6 ms and the batch-1 step
from 6.5 to 4.8 ms (same load, profiled with `jax.profiler`). The segments
made the eager loop faster too (it copied the whole 2048-slot cache at
every write): at batch 8 from 28-39 tok/s to 57-62 tok/s.

What bounds the ratio on this CPU: the eager loop costs about 30-90 ms per
step at batch 1 and at batch 8 alike (op dispatch and Trax's walk of the
layer tree, setting each layer's weights and state), while the compiled
step grows with the batch. At batch 8 its dense layers alone take
7 ms (f32 GEMMs of 8 rows stream all 76 MB of weights each token, measured
apart from the model), the attention over the cache 8 ms of one core. At
batch 1 the dense layers are matrix-vector products at the memory-bandwidth
floor (3.2 ms).
`ReversibleSerial` skips its weight-to-data tie in predict mode (it halved
ReformerLM's batch-1 step).

With --vs-trax it times every predict-mode model against Trax 1.4.1's
`autoregressive_sample` instead (decode_vs_trax.py; docs/benchmarks.md,
"Decoding vs Trax 1.4.1").

Usage: python benchmarks/decode.py [--quick] [--tokens 512] [--loop-tokens 8]
         [--repeats 3] [--batches 1,8]
         [--models TransformerLM,ReformerLM,Transformer]
         [--reformer-attention causal|self|lsh]
       python benchmarks/decode.py --vs-trax [--tokens 128] [--models ...]
         [--trax-python PATH] [--out benchmarks/results/decode_vs_trax.json]
"""

import functools

import argparse
import os
import time

import numpy as np


def _model(kind, d_model, n_layers, vocab, max_len, attention, n_tokens):
  from retrax import layers as tl
  from retrax import models
  if kind == 'TransformerLM':
    return models.TransformerLM(vocab, d_model=d_model, d_ff=4 * d_model,
                                n_layers=n_layers, n_heads=8, max_len=max_len,
                                mode='predict')
  if kind == 'Transformer':  # Encoder-decoder (trax/intro.ipynb's translator).
    return models.Transformer(vocab, d_model=d_model, d_ff=4 * d_model,
                              n_encoder_layers=n_layers,
                              n_decoder_layers=n_layers, n_heads=8,
                              max_len=max_len, mode='predict')
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


class Clock:
  """Wall and process CPU seconds since creation."""

  def __init__(self):
    self._wall, self._cpu = time.perf_counter(), time.process_time()

  def elapsed(self):
    return (time.perf_counter() - self._wall, time.process_time() - self._cpu)


def _best(runs):
  """Best (largest) wall and CPU-time rates of `[(wall rate, cpu rate), ...]`."""
  return max(r[0] for r in runs), max(r[1] for r in runs)


def _compiled_tokens_per_s(model, initial_state, source, batch, n_tokens,
                           repeats, compiles):
  """Best rates of `repeats` timed calls, the warm-up's seconds, compilations after it.

  The first timed call continues from the state the warm-up left (decoding
  again without a reset, as after trax/intro.ipynb's first translation;
  the caches hold both), the others start from `initial_state`. Neither may
  compile anything.
  """
  from retrax.supervised import decoding
  kwargs = dict(inputs=source, batch_size=batch, max_length=n_tokens,
                eos_id=None, temperature=1.0, rng=0)
  model.state = initial_state
  clock = Clock()
  decoding.autoregressive_sample(model, **kwargs)
  compile_s = clock.elapsed()[0]
  n_compiled = len(compiles)
  runs = []
  for run in range(repeats):
    if run:
      model.state = initial_state
    clock = Clock()
    out = decoding.autoregressive_sample(model, **kwargs)
    wall, cpu = clock.elapsed()
    assert out.shape == (batch, n_tokens), out.shape
    runs.append((batch * n_tokens / wall, batch * n_tokens / cpu))
  return _best(runs) + (compile_s, len(compiles) - n_compiled)


def _blog_loop_tokens_per_s(model, initial_state, source, batch, n_tokens,
                            loop_tokens, repeats):
  """The blog's loop: one eager model call per token, numpy sampling.

  Its per-token cost grows with the position (each eager call copies the
  cache segment it writes), so it is timed at `loop_tokens` positions spread
  evenly over the `n_tokens` the compiled side generates: a jitted step
  brings the state to each position, then one eager token is timed there,
  best of `repeats` (restoring the state each time). Returns the rates of
  the mean per-token time.
  """
  import jax
  rng = np.random.RandomState(0)
  cur = np.zeros((batch, 1), np.int32)
  x = cur if source is None else (source, cur)  # intro: model((inputs, cur)).

  def step(x):
    logits = model(x)
    logits = logits[0] if isinstance(logits, (tuple, list)) else logits
    logits = np.asarray(logits)[:, 0].astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.array([[rng.choice(probs.shape[-1], p=p)] for p in probs],
                    np.int32)

  model.state = initial_state
  step(x)  # Warm-up: the first eager call compiles every op.
  advance = jax.jit(model.pure_fn)
  state, position, walls, cpus = initial_state, 0, [], []
  for target in np.linspace(0, n_tokens - 1, loop_tokens).astype(int):
    for _ in range(target - position):
      _, state = advance(x, model.stacked_weights, state, model.rng)
    position = target
    best = (np.inf, np.inf)
    for _ in range(repeats):
      model.state = state
      clock = Clock()
      step(x)
      best = min(best, clock.elapsed())
    walls.append(best[0])
    cpus.append(best[1])
  return batch / np.mean(walls), batch / np.mean(cpus)


def _compile_events():
  """A list that gets an entry per XLA compilation from now on."""
  import jax
  names = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *a, **k: names.append(name)
      if 'backend_compile' in name else None)
  return names


def _row(kind, batch, args, sizes, compiles):
  """Times one model at one batch size; prints its row, returns its speedups."""
  import jax
  from retrax.shapes import ShapeDtype
  d_model, n_layers, vocab, max_len, n_tokens, loop_tokens = sizes
  model = _model(kind, d_model, n_layers, vocab, max_len,
                 args.reformer_attention, n_tokens)
  tokens = ShapeDtype((batch, 1), np.int32)
  source = None
  if kind == 'Transformer':  # A 32-token source sentence, no padding.
    source = np.random.RandomState(1).randint(1, vocab, (batch, 32))
    source = source.astype(np.int32)
  model.init(tokens if source is None else (ShapeDtype(source.shape, np.int32),
                                            tokens), rng=jax.random.PRNGKey(0))
  initial_state = model.state
  fast, fast_cpu, compile_s, recompiles = _compiled_tokens_per_s(
      model, initial_state, source, batch, n_tokens, args.repeats, compiles)
  slow, slow_cpu = _blog_loop_tokens_per_s(
      model, initial_state, source, batch, n_tokens, loop_tokens, args.repeats)
  name = kind if 'Transformer' in kind else f'{kind}-{args.reformer_attention}'
  print(f'{name:22s} {batch:5d} {fast:15.1f} {slow:16.2f} '
        f'{fast / slow:7.1f}x {fast_cpu / slow_cpu:16.1f}x '
        f'{compile_s:10.1f} {recompiles:10d}', flush=True)
  return fast / slow, fast_cpu / slow_cpu


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='2 layers, d_model 128, 64 tokens, 3 loop positions')
  parser.add_argument('--tokens', type=int, default=None,
                      help='decoded tokens (default 512)')
  parser.add_argument('--loop-tokens', type=int, default=8,
                      help='positions at which the eager loop is timed')
  parser.add_argument('--repeats', type=int, default=3,
                      help='timed runs of each side; the best one counts')
  parser.add_argument('--batches', default='1,8')
  parser.add_argument('--models', default=None,
                      help='default TransformerLM,ReformerLM,Transformer')
  parser.add_argument('--reformer-attention', default='causal',
                      choices=['causal', 'self', 'lsh'])
  parser.add_argument('--vs-trax', action='store_true',
                      help='every predict-mode model against Trax 1.4.1 '
                      '(decode_vs_trax.py; --tokens default 128, --models '
                      'default all)')
  parser.add_argument('--trax-python', default=os.path.expanduser(
      '~/.cache/trax-oracle-venv/bin/python'))
  parser.add_argument('--trax-timeout', type=float, default=3600,
                      help='seconds for the Trax subprocess (all models)')
  parser.add_argument('--out', default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), 'results',
      'decode_vs_trax.json'), help='--vs-trax JSON results')
  args = parser.parse_args()
  if args.vs_trax:
    import decode_vs_trax
    decode_vs_trax.run(
        (args.models or ','.join(decode_vs_trax.SPECS)).split(','),
        args.tokens or 128, args.trax_python, args.trax_timeout, args.out)
    return
  args.tokens = args.tokens or 512
  args.models = args.models or 'TransformerLM,ReformerLM,Transformer'
  import jax

  d_model, n_layers, n_tokens, loop_tokens = 512, 6, args.tokens, args.loop_tokens
  if args.quick:
    d_model, n_layers, n_tokens, loop_tokens = 128, 2, 64, 3
  # The caches hold two decodings: the first timed call continues the warm-up's.
  vocab, max_len = 256, max(1024, 2 * n_tokens)
  print(f'devices: {jax.devices()}')
  print(f'{n_layers} layers, d_model {d_model}, vocab {vocab}, max_len '
        f'{max_len}; {n_tokens} compiled tokens, {loop_tokens} loop positions')
  print(f'{"model":22s} {"batch":>5s} {"compiled tok/s":>15s} '
        f'{"blog loop tok/s":>16s} {"speedup":>8s} {"CPU-time speedup":>17s} '
        f'{"compile s":>10s} {"recompiles":>10s}')
  compiles = _compile_events()
  sizes = (d_model, n_layers, vocab, max_len, n_tokens, loop_tokens)
  ratios = [_row(kind, batch, args, sizes, compiles)
            for kind in args.models.split(',')
            for batch in [int(b) for b in args.batches.split(',')]]
  print(f'min speedup {min(r[0] for r in ratios):.1f}x wall, '
        f'{min(r[1] for r in ratios):.1f}x CPU time')


if __name__ == '__main__':
  main()
