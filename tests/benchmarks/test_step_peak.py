"""benchmarks/step_peak.py: the values live at the plan's peak, read from XLA's dump."""

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks',
                     'step_peak.py')
_spec = importlib.util.spec_from_file_location('step_peak_bench', _PATH)
step_peak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_peak)

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
