"""The once-per-process warning for raw logits fed to log-probability losses."""

import warnings

import jax
import numpy as np
import pytest

import retrax as trax
from retrax import layers as tl
from retrax import optimizers
from retrax import shapes
from retrax.layers import tutorial_checks
from retrax.supervised import training

Warn = tutorial_checks.LogProbabilitiesWarning


@pytest.fixture(autouse=True)
def _fresh():
  tutorial_checks.reset()
  yield
  tutorial_checks.reset()


def _recorded(fn):
  """Runs fn, returns the LogProbabilitiesWarnings it issued (all others pass)."""
  with warnings.catch_warnings(record=True) as rec:
    warnings.simplefilter('always')
    fn()
    jax.effects_barrier()
  return [r for r in rec if issubclass(r.category, Warn)]


def _data(seed=0, shape=(3, 6, 9)):
  rng = np.random.default_rng(seed)
  logits = (3 * rng.normal(size=shape)).astype(np.float32)
  targets = rng.integers(0, shape[-1], shape[:-1]).astype(np.int32)
  weights = np.ones(shape[:-1], np.float32)
  return logits, targets, weights


def _layer(make, batch):
  layer = make()
  layer.init(shapes.signature(batch))
  return layer


@pytest.mark.parametrize('make', [tl.CrossEntropyLoss, tl.CrossEntropySum])
def test_eager_raw_logits_warn_once_naming_layer_and_fix(make):
  logits, t, w = _data()
  layer = _layer(make, (logits, t, w))
  rec = _recorded(lambda: [layer((logits, t, w)) for _ in range(3)])
  assert len(rec) == 1
  msg = str(rec[0].message)
  assert make.__name__ in msg
  assert 'tl.CrossEntropyLossWithLogSoftmax()' in msg
  assert 'tl.LogSoftmax()' in msg
  # The reported deviation is numpy's mean |logsumexp| of the outputs.
  lse = np.log(np.exp(logits.astype(np.float64)).sum(-1))
  assert f'{np.mean(np.abs(lse)):.3g}' in msg
  assert tutorial_checks.has_warned()


def test_correct_programs_stay_silent():
  logits, t, w = _data()
  log_probs = np.asarray(jax.nn.log_softmax(logits))
  cases = [(tl.CrossEntropyLoss, log_probs),
           (tl.CrossEntropySum, log_probs),
           (tl.CrossEntropyLossWithLogSoftmax, logits),
           (tl.WeightedCategoryCrossEntropy, logits),
           (tl.CrossEntropyLoss, log_probs.astype(jax.numpy.bfloat16))]
  for make, out in cases:
    layer = _layer(make, (out, t, w))
    assert not _recorded(lambda layer=layer, out=out: layer((out, t, w))), (
        make.__name__)
  assert not tutorial_checks.has_warned()


def test_jitted_and_differentiated_check_calls_back_only_when_wrong():
  logits, t, w = _data()
  layer = _layer(tl.CrossEntropyLoss, (logits, t, w))

  def loss(x):
    return layer.pure_fn((x, t, w), layer.weights, layer.state, layer.rng)[0]

  step = jax.jit(jax.value_and_grad(loss))
  good = np.asarray(jax.nn.log_softmax(logits))
  assert not _recorded(lambda: step(good)[1].block_until_ready())
  rec = _recorded(lambda: [step(logits)[1].block_until_ready()
                           for _ in range(2)])
  assert len(rec) == 1
  # The gradient is untouched by the check: d/dx of -mean(x[target]).
  onehot = np.eye(9)[t] / t.size
  np.testing.assert_allclose(step(logits)[1], -onehot, atol=1e-7)


def test_warnings_as_errors_under_jit_are_raised_on_the_host():
  logits, t, w = _data()
  layer = _layer(tl.CrossEntropyLoss, (logits, t, w))
  f = jax.jit(lambda x: layer.pure_fn((x, t, w), layer.weights, layer.state,
                                      layer.rng)[0])
  with warnings.catch_warnings():
    warnings.simplefilter('error', Warn)
    f(logits).block_until_ready()  # The callback keeps the error for the host.
    jax.effects_barrier()
    with pytest.raises(Warn, match='CrossEntropyLoss expects log-prob'):
      tutorial_checks.raise_pending()
  tutorial_checks.raise_pending()  # Raised once only.


def test_negative_loss_value_check():
  rec = _recorded(lambda: tutorial_checks.check_loss_value(
      'WeightedCategoryCrossEntropy', -5.0))
  assert not rec  # Not a log-probability loss: no claim about its range.
  assert not _recorded(lambda: tutorial_checks.check_loss_value(
      'CrossEntropyLoss', 0.3))
  rec = _recorded(lambda: tutorial_checks.check_loss_value(
      'CrossEntropyLoss', -13200.0))
  assert len(rec) == 1 and 'negative loss (-1.32e+04)' in str(rec[0].message)


def _copy_batches(vocab=12, length=8, batch=4):
  rng = np.random.default_rng(0)
  while True:
    w = rng.integers(1, vocab, (batch, length // 2 - 1))
    z = np.zeros((batch, 1), np.int64)
    x = np.concatenate([z, w, z, w], 1).astype(np.int32)
    weights = np.concatenate([np.zeros((batch, length // 2)),
                              np.ones((batch, length // 2))], 1)
    yield x, x, weights.astype(np.float32)


def _quickstart_loop(tmp_path, with_log_softmax):
  """Trax 1.3's quick-start shape: TransformerLM -> CrossEntropyLoss in a Loop."""
  lm = trax.models.TransformerLM(vocab_size=12, d_model=16, d_ff=32,
                                 n_layers=1, n_heads=2, max_len=16)
  model = tl.Serial(lm, tl.LogSoftmax()) if with_log_softmax else lm
  task = training.TrainTask(_copy_batches(), tl.CrossEntropyLoss(),
                            optimizers.Adam(0.01), n_steps_per_checkpoint=5)
  evals = training.EvalTask(_copy_batches(), [tl.CrossEntropyLoss(),
                                              tl.Accuracy()])
  return training.Loop(model, task, eval_tasks=[evals],
                       output_dir=str(tmp_path))


def test_transformer_quickstart_pattern_warns_in_the_loop(tmp_path):
  loop = _quickstart_loop(tmp_path / 'raw', with_log_softmax=False)
  rec = _recorded(lambda: loop.run(5))
  assert len(rec) == 1
  assert 'CrossEntropyLoss expects log-probabilities' in str(rec[0].message)


def test_transformer_quickstart_with_log_softmax_is_silent(tmp_path):
  loop = _quickstart_loop(tmp_path / 'ok', with_log_softmax=True)
  assert not _recorded(lambda: loop.run(5))


def test_loop_warns_on_negative_loss_without_the_layer_check(tmp_path):
  # A hand-made loss named like Trax's, outside the layer check: the Loop's
  # read-back of the loss value still catches a negative cross-entropy.
  def neg(model_output, targets, weights):
    del targets, weights
    return -1.0 - jax.numpy.mean(model_output ** 2)
  task = training.TrainTask(_copy_batches(), tl.Fn('CrossEntropyLoss', neg),
                            optimizers.SGD(0.0))
  model = tl.Serial(tl.Embedding(12, 4), tl.Dense(12))
  loop = training.Loop(model, task)
  rec = _recorded(lambda: loop.run(2))
  assert len(rec) == 1 and 'negative loss' in str(rec[0].message)


def test_blog_trainer_without_log_softmax_warns(tmp_path):
  """The seed blog's Trainer: ReformerLM (no final LogSoftmax) + CrossEntropyLoss."""
  inputs = trax.supervised.Inputs(lambda _: _copy_batches(vocab=32, length=10))

  def tiny_reformer_lm(mode):
    return trax.models.ReformerLM(d_model=32, d_ff=128, n_layers=2,
                                  vocab_size=32, mode=mode)

  def run():
    trainer = trax.supervised.Trainer(
        model=tiny_reformer_lm, loss_fn=tl.CrossEntropyLoss,
        optimizer=trax.optimizers.Adam, lr_schedule=trax.lr.MultifactorSchedule,
        inputs=inputs, output_dir=str(tmp_path), has_weights=True)
    trainer.train_epoch(3, 1)

  rec = _recorded(run)
  assert len(rec) == 1
  assert 'CrossEntropyLoss' in str(rec[0].message)


def _line_of(fragment):
  """The line number in this file of the line ending in `fragment`."""
  with open(__file__, encoding='utf-8') as f:
    (number,) = [i for i, line in enumerate(f, 1)
                 if line.rstrip().endswith(fragment)]
  return number


def test_warning_names_the_users_line_not_retrax(tmp_path):
  logits, t, w = _data()
  layer = _layer(tl.CrossEntropyLoss, (logits, t, w))
  (eager,) = _recorded(lambda: layer((logits, t, w)))  # EAGER-CALL
  assert (eager.filename, eager.lineno) == (__file__, _line_of('# EAGER-CALL'))
  tutorial_checks.reset()
  f = jax.jit(lambda x: layer.pure_fn(  # JITTED-LOSS
      (x, t, w), layer.weights, layer.state, layer.rng)[0])
  (jitted,) = _recorded(lambda: f(logits).block_until_ready())
  assert (jitted.filename, jitted.lineno) == (__file__,
                                              _line_of('# JITTED-LOSS'))
  tutorial_checks.reset()
  loop = _quickstart_loop(tmp_path, with_log_softmax=False)
  (in_loop,) = _recorded(lambda: loop.run(2))  # LOOP-RUN
  assert (in_loop.filename, in_loop.lineno) == (__file__, _line_of('# LOOP-RUN'))
  tutorial_checks.reset()
  (value,) = _recorded(lambda: tutorial_checks.check_loss_value(  # VALUE
      'CrossEntropyLoss', -1.0))
  assert (value.filename, value.lineno) == (__file__, _line_of('# VALUE'))
