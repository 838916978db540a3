"""The blog's tiny ReformerLM learns the copy in 1,500 steps, through Trainer and Loop.

The blog's weighted accuracy cannot pass 5/6: its weights cover the last
symbol of the first `w` (position 4 of `0 w 0 w`, length 10), which nothing
before it predicts. On the five positions that can be predicted (the second
`0` and the copied `w`), the trained model must be right >= 99% of the time.
"""

import numpy as np
import pytest
from retrax import layers as tl
from retrax import lr
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.data.inputs import Inputs
from retrax.supervised import trainer_lib
from retrax.supervised import training

BATCH, VOCAB, LENGTH, STEPS = 16, 32, 10, 1500
PREDICTABLE = slice(LENGTH // 2, LENGTH)  # The second 0 and the copied w.


def copy_task(seed):
  """The blog's generator (0 w 0 w; weights on positions 4..9), seeded."""
  rng = np.random.RandomState(seed)
  w_length = LENGTH // 2 - 1
  while True:
    w = rng.randint(1, VOCAB - 1, size=(BATCH, w_length))
    zero = np.zeros((BATCH, 1), np.int32)
    x = np.concatenate([zero, w, zero, w], axis=1).astype(np.int32)
    weights = np.concatenate([np.zeros((BATCH, w_length)),
                              np.ones((BATCH, w_length + 2))], axis=1)
    yield x, x, weights.astype(np.float32)


def tiny_reformer_lm(mode):
  return tl.Serial(models.ReformerLM(d_model=32, d_ff=128, n_layers=2,
                                     vocab_size=VOCAB, mode=mode),
                   tl.LogSoftmax())


def copy_accuracy(weights):
  """Accuracy of an eval-mode model with `weights` on the predictable positions."""
  model = tiny_reformer_lm('eval')
  model.init(shapes.ShapeDtype((BATCH, LENGTH), np.int32))
  model.weights = weights
  batches = [next(copy_task(seed))[0] for seed in range(100, 108)]
  right = total = 0
  for x in batches:
    predicted = np.argmax(np.asarray(model(x)), axis=-1)
    right += int(np.sum(predicted[:, PREDICTABLE] == x[:, PREDICTABLE]))
    total += x[:, PREDICTABLE].size
  return right / total


@pytest.mark.slow
def test_blog_trainer_learns_the_copy():
  inputs = Inputs(lambda _: copy_task(0))
  trainer = trainer_lib.Trainer(
      model=tiny_reformer_lm, loss_fn=tl.CrossEntropyLoss,
      optimizer=optimizers.Adam, lr_schedule=lr.MultifactorSchedule,
      inputs=inputs, output_dir=None, has_weights=True, random_seed=0)
  for _ in range(3):
    trainer.train_epoch(STEPS // 3, 1)
  assert trainer.step == STEPS
  assert copy_accuracy(trainer.model_weights) >= 0.99


@pytest.mark.slow
def test_blog_config_through_loop_learns_the_copy():
  task = training.TrainTask(copy_task(0), tl.CrossEntropyLoss(),
                            optimizers.Adam(), lr_schedule=lr.multifactor(),
                            n_steps_per_checkpoint=STEPS)
  loop = training.Loop(tiny_reformer_lm('train'), task, random_seed=0)
  loop.run(STEPS)
  assert copy_accuracy(loop.model.weights) >= 0.99
