"""Trax's gin hook for `retrax.compat`: gin's `backend.name` picks the backend.

Trax made `fastmath.backend` gin-configurable, so a gin binding
`backend.name = 'numpy'` chose the backend of every computation that no
`set_backend`/`use_backend` overrode. `install()` registers a configurable
of that name (module `trax.fastmath.ops`) and makes it retrax's default
backend source (`fastmath.backend.set_default_source`) as soon as the
program imports gin (at once if it already has). A program that never
imports gin pays nothing; one that does pays a gin lookup per backend
query, as in Trax. retrax's own code reads no gin.
"""

import importlib.abc
import importlib.machinery
import sys

from retrax.fastmath.backend import set_default_source

_configured_name = None  # the gin-wrapped reader, once registered


def _backend_name(name=None):
  """The name gin binds to `backend.name` (None: none bound)."""
  return name


def _register(gin):
  global _configured_name
  if _configured_name is None:
    _configured_name = gin.external_configurable(
        _backend_name, name='backend', module='trax.fastmath.ops')
  set_default_source(_configured_name)


class _RegisteringLoader(importlib.abc.Loader):
  """Loads gin with its own loader, then registers the configurable."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    _register(module)

  def __getattr__(self, name):  # get_data, get_resource_reader, ...
    return getattr(self._loader, name)


class _GinImportWatcher(importlib.abc.MetaPathFinder):
  """Finds `gin` as the import system would, with `_RegisteringLoader`."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != 'gin':
      return None
    sys.meta_path.remove(self)  # One import only; also avoids recursion.
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
      spec.loader = _RegisteringLoader(spec.loader)
    return spec


def install():
  """Registers Trax's gin-configurable `backend` now or when gin is imported."""
  if 'gin' in sys.modules:
    _register(sys.modules['gin'])
  elif not any(isinstance(f, _GinImportWatcher) for f in sys.meta_path):
    sys.meta_path.insert(0, _GinImportWatcher())
