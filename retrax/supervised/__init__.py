"""Supervised training under Trax's names (`trax.supervised`).

`training` (Loop, LoopOptions, TrainTask, EvalTask, TrainState), `trainer_lib` (the legacy Trainer and
`train`), `callbacks`, `history`; `lr_schedules` (= `retrax.lr`), `inputs` and
`Inputs` (from `retrax.data.inputs`) and `decoding` are loaded when first used.
"""

import importlib as _importlib

from retrax.supervised import callbacks as callbacks
from retrax.supervised import history as history
from retrax.supervised import trainer_lib as trainer_lib
from retrax.supervised import training as training
from retrax.supervised.trainer_lib import Trainer as Trainer
from retrax.supervised.trainer_lib import train as train
from retrax.supervised.training import EvalTask as EvalTask
from retrax.supervised.training import Loop as Loop
from retrax.supervised.training import LoopOptions as LoopOptions
from retrax.supervised.training import TaskState as TaskState
from retrax.supervised.training import TrainState as TrainState
from retrax.supervised.training import TrainTask as TrainTask

# Name -> (modules to try in order, attribute or None for the module itself).
_LAZY = {
    'lr_schedules': (('retrax.supervised.lr_schedules', 'retrax.lr'), None),
    'inputs': (('retrax.supervised.inputs', 'retrax.data.inputs'), None),
    'Inputs': (('retrax.supervised.inputs', 'retrax.data.inputs'), 'Inputs'),
    'decoding': (('retrax.supervised.decoding',), None),
}


def __getattr__(name):
  if name not in _LAZY:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  module_names, attribute = _LAZY[name]
  for module_name in module_names:
    try:
      module = _importlib.import_module(module_name)
    except ModuleNotFoundError as e:
      if e.name != module_name:
        raise  # The module exists but one of its imports is missing.
      continue
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value
  raise AttributeError(
      f'retrax.supervised.{name} is not available: none of '
      f'{", ".join(module_names)} is installed.')


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
