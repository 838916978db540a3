"""Test-wide strictness: implicit promotion and stray warnings are errors.

Library code must say which dtype and which rank it means (users keep JAX's
defaults); `fastmath.promoted` / `fastmath.with_rank` make NumPy's rules
explicit where mixing is meant. Every test runs with
`jax_numpy_dtype_promotion='strict'`, `jax_numpy_rank_promotion='raise'`
and warnings turned into errors.
"""
import glob
import importlib.util
import os


def _cpu_only():
  """Whether this process's JAX can only be XLA:CPU (no TPU device or library,
  no GPU plugin)."""
  platforms = os.environ.get('JAX_PLATFORMS', '')
  if platforms:
    return platforms == 'cpu'
  return not (os.environ.get('TPU_LIBRARY_PATH') or glob.glob('/dev/accel*')
              or any(importlib.util.find_spec(plugin) for plugin in (
                  'libtpu', 'jax_cuda12_plugin', 'jax_cuda13_plugin',
                  'jax_rocm7_plugin')))


# The tests' programs are small: most of the suite's time is XLA:CPU
# compiling them, and most of that is LLVM optimising the generated code
# (the default suite on 2 cores: 18 min 43 s with it, 12 min 23 s without).
# Results may differ in their last bits between levels (no fast-math
# either way), so the processes tests start inherit it
# (`tests.multiprocess_env.xla_flags`). Only where the CPU is the backend:
# an accelerator's compiler keeps its own settings; a test process's own
# XLA_FLAGS win.
if _cpu_only() and '--xla_backend_optimization_level' not in os.environ.get(
    'XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                             ' --xla_backend_optimization_level=0').strip()

# (XLA reads XLA_FLAGS when a backend starts, not at import; set first anyway.)
import jax  # noqa: E402
import pytest  # noqa: E402

from retrax.layers import tutorial_checks  # noqa: E402

# `--quick` / `--record-durations`: the quick subset (tests/quick_subset.py).
pytest_plugins = ['tests.quick_subset']


def pytest_configure(config):
  """On an accelerator, the processes that tests start run on the CPU.

  One program at a time can hold a TPU chip: a child opening it while this
  process holds it fails ("libtpu multi-process lockfile"). Tests that
  compare a child's numbers with this process's pass `platform=None` to
  `tests.multiprocess_env.cpu_env` and are skipped off the CPU.

  On a TPU the tests' float32 matmuls run at full precision (see below).
  """
  del config
  if jax.default_backend() == 'tpu':
    # A TPU's default precision multiplies float32 operands in one bfloat16
    # pass (~8 mantissa bits): on a v5e (JAX 0.10.2) ~40 attention tests
    # were off float64 NumPy, or eval off predict, by 3e-3..2e-2 (relative
    # up to ~1e-2) against tolerances of 1e-5. 'highest' is float32 on the
    # chip, as a CPU computes; tests of the default or bfloat16 precision
    # set theirs (`jax.default_matmul_precision`, `precision.matmul_precision`).
    jax.config.update('jax_default_matmul_precision', 'highest')
  if jax.default_backend() != 'cpu':
    os.environ['RETRAX_TEST_BACKEND'] = jax.default_backend()
    os.environ['JAX_PLATFORMS'] = 'cpu'


def pytest_collection_modifyitems(items):
  for item in items:
    # pytest applies a test's filterwarnings marks in order, its own first
    # and later ones winning: first is lowest, so the tests' own ignores
    # and their modules' still apply.
    item.add_marker(pytest.mark.filterwarnings('error'), append=False)


@pytest.fixture(autouse=True)
def _strict_promotion():
  with jax.numpy_dtype_promotion('strict'), jax.numpy_rank_promotion('raise'):
    yield
  # The once-per-process log-probabilities warning (and one that a jitted
  # check left pending) must not leak from one test into the next.
  tutorial_checks.reset()


@pytest.fixture
def threefry_not_partitionable():
  """Trax's random bits (jax<0.5's threefry): goldens' LSH rotations, dropout."""
  old = jax.config.jax_threefry_partitionable
  jax.config.update('jax_threefry_partitionable', False)
  yield
  jax.config.update('jax_threefry_partitionable', old)


def pytest_terminal_summary(terminalreporter):
  """Lists the files and functions a reviewer should look at (never fails)."""
  from tests import test_code_shape as shape
  found = shape.over(shape.REVIEW_FILE_LINES, shape.REVIEW_FUNCTION_LINES)
  if found:
    terminalreporter.write_sep(
        '-', f'size review: over {shape.REVIEW_FILE_LINES} lines of code per '
        f'file or {shape.REVIEW_FUNCTION_LINES} per function')
    for line in found:
      terminalreporter.write_line(line)
