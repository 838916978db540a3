"""Test-wide strictness: implicit promotion and stray warnings are errors.

Library code must say which dtype and which rank it means (users keep JAX's
defaults); `fastmath.promoted` / `fastmath.with_rank` make NumPy's rules
explicit where mixing is meant. The tests under `STRICT_DIRS` run with
`jax_numpy_dtype_promotion='strict'`, `jax_numpy_rank_promotion='raise'`
and warnings turned into errors; the other directories are being converted.
"""
import os

import jax
import pytest

STRICT_DIRS = ('tests/benchmarks', 'tests/checkpoints', 'tests/layers',
               'tests/lr', 'tests/optimizers', 'tests/data', 'tests/docs',
               'tests/models', 'tests/seeds')
_ROOT = os.path.dirname(os.path.abspath(__file__))


def _is_strict(path):
  rel = os.path.relpath(str(path), _ROOT).replace(os.sep, '/')
  return any(rel == d or rel.startswith(d + '/') for d in STRICT_DIRS)


def pytest_collection_modifyitems(items):
  for item in items:
    if _is_strict(item.path):
      # pytest applies a test's filterwarnings marks in order, its own first
      # and later ones winning: first is lowest, so the tests' own ignores
      # and their modules' still apply.
      item.add_marker(pytest.mark.filterwarnings('error'), append=False)


@pytest.fixture(autouse=True)
def _strict_promotion(request):
  if not _is_strict(request.path):
    yield
    return
  with jax.numpy_dtype_promotion('strict'), jax.numpy_rank_promotion('raise'):
    yield
