"""Trax's gin-configurable names, declared where retrax defines them.

Trax decorates its layers, models, optimizers, schedules and input functions
with `@gin.configurable`, so that its `.gin` files bind their arguments.
retrax keeps gin an optional extra: `@configurable('trax.layers')` declares
the name Trax registers (its gin module, and the parameters gin may not
bind) without importing gin, and `register(gin)` registers every declared
name with gin. Only the programs that read gin call it: `python -m
retrax.trainer`, `retrax.compat` once the program imports gin, or
`retrax.trax_gin.register()` in a notebook; `import retrax` never does.

A declared function is the same object before and after `register`: its
wrapper looks up gin's configured version on each call (one dict lookup)
and calls the function itself until there is one. A declared class is
configured in place when registered (gin decorates its `__init__`, as
`@gin.configurable` on a class does). Nothing else is rebound.
"""

import functools
import inspect
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, TypeVar

_T = TypeVar('_T')


class _Declaration(NamedTuple):
  name: str
  modules: Tuple[str, ...]  # gin modules; the first one's bindings apply.
  denylist: Tuple[str, ...]
  impl: Callable  # What a declared function calls (a class: itself).


_DECLARED: Dict[Any, _Declaration] = {}  # Public object -> its declaration.
_CONFIGURED: Dict[Callable, Callable] = {}  # Public function -> gin's version.
_PUBLIC: Dict[Callable, Callable] = {}  # gin's version -> public function.
_gin: Optional[Any] = None  # The gin module, once `register` ran.


def configurable(*modules: str,
                 denylist: Tuple[str, ...] = ()) -> Callable[[_T], _T]:
  """Declares the decorated function or class configurable under `modules`.

  `modules` are the gin modules of Trax's name (`'trax.layers'`); the name
  is the object's own. `denylist` names parameters gin may not bind (`mode`,
  which the model passes). Applied to an already declared object, it adds
  `modules` and returns the object unchanged.
  """
  if not modules or not all(isinstance(m, str) for m in modules):
    raise TypeError(f'configurable: give gin module names; got {modules!r}.')

  def declare(obj: Any) -> Any:
    declared = _DECLARED.get(obj)
    if declared is not None:
      if inspect.isclass(obj):  # gin configures a class in place, once.
        raise TypeError(f'configurable: class {obj.__name__} is declared '
                        f'under {declared.modules[0]!r} already.')
      _DECLARED[obj] = declared._replace(modules=declared.modules + modules)
      _register(obj, _DECLARED[obj], modules)
      return obj
    if inspect.isclass(obj):
      public = obj
    else:
      impl = obj

      @functools.wraps(impl)
      def public(*args, **kwargs):
        return _CONFIGURED.get(public, impl)(*args, **kwargs)
    _DECLARED[public] = _Declaration(obj.__name__, modules, tuple(denylist),
                                     obj)
    _register(public, _DECLARED[public], modules)
    return public
  return declare


def _signature_visible(fn):
  """`fn`, or a call-through whose argspec gin can read.

  gin reads parameters with `getfullargspec`, which does not follow
  `__wrapped__` (retrax's models and many layers are decorated): without
  them a binding of an argument the caller gives positionally is passed
  again by keyword instead of giving way, and a binding of a parameter the
  function lacks is not refused.
  """
  if not hasattr(fn, '__wrapped__'):
    return fn

  @functools.wraps(fn)
  def call(*args, **kwargs):
    return fn(*args, **kwargs)
  call.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
  return call


def _register(public, declared, modules):
  """Registers `public` with gin under `modules`, if `register` ran."""
  if _gin is None:
    return
  denylist = list(declared.denylist) or None
  for module in modules:
    if inspect.isclass(public):
      _gin.configurable(declared.name, module=module, denylist=denylist)(
          public)
      continue
    configured = _gin.external_configurable(
        _signature_visible(declared.impl), declared.name, module=module,
        denylist=denylist)
    _PUBLIC[configured] = public
    _CONFIGURED.setdefault(public, configured)


def register(gin):
  """Registers every declared name with `gin` (the module), and later ones
  as they are declared. Idempotent."""
  global _gin
  if _gin is not None:
    return
  _gin = gin
  for public, declared in list(_DECLARED.items()):
    _register(public, declared, declared.modules)


def registered():
  """Whether `register` ran: gin bindings apply to declared names."""
  return _gin is not None


def declared_names():
  """`(gin module, name)` of every name declared so far."""
  return [(module, declared.name) for declared in _DECLARED.values()
          for module in declared.modules]


def public_object(fn):
  """The declared object `fn` is gin's configured version of, else `fn`.

  A gin reference to a declared function (`@trax.layers.CausalAttention`)
  gives gin's configured function; this gives back retrax's.
  """
  try:
    return _PUBLIC.get(fn, fn)
  except TypeError:  # Unhashable.
    return fn


def bound_arguments(fn) -> dict:
  """The arguments gin binds now for declared `fn`; `{}` before `register`."""
  if _gin is None:
    return {}
  try:
    declared = _DECLARED.get(public_object(fn))
  except TypeError:  # Unhashable: not declared.
    return {}
  if declared is None:
    return {}
  return _gin.get_bindings(f'{declared.modules[0]}.{declared.name}')


def takes_argument(fn, name) -> bool:
  """Whether callable `fn` (a class, function or partial) has parameter `name`."""
  try:
    return name in inspect.signature(fn).parameters
  except (TypeError, ValueError):  # No readable signature (a builtin).
    return False
