"""Source files stay small enough to read, counted in lines of code.

Scans retrax/ and benchmarks/. Only lines of code count: blank lines,
comments and docstrings do not, so documenting a function never pushes it
over a limit. Files over `REVIEW_FILE_LINES` and functions over
`REVIEW_FUNCTION_LINES` lines of code are listed at the end of the test run
for review (`conftest.pytest_terminal_summary`): a prompt to look at the
design, not a failure. Only sizes no reader can hold, `MAX_FILE_LINES` and
`MAX_FUNCTION_LINES`, fail. A function's count includes its nested
functions.
"""

import ast
import io
import pathlib
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[1]
REVIEW_FILE_LINES = 800
REVIEW_FUNCTION_LINES = 60
MAX_FILE_LINES = 1200
MAX_FUNCTION_LINES = 120

_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
             tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}


def _docstring_lines(tree):
  lines = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                         ast.AsyncFunctionDef)) and node.body:
      first = node.body[0]
      if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
          and isinstance(first.value.value, str)):
        lines.update(range(first.lineno, first.end_lineno + 1))
  return lines


def code_lines(source):
  """The set of line numbers of `source` that hold code (not docstrings)."""
  lines = set()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type not in _NOT_CODE:
      lines.update(range(tok.start[0], tok.end[0] + 1))
  return lines - _docstring_lines(ast.parse(source))


def sizes(source):
  """`(code lines of the file, [(function, first line, code lines), ...])`."""
  code = code_lines(source)
  functions = [
      (node.name, node.lineno,
       len(code.intersection(range(node.lineno, node.end_lineno + 1))))
      for node in ast.walk(ast.parse(source))
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
  return len(code), functions


def over(file_limit, function_limit):
  """Files and functions of retrax/ and benchmarks/ over the limits, as lines."""
  found = []
  for package in ('retrax', 'benchmarks'):
    for path in sorted((ROOT / package).rglob('*.py')):
      name = path.relative_to(ROOT)
      n_code, functions = sizes(path.read_text())
      if n_code > file_limit:
        found.append(f'{name}: {n_code} lines of code')
      found.extend(f'{name}:{line}: {fn}() has {n} lines of code'
                   for fn, line, n in functions if n > function_limit)
  return found


def test_counting_skips_docstrings_comments_and_blanks():
  body = '\n'.join(f'  x{i} = {i}  # note' for i in range(60))
  source = (f'"""Module.\n\nmore\n"""\n\ndef f():\n  """Doc.\n\n  long\n  """\n'
            f'  # a comment\n\n{body}\n\ndef g():\n  return (1,\n          2)\n')
  n_code, functions = sizes(source)
  assert functions == [('f', 6, 61), ('g', 74, 3)]
  assert n_code == 64


def test_file_and_function_sizes():
  problems = over(MAX_FILE_LINES, MAX_FUNCTION_LINES)
  assert not problems, (
      f'files over {MAX_FILE_LINES} or functions over {MAX_FUNCTION_LINES} '
      'lines of code; split them into pieces named for what they hold:\n'
      + '\n'.join(problems))
