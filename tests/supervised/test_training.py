"""Loop, TrainTask, EvalTask: training, cadence, history, report lines, callbacks."""

import os
import re

import numpy as np
import optax
import pytest

import resume_worker
import supervised_toys as toys
from retrax import optimizers
from retrax.supervised import callbacks
from retrax.supervised import metrics_log
from retrax.supervised import training
from retrax.supervised.batch_checks import BadBatchError


def _loop(output_dir=None, seed=0, n_per_checkpoint=5, optimizer=None,
          eval_tasks=True, **kwargs):
  task = training.TrainTask(toys.copy_batches(seed),
                            toys.WeightedCrossEntropy(),
                            optimizer or optimizers.Adam(0.05),
                            n_steps_per_checkpoint=n_per_checkpoint)
  evals = None
  if eval_tasks:
    evals = training.EvalTask(
        toys.copy_batches(seed + 100),
        [toys.WeightedCrossEntropy(), toys.WeightedAccuracy()],
        n_eval_batches=2)
  return training.Loop(toys.mlp(), task, eval_tasks=evals,
                       output_dir=output_dir, random_seed=seed, **kwargs)


def test_loss_decreases_and_history_is_recorded():
  loop = _loop(n_per_checkpoint=40)
  loop.run(80)
  losses = [v for _, v in loop.history.get('train',
                                           'metrics/WeightedCrossEntropy')]
  steps = [s for s, _ in loop.history.get('eval', 'metrics/WeightedAccuracy')]
  assert steps == [1, 40, 80]
  assert losses[-1] < 0.5 * losses[0]
  assert loop.history.modes == ['eval', 'train']
  assert 'training/learning_rate' in loop.history.metrics_for_mode('train')
  assert loop.step == 80


def test_report_lines_and_files(tmp_path, capsys):
  loop = _loop(output_dir=tmp_path, n_per_checkpoint=5)
  loop.run(5)
  out = capsys.readouterr().out
  lines = [l for l in out.splitlines() if l]
  assert re.fullmatch(r'Step      1: Total number of trainable weights: \d+',
                      lines[0])
  assert re.fullmatch(r'Step      1: Ran 1 train steps in \d+\.\d\d secs',
                      lines[1])
  assert re.fullmatch(
      r'Step      5: train WeightedCrossEntropy \|  \d\.\d{8}', lines[6])
  assert re.fullmatch(r'Step      5: eval      WeightedAccuracy \|  \d\.\d{8}',
                      lines[8])
  # Checkpoints at step 1 and 5 (native, and Trax's files for the newest);
  # metrics in JSONL and TensorBoard files.
  assert sorted(os.listdir(tmp_path)) == [
      'ckpt_000000001', 'ckpt_000000005', 'eval', 'metrics.jsonl',
      'model.opt_slots0.npy.gz', 'model.pkl.gz', 'model.weights.npy.gz',
      'retrax.lock', 'run_files.json', 'train']
  records = metrics_log.read_jsonl(tmp_path / 'metrics.jsonl')
  jsonl_eval = [(r['step'], r['value']) for r in records
                if r['metric'] == 'metrics/WeightedAccuracy']
  assert jsonl_eval == loop.history.get('eval', 'metrics/WeightedAccuracy')
  (event_file,) = (tmp_path / 'eval').iterdir()
  events = metrics_log.read_events(event_file)
  assert events[0]['file_version'] == 'brain.Event:2'
  tb = [(e['step'], e['scalars'][0][1]) for e in events[1:]
        if e['scalars'][0][0] == 'metrics/WeightedAccuracy']
  np.testing.assert_allclose(tb, jsonl_eval, rtol=1e-6)


def test_eval_model_shares_the_trained_weights():
  loop = resume_worker.make_loop(None)  # Dropout in training, none in eval.
  loop.run(3)
  for a, b in zip(toys.leaves(loop.model.weights),
                  toys.leaves(loop.eval_model.weights)):
    np.testing.assert_array_equal(a, b)
  assert loop.eval_model is not loop.model


class _Recorder(callbacks.TrainingStepCallback):
  calls = []

  def call_at(self, step):
    return step in (2, 3)

  def on_step_begin(self, step):
    self.calls.append(('begin', step, float(np.sum(toys.leaves(
        self._loop.model.weights)[0]))))

  def on_step_end(self, step):
    self.calls.append(('end', step, float(np.sum(toys.leaves(
        self._loop.model.weights)[0]))))


def test_callbacks_run_at_their_steps_with_current_weights():
  _Recorder.calls = []
  loop = _loop(eval_tasks=False, callbacks=[_Recorder])
  loop.run(4)
  assert [(c[0], c[1]) for c in _Recorder.calls] == [
      ('begin', 2), ('end', 2), ('begin', 3), ('end', 3)]
  # The weights change during a step; begin(3) sees end(2)'s weights.
  assert _Recorder.calls[0][2] != _Recorder.calls[1][2]
  assert _Recorder.calls[1][2] == pytest.approx(_Recorder.calls[2][2])


def test_two_tasks_alternate_and_share_the_model():
  tasks = [training.TrainTask(toys.copy_batches(s), toys.WeightedCrossEntropy(),
                              optimizers.Adam(0.05), n_steps_per_checkpoint=None)
           for s in (0, 1)]
  loop = training.Loop(toys.mlp(), tasks, random_seed=0)
  loop.run(6)
  assert [t.n_batches for t in tasks] == [3, 3]


def test_low_and_high_metric_checkpoints(tmp_path):
  loop = _loop(output_dir=tmp_path, n_per_checkpoint=4,
               checkpoint_low_metric='WeightedCrossEntropy',
               checkpoint_high_metric='WeightedAccuracy')
  loop.run(8)
  names = os.listdir(tmp_path)
  assert 'lowest_WeightedCrossEntropy' in names
  assert 'highest_WeightedAccuracy' in names


def test_task_argument_errors():
  with pytest.raises(ValueError, match='Number of metrics'):
    training.EvalTask(toys.copy_batches(0), [toys.WeightedAccuracy()],
                      metric_names=['a', 'b'])
  with pytest.raises(ValueError, match='at least one training task'):
    training.Loop(toys.mlp(), [])
  with pytest.raises(ValueError, match='n_devices'):
    _loop(n_devices=99)


def test_plain_optax_transformations_train_without_a_learning_rate():
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optax.sgd(0.5), n_steps_per_checkpoint=4)
  evals = training.EvalTask(toys.copy_batches(9), [
      toys.WeightedCrossEntropy(), toys.WeightedAccuracy()])
  loop = training.Loop(toys.mlp(), task, eval_tasks=evals, random_seed=0)
  loop.run(8)
  losses = [v for _, v in loop.history.get('eval',
                                           'metrics/WeightedCrossEntropy')]
  assert losses[-1] < losses[0]
  assert 'training/learning_rate' not in loop.history.metrics_for_mode('train')
  with pytest.raises(ValueError, match='no learning_rate hyperparameter'):
    training.Loop(toys.mlp(), training.TrainTask(
        toys.copy_batches(0), toys.WeightedCrossEntropy(), optax.sgd(0.5),
        lr_schedule=lambda step: 0.1))


def test_eval_batches_are_checked_too():
  def evals():
    good = toys.copy_batches(9)
    yield next(good)
    x, t, w = next(good)
    yield x + toys.VOCAB, t, w
  loop = training.Loop(toys.mlp(), training.TrainTask(
      toys.copy_batches(0), toys.WeightedCrossEntropy(), optimizers.SGD(0.1)),
                       eval_tasks=training.EvalTask(
                           evals(), [toys.WeightedCrossEntropy()]),
                       random_seed=0)
  with pytest.raises(BadBatchError, match=r'Step 1: eval task 0 batch: inputs '
                     r'holds the id'):
    loop.run(1)
