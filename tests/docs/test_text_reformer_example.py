"""docs/examples/text_reformer.py at a tiny size: trains, evaluates held out, samples."""

import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, 'docs', 'examples', 'text_reformer.py')


def _example():
  spec = importlib.util.spec_from_file_location('text_reformer', EXAMPLE)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_held_out_split_and_windows(tmp_path):
  ex = _example()
  data = bytes(range(32, 127)) * 3
  path = tmp_path / 'a.txt'
  path.write_bytes(data)
  train_ids, eval_ids = ex.read_ids(str(path))
  assert bytes(np.concatenate([train_ids, eval_ids]).astype(np.uint8)) == data
  assert len(eval_ids) == len(data) - int(len(data) * 0.9)
  x, y = next(ex.random_windows(train_ids, 16, seed=0))
  assert x is y and len(x) == 16
  assert data[:len(train_ids)].find(bytes(x.astype(np.uint8))) >= 0
  windows = ex.held_out_windows(eval_ids, 8)
  first = [bytes(next(windows)[0].astype(np.uint8)) for _ in range(len(eval_ids) // 8)]
  assert b''.join(first) == bytes(eval_ids[:8 * len(first)].astype(np.uint8))
  with pytest.raises(ValueError, match='too short'):
    ex.streams(str(path), 64, 2)


@pytest.mark.slow  # ~45 s of CPU: compiles the train, eval and predict programs.
def test_tiny_run_trains_evaluates_and_samples(tmp_path):
  ex = _example()
  prompt = 'Licensed under the '
  loop, text = ex.main([
      os.path.join(ROOT, 'LICENSE'), '--output_dir', str(tmp_path / 'run'),
      '--steps', '30', '--d_model', '32', '--n_layers', '1', '--length', '64',
      '--batch_size', '4', '--n_bytes', '12', '--prompt', prompt])
  evals = loop.history.get('eval', 'metrics/WeightedCategoryCrossEntropy')
  assert [s for s, _ in evals] == [1, 30]
  assert evals[0][1] > 5.0  # ~ln(256) = 5.5 untrained, on held-out bytes
  assert evals[-1][1] < evals[0][1] - 1.0
  assert text.startswith(prompt) and len(text) > len(prompt)
  assert (tmp_path / 'run' / 'model.pkl.gz').exists()
