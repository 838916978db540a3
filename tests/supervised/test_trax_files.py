"""Loop and Trainer write Trax's checkpoint files; they read back and resume.

The round trip of issue "checkpoints both ways": train with retrax -> Trax's
`model.pkl.gz` + `model.weights.npy.gz` + `model.opt_slots0.npy.gz` -> read
with the restricted loader -> identical weights, state and optimizer slots ->
a new loop resumes from those files alone.
"""

import gzip
import os
import shutil

import numpy as np

import supervised_toys as toys
from retrax import checkpoints
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax import shapes
from retrax.checkpoints import convert
from retrax.supervised import training
from tests.checkpoints.checkpoint_testlib import pickle_globals
from tests.checkpoints.checkpoint_testlib import TRAX_IMPORTABLE_GLOBALS


def _model():
  """Embedding -> BatchNorm (running statistics: non-empty state) -> Dense."""
  return tl.Serial(tl.Embedding(toys.VOCAB, 8), tl.BatchNorm(axis=(0, 1)),
                   tl.Relu(), tl.Dense(toys.VOCAB), tl.LogSoftmax())


def _same_batch():
  batch = next(toys.copy_batches(0))
  while True:
    yield batch


def _loop(output_dir, n_per_checkpoint=3, **kwargs):
  task = training.TrainTask(_same_batch(), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.01),
                            n_steps_per_checkpoint=n_per_checkpoint,
                            n_steps_per_permanent_checkpoint=6)
  evals = training.EvalTask(_same_batch(), [toys.WeightedAccuracy()],
                            n_eval_batches=1)
  return training.Loop(_model(), task, eval_tasks=evals,
                       output_dir=output_dir, random_seed=0, **kwargs)


def _assert_leaves_equal(flat, tree):
  expected = toys.leaves(tree)
  assert len(flat) == len(expected)
  for a, b in zip(flat, expected):
    np.testing.assert_array_equal(np.asarray(a), b)


def test_loop_writes_trax_files_that_read_back_and_resume(tmp_path):
  out = tmp_path / 'run'
  loop = _loop(str(out))
  loop.run(6)
  names = set(os.listdir(out))
  # Trax's names: the newest checkpoint as `model`, permanent ones `model_<step>`.
  assert {'model.pkl.gz', 'model.weights.npy.gz', 'model.opt_slots0.npy.gz',
          'model_6.pkl.gz', 'model_1.pkl.gz', 'ckpt_000000006'} <= names
  assert not any(n.endswith('.tmp') or n.startswith('.') for n in names)

  # Read back with the restricted loader: the loop's exact arrays.
  d = checkpoints.read_trax_checkpoint(str(out / 'model.pkl.gz'))
  assert d['step'] == 6
  _assert_leaves_equal(d['flat_weights'], loop.model.weights)
  assert toys.leaves(loop.model.state)  # BatchNorm's statistics.
  _assert_leaves_equal(d['flat_state'], loop.model.state)
  slots = [s for s in checkpoints.tree_leaves(loop.slots) if s is not None]
  assert len(d['slots']) == 1 and len(d['slots'][0]) == len(slots) > 0
  for a, b in zip(d['slots'][0], slots):
    np.testing.assert_array_equal(a, np.asarray(b))
  history = d['history']['eval']['metrics/WeightedAccuracy']
  assert [s for s, _ in history] == [1, 3, 6]
  assert history == loop.history.get('eval', 'metrics/WeightedAccuracy')

  # Only allowed globals, and nothing of retrax, in the pickle.
  with gzip.open(out / 'model.pkl.gz', 'rb') as f:
    found = pickle_globals(f.read())
  assert found <= TRAX_IMPORTABLE_GLOBALS, found - TRAX_IMPORTABLE_GLOBALS

  # Resume from Trax's files alone: same step, weights, state and slots; the
  # next steps equal those of the run that goes on (no dropout: the PRNG key,
  # which Trax's files do not hold, does not matter).
  trax_only = tmp_path / 'trax_only'
  trax_only.mkdir()
  for name in ('model.pkl.gz', 'model.weights.npy.gz',
               'model.opt_slots0.npy.gz'):
    shutil.copy(out / name, trax_only / name)
  resumed = _loop(str(trax_only),
                  options=training.LoopOptions(write_trax_files=False))
  assert resumed.step == 6
  _assert_leaves_equal(toys.leaves(resumed.model.weights), loop.model.weights)
  _assert_leaves_equal(toys.leaves(resumed.model.state), loop.model.state)
  loop.run(2)
  resumed.run(2)
  _assert_leaves_equal(toys.leaves(resumed.model.weights), loop.model.weights)
  _assert_leaves_equal(toys.leaves(resumed.slots), loop.slots)
  name = 'metrics/WeightedCrossEntropy'
  assert (resumed.history.get('train', name)[-1] ==
          loop.history.get('train', name)[-1])
  assert not any(n.endswith('.pkl.gz') for n in os.listdir(trax_only)
                 if n != 'model.pkl.gz')


def test_convert_native_checkpoint_gives_the_files_the_loop_wrote(tmp_path):
  loop = _loop(str(tmp_path / 'run'))
  loop.run(3)
  converted = convert.convert(tmp_path / 'run' / 'ckpt_000000003',
                              tmp_path / 'converted.pkl.gz', to='trax')
  a = checkpoints.read_trax_checkpoint(converted)
  b = checkpoints.read_trax_checkpoint(str(tmp_path / 'run' / 'model.pkl.gz'))
  assert a['step'] == b['step'] == 3
  for key in ('flat_weights', 'flat_state', 'flat_eval_state'):
    assert len(a[key]) == len(b[key])
    for x, y in zip(a[key], b[key]):
      np.testing.assert_array_equal(x, y)
  assert len(a['slots'][0]) == len(b['slots'][0])
  for x, y in zip(a['slots'][0], b['slots'][0]):
    np.testing.assert_array_equal(x, y)


def test_write_trax_files_false_writes_native_only(tmp_path):
  loop = _loop(str(tmp_path),
               options=training.LoopOptions(write_trax_files=False))
  loop.run(3)
  names = os.listdir(tmp_path)
  assert 'ckpt_000000003' in names
  assert not [n for n in names if n.endswith('.gz')]


def test_blog_style_predict_model_loads_a_loop_run(tmp_path):
  """The blog's last part: predict-mode model, init_from_file(weights_only=True)."""
  def lm(mode):
    return models.TransformerLM(toys.VOCAB, d_model=16, d_ff=32, n_layers=1,
                                n_heads=2, max_len=32, dropout=0.0, mode=mode)
  task = training.TrainTask(toys.copy_batches(0), tl.CrossEntropyLossWithLogSoftmax(),
                            optimizers.Adam(0.01), n_steps_per_checkpoint=2)
  loop = training.Loop(lm('train'), task, output_dir=str(tmp_path),
                       random_seed=0)
  loop.run(2)
  model = lm('predict')
  model.init_from_file(os.path.join(tmp_path, 'model.pkl.gz'),
                       weights_only=True,
                       input_signature=shapes.ShapeDtype((1, 1), np.int32))
  _assert_leaves_equal(toys.leaves(model.weights), loop.model.weights)
  # Token by token, as the blog samples (each step feeds the previous token;
  # eval mode shifts right instead), equals the eval-mode model.
  tokens = next(toys.copy_batches(5))[0][:1]
  fed = np.pad(tokens, ((0, 0), (1, 0)))
  step_logits = [np.asarray(model(fed[:, i:i + 1]))[:, 0]
                 for i in range(tokens.shape[1])]
  evaluator = lm('eval')
  evaluator.init(shapes.signature(tokens))
  evaluator.weights = loop.model.weights
  np.testing.assert_allclose(np.stack(step_logits, 1),
                             np.asarray(evaluator(tokens)), atol=1e-4)
