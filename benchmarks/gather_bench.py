"""Row gathers by XLA against the Pallas kernels of `gather_kernel`, on any device.

    python benchmarks/gather_bench.py [--tiny] [--widths 128,65,64]
        [--units 16] [--length 32768] [--n 32768] [--dtype float32]
        [--methods vmem,vmem_aligned,dma] [--block-rows B] [--json out.json]

`out[u, n, :] = x[u, idx[u, n], :]` for `x [U, L, W]` and random int32
`idx [U, N]` (repeats included), at the chip's LSH shapes by default: 16
units, 32768 rows, 32768 indices a unit (524,288 in all), as the 16K
paper-size step's sorts and `gather_rounds` take them. Rows, per width:

* `xla_take_along_axis`: `jnp.take_along_axis(x, idx[..., None], axis=1)`;
* `xla_take_flat`: `jnp.take(x.reshape(-1, W), flat_idx, axis=0)`, the
  units' rows as one table and the indices offset by `u * L`;
* `xla_take_vmapped`: `jnp.take(x[u], idx[u], axis=0)` vmapped over the
  units, what lsh.py's `gather_rounds` becomes under the heads' vmap;
* `pallas_vmem`, `pallas_vmem_aligned`, `pallas_dma`:
  `gather_kernel.gather_rows` by each method (compiled on a TPU,
  interpreted elsewhere: there their times mean nothing). Other than
  float32 (`--dtype bfloat16`, `int8`, ...), the kernels move int32
  words, and their times include XLA's conversions to and from them (a
  relayout of `x` and of the output, a pad for a width that is not whole
  words): what a caller would pay.

Each is jitted and timed as the median of `--repeats` calls after a
first one (compile, run and copy to the host: `compile s`), with
`block_until_ready`. A kernel's output must equal
`xla_take_along_axis`'s exactly before it is timed (a mismatch is recorded,
not timed); a kernel that fails to compile or run is recorded with its
error, and the other rows stand. Each kernel row's `over_xla` is its time
over the fastest XLA row's (below 1: the kernel is faster). The JSON is
rewritten after every row, so a run cut short keeps what it measured.
"""

import argparse
import functools
import importlib
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.dirname(_HERE))
# Its JSON writer (rewritten after every row, aside then renamed).
step_profile = importlib.import_module('step_profile')
gather_kernel = importlib.import_module('gather_kernel')  # The kernels timed.

CHIP = dict(units=16, length=32768, n=32768)
TINY = dict(units=2, length=512, n=1024)


def _first_call(fn, *args):
  """The output as numpy and the first call's seconds (compile, run, copy)."""
  start = time.perf_counter()
  out = np.asarray(fn(*args))
  return out, time.perf_counter() - start


def _median_seconds(fn, *args, repeats=5):
  """The median wall time of `repeats` calls (compiled already)."""
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _random_rows(rng, shape, dtype):
  """Normal values for a float type, the whole range for an integer one."""
  if jnp.issubdtype(dtype, jnp.integer):
    info = jnp.iinfo(dtype)
    return jnp.asarray(rng.randint(info.min, int(info.max) + 1, shape,
                                   dtype=np.int64), dtype)
  return jnp.asarray(rng.randn(*shape), dtype)


def xla_gathers():
  """`{name: jitted f(x, idx)}` of the XLA forms."""
  def flat(x, idx):
    u, length, width = x.shape
    offsets = (jnp.arange(u, dtype=idx.dtype) * length)[:, None]
    rows = jnp.take(x.reshape(-1, width), (idx + offsets).reshape(-1), axis=0)
    return rows.reshape(idx.shape + (width,))
  return {
      'xla_take_along_axis': jax.jit(
          lambda x, idx: jnp.take_along_axis(x, idx[..., None], axis=1)),
      'xla_take_flat': jax.jit(flat),
      'xla_take_vmapped': jax.jit(jax.vmap(
          lambda x, idx: jnp.take(x, idx, axis=0))),
  }


def _one_line(e):
  text = str(e).strip().splitlines()
  return f'{type(e).__name__}: {text[0][:300] if text else ""}'


def bench(units, length, n, widths, dtype, repeats=5, block_rows=None,
          methods=gather_kernel.METHODS, log=print, json_path=None):
  """Times every row at every width; returns the summary written to JSON."""
  rows = {}
  summary = dict(device=jax.devices()[0].device_kind,
                 backend=jax.default_backend(), units=units, length=length,
                 n=n, dtype=jnp.dtype(dtype).name, block_rows=block_rows,
                 rows=rows)
  interpreted = jax.default_backend() != 'tpu'
  log(f'U={units} L={length} N={n} {summary["dtype"]} on '
      f'{summary["device"]} ({summary["backend"]})' +
      (': kernels interpreted, their times mean nothing' if interpreted
       else ''))
  log(f'{"width":>5s} {"row":22s} {"compile s":>9s} {"ms":>9s} '
      f'{"ns/index":>9s} {"GB/s":>7s} {"over_xla":>8s}')
  rng = np.random.RandomState(0)
  for width in widths:
    x = _random_rows(rng, (units, length, width), dtype)
    idx = jnp.asarray(rng.randint(0, length, (units, n)), jnp.int32)
    # Bytes read and written: each output row once, each gathered row once.
    moved = 2 * units * n * width * jnp.dtype(dtype).itemsize
    here = rows.setdefault(str(width), {})
    want = None

    def record(name, compile_s, step_s, over=None, width=width, here=here,
               moved=moved):
      here[name] = dict(compile_s=compile_s, step_s=step_s,
                        ns_per_index=1e9 * step_s / (units * n),
                        gb_per_s=moved / step_s / 1e9)
      ratio = ''
      if over is not None:
        here[name]['over_xla'] = over
        ratio = f'{over:8.3f}'
      log(f'{width:5d} {name:22s} {compile_s:9.2f} {1e3 * step_s:9.3f} '
          f'{here[name]["ns_per_index"]:9.2f} {here[name]["gb_per_s"]:7.1f} '
          f'{ratio}')
      step_profile.write_json(json_path, summary)

    def failed(name, error, width=width, here=here):
      here[name] = dict(error=error)
      log(f'{width:5d} {name:22s} FAILED: {error}')
      step_profile.write_json(json_path, summary)

    for name, fn in xla_gathers().items():
      try:
        got, compile_s = _first_call(fn, x, idx)
        if want is None:
          want = got
        elif not np.array_equal(got, want):
          failed(name, 'mismatch: differs from xla_take_along_axis')
          continue
        record(name, compile_s, _median_seconds(fn, x, idx, repeats=repeats))
      except Exception as e:  # noqa: BLE001 -- recorded, the rest still run
        failed(name, _one_line(e))
    timed = [r['step_s'] for r in here.values() if 'step_s' in r]
    best_xla = min(timed) if timed else None
    for method in methods:
      name = f'pallas_{method}'
      fn = jax.jit(functools.partial(gather_kernel.gather_rows, method=method,
                                     block_rows=block_rows))
      try:
        got, compile_s = _first_call(fn, x, idx)
      except Exception as e:  # noqa: BLE001 -- a kernel the chip rejects is a result
        failed(name, _one_line(e))
        continue
      if want is not None and not np.array_equal(got, want):
        bad = int(np.sum(np.any(got != want, axis=-1)))
        failed(name, f'mismatch: {bad} of {units * n} rows differ from '
               'xla_take_along_axis')
        continue
      step_s = _median_seconds(fn, x, idx, repeats=repeats)
      record(name, compile_s, step_s,
             step_s / best_xla if best_xla else None)
  return summary


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tiny', action='store_true',
                      help=f'small sizes for a CPU: {TINY}')
  parser.add_argument('--units', type=int, default=None)
  parser.add_argument('--length', type=int, default=None)
  parser.add_argument('--n', type=int, default=None)
  parser.add_argument('--widths', default='128,65,64')
  parser.add_argument('--dtype', default='float32',
                      choices=[d.name for d in gather_kernel.DTYPES])
  parser.add_argument('--methods', default=','.join(gather_kernel.METHODS))
  parser.add_argument('--block-rows', type=int, default=None)
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--json', default=None)
  args = parser.parse_args(argv)
  sizes = dict(TINY if args.tiny else CHIP)
  for key in sizes:
    if getattr(args, key) is not None:
      sizes[key] = getattr(args, key)
  bench(sizes['units'], sizes['length'], sizes['n'],
        [int(w) for w in args.widths.split(',') if w], jnp.dtype(args.dtype),
        repeats=args.repeats, block_rows=args.block_rows,
        methods=[m for m in args.methods.split(',') if m],
        json_path=args.json)


if __name__ == '__main__':
  main()
