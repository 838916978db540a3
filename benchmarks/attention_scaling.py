"""Scaling of attention with sequence length: dense causal vs chunked vs LSH.

Claim: LSHSelfAttention's forward+backward memory grows linearly with length
(target <= 4.5x per 4x length) and at 16K positions it is >= 3x faster than
full (dense) causal attention, which is O(L^2) in time and memory.

For each layer (d_model 256, 4 heads of d_qk = d_v = 64, batch 1) and length
(1K, 4K, 16K, 64K) the script compiles `value_and_grad` of `sum(y * ct)` with
respect to the input and the weights, reports the compiled temporary memory
(`compile().memory_analysis().temp_size_in_bytes`) and the median time of a
forward+backward step. Full attention is run with all heads at once where
it fits in the available memory (with a margin), else with one head at a time
(rematerialised), else skipped. Baseline: a dense causal
multi-head attention written here with einsums (DotProductCausalAttention's
computation), run beside the efficient layers.

`--train-64k` also trains a 1-layer LSH language model (Embedding, causal
LSHSelfAttention, Dense, cross-entropy) for a few steps at L = 65,536 and
reports its loss and the process's peak resident memory.

Usage: python benchmarks/attention_scaling.py [--quick] [--train-64k]
       [--lengths 1024,4096] [--repeats 3]
"""

import argparse
import functools
import os
import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..'))
from retrax.layers.attention.efficient import SelfAttention
from retrax.layers.attention.lsh import LSHSelfAttention

D_MODEL, N_HEADS, D_HEAD, BATCH = 256, 4, 64, 1
CHUNK_LEN = 128


class DenseCausalAttention:
  """Full causal multi-head attention: [H, L, L] scores (the O(L^2) baseline).

  With `sequential_heads` the heads run one after another (`lax.map` of a
  rematerialised head), which divides the memory by the number of heads; the
  backward pass then recomputes each head's forward (about 1.3x the work).
  """

  def __init__(self, sequential_heads=False):
    self.sequential_heads = sequential_heads
    self.name = 'full causal (dense)' + (' [heads seq.]' if sequential_heads
                                         else '')

  def init(self, x):
    rng = np.random.RandomState(0)
    shape = (N_HEADS, D_MODEL, D_HEAD)
    w = [rng.normal(size=shape).astype(np.float32) / 16 for _ in range(3)]
    w_o = rng.normal(size=(N_HEADS, D_HEAD, D_MODEL)).astype(np.float32) / 8
    return tuple(w) + (w_o,), ()

  def pure_fn(self, x, weights, state, rng):
    del rng
    length = x.shape[1]
    causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]

    def heads(w_q, w_k, w_v, w_o):  # weights of H' heads: [H', d_model, D]
      q = jnp.einsum('bld,hdk->bhlk', x, w_q) / np.sqrt(D_HEAD)  # [B,H',L,D]
      k = jnp.einsum('bld,hdk->bhlk', x, w_k)
      v = jnp.einsum('bld,hdk->bhlk', x, w_v)
      dots = jnp.einsum('bhqk,bhlk->bhql', q, k)  # [B, H', L, L]
      probs = jax.nn.softmax(jnp.where(causal, dots, -1e9), axis=-1)
      o = jnp.einsum('bhql,bhlk->bhqk', probs, v)  # [B, H', L, D]
      return jnp.einsum('bhlk,hkd->bld', o, w_o)

    if not self.sequential_heads:
      return heads(*weights), state
    # Rematerialised per head, so the backward pass too holds one head's
    # [L, L] scores at a time.
    per_head = jax.lax.map(
        jax.checkpoint(lambda w: heads(*(a[None] for a in w))), weights)
    return jnp.sum(per_head, axis=0), state


class RetraxLayer:
  """A retrax attention layer under the benchmark's interface."""

  def __init__(self, name, make):
    self.name = name
    self._make = make
    self._layer = None

  def init(self, x):
    self._layer = self._make()
    return self._layer.init(jax.ShapeDtypeStruct(x.shape, x.dtype))

  def pure_fn(self, x, weights, state, rng):
    return self._layer.pure_fn(x, weights, state, rng)


def layers():
  common = dict(n_heads=N_HEADS, d_qk=D_HEAD, d_v=D_HEAD, causal=True,
                mode='train')
  out = [DenseCausalAttention(),
         RetraxLayer(f'SelfAttention chunk {CHUNK_LEN}', functools.partial(
             SelfAttention, chunk_len=CHUNK_LEN, n_chunks_before=1, **common))]
  for n_hashes in (1, 2, 4):
    out.append(RetraxLayer(f'LSH n_hashes={n_hashes}', functools.partial(
        LSHSelfAttention, chunk_len=CHUNK_LEN, n_hashes=n_hashes, **common)))
  return out


def available_bytes():
  """MemAvailable of the host, or the accelerator's free memory."""
  device = jax.devices()[0]
  if device.platform != 'cpu':
    stats = device.memory_stats() or {}
    if 'bytes_limit' in stats:
      return stats['bytes_limit'] - stats.get('bytes_in_use', 0)
  with open('/proc/meminfo') as f:
    for line in f:
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) * 1024
  return 8 << 30


def measure(layer, length, repeats):
  """(temp bytes, median seconds or None if skipped) of a fwd+bwd step."""
  x = jax.random.normal(jax.random.PRNGKey(1), (BATCH, length, D_MODEL))
  ct = jax.random.normal(jax.random.PRNGKey(2), (BATCH, length, D_MODEL))
  weights, state = layer.init(x)

  def loss(x, weights, ct):
    y, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(3))
    return jnp.sum(y * ct)

  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
  compiled = step.lower(x, weights, ct).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  # XLA:CPU's peak use was seen at ~2x its temp estimate: keep a margin.
  on_cpu = jax.devices()[0].platform == 'cpu'
  if temp > (0.3 if on_cpu else 0.6) * available_bytes():
    return temp, None
  jax.block_until_ready(compiled(x, weights, ct))  # warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(compiled(x, weights, ct))
    times.append(time.perf_counter() - start)
  return temp, float(np.median(times))


def fmt_bytes(n):
  return f'{n / 2**20:9.1f} MiB' if n < 2**30 else f'{n / 2**30:9.2f} GiB'


def run_scaling(lengths, repeats):
  print(f'device: {jax.devices()[0].device_kind} ({jax.default_backend()}), '
        f'd_model {D_MODEL}, {N_HEADS} heads x {D_HEAD}, batch {BATCH}, '
        f'chunk_len {CHUNK_LEN}, forward+backward')
  print(f'{"layer":30s} {"length":>7s} {"temp memory":>13s} {"time":>10s}')
  results = {}

  def report(name, length, temp, seconds):
    results[name, length] = (temp, seconds)
    shown = ('skipped (too big)' if seconds is None
             else f'{seconds * 1e3:8.1f}ms')
    print(f'{name:30s} {length:7d} {fmt_bytes(temp):>13s} {shown:>10s}',
          flush=True)

  for layer in layers():
    for length in lengths:
      reps = repeats if length <= 4096 else max(1, repeats // 3)
      temp, seconds = measure(layer, length, reps)
      report(layer.name, length, temp, seconds)
      if seconds is None and isinstance(layer, DenseCausalAttention):
        fallback = DenseCausalAttention(sequential_heads=True)
        report(fallback.name, length, *measure(fallback, length, reps))
  print()
  for layer in layers()[1:]:
    growth = [results[layer.name, b][0] / results[layer.name, a][0]
              for a, b in zip(lengths, lengths[1:])]
    print(f'memory growth per 4x length, {layer.name:24s}: '
          + ', '.join(f'{g:.2f}x' for g in growth)
          + ('  (target <= 4.5x)' if 'LSH' in layer.name else ''))
  ref = max((l for l in lengths if l <= 16384), default=None)
  full = (results.get((DenseCausalAttention().name, ref), (0, None))[1] or
          results.get((DenseCausalAttention(True).name, ref), (0, None))[1])
  if ref and full:
    for layer in layers()[2:]:
      ratio = full / results[layer.name, ref][1]
      print(f'speed at L={ref}: {layer.name} is {ratio:.1f}x faster than full '
            f'attention (target >= 3x at 16K)')
  return results


def cross_entropy(logits, targets):
  log_probs = jax.nn.log_softmax(logits)
  return -jnp.mean(jnp.take_along_axis(log_probs, targets[..., None], -1))


def train_64k(steps=4, length=65536, vocab=256):
  """A 1-layer LSH LM trains at L = 65,536: loss falls, peak RSS reported."""
  import optax
  from retrax.layers.combinators import Serial
  from retrax.layers.core import Dense
  from retrax.layers.core import Embedding

  model = Serial(
      Embedding(vocab, D_MODEL),
      LSHSelfAttention(n_heads=N_HEADS, d_qk=D_HEAD, d_v=D_HEAD, causal=True,
                       chunk_len=CHUNK_LEN, n_hashes=2, mode='train'),
      Dense(vocab))
  # A sequence that repeats with period 97: predictable from attention.
  period = np.random.RandomState(0).randint(1, vocab, 97)
  tokens = np.tile(period, length // 97 + 2)[:length + 1][None]
  inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
  weights, state = model.init(jax.ShapeDtypeStruct(inputs.shape, jnp.int32),
                              rng=jax.random.PRNGKey(0))
  opt = optax.adam(1e-2)
  opt_state = opt.init(weights)

  @jax.jit
  def step(weights, opt_state, state, rng, inputs, targets):
    def loss_fn(w):
      logits, new_state = model.pure_fn(inputs, w, state, rng)
      return cross_entropy(logits, targets), new_state
    (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        weights)
    updates, opt_state = opt.update(grads, opt_state, weights)
    return optax.apply_updates(weights, updates), opt_state, new_state, loss

  print(f'\n1-layer LSH LM (Embedding, LSHSelfAttention n_hashes=2, Dense), '
        f'L = {length}, vocab {vocab}, Adam:')
  for i in range(steps):
    start = time.perf_counter()
    weights, opt_state, state, loss = step(weights, opt_state, state,
                                           jax.random.PRNGKey(i), inputs,
                                           targets)
    loss = float(loss)
    print(f'  step {i}: loss {loss:.4f} ({time.perf_counter() - start:.1f}s)',
          flush=True)
  rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print(f'  peak RSS of this process: {fmt_bytes(rss).strip()}')
  return loss


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='lengths 1K and 4K only, one timing each')
  parser.add_argument('--lengths', default=None,
                      help='comma-separated lengths (default 1K,4K,16K,64K)')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--train-64k', action='store_true',
                      help='also train a 1-layer LSH LM at L = 65,536')
  parser.add_argument('--train-length', type=int, default=65536,
                      help='sequence length of the --train-64k model')
  parser.add_argument('--no-scaling', action='store_true',
                      help='skip the scaling table')
  args = parser.parse_args(argv)
  if args.lengths:
    lengths = [int(n) for n in args.lengths.split(',')]
  elif args.quick:
    lengths = [1024, 4096]
  else:
    lengths = [1024, 4096, 16384, 65536]
  repeats = 1 if args.quick else args.repeats
  if not args.no_scaling:
    run_scaling(lengths, repeats)
  if args.train_64k:
    train_64k(length=args.train_length)


if __name__ == '__main__':
  main()
