"""FSDP: per-device weights+slots bytes and step time against the device count.

    python benchmarks/sharding.py                  # 1, 2, 4, 8 forced host devices
    python benchmarks/sharding.py --devices 1,8 --json out.json
    python benchmarks/sharding.py --platform gpu   # the machine's own devices

Each device count n runs in a subprocess (on CPU with
`XLA_FLAGS=--xla_force_host_platform_device_count=n`): a TransformerLM
(d_model 256, d_ff 1024, 4 layers, vocab 256, length 128, batch 8, Adam)
trained through `training.Loop` twice, with the mesh `data=n` (weights and
slots replicated: the baseline) and with `fsdp=n` (split). Printed per run:
the largest weights+slots bytes any one device holds, the whole, their ratio
(the ideal for FSDP is 1/n), and the median seconds per step after two
warm-up steps. Forced host devices share the machine's cores, so step times
measure the partitioned program's overhead, not a speed-up.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _worker(mesh, steps, tiny):
  import jax
  import numpy as np

  from retrax import layers as tl
  from retrax import models
  from retrax import optimizers
  from retrax.supervised import sharding
  from retrax.supervised import training

  d, length = (32, 16) if tiny else (256, 128)

  def batches():
    rng = np.random.RandomState(0)
    while True:
      x = rng.randint(1, 256, size=(8, length)).astype(np.int32)
      yield x, x, np.ones(x.shape, np.float32)

  model = models.TransformerLM(256, d_model=d, d_ff=4 * d, n_layers=4,
                               n_heads=4, max_len=length, dropout=0.0)
  task = training.TrainTask(batches(), tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(1e-3))
  loop = training.Loop(model, task, random_seed=0,
                       options=training.LoopOptions(progress_bar=False,
                                                    mesh=mesh))
  state = loop.train_state
  per_device, total = sharding.bytes_per_device(
      (state.weights, [t.slots for t in state.tasks]))
  times = []
  for i in range(steps + 2):
    start = time.perf_counter()
    loop.train_step(next(task.labeled_data))
    jax.block_until_ready(loop.train_state.weights)
    if i >= 2:
      times.append(time.perf_counter() - start)
  return {'mesh': mesh, 'devices': jax.device_count(),
          'platform': jax.devices()[0].platform,
          'per_device_bytes': per_device, 'total_bytes': total,
          'ratio': per_device / total,
          'step_s': statistics.median(times)}


def _run(n, platform, steps, tiny, timeout):
  """The worker's results for n devices: `[data=n, fsdp=n]`."""
  env = dict(os.environ)
  if platform == 'cpu':
    env['JAX_PLATFORMS'] = 'cpu'
    env['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={n}'
  env['PYTHONPATH'] = os.pathsep.join([os.path.dirname(_HERE),
                                       env.get('PYTHONPATH', '')])
  rows = []
  for axis in ('data', 'fsdp'):
    args = [sys.executable, __file__, '--worker', f'{axis}={n}',
            '--steps', str(steps)] + (['--tiny'] if tiny else [])
    try:
      proc = subprocess.run(args, env=env, capture_output=True, text=True,
                            timeout=timeout)
    except subprocess.TimeoutExpired:
      rows.append({'mesh': f'{axis}={n}', 'error': f'over {timeout} s'})
      continue
    lines = [l for l in proc.stdout.splitlines() if l.startswith('{')]
    rows.append(json.loads(lines[-1]) if proc.returncode == 0 and lines else
                {'mesh': f'{axis}={n}', 'error': proc.stderr[-300:]})
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--devices', default='1,2,4,8')
  p.add_argument('--platform', default='cpu', choices=('cpu', 'gpu'),
                 help='cpu: forced host devices; gpu: the devices there are')
  p.add_argument('--steps', type=int, default=5)
  p.add_argument('--tiny', action='store_true', help='toy sizes (tests)')
  p.add_argument('--timeout', type=int, default=600)
  p.add_argument('--json')
  p.add_argument('--worker', help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    print(json.dumps(_worker(args.worker, args.steps, args.tiny)))
    return 0
  counts = [int(n) for n in args.devices.split(',')]
  if args.platform == 'gpu':  # The machine's own devices: one count.
    import jax  # pylint: disable=import-outside-toplevel
    counts = [jax.device_count()]
  results = []
  print(f'{"mesh":>8} {"MiB/device":>11} {"MiB all":>8} {"ratio":>6} '
        f'{"s/step":>7}')
  for n in counts:
    for row in _run(n, args.platform, args.steps, args.tiny, args.timeout):
      results.append(row)
      if 'error' in row:
        print(f'{row["mesh"]:>8}  error: {row["error"]}')
        continue
      print(f'{row["mesh"]:>8} {row["per_device_bytes"] / 2**20:11.2f} '
            f'{row["total_bytes"] / 2**20:8.2f} {row["ratio"]:6.3f} '
            f'{row["step_s"]:7.3f}', flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
