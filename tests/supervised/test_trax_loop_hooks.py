"""Trax's Loop behaviours: save_checkpoint as a hook with Trax's names, the
files kept per step, training/loss in the history; trainer._history; Trax's
body-and-tail schedules; the trax.tf_numpy path; a subclass driving the loop
with Trax's underscore methods."""

import collections
import functools
import glob
import math
import os
import time

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import optimizers
from retrax.supervised import checkpointing
from retrax.supervised import lr_schedules
from retrax.supervised import metrics_log
from retrax.supervised import training


def _linear_data():
  x = np.arange(8, dtype=np.float32).reshape((8, 1))
  batch = (x, np.full((8, 1), np.pi, np.float32), np.ones((8, 1), np.float32))
  while True:
    yield batch


def _loop(output_dir=None, **kwargs):
  task = training.TrainTask(_linear_data(), tl.L2Loss(), optimizers.SGD(0.01))
  eval_task = training.EvalTask(_linear_data(), [tl.L2Loss()],
                                metric_names=['l2'])
  return training.Loop(tl.Serial(tl.Dense(1)), [task], eval_tasks=[eval_task],
                       output_dir=output_dir, random_seed=0, **kwargs)


class RecordingLoop(training.Loop):
  """A Trax-style subclass: overrides save_checkpoint(basename)."""

  calls = None

  def save_checkpoint(self, basename):
    self.calls.append((self.step, basename))


def test_run_calls_save_checkpoint_with_trax_names(tmp_path):
  RecordingLoop.calls = []
  task = training.TrainTask(_linear_data(), tl.L2Loss(), optimizers.SGD(0.01))
  eval_task = training.EvalTask(_linear_data(), [tl.L2Loss()],
                                metric_names=['l2'])
  loop = RecordingLoop(
      tl.Serial(tl.Dense(1)), [task], eval_tasks=[eval_task],
      output_dir=str(tmp_path), random_seed=0,
      eval_at=lambda s: s % 2 == 0, checkpoint_at=lambda s: s % 2 == 0,
      permanent_checkpoint_at=lambda s: s == 4,
      checkpoint_low_metric='l2', checkpoint_high_metric='l2')
  loop.run(5)
  # The L2 loss falls at every eval: a new low each time, a high only at 2.
  assert RecordingLoop.calls == [
      (2, 'model'), (2, 'lowest_l2'), (2, 'highest_l2'),
      (4, 'model'), (4, 'model_4'), (4, 'lowest_l2'),
      (5, 'model')]  # The final step is saved too.


def test_final_step_scheduled_by_checkpoint_at_is_saved_once():
  # The override saves nothing; the final step's hook call still counts.
  RecordingLoop.calls = []
  task = training.TrainTask(_linear_data(), tl.L2Loss(), optimizers.SGD(0.01))
  loop = RecordingLoop(tl.Serial(tl.Dense(1)), [task], random_seed=0,
                       checkpoint_at=lambda s: s % 2 == 0)
  loop.run(6)
  assert RecordingLoop.calls == [(2, 'model'), (4, 'model'), (6, 'model')]
  loop.run(1)
  assert RecordingLoop.calls[3:] == [(7, 'model')]


def _trax_files(directory):
  return sorted(f for f in os.listdir(directory) if f.endswith('.pkl.gz'))


def test_files_and_steps_kept_follow_trax(tmp_path):
  loop = _loop(str(tmp_path), checkpoint_at=lambda s: s % 2 == 0,
               permanent_checkpoint_at=lambda s: s in (1, 4),
               options=training.LoopOptions(keep_checkpoints=2))
  loop.run(6)
  assert _trax_files(tmp_path) == ['model.pkl.gz', 'model_1.pkl.gz',
                                   'model_4.pkl.gz']
  # model.pkl.gz holds the newest step; the native rolling ones rotate.
  native = sorted(f for f in os.listdir(tmp_path) if os.path.isdir(
      tmp_path / f) and f.startswith(('ckpt_', 'model_')))
  out = str(tmp_path)
  assert native == sorted(os.path.basename(p) for p in (
      checkpointing.rolling_path(out, 4), checkpointing.rolling_path(out, 6),
      checkpointing.permanent_path(out, 1),
      checkpointing.permanent_path(out, 4)))
  assert checkpointing.read_trax_checkpoint(
      str(tmp_path / 'model.pkl.gz'))['step'] == 6
  # A named Trax checkpoint, loaded by name as in Trax.
  loop.save_checkpoint('model')  # Step 6 again: the rolling one, replaced.
  loop2 = _loop(str(tmp_path))
  assert loop2.step == 6
  loop2.load_checkpoint(str(tmp_path), 'model_4')
  assert loop2.step == 4


def test_history_has_training_loss_equal_to_the_mean_loss():
  loop = _loop(eval_at=lambda s: s in (1, 4))
  loop.run(4)
  history = loop.history
  assert sorted(history.metrics_for_mode('train')) == [
      'metrics/L2Loss', 'training/gradients_l2', 'training/learning_rate',
      'training/loss', 'training/steps per second', 'training/weights_l2']
  mean = history.get('train', 'metrics/L2Loss')
  loss = history.get('train', 'training/loss')
  assert [s for s, _ in loss] == [s for s, _ in mean] == [1, 4]
  np.testing.assert_allclose([v for _, v in loss], [v for _, v in mean],
                             rtol=1e-6)


def test_legacy_trainer_exposes_history_as_trax_does(tmp_path):
  from retrax.data import inputs as inputs_lib
  from retrax.supervised import trainer_lib

  def stream(n_devices):
    del n_devices
    rng = np.random.RandomState(0)
    while True:
      yield (rng.randint(0, 4, (4, 3)).astype(np.int32),
             rng.randint(0, 4, (4, 3)).astype(np.int32),
             np.ones((4, 3), np.float32))
  trainer = trainer_lib.Trainer(
      model=lambda mode: tl.Serial(tl.Embedding(4, 8), tl.Dense(4),
                                   tl.LogSoftmax()),
      loss_fn=tl.WeightedCategoryCrossEntropy(), optimizer=optimizers.Adam,
      lr_schedule=lr_schedules.constant(0.01),
      inputs=inputs_lib.Inputs(stream), output_dir=str(tmp_path))
  trainer.train_epoch(2, 1)
  assert trainer._history is trainer.history
  assert trainer.state.history is trainer.history
  assert trainer.history.get('eval', 'metrics/loss')[-1][0] == 2


def test_body_and_tail_with_cosine_sawtooth_is_the_closed_form():
  schedule = lr_schedules.BodyAndTail(
      0.3, body_start=10, tail_start=20,
      tail_fn=lr_schedules.CosineSawtoothTail(40, min_value=0.1))
  assert schedule(5) == pytest.approx(0.15)  # Linear warm-up from (0, 0).
  assert schedule(15) == 0.3
  for step in (20, 25, 40, 59, 60, 75):
    phase = ((step - 20) % 40) / 40
    want = 0.1 + 0.2 * 0.5 * (1 + math.cos(math.pi * phase))
    assert schedule(step) == pytest.approx(want, rel=1e-12)
  assert lr_schedules._BodyAndTail is lr_schedules.BodyAndTail
  with pytest.raises(ValueError, match='tail_fn is None'):
    lr_schedules.BodyAndTail(0.3, tail_start=3)


def test_tf_numpy_path_runs_on_jax():
  from retrax.tf_numpy import extensions
  from retrax.tf_numpy import numpy as tf_np
  assert extensions.tpu_devices() == [d for d in jax.devices()
                                      if d.platform == 'tpu']
  np.testing.assert_array_equal(tf_np.cumsum(tf_np.array([1, 2, 3])),
                                [1, 3, 6])
  old = tf_np.is_allow_float64()
  try:
    tf_np.set_allow_float64(False)
    with pytest.warns(UserWarning, match='float64 .* not available'):
      assert tf_np.array(1.0, dtype='float64').dtype == np.float32
    tf_np.set_allow_float64(True)
    assert tf_np.array(1.0, dtype='float64').dtype == np.float64
  finally:
    tf_np.set_allow_float64(old)


class TraxStyleLoop(training.Loop):
  """Rewrites `run` from Trax's own Loop internals, as Trax notebooks do
  (trax/examples/earlystopping.ipynb): low/high checkpoints aside."""

  def run(self, n_steps=1):
    self.events = []
    with self._open_summary_writers() as (train_writers, eval_writers):
      self.writers = (train_writers, eval_writers)
      loss_acc, step_acc, start_time = 0.0, 0, time.time()
      metrics_acc = collections.defaultdict(float)
      for _ in range(n_steps):
        prev_task_index = self._which_task(self._step)
        self._step += 1
        task_index = self._which_task(self._step)
        loss, metrics = self._run_one_step(task_index,
                                           task_index != prev_task_index)
        metrics, loss = fastmath.nested_map(
            functools.partial(tl.mean_or_pmean, self._n_devices),
            (metrics, loss))
        loss_acc += loss
        step_acc += 1
        self._log_step('Loss: %.4f' % loss, stdout=False)
        for name, value in metrics.items():
          metrics_acc[name] += value
        if self._checkpoint_at(self.step):
          self.save_checkpoint('model')
        if self._eval_at(self.step):
          self._log_training_progress(
              task=self._tasks[task_index], total_loss=loss_acc,
              n_steps=step_acc, elapsed_time=time.time() - start_time,
              optimizer_metrics=metrics_acc,
              summary_writer=train_writers[task_index])
          self.run_evals(eval_writers)
          loss_acc, step_acc, start_time = 0.0, 0, time.time()
          metrics_acc = collections.defaultdict(float)
        self.events.append((self.step, self._at_lowest(), self._at_highest()))
    self._eval_model.weights = self._model.weights


class StepRecorder:
  """A Trax callback (any class taking the loop) recording its calls."""

  calls = []

  def __init__(self, loop):
    self._loop = loop

  def call_at(self, step):
    return step % 2 == 0

  def on_step_begin(self, step):
    self.calls.append(('begin', step))

  def on_step_end(self, step):
    self.calls.append(('end', step))


def test_subclass_runs_with_trax_loop_internals(tmp_path):
  kwargs = dict(eval_at=lambda s: s in (1, 3, 4),
                checkpoint_at=lambda s: s == 4, checkpoint_low_metric='l2',
                checkpoint_high_metric='l2')
  StepRecorder.calls = []
  ours = TraxStyleLoop(
      tl.Serial(tl.Dense(1)),
      [training.TrainTask(_linear_data(), tl.L2Loss(), optimizers.SGD(0.01))],
      eval_tasks=[training.EvalTask(_linear_data(), [tl.L2Loss()],
                                    metric_names=['l2'])],
      output_dir=str(tmp_path), random_seed=0, callbacks=[StepRecorder],
      **kwargs)
  assert ours._output_dir == str(tmp_path)
  assert ours._use_memory_efficient_trainer is False
  ours.run(4)
  plain = _loop(**kwargs)
  plain.run(4)
  # The same training as Loop.run: steps, weights, eval and train metrics.
  assert ours.step == 4
  np.testing.assert_allclose(ours.model.weights[0][0], plain.model.weights[0][0],
                             rtol=1e-6)
  for mode, metric in (('eval', 'metrics/l2'), ('train', 'metrics/L2Loss'),
                       ('train', 'training/gradients_l2')):
    got, want = ours.history.get(mode, metric), plain.history.get(mode, metric)
    assert [s for s, _ in got] == [s for s, _ in want] == [1, 3, 4]
    np.testing.assert_allclose([v for _, v in got], [v for _, v in want],
                               rtol=1e-5)
  # The eval L2 loss falls at every eval: a new low each time.
  assert ours.events == [(1, True, True), (2, True, True), (3, True, False),
                         (4, True, False)]
  assert StepRecorder.calls == [('begin', 2), ('end', 2), ('begin', 4),
                                ('end', 4)]
  assert os.path.exists(tmp_path / 'model.pkl.gz')
  # One TensorBoard writer per task, each holding its metrics.
  train_writers, eval_writers = ours.writers
  assert len(train_writers) == len(eval_writers) == 1
  tags = {tag for kind in ('train', 'eval')
          for path in glob.glob(str(tmp_path / kind / 'events.*'))
          for event in metrics_log.read_events(path)
          for tag, _ in event['scalars']}
  assert {'metrics/L2Loss', 'metrics/l2', 'training/learning_rate'} <= tags


def test_summary_writers_are_nones_without_output_dir():
  loop = _loop()
  with loop._open_summary_writers() as (train_writers, eval_writers):
    assert train_writers == [None] and eval_writers == [None]
