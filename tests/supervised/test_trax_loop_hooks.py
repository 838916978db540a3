"""Trax's Loop behaviours: save_checkpoint as a hook with Trax's names, the
files kept per step, training/loss in the history; trainer._history; Trax's
body-and-tail schedules; the trax.tf_numpy path."""

import math
import os

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import optimizers
from retrax.supervised import checkpointing
from retrax.supervised import lr_schedules
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
               keep_checkpoints=2)
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
