"""benchmarks/step_peak.py: the values live at the plan's peak, read from XLA's dump."""

import importlib.util
import os
import subprocess
import sys

import pytest
from tests import benchmark_scripts

_PATH = benchmark_scripts.path('step_peak')
step_peak = benchmark_scripts.load('step_peak')

_LIVE_RANGES = """\
  Live ranges at 7 (peak):
    fusion.1{}: 64 bytes (cumulative: 64 bytes)
    while.2{1}: 256 bytes (cumulative: 320 bytes)
  Stack trace breakdown for peak usage: 320 bytes
"""
_HLO = (
    '  %fusion.1 = f32[4,4]{1,0} fusion(%p), kind=kLoop, '
    'metadata={op_name="jit(step)/jvp()/add" stack_frame_id=3}\n'
    '  %while.2 = (s32[], f32[8,8]{1,0}) while(%t), body=%b, '
    'metadata={op_name="jit(step)/transpose(jvp())/while"}\n')


def test_peak_values_name_size_shape_and_origin_largest_first():
  assert step_peak.peak_values(_LIVE_RANGES, _HLO) == [
      (256, 'while.2{1}', '(tuple)', 'transpose(jvp())/while'),
      (64, 'fusion.1', 'f32[4,4]{1,0}', 'jvp()/add')]


_BUFFER_ASSIGNMENT = """\
BufferAssignment:
allocation 0: size 4096, parameter 0, shape |f32[1024]| at ShapeIndex {}:
 value: <1 p @0> (size=4096,offset=0): f32[1024]{0}
allocation 1: size 3072, preallocated-temp:
 value: <2 a @0> (size=1024,offset=0): f32[2,128]{1,0:T(8,128)}
 value: <3 b @0> (size=1024,offset=1024): f32[8,64]{1,0:T(8,128)}
 value: <4 c{0} @0> (size=1024,offset=2048): f32[8,128]{1,0:T(8,128)}
 value: <5 d @0> (size=1024,offset=0): f32[8,128]{1,0:T(8,128)}
 value: <6 e @0> (size=1024,offset=0): f32[8,128]{1,0:T(8,128)}
"""
_HEAP_LIVE_RANGES = """\
HloLiveRange (max 5):
  BufferLiveRange:
    p{}:0-5
    a{}:0-2
    b{}:1-3
    c{0}:2-2
    d{}:3-5
    e{}:2-2
  Live ranges at 1 (peak):
"""


def test_heap_peak_counts_laid_out_bytes_where_the_heap_is_fullest():
  # At instruction 2, a, b and c fill the 3 KB heap (e shares a's buffer:
  # counted and listed once); sizes are the dump's laid-out (padded) ones.
  hlo = ('  %a = f32[2,128]{1,0:T(8,128)} add(%x, %y), '
         'metadata={op_name="jit(step)/jvp()/add"}\n')
  live, peak = step_peak.heap_peak(_BUFFER_ASSIGNMENT, _HEAP_LIVE_RANGES, hlo)
  assert live == 3072
  assert peak == [(1024, 'a', 'f32[2,128]{1,0:T(8,128)}', 'jvp()/add'),
                  (1024, 'b', 'f32[8,64]{1,0:T(8,128)}', ''),
                  (1024, 'c{0}', 'f32[8,128]{1,0:T(8,128)}', '')]


def test_axial_shape_is_vs_peers():
  assert step_peak.axial_shape(2 ** 21) == (1024, 2048)
  assert step_peak.axial_shape(2 ** 16) == (256, 256)
  with pytest.raises(ValueError, match='powers of two'):
    step_peak.axial_shape(3000)


def test_toy_reformer_step_peak(capsys):
  results = step_peak.main(['--tiny', '--axial-pos', '--lengths', '256',
                            '--top', '3'])
  r = results[256]
  sizes = [v[0] for v in r['peak']]
  assert r['temp_bytes'] > 0 and sizes == sorted(sizes, reverse=True)
  assert 0 < sizes[0] <= r['temp_bytes']
  # The step's forward and backward passes both show up among the origins.
  ops = ' '.join(v[3] for v in r['peak'])
  assert 'transpose(jvp())' in ops or 'jvp()' in ops, r['peak']
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith('L=256: planned temporaries') and len(out) == 4


def test_a_tpu_plan_over_the_chip_says_what_it_would_need():
  line = step_peak.format_peak(2 ** 21, dict(required_bytes=20.28 * 2**30),
                               top=3)
  assert line == ('L=2097152: the TPU heap would need 20.28 GiB (10383 bytes '
                  'per token): more than the chip has')


def test_toy_step_planned_for_a_tpu_chip_ahead_of_time():
  """`--tpu` (needs libtpu, absent from the test extra: skipped there)."""
  if importlib.util.find_spec('libtpu') is None:
    pytest.skip('libtpu is not installed')
  # A process of its own: `--tpu` makes it trace as on a TPU for good. (JAX
  # in this one may have loaded libtpu too, looking for a chip.)
  proc = subprocess.run(
      [sys.executable, _PATH, '--tiny', '--tpu', '--axial-pos', '--lengths',
       '256', '--top', '2'], capture_output=True, text=True, timeout=600,
      check=False, env=dict(os.environ, ALLOW_MULTIPLE_LIBTPU_LOAD='1'))
  assert proc.returncode == 0, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[0].startswith('L=256: TPU heap ') and len(lines) == 3, lines
  heap = float(lines[0].split('(')[1].split(' ')[0])  # bytes per token
  assert heap > 0
  # The values at the peak are laid out in the TPU's tiles.
  assert all(':T(' in line for line in lines[1:]), lines
