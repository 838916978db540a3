"""No module of retrax rebinds a module's attributes at run time.

Behaviour must follow from where things are defined and what is passed to
them: a `setattr(module, ...)` or `module.name = ...` outside a module's own
top level (a Terraformer rebinding `DotProductCausalAttention`, a gin bridge
replacing functions with its wrappers) changes code that has no import edge,
type or test pointing at it. This scans the package's source.
"""

import ast
import importlib.util
import os

import retrax

_PACKAGE = os.path.dirname(retrax.__file__)

# (file, function) that may, and why. `setattr` on an object the scan cannot
# type is reported too (a module may hide behind a variable), so a function
# setting attributes of other objects is listed here.
_ALLOWED = {
    # `retrax.compat.install()` gives back names that current JAX removed
    # (`jax.lax.tie_in`, `jax.tree_map`, ...) to the Trax-era programs that
    # asked for compat; it adds missing names only.
    ('retrax/compat.py', '_patch_jax'),
    # `python -m retrax.compat program.py ARGS` gives the program its argv.
    ('retrax/compat.py', 'main'),
    # A combinator's weights and state are set on its sublayers (Layers).
    ('retrax/layers/base.py', '_spread_to_sublayers'),
}


def _is_module(name):
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):
    return False


def _module_names(tree):
  """Names bound to modules by the file's imports (and `sys.modules[...]`)."""
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        names.add(alias.asname or alias.name.split('.')[0])
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        if _is_module(f'{node.module}.{alias.name}'):
          names.add(alias.asname or alias.name)
  return names


def _root(node):
  """The name an attribute chain starts from (`a` of `a.b.c`), or None."""
  while isinstance(node, ast.Attribute):
    node = node.value
  if isinstance(node, ast.Subscript):  # sys.modules[name]
    inner = node.value
    if (isinstance(inner, ast.Attribute) and inner.attr == 'modules' and
        isinstance(inner.value, ast.Name) and inner.value.id == 'sys'):
      return 'sys.modules'
  if isinstance(node, ast.Call):  # importlib.import_module(...), getattr(...)
    return 'a call'
  return node.id if isinstance(node, ast.Name) else None


def module_rebindings(path, source):
  """`(function, line, code)` of each module-attribute rebinding in `source`."""
  tree = ast.parse(source)
  modules = _module_names(tree) | {'sys.modules'}
  found = []

  def visit(node, function):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      function = node.name
    rebinds = False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
        node.func.id in ('setattr', 'delattr')) and node.args:
      # Anything but `self`/`cls` may be a module behind a variable.
      rebinds = _root(node.args[0]) not in ('self', 'cls')
    elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                           ast.Delete)):
      for target in getattr(node, 'targets', None) or [node.target]:
        for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
          rebinds |= (isinstance(t, ast.Attribute) and
                      _root(t.value) in modules)
    if rebinds:
      found.append((function, node.lineno, ast.unparse(node)[:80]))
    for child in ast.iter_child_nodes(node):
      visit(child, function)

  visit(tree, None)
  return found


def test_the_scan_sees_rebindings():
  source = ('import sys\nfrom retrax.layers import rnn\nimport jax.numpy\n'
            'def f():\n  setattr(rnn, "ScanSRUCell", None)\n'
            'def g():\n  jax.numpy.x = 1\n'
            'def h():\n  setattr(sys.modules["m"], "x", 1)\n'
            'def i(patches):\n  for m, v in patches:\n    setattr(m, "x", v)\n'
            'class C:\n  def __init__(self):\n    self.x = rnn\n'
            '    setattr(self, "y", 1)\n    sys.modules["m"] = rnn\n')
  assert [(f, line) for f, line, _ in module_rebindings('x.py', source)] == [
      ('f', 5), ('g', 7), ('h', 9), ('i', 12)]


def test_no_module_attribute_is_rebound():
  found = []
  for folder, _, files in os.walk(_PACKAGE):
    for name in sorted(files):
      if not name.endswith('.py'):
        continue
      path = os.path.join(folder, name)
      rel = os.path.relpath(path, os.path.dirname(_PACKAGE))
      with open(path, encoding='utf-8') as f:
        for function, line, code in module_rebindings(path, f.read()):
          if (rel, function) not in _ALLOWED:
            found.append(f'{rel}:{line} ({function}): {code}')
  assert not found, '\n'.join(found)
