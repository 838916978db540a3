"""retrax: Trax's programming model, reversible layers and the Reformer, on today's JAX.

`import retrax as trax` and `from retrax import layers as tl` give Trax's names.
"""

from retrax import fastmath as fastmath
from retrax import layers as layers
from retrax import lr as lr
from retrax import optimizers as optimizers
from retrax import shapes as shapes

__version__ = '0.1.0'


def __getattr__(name):
  # Heavier subpackages load on first use (`trax.models`, `trax.supervised`, `trax.data`).
  import importlib  # pylint: disable=g-import-not-at-top
  if name in ('models', 'supervised', 'data'):
    return importlib.import_module(f'retrax.{name}')
  if name == 'load_run':  # A run directory's model with its weights.
    return importlib.import_module('retrax.run').load_run
  raise AttributeError(f'module retrax has no attribute {name!r}')
