"""The public Trax names listed in the project's Trax API inventory (`trax_api.md`).

`extract(text)` reads the inventory's tables (sections 0-12: packages, layers,
models, optimizers, schedules, supervised, data, fastmath, shapes) and the
"Module functions" line, and returns the Python names they list: each
backticked name in the first column, or in the second where the first holds
none (e.g. `core.py | Dense(...), Embedding(...)`), with arguments removed and
`A/B`, `A, B` and `Glorot{Normal,Uniform}` lists expanded. File names, quoted
strings and wildcard families (`LeCun*`) are skipped.

`python docs/trax_names.py [trax_api.md]` rewrites `docs/trax_names.txt`.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES_FILE = os.path.join(HERE, 'trax_names.txt')
DEFAULT_INVENTORY = os.path.join(HERE, '..', '..', 'shared', 'trax_api.md')

_IDENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$')
_LAST_SECTION = 12  # Sections 13+ describe formats, gin, devices, configs.


def _strip_parens(s):
  out, depth = [], 0
  for ch in s:
    if ch in '([{' and not (ch == '{' and depth == 0):
      depth += 1
    elif ch in ')]}' and depth:
      depth -= 1
    elif depth == 0:
      out.append(ch)
  return ''.join(out)


def _expand_braces(s):
  m = re.search(r'\{([^{}]*)\}', s)
  if not m:
    return [s]
  return [x for alt in m.group(1).split(',')
          for x in _expand_braces(s[:m.start()] + alt.strip() + s[m.end():])]


# Backticked words of the inventory that are arguments or stand-ins, not names.
NOT_NAMES = frozenset(['jnp', 'attention_type', 'd_model'])


def _slash_group(group):
  """`avg/max/sum_pool` -> avg_pool, max_pool, sum_pool; `index_update/add` ->
  index_update, index_add (a shared prefix or suffix written once)."""
  items = group.split('/')
  if len(items) < 2 or any('_' in x for x in items[1:-1]):
    return items
  if '_' in items[0] and not any('_' in x for x in items[1:]):
    prefix = items[0].split('_')[0] + '_'
    return [items[0]] + [prefix + x for x in items[1:]]
  if '_' in items[-1] and not any('_' in x for x in items[:-1]):
    suffix = '_' + items[-1].split('_', 1)[1]
    return [x + suffix for x in items[:-1]] + [items[-1]]
  return items


def _names_in_span(span):
  if re.search(r'\.(py|ipynb|gin|md)\b', span):
    return []  # A file path.
  names = []
  words = [w for text in _expand_braces(_strip_parens(span))
           for w in re.split(r'[,;]|\s+', text)]
  for part in [p for word in words for p in _slash_group(word.strip())]:
    part = part.strip().rstrip('.').lstrip('.')
    if not part or '*' in part or "'" in part:
      continue
    if (_IDENT.match(part) and not part.startswith('_') and
        '__' not in part and part not in NOT_NAMES and part not in names):
      names.append(part)
  return names


def _cell_names(cell):
  return [n for span in re.findall(r'`([^`]+)`', cell)
          for n in _names_in_span(span)]


def _leaf(name):
  if name.startswith('trax.'):
    name = name[len('trax.'):]
  return name.split('.')[-1] if '.' in name and not name.startswith(
      'Layer.') else name


def extract(text):
  """Sorted unique Trax names of the inventory's sections 0-12."""
  names, section = set(), None
  for line in text.splitlines():
    m = re.match(r'^##\s+(\d+)\.', line)
    if m:
      section = int(m.group(1))
      continue
    if section is None or section > _LAST_SECTION:
      continue
    if line.startswith('Module functions:'):
      names.update(_cell_names(line))
      continue
    if not line.startswith('|') or re.match(r'^\|\s*-', line):
      continue
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if cells[0] in ('Name', 'Member', 'Class', 'Model', 'Module', 'Optimizer',
                    'Fn', 'Item', 'Class / fn', 'Use case'):
      continue  # A header row.
    found = _cell_names(cells[0])
    if not found and len(cells) > 1:
      found = _cell_names(cells[1])
    names.update(_leaf(n) for n in found)
  return sorted(names)


def read_names(path=NAMES_FILE):
  with open(path, encoding='utf-8') as f:
    return [line.strip() for line in f if line.strip() and
            not line.startswith('#')]


def main(argv):
  src = argv[1] if len(argv) > 1 else DEFAULT_INVENTORY
  with open(src, encoding='utf-8') as f:
    names = extract(f.read())
  with open(NAMES_FILE, 'w', encoding='utf-8') as f:
    f.write('# Public Trax names from shared/trax_api.md (docs/trax_names.py '
            'rewrites this file).\n')
    f.write('\n'.join(names) + '\n')
  print(f'{len(names)} names -> {NAMES_FILE}')


if __name__ == '__main__':
  main(sys.argv)
