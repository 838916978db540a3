"""gin's `backend.name` selects the default backend under retrax.compat (as
Trax's gin-configurable `fastmath.backend` did)."""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PROGRAM = textwrap.dedent('''
    import sys
    import jax.numpy as jnp
    import numpy as onp
    import retrax.compat
    retrax.compat.install()
    assert 'gin' not in sys.modules  # nothing imported until the program does
    from trax import fastmath
    import gin
    assert fastmath.backend()['np'] is jnp and fastmath.backend_name() == 'jax'
    gin.parse_config_files_and_bindings(None, "backend.name = 'numpy'")
    assert fastmath.backend()['np'] is onp
    assert fastmath.backend_name() == 'numpy'
    assert fastmath.numpy.isinf is onp.isinf
    assert fastmath.backend('jax')['np'] is jnp  # an explicit name wins
    with fastmath.use_backend('jax'):  # an override wins over gin
      assert fastmath.backend_name() == 'jax'
    fastmath.set_backend('jax')
    assert fastmath.backend_name() == 'jax'
    fastmath.set_backend(None)
    assert fastmath.backend_name() == 'numpy'
    gin.clear_config()
    assert fastmath.backend_name() == 'jax'
    gin.parse_config("backend.name = 'no-such-backend'")
    try:
      fastmath.backend_name()
      raise AssertionError('an unknown backend name was accepted')
    except ValueError as e:
      assert "'no-such-backend'" in str(e), e
    gin.clear_config()
    print('ok')
''')


def test_gin_backend_name_under_compat():
  if importlib.util.find_spec('gin') is None:  # Not imported here: see
    pytest.skip('gin-config is not installed')  # tests/test_trax_gin.py.
  out = subprocess.run([sys.executable, '-c', _PROGRAM], cwd=_ROOT,
                       capture_output=True, text=True, timeout=300,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().endswith('ok')
