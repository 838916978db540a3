"""retrax: Trax's programming model, reversible layers and the Reformer, on today's JAX.

`import retrax as trax` and `from retrax import layers as tl` give Trax's names.
"""

from retrax import fastmath as fastmath
from retrax import layers as layers
from retrax import lr as lr
from retrax import optimizers as optimizers
from retrax import shapes as shapes
from retrax.checkpoints import layer_io as _layer_io
from retrax.checkpoints import tree as _checkpoint_tree
from retrax import trax_gin as _trax_gin

# The layers read and write weights files through the checkpoint package.
layers.base.install_weights_files(_layer_io.init_layer_from_file,
                                  _layer_io.save_layer_to_file,
                                  _checkpoint_tree.unflatten_weights_and_state)

__version__ = '0.1.0'

# Trax's gin configurables, registered once the program imports gin (an
# optional extra): Trax's `.gin` files and bindings then work.
_trax_gin.install()


def __getattr__(name):
  # Heavier subpackages load on first use (`trax.models`, `trax.supervised`, `trax.data`).
  import importlib
  if name in ('models', 'supervised', 'data'):
    return importlib.import_module(f'retrax.{name}')
  if name == 'load_run':  # A run directory's model with its weights.
    return importlib.import_module('retrax.run').load_run
  raise AttributeError(f'module retrax has no attribute {name!r}')
