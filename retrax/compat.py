"""Run Trax programs unchanged: `import trax` resolves to retrax.

`retrax.compat.install()` installs an import hook so that `trax` and every
`trax.X.Y` module resolve to their retrax counterparts (with Trax's older
module paths mapped too), and Trax's gin configurables are registered once
the program imports gin (`retrax.trax_gin`), as `import trax` did;
`python -m retrax.compat program.py [args]` runs a program with the hook
installed. Nothing of this happens unless the program asks for it.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import runpy
import sys
import types

import jax

# Trax module paths whose retrax module has another name.
_RENAMED = {
    'trax.math': 'retrax.fastmath',
    'trax.learning_rate': 'retrax.lr',
    'trax.lr': 'retrax.lr',
    'trax.supervised.inputs': 'retrax.data.inputs',
    'trax.data.inputs': 'retrax.data.inputs',
}


def retrax_name(fullname):
  """The retrax module name for a Trax module name."""
  if fullname in _RENAMED:
    return _RENAMED[fullname]
  return 'retrax' + fullname[len('trax'):]


class _AliasLoader(importlib.abc.Loader):
  """Loads a `trax.*` module as the already-imported retrax module."""

  def __init__(self, target):
    self._target = target

  def create_module(self, spec):
    module = importlib.import_module(self._target)
    self._spec = module.__spec__
    return module

  def exec_module(self, module):
    module.__spec__ = self._spec  # importlib set the alias spec; keep retrax's.


class _RegisteringLoader(importlib.abc.Loader):
  """Loads gin with its own loader, then registers Trax's names with it."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    from retrax import trax_gin
    trax_gin.register(module)

  def __getattr__(self, name):  # get_data, get_resource_reader, ...
    return getattr(self._loader, name)


class _TraxFinder(importlib.abc.MetaPathFinder):
  """Maps `trax` and `trax.*` imports to retrax modules; registers Trax's gin
  names when the program imports gin (Trax's modules did on import)."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname == 'gin':
      # Found as the import system would without this finder (not through
      # sys.meta_path, which would come back here).
      spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
      if spec is not None and spec.loader is not None:
        spec.loader = _RegisteringLoader(spec.loader)
      return spec
    if fullname != 'trax' and not fullname.startswith('trax.'):
      return None
    name = retrax_name(fullname)
    if importlib.util.find_spec(name) is None:
      return None
    return importlib.util.spec_from_loader(fullname, _AliasLoader(name))


def alias_trax_modules():
  """Makes `import trax` (and `trax.*`) import retrax, and registers Trax's
  gin names when gin is imported (now, if it is). Idempotent.

  Only the module names: `install` also restores JAX's removed names.
  """
  if not any(isinstance(f, _TraxFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _TraxFinder())
  if 'gin' in sys.modules:
    from retrax import trax_gin
    trax_gin.register(sys.modules['gin'])


def _module_alias(name, **attrs):
  """A module `name` in `sys.modules` with `attrs`, unless `name` imports."""
  try:
    importlib.import_module(name)
    return
  except ImportError:
    pass
  module = types.ModuleType(name)
  module.__dict__.update(attrs)
  sys.modules[name] = module


def _index_op(method):
  def op(x, idx, y, indices_are_sorted=False, unique_indices=False):
    del indices_are_sorted, unique_indices
    return getattr(x.at[idx], method)(y)
  op.__name__ = f'index_{method}'
  op.__doc__ = f'`x.at[idx].{method}(y)` (the removed `jax.ops` name).'
  return op


def _device_put_replicated(x, devices):
  """`x` stacked once per device, one copy on each (the removed JAX name)."""
  devices = list(devices)
  mesh = jax.sharding.Mesh(devices, ('d',))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('d'))
  def put(leaf):
    stacked = jax.numpy.stack([jax.numpy.asarray(leaf)] * len(devices))
    return jax.device_put(stacked, sharding)
  return jax.tree_util.tree_map(put, x)


# JAX names removed since Trax 1.4.1 and what they became.
_JAX_TOP_LEVEL = {
    'tree_map': 'tree_map', 'tree_multimap': 'tree_map',
    'tree_structure': 'tree_structure', 'tree_flatten': 'tree_flatten',
    'tree_unflatten': 'tree_unflatten', 'tree_leaves': 'tree_leaves',
    'tree_transpose': 'tree_transpose',
}


def _patch_jax():
  """Restores JAX names that Trax-era code uses and current JAX removed.

  Only missing names are added (nothing JAX still has is replaced):
  `jax.lax.tie_in`, the `jax.config` module (`from jax.config import
  config`), `jax.tree_map`/`tree_multimap`/`tree_structure`/`tree_flatten`/
  `tree_unflatten`/`tree_leaves`/`tree_transpose`, `jax.ops.index` and
  `jax.ops.index_update`/`add`/`mul`/`min`/`max`,
  `jax.device_put_replicated` and `jax.ShapedArray`.
  """
  # The assignments below add names this JAX's stubs no longer declare, hence
  # the attr-defined ignores.
  if not hasattr(jax.lax, 'tie_in'):
    jax.lax.tie_in = lambda x, y: y  # type: ignore[attr-defined]
  _module_alias('jax.config', config=jax.config)
  for old, new in _JAX_TOP_LEVEL.items():
    if not hasattr(jax, old):
      setattr(jax, old, getattr(jax.tree_util, new))
  if not hasattr(jax.ops, 'index'):
    jax.ops.index = jax.numpy.index_exp  # type: ignore[attr-defined]
  for method in ('set', 'add', 'mul', 'min', 'max'):
    name = 'index_update' if method == 'set' else f'index_{method}'
    if not hasattr(jax.ops, name):
      setattr(jax.ops, name, _index_op(method))
  if not hasattr(jax, 'device_put_replicated'):
    jax.device_put_replicated = _device_put_replicated
  if not hasattr(jax, 'ShapedArray'):
    jax.ShapedArray = jax.core.ShapedArray  # type: ignore[attr-defined]


def install():
  """Makes `import trax` (and `trax.*`) import retrax. Idempotent.

  Once the program imports gin (or now, if it has), Trax's configurable
  names are registered (`retrax.trax_gin`), so Trax's gin files and
  bindings work as in Trax.
  """
  _patch_jax()
  alias_trax_modules()


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ('-h', '--help') or argv == ['-m']:
    print('usage: python -m retrax.compat PROGRAM.py [ARGS...]\n'
          '       python -m retrax.compat -m MODULE [ARGS...]\n'
          'Runs a Trax program (or module, e.g. trax.trainer) with `import '
          'trax` resolved to retrax.')
    return 0 if argv and argv[0] != '-m' else 2
  install()
  if argv[0] == '-m':  # `-m trax.trainer` runs retrax's module of that name.
    sys.argv = argv[1:]
    runpy.run_module(retrax_name(argv[1]) if argv[1].split('.')[0] == 'trax'
                     else argv[1], run_name='__main__', alter_sys=True)
    return 0
  sys.argv = argv
  runpy.run_path(argv[0], run_name='__main__')
  return 0


if __name__ == '__main__':
  sys.exit(main())
