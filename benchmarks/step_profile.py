"""Where a ReformerLM training step's time goes, part by part, on any device.

    python benchmarks/step_profile.py [--length 16384] [--tiny] [--trace DIR]
        [--units 1,4] [--json out.json] [--hlo lsh_hlo.txt.gz] [--step-only]
        [--trace-steps 3] [--set MODULE.NAME=VALUE ...]
        [--matmul-dtype bfloat16] [--compiler-option NAME=VALUE ...]
        [--n-parallel-heads K]
    python benchmarks/step_profile.py --compare base.json variant.json ...

Paper-size model by default (d_model 1024, d_ff 4096, 16 heads of 64, 6
layers, LSH-2, chunk 128, vocab 256, batch 1). Each part is jitted alone,
forward and backward (gradients for inputs and weights), and timed as the
median of five calls after a compiling one:

* `step`: the whole loss's value-and-gradient (embedding, reversible blocks,
  the head and the cross-entropy), what `training.Loop` runs minus Adam;
* `lsh`: one `LSHSelfAttention` on `[1, L, d_model]`, its chunked
  attention by XLA ops (`implementation='xla'`, the default);
* `lsh_unitsK` (`--units`): the same layer with `n_parallel_heads=K`,
  (example, head) units K at a time (a loop over groups) where `lsh` takes
  the layer's default (on a CPU or a TPU as many as fit 16 MiB, one at a
  time for the paper-size layer; on a GPU as many as fit a quarter of its
  memory): fewer units make smaller gathers and
  sorts, more of them;
* `lsh_pallas`: the same layer with the Pallas kernel
  (`implementation='pallas'`: compiled on a TPU, interpreted elsewhere),
  timed last; the kernel's time over XLA's is printed as a ratio (below 1:
  the kernel is faster). Should the kernel fail to compile, its error is
  recorded instead and the other rows stand;
* `ff`: one feed-forward block (LayerNorm, Dense, ReLU, Dense);
* `matmul`: `[L, d_model] @ [d_model, d_ff]` in bfloat16, the chip's
  reachable rate for this shape (the baseline every part's rate is read
  against: each part's TFLOP/s is printed beside its share of it).

FLOPs are the closed forms of `vs_peers_report` (matmuls only), so the rates
compare with vs_peers' table. `--trace DIR` also writes `jax.profiler` traces
of `--trace-steps` calls (3) of the step and of each LSH layer there (open
them with xprof / TensorBoard's profile tab) and sums their device ops by
HLO category; `--step-only` times and traces the step alone. `--set
retrax.layers.attention.ops.REMAT_SPEED_BLOCKS=False` runs with a module
constant changed (a Python literal; repeatable): one variant of a policy per
run, to compare on a device with the default's run (`--compare` prints
each run's step over the first's). `--compiler-option
xla_tpu_scoped_vmem_limit_kib=98304` compiles the step with an XLA option
(the other parts without), e.g. a TPU compiler's flag that would otherwise
need `LIBTPU_INIT_ARGS` before the process starts.
Each row is printed, and `--json` rewritten, as soon as it is measured, so
a run cut short by a time limit keeps the rows it finished.
"""

import argparse
import ast
import collections
import functools
import glob
import gzip
import importlib
import json
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
report = importlib.import_module('vs_peers_report')

from retrax import layers as tl  # noqa: E402
from retrax import models  # noqa: E402
from retrax import shapes  # noqa: E402
from retrax import validation  # noqa: E402
from retrax.fastmath import precision  # noqa: E402

PAPER = dict(vocab=256, d_model=1024, d_ff=4096, n_heads=16, d_head=64,
             n_layers=6, n_hashes=2, chunk_len=128)
TINY = dict(vocab=32, d_model=32, d_ff=64, n_heads=2, d_head=16, n_layers=2,
            n_hashes=2, chunk_len=8)


def _median_seconds(fn, *args, repeats=5):
  """Compile time (first call) and the median wall time of `repeats` calls."""
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return compile_s, statistics.median(times)


def _layer_grad_fn(layer, x):
  """Jitted gradient of `sum(layer(x))` for x and the weights."""
  weights, state = layer.init(shapes.signature(x))

  def loss(w, x):
    y, _ = layer.pure_fn(x, w, state, jax.random.PRNGKey(0))
    return jnp.sum(y.astype(jnp.float32))
  return jax.jit(jax.grad(loss, argnums=(0, 1))), weights


def model_of(cfg, length):
  """The ReformerLM of `cfg`; its attention runs `cfg['n_parallel_heads']`
  (example, head) units at a time if given (`--n-parallel-heads`), else the
  layer's default."""
  attention = functools.partial(tl.LSHSelfAttention, n_hashes=cfg['n_hashes'],
                                chunk_len=cfg['chunk_len'],
                                n_parallel_heads=cfg.get('n_parallel_heads'))
  return models.ReformerLM(
      vocab_size=cfg['vocab'], d_model=cfg['d_model'], d_ff=cfg['d_ff'],
      d_attention_key=cfg['d_head'], d_attention_value=cfg['d_head'],
      n_layers=cfg['n_layers'], n_heads=cfg['n_heads'], dropout=0.0,
      max_len=length, attention_type=attention, mode='train')


def step_fn(cfg, length, compiler_options=None):
  """The loss's jitted value-and-gradient, its weights and one batch.

  `compiler_options`: XLA options for this jit (`--compiler-option`)."""
  model = tl.Serial(model_of(cfg, length), tl.WeightedCategoryCrossEntropy())
  rng = np.random.RandomState(0)
  tokens = rng.randint(1, cfg['vocab'], size=(1, length)).astype(np.int32)
  batch = (tokens, tokens, np.ones((1, length), np.float32))
  _, state = model.init(shapes.signature(batch), rng=jax.random.PRNGKey(0))
  weights = model.stacked_weights  # As training.Loop passes them.

  def loss(w, batch):
    y, _ = model.pure_fn(batch, w, state, jax.random.PRNGKey(0))
    return y
  return (jax.jit(jax.value_and_grad(loss), compiler_options=compiler_options),
          weights, batch)


def _lsh_layer(cfg, implementation, n_parallel_heads=None):
  return tl.LSHSelfAttention(n_heads=cfg['n_heads'], d_qk=cfg['d_head'],
                             d_v=cfg['d_head'], n_hashes=cfg['n_hashes'],
                             chunk_len=cfg['chunk_len'], mode='train',
                             implementation=implementation,
                             n_parallel_heads=(n_parallel_heads or
                                               cfg.get('n_parallel_heads')))


def profile(cfg, length, trace_dir=None, log=print, json_path=None,
            units=(), hlo_path=None, step_only=False, trace_steps=3,
            settings=None, compiler_options=None):
  """Times the parts; returns `{part: {compile_s, step_s, flops, tflops,
  of_matmul} or {error}}` plus `lsh_kernel_over_xla` when both ran. `units`:
  the `n_parallel_heads` of the `lsh_unitsK` rows. With `trace_dir`, the
  step and both LSH layers are traced: `traces[part]` holds each one's
  device time by HLO category and its slowest ops (the step's also as
  `top_ops`). `hlo_path`: the XLA layer's compiled HLO, gzipped, for
  reading what its slowest fusions are (the step's beside it, `_step`
  added before `.txt`). `step_only`: the matmul baseline and the step
  alone; `trace_steps`: calls per trace (fewer: a long length's trace
  read within a time limit); `settings`: the module constants `--set`
  changed, recorded in the summary; `compiler_options`: XLA options for the
  step's compile alone (recorded in `settings` by `main`)."""
  blocks, head = report.forward_flops(cfg, length)
  per_layer = blocks / cfg['n_layers']
  d = cfg['d_model']
  ff_flops = 3 * 2 * 2 * d * cfg['d_ff'] * length  # forward + backward
  lsh_flops = 3 * (per_layer - 2 * 2 * d * cfg['d_ff'] * length)
  out = {}
  summary = dict(length=length, cfg=cfg, settings=settings or {}, parts=out)
  x = jax.random.normal(jax.random.PRNGKey(1), (1, length, d), jnp.float32)
  log(f'L={length} device={jax.devices()[0].device_kind} '
      f'cfg={json.dumps(cfg)} settings={settings or {}}')
  log(f'{"part":10s} {"compile s":>10s} {"step ms":>10s} {"TFLOP/s":>8s} '
      f'{"of matmul":>9s}')

  def record(name, compile_s, step_s, flops):
    rate = flops / step_s
    peak = out['matmul']['tflops'] * 1e12 if out else rate
    out[name] = dict(compile_s=compile_s, step_s=step_s, flops=flops,
                     tflops=rate / 1e12, of_matmul=rate / peak)
    log(f'{name:10s} {compile_s:10.2f} {1e3 * step_s:10.2f} '
        f'{rate / 1e12:8.2f} {rate / peak:9.2f}')
    write_json(json_path, summary)

  a = jax.random.normal(jax.random.PRNGKey(2), (length, d), jnp.bfloat16)
  b = jax.random.normal(jax.random.PRNGKey(3), (d, cfg['d_ff']), jnp.bfloat16)
  mm = jax.jit(lambda a, b: a @ b)
  record('matmul', *_median_seconds(mm, a, b), 2 * length * d * cfg['d_ff'])

  def trace(part, fn, *args, top=25):
    if not trace_dir:
      return
    folder = os.path.join(trace_dir, part)
    with jax.profiler.trace(folder):
      for _ in range(trace_steps):
        jax.block_until_ready(fn(*args))
    summary.setdefault('traces', {})[part] = dict(
        categories=op_categories(folder, trace_steps),
        top_ops=top_ops(folder, trace_steps, top=top))
    write_json(json_path, summary)

  if step_only:
    _step_part(cfg, length, record, trace, summary, json_path, hlo_path,
               compiler_options)
    return summary

  ff = tl.Serial(tl.LayerNorm(), tl.Dense(cfg['d_ff']), tl.Relu(),
                 tl.Dense(d))
  fn, w = _layer_grad_fn(ff, x)
  record('ff', *_median_seconds(fn, w, x), ff_flops)

  fn, w = _layer_grad_fn(_lsh_layer(cfg, 'xla'), x)
  record('lsh', *_median_seconds(fn, w, x), lsh_flops)
  write_hlo(hlo_path, fn, w, x)
  trace('lsh', fn, w, x)

  _step_part(cfg, length, record, trace, summary, json_path, hlo_path,
             compiler_options)

  for k in units:
    fn, w = _layer_grad_fn(_lsh_layer(cfg, 'xla', k), x)
    record(f'lsh_units{k}', *_median_seconds(fn, w, x), lsh_flops)

  try:
    fn, w = _layer_grad_fn(_lsh_layer(cfg, 'pallas'), x)
    record('lsh_pallas', *_median_seconds(fn, w, x), lsh_flops)
    trace('lsh_pallas', fn, w, x)
  except Exception as e:  # noqa: BLE001 -- a kernel the chip rejects is a result
    error = f'{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}'
    out['lsh_pallas'] = dict(error=error)
    log(f'lsh_pallas FAILED: {error}')
  else:
    ratio = out['lsh_pallas']['step_s'] / out['lsh']['step_s']
    summary['lsh_kernel_over_xla'] = ratio
    log(f'LSHSelfAttention fwd+bwd, Pallas kernel / XLA: {ratio:.3f} '
        f'({1e3 * out["lsh_pallas"]["step_s"]:.2f} / '
        f'{1e3 * out["lsh"]["step_s"]:.2f} ms)')
  write_json(json_path, summary)
  return summary


def _step_part(cfg, length, record, trace, summary, json_path, hlo_path,
               compiler_options=None):
  """Times (and traces) the whole step: `profile`'s 'step' row."""
  fn, w, batch = step_fn(cfg, length, compiler_options)
  record('step', *_median_seconds(fn, w, batch, repeats=3),
         report.train_flops(cfg, length))
  if hlo_path:
    write_hlo(hlo_path.replace('.txt', '_step.txt'), fn, w, batch)
  # The step has ~10x the layer's distinct ops: more of them to read.
  trace('step', fn, w, batch, top=80)
  if 'traces' in summary:
    summary['top_ops'] = summary['traces']['step']['top_ops'][:15]
    write_json(json_path, summary)


def write_hlo(path, fn, *args):
  """Writes `fn`'s compiled HLO for `args` to `path`, gzipped (None: nothing)."""
  if path:
    with gzip.open(path, 'wt') as f:
      f.write(fn.lower(*args).compile().as_text())


def write_json(path, summary):
  """Rewrites `path` with `summary` (written aside, then renamed into place)."""
  if not path:
    return
  with open(path + '.tmp', 'w') as f:
    json.dump(summary, f, indent=1)
  os.replace(path + '.tmp', path)


def _device_op_totals(trace_dir):
  """`{op: [microseconds, calls, HLO category]}` of a device trace, or None.

  Reads the Chrome-format `*.trace.json.gz` that `jax.profiler.trace`
  writes: the leaf XLA ops of the first device (loops and conditionals,
  which contain other ops, are left out).
  """
  paths = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'),
                    recursive=True)
  if not paths:
    return None
  with gzip.open(sorted(paths)[-1]) as f:
    events = json.load(f)['traceEvents']
  names = {(e['pid'], e['tid']): e['args']['name'] for e in events
           if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  device = min((e['pid'] for e in events if e.get('ph') == 'M' and
                e.get('name') == 'process_name' and
                '/device:' in e['args']['name']), default=None)
  totals = collections.defaultdict(lambda: [0.0, 0, ''])
  for e in events:
    if (e.get('ph') != 'X' or e.get('pid') != device or
        names.get((e['pid'], e['tid'])) != 'XLA Ops' or
        e['name'].startswith(('while', 'conditional'))):
      continue
    t = totals[e['name']]
    t[0] += e['dur']
    t[1] += 1
    t[2] = t[2] or e.get('args', {}).get('hlo_category', '')
  return totals


def top_ops(trace_dir, n_steps=3, top=15):
  """`[(ms per step, calls per step, op, HLO category)]`, slowest first."""
  totals = _device_op_totals(trace_dir) or {}
  rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
  return [(us / n_steps / 1e3, calls // n_steps, name, category)
          for name, (us, calls, category) in rows]


def op_categories(trace_dir, n_steps=3):
  """`{HLO category: ms per step}` of a device trace, largest first."""
  sums = collections.Counter()
  for us, _, category in (_device_op_totals(trace_dir) or {}).values():
    sums[category or 'other'] += us / n_steps / 1e3
  return dict(sums.most_common())


def compare_steps(paths, log=print):
  """The step of each `--json` summary in `paths` (runs of one length under
  different `--set`s), its time over the first one's that has a step;
  returns the rows `(settings, step ms, ratio)`. A run without a step (cut
  short) shows None."""
  rows = []
  first = None
  for path in paths:
    with open(path) as f:
      summary = json.load(f)
    step = summary['parts'].get('step', {}).get('step_s')
    first = first or step
    rows.append((summary.get('settings', {}), step and 1e3 * step,
                 step and first and step / first))
  log(f'{"step ms":>9s} {"/ first":>8s}  settings')
  for settings, ms, ratio in rows:
    shown = ' '.join(f'{k}={v!r}' for k, v in settings.items()) or 'defaults'
    log(f'{ms or float("nan"):9.2f} {ratio or float("nan"):8.3f}  {shown}')
  return rows


def apply_settings(assignments, matmul_dtype=None):
  """Sets each `MODULE.NAME=VALUE` (VALUE a Python literal) and returns
  `{MODULE.NAME: VALUE}`; a name the module lacks is an error, not a new
  attribute (a misspelt policy would otherwise measure the default).
  `matmul_dtype` ('float32' or 'bfloat16'), if given, sets the matmul policy
  (`precision.set_matmul_dtype`, as `RETRAX_MATMUL_DTYPE` does), recorded
  as `matmul_dtype`."""
  settings = {}
  if matmul_dtype:
    precision.set_matmul_dtype(matmul_dtype)
    settings['matmul_dtype'] = matmul_dtype
  for assignment in assignments:
    target, sep, text = assignment.partition('=')
    module_name, _, name = target.rpartition('.')
    if not (sep and module_name and name):
      raise SystemExit(f'--set takes MODULE.NAME=VALUE; got {assignment!r}')
    try:
      module = importlib.import_module(module_name)
    except ImportError:
      raise SystemExit(f'--set: no module {module_name}') from None
    if not hasattr(module, name):
      raise SystemExit(f'--set: {module_name} has no {name}')
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      raise SystemExit(f'--set: {text!r} is not a Python literal') from None
    setattr(module, name, value)
    settings[target] = value
  return settings


def compiler_options(assignments):
  """`{NAME: VALUE}` of `--compiler-option NAME=VALUE`s: VALUE `true` or
  `false` (any case) a bool, digits an int, anything else text (XLA takes
  each option typed: it refuses the text 'false' for a bool)."""
  options = {}
  for assignment in assignments:
    name, sep, value = assignment.partition('=')
    if not (sep and name and value):
      raise SystemExit(f'--compiler-option takes NAME=VALUE; got '
                       f'{assignment!r}')
    if value.lower() in ('true', 'false'):
      value = value.lower() == 'true'
    elif value.lstrip('-').isdigit():
      value = int(value)
    options[name.removeprefix('--')] = value
  return options


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--length', type=int, default=16384)
  parser.add_argument('--tiny', action='store_true')
  parser.add_argument('--trace', default=None)
  parser.add_argument('--units', default='',
                      help='also time the LSH layer with these '
                      'n_parallel_heads, e.g. 1,4')
  parser.add_argument('--json', default=None)
  parser.add_argument('--hlo', default=None,
                      help="write the XLA LSH layer's compiled HLO here "
                      "(gzipped text; the step's beside it, '_step' added "
                      "before '.txt')")
  parser.add_argument('--step-only', action='store_true',
                      help='time (and trace) only the matmul baseline and '
                      'the step')
  parser.add_argument('--trace-steps', type=int, default=3,
                      help='calls of each part per trace (default 3)')
  parser.add_argument('--set', action='append', default=[],
                      metavar='MODULE.NAME=VALUE',
                      help='change a module constant for this run, e.g. '
                      'retrax.layers.attention.ops.REMAT_SPEED_BLOCKS=False')
  parser.add_argument('--matmul-dtype', choices=['float32', 'bfloat16'],
                      help='the matmul policy for this run (as '
                      'RETRAX_MATMUL_DTYPE)')
  parser.add_argument('--n-parallel-heads', type=int,
                      help="the step's LSH layers run this many (example, "
                      'head) units at a time (default: the layer\'s choice)')
  parser.add_argument('--compiler-option', action='append', default=[],
                      metavar='NAME=VALUE',
                      help="an XLA option for the step's compile, e.g. "
                      'xla_tpu_scoped_vmem_limit_kib=98304 (repeatable)')
  parser.add_argument('--compare', nargs='+', metavar='JSON',
                      help='print the step of these runs (their --json), '
                      'each over the first; nothing is run')
  args = parser.parse_args(argv)
  if args.compare:
    compare_steps(args.compare)
    return
  settings = apply_settings(args.set, args.matmul_dtype)
  options = compiler_options(args.compiler_option)
  if options:
    settings['compiler_options'] = options
  cfg = TINY if args.tiny else PAPER
  if args.n_parallel_heads:
    cfg = dict(cfg, n_parallel_heads=args.n_parallel_heads)
    settings['n_parallel_heads'] = args.n_parallel_heads
  units = [int(k) for k in args.units.split(',') if k]
  try:
    summary = profile(cfg, args.length, args.trace, json_path=args.json,
                      units=units, hlo_path=args.hlo,
                      step_only=args.step_only, trace_steps=args.trace_steps,
                      settings=settings, compiler_options=options or None)
  except validation.ArgumentError as e:
    # A setting the model's layers refuse (e.g. `--n-parallel-heads 3` for
    # 16 heads): their one-line message, not a traceback.
    parser.error(str(e))
  ops = summary.get('top_ops', [])
  if ops:
    print('slowest device ops of a step (ms, calls, op, category):')
  for ms, calls, name, category in ops:
    print(f'{ms:9.2f} {calls:5d}  {name:32s} {category}')


if __name__ == '__main__':
  main()
  # Everything is written: leave without the runtime's orderly teardown,
  # which took 20 s or more after a 64K step on the TPU machine (2026-12-07:
  # tpu.sh's variants ran out of their time share while exiting).
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(0)
