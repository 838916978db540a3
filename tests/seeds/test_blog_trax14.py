"""The blog program in its Trax-1.4 form (blog_reformer_trax14.py) decodes its copies.

Its predict-mode model is loaded with `init_from_file(weights_only=True)` and
no signature, so its state is sized for the checkpoint's training batch (16);
it is then fed batch-1 tokens, as on Trax, which decodes 10/10 copies from the
same program and checkpoint.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(__file__)
FIXTURE = os.path.join(HERE, '..', 'fixtures', 'golden', 'reformerlm_copy')


def _run(out_dir, train_steps, cwd):
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  return subprocess.run(
      [sys.executable, '-m', 'retrax.compat',
       os.path.join(HERE, 'blog_reformer_trax14.py'), str(out_dir),
       str(train_steps)],
      cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
      check=False)


def _copies(out):
  assert out.returncode == 0, out.stderr[-3000:]
  return int(re.search(r'COPIES (\d+)/10', out.stdout).group(1))


def test_trax14_blog_decodes_copies_from_trax_checkpoint(tmp_path):
  run = tmp_path / 'run'
  run.mkdir()
  for name in ('model.pkl.gz', 'model.weights.npy.gz'):
    shutil.copy(os.path.join(FIXTURE, name), run / name)
  out = _run(run, 0, tmp_path)
  assert _copies(out) == 10
  samples = re.findall(r'SAMPLE ([\d ]+)', out.stdout)
  assert len(samples) == 10
  # Trax 1.4.1 prints this first sample from the same program and file.
  assert samples[0].split() == '0 6 12 13 9 0 6 12 13 9'.split()


@pytest.mark.slow
def test_trax14_blog_trains_then_decodes_copies(tmp_path):
  out = _run(tmp_path / 'run', 300, tmp_path)
  assert _copies(out) >= 9
