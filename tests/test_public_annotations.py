"""The training surface users call is annotated, so mypy checks their calls.

mypy's check_untyped_defs checks function bodies; only annotations check the
callers. Every public method and property of `Loop`, `TrainTask` and
`EvalTask`, and `load_run` and the `TrainState` functions, names the types
of its arguments and of its result.
"""

import inspect

import pytest

from retrax.runs import loading
from retrax.supervised import tasks
from retrax.supervised import train_step
from retrax.supervised import training


def _methods(cls):
  """`(name, function)` of `cls`'s own public methods, properties, __init__."""
  for name, value in vars(cls).items():
    if name.startswith('_') and name != '__init__':
      continue
    if isinstance(value, property):
      yield f'{cls.__name__}.{name}', value.fget
    elif inspect.isfunction(value):
      yield f'{cls.__name__}.{name}', value


_FUNCTIONS = [
    *_methods(training.Loop), *_methods(tasks.TrainTask),
    *_methods(tasks.EvalTask), *_methods(tasks.TrainTask.__mro__[1]),
    ('load_run', loading.load_run),
    *[(f'train_step.{name}', getattr(train_step, name)) for name in (
        'replicate', 'place_task', 'init_task', 'init_state', 'new_rng',
        'train_step')],
]


@pytest.mark.parametrize('name, fn', _FUNCTIONS, ids=[n for n, _ in _FUNCTIONS])
def test_annotated(name, fn):
  signature = inspect.signature(fn)
  params = [p for p in signature.parameters.values() if p.name != 'self']
  missing = [p.name for p in params if p.annotation is p.empty]
  if signature.return_annotation is signature.empty:
    missing.append('return')
  assert not missing, f'{name} has no annotation for {missing}'
