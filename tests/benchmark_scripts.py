"""The scripts of `benchmarks/` as modules, for their tests.

`benchmarks/` is a folder of scripts run by path (`python benchmarks/x.py`),
not a package: a test loads the script it checks from its file.
"""

import importlib.util
import os

FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..',
                      'benchmarks')


def path(name):
  """The file of the script `benchmarks/<name>.py`."""
  return os.path.join(FOLDER, name + '.py')


def load(name):
  """The script `benchmarks/<name>.py`, executed as a new module."""
  spec = importlib.util.spec_from_file_location(f'{name}_bench', path(name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
