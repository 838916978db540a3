"""Builds retrax's API reference from its docstrings (pdoc) and checks it.

    python docs/build_api.py [OUTPUT_DIR]     # default: docs/_build/api

writes one HTML page per public module (with a search box), then checks that
every public Trax name of `docs/trax_names.txt` (from the project's Trax API
inventory, see `trax_names.py`) is either documented there with a docstring or
listed in `docs/coming_from_trax.md` under "Trax names retrax does not
provide". Exits 1 and names what is missing otherwise (and notes listed
names that are documented after all).
"""

import os
import pkgutil
import re
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import trax_names  # pylint: disable=g-import-not-at-top,wrong-import-position

COMING_FROM_TRAX = os.path.join(HERE, 'coming_from_trax.md')
NOT_PROVIDED_HEADING = '## Trax names retrax does not provide'
# Not API: the entry point run by `python -m retrax`.
EXCLUDED_MODULES = frozenset(['retrax.__main__'])


def public_modules():
  """'retrax' and its submodules, except private ones (`_x`) and __main__."""
  import retrax  # pylint: disable=g-import-not-at-top
  names = ['retrax']
  for info in pkgutil.walk_packages(retrax.__path__, 'retrax.'):
    if info.name in EXCLUDED_MODULES or any(
        part.startswith('_') for part in info.name.split('.')):
      continue
    names.append(info.name)
  return sorted(names)


def _docs(modules):
  import pdoc.doc  # pylint: disable=g-import-not-at-top
  return [pdoc.doc.Module.from_name(m) for m in modules]


def documented_names(module_docs):
  """Names with a non-empty docstring in the reference: module leaf names,
  qualified names (`Layer.init`) and their last part (`init`)."""
  names = set()
  for mod in module_docs:
    if mod.docstring.strip():
      names.add(mod.modulename.split('.')[-1])
    for member in _public_members(mod):
      if member.docstring.strip():
        names.add(member.qualname)
        names.add(member.qualname.split('.')[-1])
  return names


def _public_members(doc):
  """The public members pdoc renders: own module members, and classes' own
  members (recursively); `_private` names are left out, as pdoc does."""
  for member in doc.own_members:
    if member.name.startswith('_') and member.name != '__init__':
      continue
    yield member
    if type(member).__name__ == 'Class':
      yield from _public_members(member)


def not_provided_names(path=COMING_FROM_TRAX):
  """Names listed in the 'does not provide' section of the Trax page: the
  backticked names of each bullet before its first ': ' (the reason and
  the replacement follow it)."""
  with open(path, encoding='utf-8') as f:
    text = f.read()
  start = text.find(NOT_PROVIDED_HEADING)
  if start < 0:
    return set()
  section = text[start + len(NOT_PROVIDED_HEADING):]
  end = re.search(r'^## ', section, flags=re.M)
  section = section[:end.start()] if end else section
  names = set()
  for line in section.splitlines():
    if line.startswith('- '):
      head = line[2:].split(': ', 1)[0]
      names.update(m.split('.')[-1] for m in
                   re.findall(r'`([A-Za-z_][\w.]*)(?:\([^`]*\))?`', head))
  return names


def check(trax_list, documented, not_provided):
  """`(missing, contradictory)`: names neither documented nor listed as not
  provided, and names listed as not provided that are documented."""
  missing = sorted(n for n in trax_list
                   if n not in documented and n not in not_provided)
  contradictory = sorted(n for n in trax_list
                         if n in documented and n in not_provided)
  return missing, contradictory


def build(output_dir, modules=None):
  """Renders the HTML reference into `output_dir`; returns the module docs."""
  import pdoc  # pylint: disable=g-import-not-at-top
  import pdoc.render  # pylint: disable=g-import-not-at-top
  from pathlib import Path  # pylint: disable=g-import-not-at-top
  modules = modules or public_modules()
  pdoc.render.configure(docformat='google', show_source=False,
                        footer_text='retrax API reference')
  with warnings.catch_warnings():
    # pdoc's notes on source it cannot parse (lambdas, JAX's type aliases).
    warnings.filterwarnings('ignore', module=r'pdoc(\.|$)')
    module_docs = _docs(modules)
    pdoc.pdoc(*modules, output_directory=Path(output_dir))
  return module_docs


def main(argv):
  out = argv[1] if len(argv) > 1 else os.path.join(HERE, '_build', 'api')
  t0 = time.time()
  module_docs = build(out)
  missing, contradictory = check(trax_names.read_names(),
                                 documented_names(module_docs),
                                 not_provided_names())
  print(f'API reference: {len(module_docs)} modules -> {out} '
        f'({time.time() - t0:.1f} s)')
  if missing:
    print('Trax names neither documented nor listed as not provided in '
          f'{COMING_FROM_TRAX}: {", ".join(missing)}')
  if contradictory:
    print('Note: listed as not provided in coming_from_trax.md but now '
          f'documented (update the list): {", ".join(contradictory)}')
  return 1 if missing else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
