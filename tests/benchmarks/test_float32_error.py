"""benchmarks/float32_error.py: the error measure and the CPU's figures."""

import json

import jax
import numpy as np
import pytest

from tests import backend_tolerance
from tests import benchmark_scripts

float32_error = benchmark_scripts.load('float32_error')


def test_errors_is_max_abs_and_relative_away_from_zero():
  want = np.array([4.0, -3.0, 0.001, 0.0])  # RMS 2.5: the first two count.
  got = want + np.array([0.04, 0.0, 0.01, 0.5])
  abs_err, rel_err = float32_error.errors(got, want)
  assert abs_err == pytest.approx(0.5)
  assert rel_err == pytest.approx(0.01)


def test_cpu_float32_is_at_float32_numpys_rounding(tmp_path):
  out = tmp_path / 'f32.json'
  assert float32_error.main(['--size', '64', '--json', str(out)]) == 0
  result = json.loads(out.read_text())
  assert result['backend'] == jax.default_backend()
  cases = result['cases']
  assert set(cases) >= {'matmul default', 'matmul highest', 'exp', 'softmax',
                        'attention (highest)'}
  if result['backend'] == 'tpu':
    # What the tests' TPU floor rests on: every float32 case within it but
    # the default precision's matmul, one bfloat16 pass (~1e-2; 9.2e-3 on a
    # v5e chip, 2026-12-06).
    for name, c in cases.items():
      bound = (2e-2 if name == 'matmul default'
               else backend_tolerance.TPU_FLOAT32_FLOOR)
      assert c['rel'] <= bound, (name, c)
    return
  if result['backend'] != 'cpu':
    pytest.skip(f'no claim about {result["backend"]} float32 here')
  for name, c in cases.items():
    # XLA:CPU computes float32 as NumPy does: within a few ulps of it.
    assert c['rel'] <= 4 * c['numpy32_rel'] + 1e-6, (name, c)
