"""Run Trax programs unchanged: `import trax` resolves to retrax.

`retrax.compat.install()` installs an import hook so that `trax` and every
`trax.X.Y` module resolve to their retrax counterparts (with Trax's older
module paths mapped too); `python -m retrax.compat program.py [args]` runs a
program with the hook installed.
"""

import importlib
import importlib.abc
import importlib.util
import runpy
import sys

# Trax module paths whose retrax module has another name.
_RENAMED = {
    'trax.math': 'retrax.fastmath',
    'trax.learning_rate': 'retrax.lr',
    'trax.lr': 'retrax.lr',
    'trax.layers.research.efficient_attention': 'retrax.layers.efficient_attention',
    'trax.layers.research.position_encodings': 'retrax.layers.position',
    'trax.layers.research': 'retrax.layers',
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


class _TraxFinder(importlib.abc.MetaPathFinder):
  """Maps `trax` and `trax.*` imports to retrax modules."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname != 'trax' and not fullname.startswith('trax.'):
      return None
    name = retrax_name(fullname)
    if importlib.util.find_spec(name) is None:
      return None
    return importlib.util.spec_from_loader(fullname, _AliasLoader(name))


def _patch_jax():
  """Restores `jax.lax.tie_in` (removed from JAX; old Trax code imports it)."""
  import jax  # pylint: disable=g-import-not-at-top
  if not hasattr(jax.lax, 'tie_in'):
    jax.lax.tie_in = lambda x, y: y


def install():
  """Makes `import trax` (and `trax.*`) import retrax. Idempotent."""
  _patch_jax()
  if not any(isinstance(f, _TraxFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _TraxFinder())


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ('-h', '--help'):
    print('usage: python -m retrax.compat PROGRAM.py [ARGS...]\n'
          'Runs a Trax program with `import trax` resolved to retrax.')
    return 0 if argv else 2
  install()
  sys.argv = argv
  runpy.run_path(argv[0], run_name='__main__')
  return 0


if __name__ == '__main__':
  sys.exit(main())
