"""Each package's API page lists the names it exports, as users write them
(`tl.LSHSelfAttention`), with a one-line summary and a link to the module page."""

import importlib
import inspect
import os
import re
import sys

import retrax.layers as tl
import retrax.models

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, 'docs'))
build_api = importlib.import_module('build_api')


def _by_name(rows):
  return {shown: (summary, where) for shown, summary, where in rows}


def test_layers_index_names_what_tl_users_write():
  rows = _by_name(build_api.package_names('retrax.layers'))
  for name in ('LSHSelfAttention', 'Serial', 'Dense', 'Branch', 'Fn',
               'ReversibleSerial', 'CrossEntropyLoss'):
    summary, where = rows[f'tl.{name}']
    obj = getattr(tl, name)
    # The module that defines it (by Python's own record), at the anchor
    # pdoc gives it.
    assert where == (obj.__module__, name), (name, where)
    assert summary and inspect.getdoc(obj).startswith(summary.split(' ')[0])
  assert 'tl.core' not in rows and 'tl.base' not in rows  # Modules: links.
  assert len(rows) > 150


def test_every_link_goes_to_a_documented_module_holding_the_name():
  modules = build_api.public_modules()
  for package in ('retrax.layers', 'retrax.models', 'retrax.optimizers'):
    module = sys.modules[package]
    for shown, _, where in build_api.package_names(package, modules):
      if where is None:
        continue
      home, anchor = where
      assert home in modules, shown
      if anchor is None:
        continue
      documented = getattr(sys.modules[home], anchor)
      exported = getattr(module, shown.rsplit('.', 1)[1])
      # The same object, or a wrapper of the documented function (a registry).
      assert documented is exported or inspect.unwrap(exported) is documented or (
          getattr(exported, '__qualname__', None) == anchor), shown


def test_models_page_links_reformer_lm(tmp_path):
  modules = ['retrax.models', 'retrax.models.reformer',
             'retrax.models.reformer.reformer']
  build_api.build(str(tmp_path), modules)
  page = (tmp_path / 'retrax' / 'models.html').read_text('utf-8')
  section = page[page.index('<section id="public-names">'):]
  section = section[:section.index('</section>')]
  link = re.search(r'<a href="([^"#]+)#ReformerLM"><code>'
                   r'retrax.models.ReformerLM</code></a>', section)
  assert link, section[:500]
  target = tmp_path / 'retrax' / link.group(1)
  assert 'id="ReformerLM"' in target.read_text('utf-8')
  summary = inspect.getdoc(retrax.models.ReformerLM).split('\n')[0]
  assert summary.split('`')[0] in section
  # Every anchored link into a page that was built lands on its name.
  for href, anchor in re.findall(r'<a href="([^"#]+)#([^"]+)">', section):
    page_path = tmp_path / 'retrax' / href
    if page_path.exists():
      assert f'id="{anchor}"' in page_path.read_text('utf-8'), (href, anchor)
  # The table sits between the package's docstring and its members.
  assert page.index('class="module-info"') < page.index('id="public-names"')
