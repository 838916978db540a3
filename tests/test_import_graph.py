"""retrax's modules import each other without circles, and only downwards.

Every import counts, at module level or inside a function, and
`importlib.import_module` of a literal name too: a circle broken only by
importing late is still one concept split over two modules. Edges go from a
module to the module it names (`from retrax.layers import base` is
`retrax.layers.base`; `from retrax.layers.base import Layer` also).
"""

import ast
import pathlib

import retrax

_ROOT = pathlib.Path(retrax.__file__).parent


def _module_name(path):
  parts = path.relative_to(_ROOT.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _exists(name):
  path = _ROOT.parent.joinpath(*name.split('.'))
  return path.with_suffix('.py').exists() or (path / '__init__.py').exists()


def _targets(node, package):
  """The retrax modules an import node names."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names]
  if isinstance(node, ast.ImportFrom):
    base = node.module or ''
    if node.level:  # Relative: from the importing package.
      up = package.split('.')[:len(package.split('.')) - node.level + 1]
      base = '.'.join(up + ([base] if base else []))
    return [f'{base}.{a.name}' if _exists(f'{base}.{a.name}') else base
            for a in node.names]
  if (isinstance(node, ast.Call) and getattr(node.func, 'attr', None) ==
      'import_module' and node.args and
      isinstance(node.args[0], ast.Constant)):
    return [node.args[0].value]
  return []


def import_graph():
  """`{module: {modules of retrax it imports}}`."""
  graph = {}
  for path in _ROOT.rglob('*.py'):
    name = _module_name(path)
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
      edges.update(t for t in _targets(node, package)
                   if t.startswith('retrax.') and t != name)
    graph[name] = edges
  return graph


def circles(graph):
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = set()
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.add(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in list(graph):
    if v not in index:
      visit(v)
  return found


def test_the_finder_sees_a_circle():
  assert circles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [
      ['a', 'b', 'c']]


def test_no_module_circles():
  graph = import_graph()
  assert 'retrax.checkpoints.layer_io' in graph['retrax.layers.base']
  assert circles(graph) == []


# The package levels of docs/architecture.md, lowest first: a module may
# import its own level and those below it, never one above. A new top-level
# module or package must be placed here.
LEVELS = (
    ('errors', 'validation', 'run_layout', 'local_paths', 'suggest',
     'shapes', 'configurable'),
    ('trax_gin', 'compat'),
    ('fastmath',),
    ('checkpoints',),
    ('layers',),
    ('models', 'optimizers', 'lr'),
    ('data',),
    ('supervised',),
    ('runs',),
    ('app', 'trainer', '__main__', 'tf_numpy', 'test_utils', ''),
)


def level(module):
  """The level of `module`'s top-level package ('' for `retrax` itself)."""
  top = module.split('.')[1] if '.' in module else ''
  for i, names in enumerate(LEVELS):
    if top in names:
      return i
  raise AssertionError(f'{module}: top-level name {top!r} has no level in '
                       'LEVELS; place it there (and in docs/architecture.md).')


def upward(graph):
  """The edges of `graph` from a module to one of a higher level."""
  return sorted(f'{a} -> {b}' for a, targets in graph.items()
                for b in targets if level(b) > level(a))


def test_imports_run_only_downwards():
  assert upward(import_graph()) == []


def test_the_level_check_sees_an_upward_import():
  assert level('retrax.models.registry') > level('retrax.layers.base')
  assert (level('retrax.app.cli') > level('retrax.runs.loading') >
          level('retrax.supervised.training'))
  assert upward({'retrax.trax_gin': {'retrax.data.tensorflow_only'},
                 'retrax.runs.loading': {'retrax.app.jobs'},
                 'retrax.app.jobs': {'retrax.runs.loading'}}) == [
                     'retrax.runs.loading -> retrax.app.jobs',
                     'retrax.trax_gin -> retrax.data.tensorflow_only']
