"""Bad batches and NaN losses stop training with a clear message, saving nothing broken."""

import os

import numpy as np
import pytest

import supervised_toys as toys
from retrax import layers as tl
from retrax import optimizers
from retrax.checkpoints import load_native
from retrax.supervised import training
from retrax.supervised.batch_checks import BadBatchError
from retrax.supervised.batch_checks import NonFiniteLossError


def _stream(bad_batch, at):
  """Good copy-task batches, with `bad_batch` as training batch number `at`."""
  good = toys.copy_batches(0)
  yield next(good)  # The sample batch.
  n = 0
  while True:
    n += 1
    yield bad_batch if n == at else next(good)


def _run(bad_batch, at=3, output_dir=None, model=None, n_steps=6):
  task = training.TrainTask(_stream(bad_batch, at),
                            toys.WeightedCrossEntropy(), optimizers.Adam(0.05),
                            n_steps_per_checkpoint=2)
  loop = training.Loop(model or toys.mlp(), task, output_dir=output_dir,
                       random_seed=0)
  loop.run(n_steps)
  return loop


def _good():
  return next(toys.copy_batches(5))


@pytest.mark.parametrize('bad, message', [
    ((_good()[0].astype(np.float32),) + _good()[1:],
     r'Step 3: training batch: inputs has dtype float32 but the model was set '
     r'up for int32'),
    ((_good()[0][:, :, None],) + _good()[1:],
     r'Step 3: training batch: inputs has shape \(8, 10, 1\) \(rank 3\)'),
    (_good()[:2], r'Step 3: training batch has 2 items; the model was set up '
                  r'for 3'),
    ([_good()[0]], r'Step 3: training batch has 1 items'),
    ('not a batch', r'Step 3: training batch is a str; expected a tuple'),
    ((_good()[0] + toys.VOCAB,) + _good()[1:],
     r'Step 3: training batch: inputs holds the id \d+, outside \[0, 16\) '
     r'where 16 is the vocabulary size'),
    (_good()[:1] + (_good()[1] - 20, _good()[2]),
     r'Step 3: training batch: targets holds the id -\d+, outside \[0, 16\) '
     r'where 16 is the size of the model\'s output'),
])
def test_bad_batches_name_the_step_and_the_problem(bad, message):
  with pytest.raises(BadBatchError, match=message):
    _run(bad)


def test_shape_errors_inside_the_model_name_the_step():
  model = tl.Serial(tl.Dense(toys.VOCAB), tl.LogSoftmax())
  features = np.ones((toys.BATCH, toys.LENGTH, 4), np.float32)
  targets, weights = _good()[1:]

  def stream():
    yield features, targets, weights
    yield features, targets, weights
    yield features[..., :3], targets, weights  # Fewer features than Dense knows.
  task = training.TrainTask(stream(), toys.WeightedCrossEntropy(),
                            optimizers.SGD(0.1), n_steps_per_checkpoint=None)
  loop = training.Loop(model, task, random_seed=0)
  with pytest.raises(BadBatchError, match=r'Step 2: the training step failed on '
                     r'a batch of signature') as e:
    loop.run(2)
  assert 'Dense' in str(e.value)


class _BuggySGD(optimizers.SGD):
  """An optimizer whose update has a bug (a TypeError inside the step)."""

  def update(self, step, grads, weights, slots, opt_params):
    raise TypeError('unsupported operand type(s) for +: a bug in update')


def test_an_optimizer_bug_in_the_step_is_not_called_a_bad_batch():
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            _BuggySGD(0.1), n_steps_per_checkpoint=None)
  loop = training.Loop(toys.mlp(), task, random_seed=0)
  with pytest.raises(TypeError, match='a bug in update') as e:
    loop.run(1)
  assert not isinstance(e.value, BadBatchError)
  assert any(frame.name == 'update' for frame in e.traceback)


def test_a_layer_bug_in_the_step_keeps_its_traceback():
  def buggy(x):
    raise ValueError('a bug in the layer')
  model = tl.Serial(toys.mlp(), tl.Fn('Buggy', lambda x: x + buggy(x)))
  x, t, w = _good()
  # The sample batch initializes abstractly and meets the bug first.
  with pytest.raises(tl.LayerError, match='a bug in the layer') as e:
    training.Loop(model, training.TrainTask(
        iter([(x, t, w)] * 3), toys.WeightedCrossEntropy(), optimizers.SGD(0.1),
        n_steps_per_checkpoint=None), random_seed=0).run(1)
  assert not isinstance(e.value, BadBatchError)
  assert isinstance(e.value.__cause__, ValueError)


def test_nan_loss_stops_and_saves_nothing_after_it(tmp_path):
  x, t, w = _good()
  nan_batch = (x, t, np.full_like(w, np.nan))
  with pytest.raises(NonFiniteLossError,
                     match=r'Step 5: the training loss of task 0 is nan\. '
                     r'Training stopped .*last checkpoint is from step 4'):
    _run(nan_batch, at=5, output_dir=str(tmp_path), n_steps=8)
  saved = sorted(n for n in os.listdir(tmp_path) if n.startswith('ckpt_'))
  assert saved == ['ckpt_000000001', 'ckpt_000000002', 'ckpt_000000004']
  last = load_native(os.path.join(tmp_path, 'ckpt_000000004'))
  assert all(np.all(np.isfinite(a)) for a in toys.leaves(last.trees['weights']))


def test_nan_on_a_checkpoint_step_is_caught_before_saving(tmp_path):
  x, t, w = _good()
  with pytest.raises(NonFiniteLossError, match='Step 4: '):
    _run((x, t, np.full_like(w, np.inf)), at=4, output_dir=str(tmp_path))
  saved = sorted(n for n in os.listdir(tmp_path) if n.startswith('ckpt_'))
  assert saved == ['ckpt_000000001', 'ckpt_000000002']
