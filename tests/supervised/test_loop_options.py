"""`LoopOptions`: retrax's own `Loop` options in one frozen, checked object."""

import dataclasses

import jax
import numpy as np
import pytest

import supervised_toys as toys
from retrax import optimizers
from retrax.errors import UserInputError
from retrax.supervised import training
from retrax.supervised.training import LoopOptions
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError


def _loop(**kwargs):
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05))
  return training.Loop(toys.mlp(), task, random_seed=0, **kwargs)


def test_defaults_are_the_documented_ones():
  assert dataclasses.asdict(LoopOptions()) == {
      'keep_checkpoints': 3, 'progress_bar': None, 'check_batches': True,
      'write_trax_files': True, 'opt_step_offset': 0, 'checkpoint_kind': 'Loop',
      'log_every': None, 'report_to': None, 'report_config': None,
      'mesh': None}
  doc = LoopOptions.__doc__
  assert all(f'{f.name}:' in doc for f in dataclasses.fields(LoopOptions))
  assert _loop().options == LoopOptions()


def test_options_are_frozen():
  options = LoopOptions(log_every=5)
  with pytest.raises(dataclasses.FrozenInstanceError):
    options.log_every = 6  # type: ignore[misc]
  assert dataclasses.replace(options, log_every=6).log_every == 6
  assert options == LoopOptions(log_every=5) != LoopOptions()


@pytest.mark.parametrize('field, value, error, message', [
    ('keep_checkpoints', 0, ArgumentValueError,
     'LoopOptions: keep_checkpoints must be an int >= 1; got 0.'),
    ('keep_checkpoints', 2.0, ArgumentTypeError,
     'LoopOptions: keep_checkpoints must be an int >= 1; got 2.0 (float).'),
    ('progress_bar', 'yes', ArgumentTypeError,
     "LoopOptions: progress_bar must be True, False or None; got 'yes' (str)."),
    ('check_batches', None, ArgumentTypeError,
     'LoopOptions: check_batches must be True or False; got None (NoneType).'),
    ('write_trax_files', 1, ArgumentTypeError,
     'LoopOptions: write_trax_files must be True or False; got 1 (int).'),
    ('opt_step_offset', True, ArgumentTypeError,
     'LoopOptions: opt_step_offset must be an int; got True (bool).'),
    ('checkpoint_kind', 'trainer', ArgumentValueError,
     "LoopOptions: checkpoint_kind must be one of ('Loop', 'Trainer'); got "
     "'trainer'."),
    ('log_every', 0, ArgumentValueError,
     'LoopOptions: log_every must be an int >= 1; got 0.'),
    ('report_to', 'tensorboard', UserInputError,
     "report_to: unknown reporter 'tensorboard'; use 'wandb' or 'mlflow' "
     '(or a list).'),
])
def test_a_bad_value_is_one_line_naming_the_option(field, value, error,
                                                   message):
  with pytest.raises(error) as e:
    LoopOptions(**{field: value})
  assert str(e.value) == message


def test_loop_takes_only_a_loop_options():
  with pytest.raises(ArgumentTypeError) as e:
    _loop(options={'log_every': 5})
  assert str(e.value) == ("Loop: options must be a LoopOptions (or None); got "
                          "{'log_every': 5} (dict).")
  with pytest.raises(TypeError, match="unexpected keyword argument 'log_every'"):
    _loop(log_every=5)  # retrax's options go in LoopOptions, not beside Trax's.


def test_options_that_do_not_touch_numerics_train_identically():
  default, given = _loop(), _loop(options=LoopOptions(
      progress_bar=False, check_batches=False, keep_checkpoints=1))
  default.run(3)
  given.run(3)
  for a, b in zip(jax.tree_util.tree_leaves(default.train_state),
                  jax.tree_util.tree_leaves(given.train_state), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
