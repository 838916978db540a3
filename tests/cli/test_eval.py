"""`retrax eval RUN` scores the run's saved weights (not a re-initialised model)."""

import re

import pytest

from retrax.app import cli
from retrax.runs import config as config_lib
from retrax.app import jobs
from retrax.app import run_commands

# A TransformerLM on a 3-symbol duplication task: perfect after ~100 steps,
# while a freshly initialised model scores about 1/3.
_SETTINGS = dict(model='TransformerLM', vocab_size=4, length=8, d_model=32,
                 d_ff=64, n_layers=1, n_heads=2, batch_size=32, steps=100,
                 eval_every=50, checkpoint_every=50, warmup_steps=10,
                 learning_rate=0.01, n_samples=0)


@pytest.fixture(scope='module')
def trained_run(tmp_path_factory):
  out = tmp_path_factory.mktemp('eval_run') / 'run'
  config = config_lib.RunConfig().replace(output_dir=str(out), **_SETTINGS)
  loop = jobs.train(config, quiet=True)
  history = loop.history.get('eval', 'metrics/WeightedCategoryAccuracy')
  assert history[-1][0] == config.train.steps
  return config, float(history[-1][1])


def test_evaluate_returns_the_training_loops_accuracy(trained_run):
  config, train_acc = trained_run
  assert train_acc > 0.9  # the run has learned the task
  first = run_commands.evaluate(config.train.output_dir, n_batches=4)
  second = run_commands.evaluate(config.train.output_dir, n_batches=4)
  assert set(first) == {'WeightedCategoryCrossEntropy',
                        'WeightedCategoryAccuracy'}
  # Two samples of the eval stream: `evaluate` reads its first 4 batches,
  # the loop's last eval 4 after its earlier evals' (0.979 against 0.992
  # under another XLA:CPU code generation of the same run): near, not equal.
  assert abs(first['WeightedCategoryAccuracy'] - train_acc) < 0.03
  assert abs(second['WeightedCategoryAccuracy'] - train_acc) < 0.03
  assert first == second


def test_eval_command_prints_the_same_numbers(trained_run, capsys):
  config, train_acc = trained_run
  expected = run_commands.evaluate(config.train.output_dir, n_batches=3)
  for _ in range(2):
    assert cli.main(['eval', config.train.output_dir, '--batches', '3']) == 0
    text = capsys.readouterr().out
    acc = float(re.search(r'WeightedCategoryAccuracy ([0-9.]+)', text)[1])
    loss = float(re.search(r'WeightedCategoryCrossEntropy ([0-9.]+)',
                           text)[1])
    assert abs(acc - train_acc) < 0.03
    assert acc == pytest.approx(expected['WeightedCategoryAccuracy'],
                                abs=1e-6)
    assert loss == pytest.approx(expected['WeightedCategoryCrossEntropy'],
                                 abs=1e-6)
