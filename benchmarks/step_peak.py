"""What the training step holds at its memory peak, by XLA's plan (CPU or TPU).

    python benchmarks/step_peak.py [--lengths 262144,1048576] [--top 16]
        [--model ReformerLM] [--axial-pos] [--plain-loss] [--tiny] [--tpu]

Compiles `long_models`' training step (the one `training.Loop` compiles;
`--plain-loss`: `Serial(model, loss)` differentiated whole) and prints, per
length, the planned temporaries (`memory_analysis()`) per token and the
largest buffers live at the plan's peak: size, shape and the JAX operation
that made each (its `op_name`: `transpose(jvp())/while/...` is the backward
pass, `jvp()/...` the forward). They come from the compiler's dump of the
module (`xla_dump_to`, a temporary folder, deleted after): its
`*-live-range.txt` lists the values live at the peak. Nothing is run, so
lengths a TPU would hold compile here in seconds; XLA:TPU plans differently
(layouts pad a minor dimension of 64 to 128, for one), but the values live
at the peak are the same program's.

`--tpu` plans the step for one TPU v5e chip from this host, without one:
compiled ahead of time by the TPU compiler (libtpu, in a separate virtual
environment: `pip install -e . "jax[tpu]==<this JAX's version>"`) for a
`v5e:1x1` topology, the model traced with a TPU's choices
(`jax.default_backend()` reads 'tpu' in this process). It prints the
heap the chip would need (the "HLO temporaries" a chip's compile checks
against its 15.75 GiB: the values live at the peak plus what their
placement leaves unused) and the values in it where it is fullest, with
their sizes as laid out in the chip's tiles (`heap_peak`). Checked against
the chip: the default model's 2M step with axial positions, 20.28 GB here,
20.27 on the chip (2026-12-07).
"""

import argparse
import functools
import glob
import importlib
import os
import re
import sys
import tempfile

import jax

from retrax import layers as tl
from retrax import models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
long_models = importlib.import_module('long_models')  # Its model and step.

DUMP_OPTIONS = {'xla_dump_hlo_as_text': True,
                'xla_dump_hlo_module_re': 'jit_step'}


def axial_shape(length):
  """`(a, b)`, `a * b = length` (a power of two), `a` the power of two at
  or below its square root (as `vs_peers.axial_shape`)."""
  if length < 4 or length & (length - 1):
    raise ValueError(f'--axial-pos needs lengths that are powers of two >= 4;'
                     f' got {length}.')
  a = 1 << ((length.bit_length() - 1) // 2)
  return a, length // a


def build(name, cfg, length, axial_pos=False):
  """`long_models.build`'s model; ReformerLM with axial positions if asked."""
  if not axial_pos:
    return long_models.build(name, cfg, length)
  if name != 'ReformerLM':
    raise ValueError(f'--axial-pos is for ReformerLM; got {name!r}.')
  lsh = functools.partial(tl.LSHSelfAttention, n_hashes=cfg['n_hashes'],
                          chunk_len=cfg['chunk_len'])
  d = cfg['d_model']
  return models.ReformerLM(
      cfg['vocab'], d_model=d, d_ff=cfg['d_ff'],
      d_attention_key=cfg['d_head'], d_attention_value=cfg['d_head'],
      n_layers=cfg['n_layers'], n_heads=cfg['n_heads'], dropout=0.0,
      max_len=length, attention_type=lsh, pos_type='axial',
      pos_axial_shape=axial_shape(length),
      pos_d_axial_embs=(d // 2, d - d // 2)), 1


def _read(folder, suffix):
  paths = glob.glob(os.path.join(folder, f'*jit_step*{suffix}'))
  if len(paths) != 1:
    raise RuntimeError(f'expected one *jit_step*{suffix} in the dump; got '
                       f'{[os.path.basename(p) for p in paths]}.')
  with open(paths[0], encoding='utf-8') as f:
    return f.read()


def peak_values(live_ranges, hlo):
  """`[(bytes, value, shape, op_name)]` live at the peak, largest first.

  `live_ranges`: the dump's `*-live-range.txt`; `hlo`: its
  `*cpu_after_optimizations.txt` (where each instruction's shape and
  `op_name` are).
  """
  start = live_ranges.index('(peak):')
  values = []
  for line in live_ranges[start:].splitlines()[1:]:
    m = re.match(r'\s+(\S+?)\{(.*?)\}: (\d+) bytes', line)
    if not m:
      break
    name, index, size = m.groups()
    found = re.search(r'^\s*(?:ROOT )?%' + re.escape(name) + r' = (.*)$',
                      hlo, re.M)
    text = found.group(1) if found else ''
    shape = '(tuple)' if text.startswith('(') else text.split(' ')[0]
    op = re.search(r'op_name="([^"]*)"', text)
    values.append((int(size), name + (f'{{{index}}}' if index else ''),
                   shape, op.group(1).removeprefix('jit(step)/') if op else ''))
  return sorted(values, key=lambda v: -v[0])


def heap_peak(buffer_assignment, live_ranges, hlo):
  """`(bytes, [(bytes, value, shape, op_name)])` at the TPU heap's fullest.

  The heap is the module's largest preallocated-temp allocation in the
  dump's `*-buffer-assignment.txt`, where each value has its offset and its
  size as laid out (a TPU's tiles pad a 64-wide minor axis to 128 lanes and
  a `[N, 1]` column 128 times; the live-range file counts unpadded bytes).
  Bytes live are the union of the live values' offset ranges, measured
  where each value starts (`*-live-range.txt`'s instruction numbers).
  """
  allocations = re.split(r'\n(?=allocation \d+:)', buffer_assignment)
  heap = max((a for a in allocations
              if 'preallocated-temp' in a.split('\n', 1)[0]),
             key=lambda a: int(re.match(r'allocation \d+: size (\d+)', a)
                               .group(1)))
  ranges = dict(
      (m.group(1), (int(m.group(2)), int(m.group(3)))) for m in re.finditer(
          r'^\s+(\S+\{.*?\}):(\d+)-(\d+)',
          live_ranges[live_ranges.index('BufferLiveRange:'):], re.M))
  values = []  # (start, end, offset, size, name, shape)
  for m in re.finditer(r'value: <\d+ (\S+?) @0> \(size=(\d+),offset=(\d+)\):'
                       r' (\S+)', heap):
    name, size, offset, shape = m.groups()
    span = ranges.get(name if '{' in name else name + '{}')
    if span:
      values.append((*span, int(offset), int(size), name, shape))

  def live_bytes(t):
    covered, end = 0, -1
    for _, _, offset, size, _, _ in sorted(
        (v for v in values if v[0] <= t <= v[1]), key=lambda v: v[2]):
      covered += max(0, offset + size - max(offset, end))
      end = max(end, offset + size)
    return covered
  t = max({v[0] for v in values}, key=live_bytes)
  peak = {}
  for start, end, offset, size, name, shape in values:
    if start <= t <= end:  # Values sharing a buffer: listed once.
      op = re.search(r'^\s*(?:ROOT )?%' + re.escape(name.split('{')[0]) +
                     r' = .*?op_name="([^"]*)"', hlo, re.M)
      peak.setdefault((offset, size), (size, name, shape, op.group(1)
                                       .removeprefix('jit(step)/') if op
                                       else ''))
  return live_bytes(t), sorted(peak.values(), key=lambda v: -v[0])


def measure(name, cfg, length, axial_pos=False, plain_loss=False, tpu=None):
  """The step's plan at `length`: temp bytes and the values live at its peak.

  `tpu`: a TPU device of `tpu_topology()` to plan for (ahead of time); the
  result then has `heap_bytes` too (None with `required_bytes` where the
  plan exceeds the chip's memory: the compiler stops there).
  """
  model, n_inputs = build(name, cfg, length, axial_pos)
  batch = long_models.batch_for(cfg, length, n_inputs)
  init, step = long_models.train_step_of(model, plain_loss)
  if tpu is None:
    weights, state, opt_state = init(batch)
    lowered = step.lower(weights, state, opt_state, batch,
                         jax.random.PRNGKey(1))
  else:
    on_tpu = lambda t: jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(tpu)),
        t)
    lowered = step.trace(*on_tpu(jax.eval_shape(init, batch)), on_tpu(batch),
                         on_tpu(jax.eval_shape(jax.random.PRNGKey, 1))).lower()
  with tempfile.TemporaryDirectory() as folder:
    try:
      compiled = lowered.compile(dict(DUMP_OPTIONS, xla_dump_to=folder))
    except jax.errors.JaxRuntimeError as e:
      required = re.search(r'HLO temporaries \(([\d.]+)G\)', str(e))
      if tpu is None or not required:
        raise
      return dict(heap_bytes=None, required_bytes=float(required.group(1))
                  * 2**30, temp_bytes=None, peak=[])
    # The optimized module, whichever backend's compiler named it.
    values = peak_values(_read(folder, 'live-range.txt'),
                         _read(folder, 'after_optimizations.txt'))
    result = dict(temp_bytes=compiled.memory_analysis().temp_size_in_bytes,
                  peak=values)
    if tpu is not None:
      result['heap_bytes'] = int(re.search(
          r'Total bytes: (\d+)', _read(folder, 'memory-usage-report.txt'))
                                 .group(1))
      result['live_bytes'], result['peak'] = heap_peak(
          _read(folder, 'after_optimizations-buffer-assignment.txt'),
          _read(folder, 'live-range.txt'),
          _read(folder, 'after_optimizations.txt'))
  return result


def tpu_topology():
  """One TPU v5e chip to compile for ahead of time (libtpu, no chip needed).

  From here on this process traces models as on that chip: retrax's
  backend-dependent choices (permutations, projections, the attention's
  layouts, XLA:CPU's own compiler options) read `jax.default_backend()`.
  """
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', 'v5litepod-1')  # (no chip)
  try:
    topology = topologies.get_topology_desc(
        platform='tpu', topology_name='v5e:1x1', chips_per_host_bounds=[1, 1, 1])
  except Exception as e:  # pylint: disable=broad-except
    raise SystemExit(f'--tpu needs the TPU compiler (libtpu) beside this JAX: '
                     f'pip install "jax[tpu]=={jax.__version__}" (in a '
                     f'separate virtual environment); got: {e}') from None
  jax.default_backend = lambda: 'tpu'
  return topology.devices[0]


def format_peak(length, result, top):
  if result.get('required_bytes'):
    need = result['required_bytes']
    return (f'L={length}: the TPU heap would need {need / 2**30:.2f} GiB '
            f'({need / length:.0f} bytes per token): more than the chip has')
  temp = result['temp_bytes']
  lines = [f'L={length}: planned temporaries {temp / 1e9:.3f} GB, '
           f'{temp / length:.0f} bytes per token; largest live at the peak:']
  if result.get('heap_bytes'):
    heap = result['heap_bytes']
    lines[0] = (f'L={length}: TPU heap {heap / 2**30:.2f} GiB ({heap / length:.0f}'
                f' bytes per token), at its fullest '
                f'{result["live_bytes"] / 2**30:.2f} GiB live; largest:')
  for size, value, shape, op in result['peak'][:top]:
    lines.append(f'  {size / 2**20:10.1f} MiB  {size / length:7.0f} B/token  '
                 f'{shape:28s} {value}  {op}')
  return '\n'.join(lines)


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--lengths', default='262144')
  p.add_argument('--model', default='ReformerLM')
  p.add_argument('--top', type=int, default=16)
  p.add_argument('--axial-pos', action='store_true',
                 help="ReformerLM with pos_type='axial' (tables of ~sqrt(L) "
                 'rows, as vs_peers --axial-pos)')
  p.add_argument('--plain-loss', action='store_true',
                 help='differentiate Serial(model, loss) whole')
  p.add_argument('--tiny', action='store_true', help='toy sizes (for the test)')
  p.add_argument('--tpu', action='store_true',
                 help='plan for one TPU v5e chip, ahead of time (needs libtpu)')
  return p.parse_args(argv)


def main(argv=None):
  args = parse_args(argv)
  cfg = long_models.TINY if args.tiny else long_models.FULL
  tpu = tpu_topology() if args.tpu else None
  results = {}
  for length in [int(n) for n in args.lengths.split(',')]:
    results[length] = measure(args.model, cfg, length, args.axial_pos,
                              args.plain_loss, tpu)
    print(format_peak(length, results[length], args.top), flush=True)
  return results


if __name__ == '__main__':
  main()
