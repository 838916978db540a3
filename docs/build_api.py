"""Builds retrax's API reference from its docstrings (pdoc) and checks it.

    python docs/build_api.py [OUTPUT_DIR]     # default: docs/_build/api

writes one HTML page per public module (with a search box), each package's
page opening with a table of the names it exports (`tl.Serial`,
`retrax.models.ReformerLM`: a one-line summary and a link to the module page
that documents it), then checks that
every public Trax name of `docs/trax_names.txt` (from the project's Trax API
inventory, see `trax_names.py`) is either documented there with a docstring or
listed in `docs/coming_from_trax.md` under "Trax names retrax does not
provide". Exits 1 and names what is missing otherwise (and notes listed
names that are documented after all).
"""

import html
import importlib
import inspect
import os
import pkgutil
import posixpath
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


# How users name a package's exports (Trax's `from trax import layers as tl`).
SHORT_NAMES = {'retrax.layers': 'tl'}


def _summary(obj):
  """The first paragraph of a class's or function's docstring, on one line."""
  if not (inspect.isclass(obj) or inspect.isroutine(obj) or
          hasattr(obj, '__wrapped__')):
    return ''
  doc = inspect.getdoc(obj) or ''
  return ' '.join(doc.strip().split('\n\n')[0].split())


def _documented_at(obj, name, modules):
  """`(module, anchor)` of the page documenting `obj` (exported as `name`):
  the module that defines it if it has a page, else None."""
  home = getattr(obj, '__module__', None)
  if not isinstance(home, str) or home not in modules:
    return None
  page = sys.modules.get(home) or importlib.import_module(home)
  for anchor in (getattr(obj, '__qualname__', None), name):
    if isinstance(anchor, str) and getattr(page, anchor, None) is obj:
      return home, anchor
  # A registry may export a wrapper of the function its module documents.
  qualname = getattr(obj, '__qualname__', None)
  if isinstance(qualname, str) and '.' not in qualname and callable(
      getattr(page, qualname, None)):
    return home, qualname
  return home, None


def package_names(package, modules=None):
  """`[(shown name, summary, (module, anchor) or None)]` for the public names
  `package` exports (its `__all__`, else every name without a leading `_`
  that is not a submodule), sorted without regard to case."""
  modules = set(modules or public_modules())
  mod = importlib.import_module(package)
  prefix = SHORT_NAMES.get(package, package)
  names = getattr(mod, '__all__', None) or [
      n for n in dir(mod) if not n.startswith('_')]
  rows = []
  for name in sorted(names, key=lambda n: (n.lower(), n)):
    obj = getattr(mod, name)
    if inspect.ismodule(obj):
      continue
    rows.append((f'{prefix}.{name}', _summary(obj),
                 _documented_at(obj, name, modules)))
  return rows


def _page(module):
  return module.replace('.', '/') + '.html'


def _code(text):
  return re.sub(r'`([^`]+)`', r'<code>\1</code>', html.escape(text, quote=False))


def names_table(package, rows):
  """The HTML section listing `rows` (`package_names`) on `package`'s page."""
  here = posixpath.dirname(_page(package))
  lines = [f'<section id="public-names"><h2>Names in <code>{package}</code> '
           f'({len(rows)})</h2><table><tr><th>Name</th><th>Summary</th>'
           '<th>Documented in</th></tr>']
  for shown, summary, where in rows:
    name, home = f'<code>{html.escape(shown)}</code>', ''
    if where is not None:
      href = posixpath.relpath(_page(where[0]), here)
      name = (f'<a href="{href}#{where[1]}">{name}</a>' if where[1] else name)
      home = f'<a href="{href}">{where[0]}</a>'
    lines.append(f'<tr><td>{name}</td><td>{_code(summary)}</td>'
                 f'<td>{home}</td></tr>')
  lines.append('</table></section>')
  return '\n'.join(lines)


def add_name_tables(output_dir, modules):
  """Puts `names_table` on the page of each package in `modules` that
  exports names, after the package's docstring. Returns those packages."""
  done = []
  for package in modules:
    if not hasattr(importlib.import_module(package), '__path__'):
      continue
    rows = package_names(package, modules)
    if not rows:  # Subpackages only (their pages list their names).
      continue
    path = os.path.join(output_dir, _page(package))
    with open(path, encoding='utf-8') as f:
      text = f.read()
    start = text.find('<section class="module-info">')
    end = text.find('</section>', start) + len('</section>')
    if start < 0 or end < len('</section>'):
      raise ValueError(f'{path}: no module-info section (pdoc changed layout?)')
    table = names_table(package, rows)
    with open(path, 'w', encoding='utf-8') as f:
      f.write(text[:end] + '\n' + table + text[end:])
    done.append(package)
  return done


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
  add_name_tables(output_dir, modules)
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
