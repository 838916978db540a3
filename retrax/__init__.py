"""retrax: Trax's programming model, reversible layers and the Reformer, on today's JAX.

`import retrax as trax` and `from retrax import layers as tl` give Trax's names.
The subpackages (`fastmath`, `layers`, `lr`, `optimizers`, `shapes`, `models`,
`supervised`, `data`, and the Trax bridges `trax_gin` and `compat`) load on
first use, so that importing the package alone (the `retrax` command's
`--version`, `--help` and argument errors) does not import JAX. Importing it
installs nothing: gin names are registered and `import trax` redirected only
by `retrax.trax_gin.register()` / `retrax.compat.install()`.
"""

import importlib

from retrax.errors import Error as Error  # Base of retrax's errors.

__version__ = '0.1.0'

_SUBPACKAGES = ('fastmath', 'layers', 'lr', 'optimizers', 'shapes', 'models',
                'supervised', 'data', 'trax_gin', 'compat')


def __getattr__(name):
  if name in _SUBPACKAGES:  # `retrax.layers`, `from retrax import lr`, ...
    return importlib.import_module(f'retrax.{name}')
  if name == 'load_run':  # A run directory's model with its weights.
    return importlib.import_module('retrax.runs.loading').load_run
  raise AttributeError(f'module retrax has no attribute {name!r}')


def __dir__():
  return sorted(set(globals()) | set(_SUBPACKAGES) | {'load_run'})
