"""`retrax bench`: runs from the installed package alone; --quick stays short."""

import os
import re
import subprocess
import sys
import time

import pytest

from retrax.app import bench


def test_data_bench_line():
  line = bench.bench_data(quick=True)
  assert re.fullmatch(r'data .* +\d+\.\d MB/s', line), line


@pytest.mark.slow
def test_quick_bench_finishes_in_two_minutes_outside_the_source_tree(tmp_path):
  env = dict(os.environ)
  env.pop('PYTHONPATH', None)
  start = time.perf_counter()
  proc = subprocess.run([sys.executable, '-m', 'retrax', 'bench', '--quick'],
                        cwd=tmp_path, capture_output=True, text=True,
                        env=env, check=False, timeout=600)
  seconds = time.perf_counter() - start
  assert proc.returncode == 0, proc.stderr
  lines = proc.stdout.splitlines()
  assert [l.split()[0] for l in lines[1:4]] == ['train', 'decode', 'data']
  assert seconds < 120, f'{seconds:.0f} s'
