"""Trax's gin configs on retrax: registers Trax's configurable names with gin.

Trax runs its experiments from gin files (`train.model = @trax.models.ReformerLM`,
`LSHSelfAttention.n_hashes = 4`, `multifactor.constant = 0.05`, ...), and its
modules register every layer, model, optimizer, schedule and input function
with gin under Trax's module names. retrax declares the same names where it
defines them (`retrax.configurable`, which imports no gin); `register()`
registers them with gin, under Trax's modules (`trax.layers`, `trax.models`,
`trax.optimizers`, `trax.supervised.lr_schedules`,
`trax.supervised.trainer_lib`, `trax.supervised.training`, `trax.data`,
`trax.fastmath.ops`). The programs that read gin call it:
`python -m retrax.trainer`, `retrax.compat` (when the Trax program imports
gin), or a notebook, once:

    import gin, retrax
    retrax.trax_gin.register()
    gin.parse_config('LSHSelfAttention.n_hashes = 4')

Trax's `.gin` files begin with `import trax.models` and the like: they need
`import trax` to resolve, i.e. `retrax.compat.install()` (which registers
too); `register` itself never redirects `import trax`.

Bindings reach a declared name however it is reached: a function through
any import path or a model's default argument (its wrapper looks gin up), a
class wherever it is built (gin configures it in place). Trax's TensorFlow
data functions that retrax does not provide (T5, BERT and MathQA inputs) are
declared as stand-ins (`retrax.data.tensorflow_only`), so their configs
parse; calling one raises `TensorFlowOnlyError`, saying what to use instead.
gin's `backend.name` (`fastmath.backend`, module `trax.fastmath.ops`)
chooses the default fastmath backend, as in Trax.
"""

import importlib

from retrax import configurable
from retrax.errors import UserInputError

# The modules whose definitions declare Trax's names: importing them
# declares every one (`trax.layers`, ... are imported lazily otherwise).
_DECLARING_MODULES = (
    'retrax.fastmath', 'retrax.layers', 'retrax.models', 'retrax.optimizers',
    'retrax.lr', 'retrax.supervised.trainer_lib', 'retrax.supervised.training',
    'retrax.data')


def _import_gin():
  try:
    import gin
  except ImportError:
    raise UserInputError(
        'gin configs need the gin-config package: pip install '
        '"retrax[gin]" (or pip install gin-config).') from None
  return gin


def register(gin=None):
  """Registers Trax's configurable names with gin (imported if not given).

  Idempotent. Imports retrax's layers, models, optimizers, schedules,
  trainer and data modules (so every name is declared) and the default
  backend then follows gin's `backend.name`.

  Raises:
    UserInputError: gin-config is not installed.
  """
  if configurable.registered():
    return
  gin = _import_gin() if gin is None else gin
  for module in _DECLARING_MODULES:
    importlib.import_module(module)
  configurable.register(gin)

