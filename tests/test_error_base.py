"""Every error class retrax defines derives from `retrax.Error` (and keeps its builtin base)."""

import ast
import importlib
import pathlib

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
