"""Source files stay small enough to read: at most 600 lines, functions at most 60.

Scans retrax/ and benchmarks/ with `ast`. A function's length counts its
decorators, docstring and body (`end_lineno - lineno + 1`); nested functions
count inside their parent too.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60


def long_functions(source, limit=MAX_FUNCTION_LINES):
  """`(name, first line, length)` of each function in `source` over `limit` lines."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      length = node.end_lineno - node.lineno + 1
      if length > limit:
        found.append((node.name, node.lineno, length))
  return found


def _sources():
  for package in ('retrax', 'benchmarks'):
    yield from sorted((ROOT / package).rglob('*.py'))


def test_counting_sees_long_functions():
  body = '\n'.join(f'  x{i} = {i}' for i in range(60))
  source = f'def f():\n{body}\n\ndef g():\n  return 1\n'
  assert long_functions(source) == [('f', 1, 61)]
  assert long_functions(source, limit=61) == []


def test_file_and_function_sizes():
  problems = []
  for path in _sources():
    name = path.relative_to(ROOT)
    source = path.read_text()
    n_lines = len(source.splitlines())
    if n_lines > MAX_FILE_LINES:
      problems.append(f'{name}: {n_lines} lines')
    problems.extend(f'{name}:{line}: {fn}() has {length} lines'
                    for fn, line, length in long_functions(source))
  assert not problems, (
      f'files over {MAX_FILE_LINES} lines or functions over '
      f'{MAX_FUNCTION_LINES}; split them into pieces named for what they '
      'hold:\n' + '\n'.join(problems))
