"""Every error class retrax defines derives from `retrax.Error` (and keeps its builtin base)."""

import ast
import importlib
import pathlib

import numpy as np

import retrax

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _error_classes():
  """`(module, class name)` of each public class in retrax/ named `*Error`."""
  for path in sorted((ROOT / 'retrax').rglob('*.py')):
    module = '.'.join(path.relative_to(ROOT).with_suffix('').parts)
    module = module.removesuffix('.__init__')
    for node in ast.parse(path.read_text()).body:
      if (isinstance(node, ast.ClassDef) and node.name.endswith('Error')
          and not node.name.startswith('_')):
        yield module, node.name


def test_every_error_class_derives_from_retrax_error():
  found = list(_error_classes())
  assert len(found) >= 20  # The scan sees the package's errors.
  outside = []
  for module, name in found:
    cls = getattr(importlib.import_module(module), name)
    if not issubclass(cls, retrax.Error):
      outside.append(f'{module}.{name}')
  assert not outside, f'not subclasses of retrax.Error: {outside}'


def test_errors_keep_their_builtin_bases():
  from retrax.checkpoints import errors as checkpoint_errors
  from retrax import validation
  from retrax.supervised import batch_checks
  assert issubclass(validation.ArgumentTypeError, TypeError)
  assert issubclass(validation.ArgumentValueError, ValueError)
  assert issubclass(checkpoint_errors.CheckpointNotFoundError, FileNotFoundError)
  assert issubclass(batch_checks.NonFiniteLossError, FloatingPointError)
  assert issubclass(retrax.errors.UserInputError, ValueError)


def test_except_retrax_error_catches_a_bad_argument():
  from retrax import layers as tl
  try:
    tl.Dense(-3)
  except retrax.Error as e:
    assert 'n_units' in str(e)
  else:
    raise AssertionError('Dense(-3) did not raise')


def _bare_raises(source):
  """`(lines, total)`: the lines of the raise statements in `source` whose
  exception is the builtin `ValueError` or `TypeError` (called or not), and
  how many raise statements it has in all (a bare re-raise not counted)."""
  lines, total = [], 0
  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Raise) or node.exc is None:
      continue
    total += 1
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name) and exc.id in ('ValueError', 'TypeError'):
      lines.append(node.lineno)
  return lines, total


def test_the_raise_counter_sees_bare_builtins():
  source = ('raise ValueError("x")\nraise TypeError from e\n'
            'raise errors.InputValueError("y")\nraise\nraise KeyError(1)\n')
  assert _bare_raises(source) == ([1, 2], 4)


def test_few_raises_are_bare_value_or_type_errors():
  # Deliberate errors are `retrax.Error`s (argument, input, user input,
  # checkpoint...); a bare builtin is left only for an internal invariant.
  bare, total = [], 0
  for path in sorted((ROOT / 'retrax').rglob('*.py')):
    lines, n = _bare_raises(path.read_text())
    bare += [f'{path.relative_to(ROOT)}:{line}' for line in lines]
    total += n
  assert total >= 500  # The scan sees the package's raises.
  assert len(bare) <= total // 10, (
      f'{len(bare)} of {total} raises are bare ValueError/TypeError; use a '
      f'retrax.Error subclass (validation.Argument*Error, errors.Input*Error, '
      f'errors.UserInputError...): {bare}')


def test_input_errors_keep_their_builtin_bases():
  from retrax import errors
  assert issubclass(errors.InputValueError, errors.InputError)
  assert issubclass(errors.InputValueError, ValueError)
  assert issubclass(errors.InputTypeError, TypeError)
  assert issubclass(errors.InputError, retrax.Error)


def test_training_stopped_is_a_signal_not_an_error():
  # Like KeyboardInterrupt: `except Exception` / `except retrax.Error` in a
  # user's loop must not swallow the stop that SIGINT/SIGTERM asked for.
  from retrax.supervised import interrupts
  assert issubclass(interrupts.TrainingStopped, BaseException)
  assert not issubclass(interrupts.TrainingStopped, Exception)
  assert issubclass(interrupts.Interrupted, KeyboardInterrupt)
  assert issubclass(interrupts.Terminated, SystemExit)
  assert 'TrainingStopped' in retrax.errors.__doc__


def _layer_error(cause):
  """The LayerError that running a layer whose function raises `cause` gives."""
  from retrax import layers as tl

  def fail(x):
    raise cause
  try:
    tl.Fn('Fail', fail)(np.ones(2, np.float32))
  except tl.LayerError as e:
    return e
  raise AssertionError('the layer did not fail')


def test_a_layer_error_is_as_deliberate_as_its_cause():
  from retrax import errors
  bug = _layer_error(TypeError('unsupported operand'))
  assert isinstance(bug, retrax.Error) and not errors.deliberate(bug)
  checked = _layer_error(errors.InputValueError('Fail expects rank 2'))
  assert errors.deliberate(checked)
  assert errors.deliberate(errors.UserInputError('bad key'))
  assert not errors.deliberate(ValueError('a bug'))


def test_an_arity_error_is_deliberate():
  from retrax import errors
  from retrax import layers as tl
  try:
    tl.Add().init(retrax.shapes.ShapeDtype((2,)))
  except tl.LayerError as e:
    assert errors.deliberate(e)
    assert isinstance(e.__cause__, errors.InputValueError)
    assert 'Add expects a tuple of 2 inputs' in str(e)
  else:
    raise AssertionError('Add on one input did not fail')
