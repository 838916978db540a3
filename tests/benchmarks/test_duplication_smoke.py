"""Smoke tests of benchmarks/duplication.py on a tiny config."""

import json

import jax
import numpy as np
import pytest
from tests import benchmark_scripts

duplication = benchmark_scripts.load('duplication')


def tiny_config(**overrides):
  cfg = duplication.parse_args([
      '--length', '16', '--batch', '2', '--steps', '3', '--vocab', '6',
      '--d_model', '16', '--d_ff', '32', '--n_heads', '2', '--chunk_len', '4',
      '--warmup', '1', '--eval_batch', '2', '--eval_batches', '2',
      '--log_every', '2', '--train', 'full', '--eval', 'full,lsh-2'])
  del cfg.json, cfg.quick
  for key, value in overrides.items():
    setattr(cfg, key, value)
  return cfg


@pytest.mark.slow  # ~15-40 s on 2 CPU cores: it compiles a training step.
def test_run_table_shape_and_range():
  # Trained with full attention, evaluated with it and with LSH.
  results = duplication.run(tiny_config(), log=lambda *_: None)
  assert list(results['table']) == ['full']
  assert list(results['table']['full']) == ['full', 'lsh-2']
  assert all(0.0 <= acc <= 1.0 for acc in results['table']['full'].values())
  # Logged at step 2 and at the last step, 3.
  curve = results['curves']['full']
  assert [(step, length) for step, length, _, _, _ in curve] == [(2, 16),
                                                                 (3, 16)]
  assert all(np.isfinite(loss) and 0 <= acc <= 1 for _, _, loss, acc, _ in
             curve)
  json.dumps(results)  # --json must be able to write it.
  assert len(duplication.format_table(results).splitlines()) == 2 + 1


@pytest.mark.slow  # ~30-80 s on 2 CPU cores: it compiles two training steps.
def test_curriculum_carries_weights_and_stops_at_accuracy():
  # vocab 2: every target is 1, so the accuracy is > 0 at the first log and
  # each stage stops there (step 2 of 3); the next stage continues the count.
  cfg = tiny_config(vocab=2, train='lsh-2', eval='lsh-2',
                    curriculum='16:3,32:3', stop_at=1e-9, target=1e-9)
  results = duplication.run(cfg, log=lambda *_: None)
  curve = results['curves']['lsh-2']
  assert [(step, length) for step, length, _, _, _ in curve] == [(2, 16),
                                                                 (4, 32)]
  assert results['reached']['lsh-2'][0] == 4  # First log of the last stage.
  assert 0 < results['table']['lsh-2']['lsh-2'] <= 1


def test_stages_and_max_len():
  assert duplication.stages(tiny_config()) == [(16, 3)]
  cfg = tiny_config(curriculum='64:200,256:30,128:5')
  assert duplication.stages(cfg) == [(64, 200), (256, 30), (128, 5)]
  assert duplication.max_len(cfg) == 256
  # Evaluation and the table use the last stage's length.
  x, _, _ = next(duplication._inputs(cfg).eval_stream(1))
  assert x.shape == (cfg.eval_batch, 128)
  for bad in ['64', '64:0', '64:x', '64:10,,']:
    with pytest.raises(ValueError, match='--curriculum'):
      duplication.stages(tiny_config(curriculum=bad))


def test_plot_writes_png(tmp_path):
  results = dict(curves={'lsh-4': [(100, 64, 4.8, 0.01, 1.0),
                                   (200, 64, 0.1, 0.99, 2.0),
                                   (300, 256, 4.0, 0.02, 3.0)]})
  path = tmp_path / 'curves.png'
  duplication.plot(results, str(path))
  assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('attention', ['full', 'full-norm', 'lsh-2'])
def test_evaluate_matches_numpy_for_constant_prediction(attention):
  # All weights zero except the output bias: every position predicts `token`,
  # so the accuracy is the share of copy positions whose target is `token`.
  cfg = tiny_config()
  model = duplication.build_model(attention, cfg, 'eval')
  stream = duplication._inputs(cfg).eval_stream(1)
  batches = [next(stream) for _ in range(cfg.eval_batches)]
  model.init(jax.ShapeDtypeStruct(batches[0][0].shape, np.int32))
  leaves, tree = jax.tree_util.tree_flatten(model.weights)
  token = 3
  leaves = [np.zeros_like(leaf) for leaf in leaves]
  leaves[-1][token] = 1.0  # Bias of the final Dense(vocab).
  weights = jax.tree_util.tree_unflatten(tree, leaves)
  expected = (sum(((y == token) * w).sum() for _, y, w in batches) /
              sum(w.sum() for _, _, w in batches))
  assert 0 < expected < 1
  np.testing.assert_allclose(duplication.evaluate(weights, attention, cfg),
                             expected, rtol=1e-6)


def test_bad_attention_name():
  with pytest.raises(ValueError, match='unknown attention'):
    duplication.attention_type('lsh-0', 4)
  with pytest.raises(ValueError, match='unknown attention'):
    duplication.run(tiny_config(eval='full,dense'), log=lambda *_: None)


def test_fixed_bucket_count_scales_the_chunk_with_length():
  cfg = tiny_config(n_buckets=8, curriculum='64:2,256:2')
  assert [duplication.chunk_len_at(cfg, n) for n in (64, 128, 256)] == [
      16, 32, 64]
  assert duplication.chunk_len_at(tiny_config(), 256) == 4  # --chunk_len.
