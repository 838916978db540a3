"""Layers hand `mode` to `Layer.__init__` instead of setting `self._mode`
themselves after it (one place decides what an unset mode means)."""

import ast
import pathlib

import retrax
from retrax import layers as tl

_ROOT = pathlib.Path(retrax.__file__).parent


def test_no_init_assigns_self_mode_itself():
  found = []
  for path in _ROOT.rglob('*.py'):
    if path == _ROOT / 'layers' / 'base.py':
      continue  # Layer.__init__ itself.
    for fn in ast.walk(ast.parse(path.read_text())):
      if isinstance(fn, ast.FunctionDef) and fn.name == '__init__':
        found += [f'{path.relative_to(_ROOT)}:{n.lineno}'
                  for n in ast.walk(fn) if isinstance(n, ast.Assign) and
                  any(ast.unparse(t) == 'self._mode' for t in n.targets)]
  assert found == []


def test_layers_report_the_mode_they_were_given():
  assert tl.Dropout(0.1, mode='eval')._mode == 'eval'
  assert tl.DotProductCausalAttention(mode='predict')._mode == 'predict'
  assert tl.LayerNorm()._mode is None  # No mode: Layer's default.
