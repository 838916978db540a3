"""benchmarks/gather_bench.py on CPU: rows timed, mismatches and failures recorded."""

import json

import jax.numpy as jnp
import pytest
from tests import benchmark_scripts

gather_bench = benchmark_scripts.load('gather_bench')
gather_kernel = gather_bench.gather_kernel  # The module the benchmark times.

XLA_ROWS = {'xla_take_along_axis', 'xla_take_flat', 'xla_take_vmapped'}
KERNEL_ROWS = {f'pallas_{m}' for m in gather_kernel.METHODS}


def test_every_row_timed_and_kernels_over_the_fastest_xla(tmp_path):
  path = str(tmp_path / 'g.json')
  gather_bench.main(['--units', '2', '--length', '40', '--n', '256',
                     '--widths', '65,8', '--repeats', '2', '--json', path])
  with open(path) as f:
    summary = json.load(f)
  assert (summary['units'], summary['length'], summary['n']) == (2, 40, 256)
  assert set(summary['rows']) == {'65', '8'}
  for rows in summary['rows'].values():
    assert set(rows) == XLA_ROWS | KERNEL_ROWS
    assert all(r['step_s'] > 0 for r in rows.values())
    best = min(rows[name]['step_s'] for name in XLA_ROWS)
    for name in KERNEL_ROWS:
      assert rows[name]['over_xla'] == pytest.approx(
          rows[name]['step_s'] / best)
      assert rows[name]['ns_per_index'] == pytest.approx(
          1e9 * rows[name]['step_s'] / 512)


def test_a_wrong_or_failing_kernel_is_recorded_not_timed(monkeypatch):
  right = gather_kernel.gather_rows

  def faulty(x, indices, *, method, **kwargs):
    if method == 'dma':
      raise ValueError('Mosaic says no\nsecond line')
    return right(x, indices, method=method, **kwargs).at[0, 3].add(1)
  monkeypatch.setattr(gather_kernel, 'gather_rows', faulty)
  lines = []
  summary = gather_bench.bench(2, 16, 128, [8], jnp.float32, repeats=1,
                               log=lines.append)
  rows = summary['rows']['8']
  for name in ('pallas_vmem', 'pallas_vmem_aligned'):
    assert rows[name] == {
        'error': 'mismatch: 1 of 256 rows differ from xla_take_along_axis'}
  assert rows['pallas_dma'] == {'error': 'ValueError: Mosaic says no'}
  assert all(rows[name]['step_s'] > 0 for name in XLA_ROWS)
  assert any('pallas_dma' in line and 'FAILED' in line for line in lines)


@pytest.mark.parametrize('dtype', ['bfloat16', 'int8'])
def test_narrow_types_timed_with_kernels_equal_to_xla(dtype, tmp_path):
  """bfloat16 (odd width: a padded column) and int8 rows, moved as words."""
  path = str(tmp_path / 'g.json')
  gather_bench.main(['--units', '2', '--length', '24', '--n', '128',
                     '--widths', '65', '--repeats', '1', '--dtype', dtype,
                     '--json', path])
  with open(path) as f:
    summary = json.load(f)
  assert summary['dtype'] == dtype
  rows = summary['rows']['65']
  assert set(rows) == XLA_ROWS | KERNEL_ROWS
  # Timed, not recorded as failed: each kernel equals xla_take_along_axis.
  assert all(r['step_s'] > 0 for r in rows.values())
