"""benchmarks/long_models.py: its measurements at toy sizes and its table."""

import math

import jax
import pytest

from retrax.layers import position_chunks
from tests import benchmark_scripts

long_models = benchmark_scripts.load('long_models')


def test_batches_hold_length_tokens_in_all():
  lm_batch = long_models.batch_for(long_models.TINY, 64, 1)
  assert [x.shape for x in lm_batch] == [(1, 64)] * 3
  source, target, targets, weights = long_models.batch_for(
      long_models.TINY, 64, 2)
  assert source.shape == target.shape == weights.shape == (1, 32)
  assert (targets == target).all()


def test_transformer_step_plan_and_loss_at_chance():
  cfg = long_models.TINY
  r = long_models.measure('TransformerLM', cfg, 32, steps=1,
                          budget_bytes=1e12)
  assert r['temp_bytes'] > 0 and r['argument_bytes'] > 0
  assert len(r['step_s']) == 1 and r['step_s'][0] > 0
  # Three Adam steps from a random init: still near chance, ln(vocab).
  assert abs(r['loss'] - math.log(cfg['vocab'])) < 0.5
  skipped = long_models.measure('TransformerLM', cfg, 32, steps=1,
                                budget_bytes=0)
  assert 'step_s' not in skipped and 'budget 0.0 GB' in skipped['skipped']


def test_unknown_model_is_named():
  with pytest.raises(ValueError, match="'GPT'.*TransformerLM"):
    long_models.build('GPT', long_models.TINY, 32)


def test_table_ratios_are_to_transformer_lm():
  results = {'1024': {
      'TransformerLM': dict(temp_bytes=4e9, compile_s=2.0, step_s=[2.0, 4.0]),
      'ReformerLM': dict(temp_bytes=1e9, compile_s=3.0, step_s=[1.5]),
      'Terraformer': dict(temp_bytes=2e9, compile_s=9.0, skipped='too big')}}
  rows = long_models.format_table(results, [1024]).splitlines()
  assert rows[2] == '| TransformerLM | 1024 | 4.00 | 1.00x | 3.00 | 1.00x | 2.0 |'
  assert rows[3] == '| ReformerLM | 1024 | 1.00 | 0.25x | 1.50 | 0.50x | 3.0 |'
  assert rows[4] == '| Terraformer | 1024 | 2.00 | 0.50x | too big | — | 9.0 |'


@pytest.mark.slow  # Compiles three models' training steps (~2-4 min here).
def test_all_three_models_train_end_to_end(capsys):
  results = long_models.main(['--tiny', '--lengths', '32', '--steps', '1'])
  for name in long_models.MODELS:
    r = results['32'][name]
    # A random init's logits are not uniform: the tiny models' first losses
    # were 3.93 / 4.12 / 3.57 (ln 32 = 3.47), falling over the 3 Adam steps.
    assert abs(r['loss'] - math.log(long_models.TINY['vocab'])) < 1.0, name
  assert '| Terraformer | 32 |' in capsys.readouterr().out


def test_reformer_step_runs_head_and_loss_over_position_chunks(monkeypatch):
  # The step is the training loop's (`loss_chunks.forward_fn`): ReformerLM's
  # head (Concatenate, LayerNorm, Dense) and the loss over chunks of
  # positions. The chunk threshold is lowered to what a toy model reaches.
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 2 ** 10)
  # A vocabulary wide enough that the head is what the step holds at its peak.
  cfg, length = dict(long_models.TINY, vocab=512), 1024
  chunked = long_models.measure('ReformerLM', cfg, length, steps=1,
                                budget_bytes=1e12)
  plain = long_models.measure('ReformerLM', cfg, length, steps=1,
                              budget_bytes=1e12, plain_loss=True)
  # Measured: 3.6 MB of temporaries against 7.8 MB with the [L, vocab]
  # logits and the loss's activations whole. A claim of XLA:CPU's plan: at
  # this toy size a v5e chip's compiler planned 5.7 MB against 5.6 (its
  # long steps are measured at 1M tokens by benchmarks/tpu.sh instead).
  if jax.default_backend() == 'cpu':
    assert chunked['temp_bytes'] < 0.6 * plain['temp_bytes'], (chunked, plain)
  # The same three Adam steps: the same loss, up to float rounding.
  assert chunked['loss'] == pytest.approx(plain['loss'], rel=1e-5)


def test_step_takes_the_reversible_blocks_weights_stacked():
  """As `training.Loop` holds them: Trax's per-layer tree would make the
  step restack the blocks' weights (one more copy of weights and grads)."""
  from retrax.layers.stacked import StackedLayers
  cfg = dict(long_models.TINY, n_layers=2)
  model, n_inputs = long_models.build('ReformerLM', cfg, 64)
  init, _ = long_models.train_step_of(model)
  weights, _, _ = init(long_models.batch_for(cfg, 64, n_inputs))
  found = jax.tree_util.tree_leaves(
      weights, is_leaf=lambda x: isinstance(x, StackedLayers))
  assert any(isinstance(x, StackedLayers) for x in found)
