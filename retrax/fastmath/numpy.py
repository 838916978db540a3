"""`fastmath.numpy` as a module: `import trax.fastmath.numpy as np` works.

Trax has a module `trax.fastmath.numpy` (its pure-NumPy backend helpers and
the tree functions), while the attribute `trax.fastmath.numpy` is the backend
object that forwards names to `jax.numpy` (or NumPy under
`use_backend('numpy')`); `import trax.fastmath.numpy as np` binds the latter.
Here the module is that forwarder itself: every name not defined below is
looked up in the current backend's numpy at access time, so the module and the
attribute `retrax.fastmath.numpy` are one object and behave the same however
they were reached (importing a submodule rebinds its parent's attribute).
"""

from retrax.fastmath.backend import numpy as _backend_numpy
from retrax.fastmath.tree import nested_map as nested_map
from retrax.fastmath.tree import nested_map_multiarg as nested_map_multiarg
from retrax.fastmath.tree import nested_stack as nested_stack
from retrax.fastmath.tree import nested_zip as nested_zip
from retrax.fastmath.tree import tree_flatten as tree_flatten
from retrax.fastmath.tree import tree_leaves as tree_leaves
from retrax.fastmath.tree import tree_unflatten as tree_unflatten


def __getattr__(name):
  # Dunder lookups (`__path__`, `__all__`...) are about this module: answering
  # them from jax.numpy (a package) would make this module look like one.
  if name.startswith('__') and name.endswith('__'):
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
  return getattr(_backend_numpy, name)


def __dir__():
  return sorted(set(globals()) | set(dir(_backend_numpy)))
