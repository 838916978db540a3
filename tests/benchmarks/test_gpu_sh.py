"""benchmarks/gpu.sh end to end at toy sizes on CPU (RETRAX_GPU_SH_TINY=1)."""

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks',
                       'gpu.sh')


@pytest.mark.slow  # ~35 s on a quiet 2-core CPU, ~80 s at load 7: 3 workers.
def test_gpu_sh_tiny(tmp_path):
  env = dict(os.environ, RETRAX_GPU_SH_TINY='1', OUT=str(tmp_path),
             PYTHON=sys.executable)
  proc = subprocess.run(['bash', _SCRIPT], capture_output=True, text=True,
                        env=env, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  out = proc.stdout
  assert '| train step L=32, median s |' in out
  assert 'MAX LENGTH: L=32 trains' in out
  table = json.loads((tmp_path / 'gpu_vs_peers.json').read_text())
  assert table['peers'][:2] == ['retrax', 'retrax-bf16']
  for peer in ('retrax', 'retrax-bf16'):
    step = table['train']['32'][peer]['step_s']
    assert len(step) == 1 and 0 < step[0] < 60
  shards = json.loads((tmp_path / 'gpu_sharding.json').read_text())
  assert [r['mesh'] for r in shards] == ['data=1', 'fsdp=1']
  assert all(r['ratio'] == 1.0 and r['step_s'] > 0 for r in shards)
  search = json.loads((tmp_path / 'gpu_max_length.json').read_text())
  assert search['fits'] == 32 and list(search['tries']) == ['32']
