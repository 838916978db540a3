"""Memory of `jax.value_and_grad` through a reversible stack vs the plain residual stack.

Claim: `ReversibleSerial` keeps O(1) layer activations for the backward pass,
so its memory stays flat with depth while the plain residual stack's grows
linearly. Both stacks are built from the same blocks,

    [HalfResidual(FF), Swap, HalfResidual(FF), Swap],
    FF = LayerNorm, Dense(d_ff), Relu, Dense(d_model)

once as `ReversibleSerial(ReversibleHalfResidual(FF), ReversibleSwap(), ...)`
and once as a plain `Serial` whose halves compute `acc + FF(ctx)` with
`Select`/`Add` (ordinary autodiff). For each depth (number of blocks) it
prints the compiled temp memory of `jax.jit(jax.value_and_grad(loss))`
(`.lower(...).compile().memory_analysis()`) and the peak RSS of running it
once, each (stack, depth) in a fresh subprocess, then the growth ratios from
the smallest to the largest depth.

Usage: python benchmarks/reversible_memory.py [--quick] [--depths 2,4,8,16,32]
"""

import argparse
import json
import os
import subprocess
import sys
import time


def _build(kind, depth, d_model, d_ff):
  from retrax import layers as tl
  from retrax.layers import reversible as rv

  def ff():
    return [tl.LayerNorm(), tl.Dense(d_ff), tl.Relu(), tl.Dense(d_model)]

  layers = []
  for _ in range(depth):
    if kind == 'reversible':
      layers += [rv.ReversibleHalfResidual(*ff()), rv.ReversibleSwap(),
                 rv.ReversibleHalfResidual(*ff()), rv.ReversibleSwap()]
    else:
      # (acc, ctx) -> (ctx, acc, ctx) -> (FF(ctx), acc, ctx) -> (acc + FF(ctx), ctx)
      def half():
        return tl.Serial(tl.Select([1, 0, 1]), *ff(), tl.Add())
      layers += [half(), tl.Swap(), half(), tl.Swap()]
  if kind == 'reversible':  # Declared copies of one block: held stacked, scanned.
    return rv.ReversibleSerial(layers, repeats=depth)
  return tl.Serial(layers)


def _rss_kib(field):
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1])
  return -1


def _reset_peak_rss():
  """Resets VmHWM (Linux >= 4.0) so the peak covers only what follows."""
  try:
    with open('/proc/self/clear_refs', 'w') as f:
      f.write('5')
    return True
  except OSError:
    return False


def _worker(kind, depth, d_model, d_ff, length, batch):
  """Measures one (stack, depth) in this process; prints one JSON line."""
  import jax
  import jax.numpy as jnp
  from retrax.shapes import ShapeDtype

  model = _build(kind, depth, d_model, d_ff)
  sig = ShapeDtype((batch, length, d_model))
  _, state = model.init((sig, sig), rng=jax.random.PRNGKey(0))
  # As the training step holds them: Trax's per-layer tree (`model.weights`)
  # would be restacked inside the program, one more copy of every block's
  # weights and gradients, and the temporaries would grow with depth.
  weights = model.stacked_weights
  keys = jax.random.split(jax.random.PRNGKey(1), 2)
  x = tuple(jax.random.normal(k, sig.shape) for k in keys)
  rng = jax.random.PRNGKey(2)

  def loss(w, x, rng):
    y1, y2 = model.pure_fn(x, w, state, rng)[0]
    return jnp.mean(y1 * y1) + jnp.mean(y2 * y2)

  t0 = time.time()
  compiled = jax.jit(jax.value_and_grad(loss)).lower(weights, x, rng).compile()
  compile_s = time.time() - t0
  mem = compiled.memory_analysis()
  jax.block_until_ready((weights, x))
  rss_before = _rss_kib('VmRSS')
  reset = _reset_peak_rss()
  t0 = time.time()
  value, grads = compiled(weights, x, rng)
  jax.block_until_ready((value, grads))
  run_s = time.time() - t0
  peak = _rss_kib('VmHWM')
  device_peak = None
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    device_peak = stats['peak_bytes_in_use']
  print(json.dumps({
      'kind': kind, 'depth': depth,
      'temp_bytes': mem.temp_size_in_bytes,
      'argument_bytes': mem.argument_size_in_bytes,
      'output_bytes': mem.output_size_in_bytes,
      'rss_before_kib': rss_before, 'peak_rss_kib': peak,
      'peak_reset': reset, 'device_peak_bytes': device_peak,
      'compile_s': compile_s, 'run_s': run_s, 'loss': float(value),
      'platform': jax.devices()[0].platform,
  }))


def _measure(kind, depth, args):
  cmd = [sys.executable, os.path.abspath(__file__), '--worker', kind,
         str(depth), '--d_model', str(args.d_model), '--d_ff', str(args.d_ff),
         '--length', str(args.length), '--batch', str(args.batch)]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ)
  env['PYTHONPATH'] = root + os.pathsep + env.get('PYTHONPATH', '')
  out = subprocess.run(cmd, capture_output=True, text=True, env=env,
                       check=False)
  if out.returncode != 0:
    raise RuntimeError(f'worker {kind} depth {depth} failed:\n{out.stderr}')
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--quick', action='store_true',
                      help='small sizes (d_model 64, d_ff 256, length 512)')
  parser.add_argument('--depths', default='2,4,8,16,32')
  parser.add_argument('--d_model', type=int, default=512)
  parser.add_argument('--d_ff', type=int, default=2048)
  parser.add_argument('--length', type=int, default=4096)
  parser.add_argument('--batch', type=int, default=1)
  parser.add_argument('--worker', nargs=2, metavar=('KIND', 'DEPTH'),
                      help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.quick:
    args.d_model, args.d_ff, args.length = 64, 256, 512
  if args.worker:
    _worker(args.worker[0], int(args.worker[1]), args.d_model, args.d_ff,
            args.length, args.batch)
    return

  depths = [int(d) for d in args.depths.split(',')]
  print(f'd_model {args.d_model}, d_ff {args.d_ff}, length {args.length}, '
        f'batch {args.batch}; depth = blocks of [RHR(FF), Swap, RHR(FF), Swap]')
  print('temp: compiled temp memory of jit(value_and_grad(loss)); peak RSS: '
        'process high-water mark; run+: RSS growth while running it once; '
        'run+ - grads: the same minus the gradient outputs (O(depth) like the '
        'weights in any network)')
  print(f'{"stack":<11}{"depth":>6}{"temp MiB":>10}{"peak RSS MiB":>14}'
        f'{"run+ MiB":>10}{"run+ - grads":>14}{"compile s":>11}{"run s":>8}')
  results = {}
  for kind in ('reversible', 'plain'):
    for depth in depths:
      r = _measure(kind, depth, args)
      r['run_mib'] = (r['peak_rss_kib'] - r['rss_before_kib']) / 1024
      r['act_mib'] = r['run_mib'] - r['output_bytes'] / 2**20
      results[kind, depth] = r
      extra = ''
      if r['device_peak_bytes'] is not None:
        extra = f'  device peak {r["device_peak_bytes"] / 2**20:.1f} MiB'
      print(f'{kind:<11}{depth:>6}{r["temp_bytes"] / 2**20:>10.1f}'
            f'{r["peak_rss_kib"] / 1024:>14.1f}{r["run_mib"]:>10.1f}'
            f'{r["act_mib"]:>14.1f}{r["compile_s"]:>11.1f}{r["run_s"]:>8.1f}'
            f'{extra}', flush=True)
  lo, hi = depths[0], depths[-1]
  print(f'\ngrowth {lo} -> {hi} blocks ({hi / lo:.0f}x depth):')
  for kind in ('reversible', 'plain'):
    a, b = results[kind, lo], results[kind, hi]
    line = (f'  {kind:<11} temp {b["temp_bytes"] / a["temp_bytes"]:.2f}x, '
            f'peak RSS {b["peak_rss_kib"] / a["peak_rss_kib"]:.2f}x, '
            f'run+ {b["run_mib"] / max(a["run_mib"], 1e-9):.2f}x, '
            f'run+ - grads {b["act_mib"] / max(a["act_mib"], 1e-9):.2f}x')
    if a['device_peak_bytes'] and b['device_peak_bytes']:
      line += (f', device peak '
               f'{b["device_peak_bytes"] / a["device_peak_bytes"]:.2f}x')
    print(line)
  rev = (results['reversible', hi]['temp_bytes'] /
         results['reversible', lo]['temp_bytes'])
  print(f'\ntarget: reversible temp growth <= 1.15x: '
        f'{"met" if rev <= 1.15 else "NOT met"} ({rev:.2f}x)')


if __name__ == '__main__':
  main()
