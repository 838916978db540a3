"""The README's training quickstart runs as printed and samples the copy."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _training_block():
  with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
    blocks = re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)
  found = [b for b in blocks if 'loop.run(' in b]
  assert len(found) == 1, 'README should have one training quickstart block'
  return found[0]


def test_quickstart_block_is_present_and_prints_its_expected_sample():
  block = _training_block()
  assert 'load_run' in block and 'autoregressive_sample' in block
  assert '# [[3 5 2 7]]' in block


@pytest.mark.slow  # ~1 min of CPU: compiles train, eval and predict programs.
def test_quickstart_trains_and_samples_the_copy(tmp_path):
  (tmp_path / 'quickstart.py').write_text(_training_block(), encoding='utf-8')
  out = subprocess.run([sys.executable, 'quickstart.py'], cwd=tmp_path,
                       env=dict(os.environ, JAX_PLATFORMS='cpu'),
                       capture_output=True, text=True, timeout=900, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1] == '[[3 5 2 7]]'
  assert (tmp_path / 'runs' / 'quickstart' / 'model.json').exists()
