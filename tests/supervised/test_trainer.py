"""The legacy Trainer: report lines, numerics equal to Loop's, checkpoints, train()."""

import os
import re

import jax
import numpy as np
import pytest

import supervised_toys as toys
from retrax import layers as tl
from retrax import lr
from retrax import optimizers
from retrax.data.inputs import Inputs
from retrax.supervised import trainer_lib
from retrax.supervised import training


def _metrics():
  return {'loss': toys.WeightedCrossEntropy(),
          'accuracy': toys.WeightedAccuracy(),
          'neg_log_perplexity': tl.Serial(toys.WeightedCrossEntropy(),
                                          tl.Negate()),
          'weights_per_batch_per_core': toys.SumOfWeights()}


def _inputs(seed=0):
  return Inputs(lambda _: toys.copy_batches(seed),
                eval_stream=lambda _: toys.copy_batches(seed + 50))


def _trainer(output_dir=None, optimizer=optimizers.Adam, schedule=None,
             **kwargs):
  return trainer_lib.Trainer(
      model=toys.mlp, loss_fn=toys.WeightedCrossEntropy, optimizer=optimizer,
      lr_schedule=schedule or (lambda step: 0.05), inputs=_inputs(),
      output_dir=output_dir, has_weights=True, random_seed=0,
      metrics=_metrics(), **kwargs)


def test_train_epoch_prints_trax_report(capsys):
  trainer = _trainer()
  trainer.train_epoch(5, 2)
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == ''
  assert re.fullmatch(r'Step      5: Ran 5 train steps in \d+\.\d\d secs',
                      lines[1])
  assert lines[2] == 'Step      5: Evaluation'
  names = ['accuracy', 'loss', 'neg_log_perplexity',
           'weights_per_batch_per_core']
  for i, mode in enumerate(['train', 'eval']):
    for j, name in enumerate(names):
      line = lines[3 + 4 * i + j]
      assert re.fullmatch(rf'Step      5: {mode:5} {name:>26} \| [ -]\d+\.\d{{8}}',
                          line), line
  assert lines[11] == 'Step      5: Finished evaluation'
  assert lines[6] == ('Step      5: train weights_per_batch_per_core |  '
                      f'{toys.BATCH * (toys.LENGTH // 2 + 1):.8f}')
  loss = trainer.history.get('eval', 'metrics/loss')[-1][1]
  nlp = trainer.history.get('eval', 'metrics/neg_log_perplexity')[-1][1]
  assert nlp == pytest.approx(-loss)
  assert trainer.step == 5


def test_trainer_and_loop_train_identically():
  trainer = _trainer(optimizer=optimizers.SGD, schedule=lambda step: 0.1)
  for _ in range(4):
    trainer.train_step(next(trainer._loop.tasks[0]._labeled_data))
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.SGD(0.1),
                            sample_batch=next(toys.copy_batches(99)))
  loop = training.Loop(toys.mlp(), task, random_seed=0)
  loop.run(4)
  batch = next(toys.copy_batches(7))
  for got, want in zip(toys.leaves(trainer.model_weights),
                       toys.leaves(loop.model.weights)):
    np.testing.assert_array_equal(got, want)
  assert float(toys.mlp_reference_loss((trainer.model_weights, ()), batch)) == (
      float(toys.mlp_reference_loss((loop.model.weights, ()), batch)))


def test_trainer_passes_step_zero_to_the_first_adam_update():
  trainer = _trainer(optimizer=optimizers.Adam, schedule=lambda step: 0.05)
  initial = [np.asarray(w, np.float64) for w in
             toys.leaves(trainer.model_weights)]
  batch = next(toys.copy_batches(3))
  tree = jax.tree_util.tree_map(np.asarray, trainer.model_weights)
  grads = toys.leaves(jax.grad(toys.mlp_reference_loss)((tree, ()), batch))
  trainer.train_step(batch)
  for got, w, g in zip(toys.leaves(trainer.model_weights), initial, grads):
    want, _ = toys.adam_reference(w, np.asarray(g, np.float64),
                                  (np.zeros_like(w), np.zeros_like(w)), 0, 0.05)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_history_based_schedule_and_learning_rate():
  trainer = _trainer(schedule=lr.MultifactorSchedule)
  assert trainer.learning_rate == 0.0  # linear_warmup at step 0.
  trainer.train_epoch(1, 1)
  assert float(trainer.learning_rate) == pytest.approx(
      0.1 * (1 / 400) / np.sqrt(400), rel=1e-6)
  assert trainer.history.get('train', 'training/learning_rate')[-1][0] == 1


def test_checkpoints_and_resume(tmp_path, capsys):
  out = str(tmp_path)
  trainer = _trainer(output_dir=out, checkpoints_at=[2])
  assert {'ckpt_000000000', 'model.pkl.gz'} <= set(os.listdir(out))
  trainer.train_epoch(3, 1)
  names = set(os.listdir(out))
  assert {'ckpt_000000003', 'model_000000002', 'model_2.pkl.gz',
          'model.pkl.gz', 'train', 'eval', 'metrics.jsonl'} <= names
  weights = [np.asarray(w) for w in toys.leaves(trainer.model_weights)]
  capsys.readouterr()
  again = _trainer(output_dir=out)
  assert 'Resumed from checkpoint' in capsys.readouterr().out
  assert again.step == 3
  for a, b in zip(toys.leaves(again.model_weights), weights):
    np.testing.assert_array_equal(a, b)
  # The Trax-format file holds the same weights, for Layer.init_from_file.
  model = toys.mlp(mode='eval')
  model.init_from_file(os.path.join(out, 'model.pkl.gz'), weights_only=True)
  for a, b in zip(toys.leaves(model.weights), weights):
    np.testing.assert_array_equal(a, b)


def test_missing_loss_weights_are_added():
  inputs = Inputs(lambda _: ((x, t) for x, t, _ in toys.copy_batches(0)))
  trainer = trainer_lib.Trainer(
      toys.mlp, toys.WeightedCrossEntropy, optimizers.SGD, lambda s: 0.1,
      inputs, has_weights=False, id_to_mask=0, random_seed=0,
      metrics={'weights_per_batch_per_core': toys.SumOfWeights()})
  trainer.train_epoch(1, 1)
  x = next(toys.copy_batches(50))[0]  # The eval stream restarts at batch 0.
  assert trainer.history.get('eval', 'metrics/weights_per_batch_per_core')[
      -1][1] == pytest.approx(np.sum(x != 0))


def test_default_metrics_are_trax_s_or_say_what_is_missing():
  names = ('WeightedCategoryCrossEntropy', 'WeightedCategoryAccuracy')
  if all(hasattr(tl, n) for n in names):
    assert sorted(trainer_lib.default_metrics()) == [
        'accuracy', 'loss', 'neg_log_perplexity', 'weights_per_batch_per_core']
  else:
    with pytest.raises(ValueError, match='pass metrics='):
      trainer_lib.default_metrics()


def test_epochs_follow_trax():
  assert list(trainer_lib.epochs(10, 0, [3, 3, 3, 3])) == [3, 3, 3, 1]
  assert list(trainer_lib.epochs(10, 4, [3, 3, 3, 3])) == [2, 3, 1]
  assert list(trainer_lib.epochs(10, 10, [3, 3, 3, 3])) == []


def test_train_function_runs_loop_and_trainer(tmp_path):
  kwargs = dict(model=toys.mlp, loss_fn=toys.WeightedCrossEntropy(),
                inputs=_inputs(), optimizer=optimizers.Adam,
                lr_schedule_fn=lambda: lr.constant(0.05), steps=4,
                eval_steps=1, eval_frequency=2, random_seed=0,
                metrics=_metrics())
  loop = trainer_lib.train(str(tmp_path / 'loop'), **kwargs)
  assert isinstance(loop, training.Loop) and loop.step == 4
  assert [s for s, _ in loop.history.get('eval', 'metrics/loss')] == [1, 2, 4]
  kwargs['loss_fn'] = toys.WeightedCrossEntropy
  state = trainer_lib.train(str(tmp_path / 'trainer'), use_loop=False,
                            **kwargs)
  assert state.step == 4
  assert [s for s, _ in state.history.get('eval', 'metrics/loss')] == [1, 2, 4]
  with pytest.raises(ValueError, match='n_weights_shards'):
    trainer_lib.train(str(tmp_path / 'x'), n_weights_shards=2, **kwargs)
