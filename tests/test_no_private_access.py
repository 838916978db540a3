"""No retrax module reads another object's private (`_name`) attributes.

Scans retrax/ with `ast`: an access `x._name` is allowed only where `x` is
`self`, `cls` or `super()`, or a name the same module defines at top level
(its own class, function or global), or where `_name` is one of the few
public APIs of the standard library spelled with a leading underscore.
Everything else means a module reaches into another's internals; give the
owner a public accessor instead.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'retrax'

# Public APIs of namedtuples, `sys` and `os` that happen to start with '_'.
_STDLIB_NAMES = {'_replace', '_fields', '_asdict', '_make', '_field_defaults'}
_STDLIB_CALLS = {('sys', '_getframe'), ('os', '_exit')}


def _is_private(attr):
  return attr.startswith('_') and not (attr.startswith('__') and
                                       attr.endswith('__'))


def _module_names(tree):
  """Names bound at the top level of a module (defs, classes, assignments)."""
  names = set()
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      for target in targets:
        names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
  return names


def _owner_is_allowed(value, local_names):
  if isinstance(value, ast.Name):
    return value.id in ('self', 'cls') or value.id in local_names
  return (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and
          value.func.id == 'super')


def private_accesses(source):
  """`(line, text)` of every disallowed `x._name` in `source`."""
  tree = ast.parse(source)
  local_names = _module_names(tree)
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Attribute) or not _is_private(node.attr):
      continue
    if node.attr in _STDLIB_NAMES or _owner_is_allowed(node.value,
                                                       local_names):
      continue
    if (isinstance(node.value, ast.Name) and
        (node.value.id, node.attr) in _STDLIB_CALLS):
      continue
    found.append((node.lineno, node.col_offset, ast.unparse(node)))
  return [(line, text) for line, _, text in sorted(found)]


def _all_accesses():
  out = {}
  for path in sorted(ROOT.rglob('*.py')):
    hits = private_accesses(path.read_text())
    if hits:
      out[str(path.relative_to(ROOT.parent))] = hits
  return out


def test_scanner_flags_reads_of_other_objects_privates():
  source = '\n'.join([
      'import sys',
      'from pkg import other',
      '_CACHE = {}',
      'class Local:',
      '  def f(self, layer):',
      '    self._a = layer._mode',          # flagged: layer._mode
      '    super()._b()',
      '    return other._helper, Local._c, _CACHE._d, sys._getframe(0)',
      'def g(state, lr):',
      '  state._replace(x=1)',
      '  return type(state)._fields, lr()._private, state.__class__',
  ])
  got = [text for _, text in private_accesses(source)]
  assert got == ['layer._mode', 'other._helper', 'lr()._private']


def test_no_module_reads_another_modules_private_attributes():
  found = _all_accesses()
  if found:
    lines = [f'{path}:{line}: {text}' for path, hits in found.items()
             for line, text in hits]
    pytest.fail('Private attributes read across objects (add a public '
                'accessor):\n  ' + '\n  '.join(lines))


def test_checkpoints_import_no_layers():
  """`retrax.checkpoints` sits below `retrax.layers` (whose `init_from_file`
  calls `checkpoints.layer_io`): no module of it imports layers, models or
  training (the Hugging Face conversion that builds runs is `retrax.app.hf_runs`)."""
  found = []
  for path in sorted((ROOT / 'checkpoints').rglob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom):  # (`from retrax import layers`.)
        names = [f'{node.module}.{a.name}' for a in node.names]
      else:
        continue
      found += [f'{path.name}:{node.lineno}: {n}' for n in names
                if n.startswith(('retrax.layers', 'retrax.models',
                                 'retrax.supervised'))]
  assert not found, found
