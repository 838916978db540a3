"""float32_tolerance: a test's own tolerances off a TPU, floored on one."""

import jax
import pytest

from tests import backend_tolerance
from tests.backend_tolerance import TPU_FLOAT32_FLOOR, float32_tolerance


@pytest.fixture
def backend(monkeypatch):
  """Sets the backend that the helper sees (`jax.default_backend()`)."""
  def use(name):
    monkeypatch.setattr(jax, 'default_backend', lambda: name)
  return use


@pytest.mark.parametrize('name', ['cpu', 'gpu'])
def test_off_a_tpu_the_tests_own_values_come_back(backend, name):
  backend(name)
  assert float32_tolerance(rtol=1e-5, atol=2e-6) == dict(rtol=1e-5, atol=2e-6)
  assert float32_tolerance(rtol=0, atol=1e-5, scale=26.5) == dict(
      rtol=0, atol=1e-5 * 26.5)
  assert float32_tolerance(rtol=1e-5, atol=1e-5, scale=1.0)['atol'] == 1e-5


def test_this_process_reads_its_own_backend():
  assert backend_tolerance.on_tpu() == (jax.default_backend() == 'tpu')


def test_on_a_tpu_the_floor_applies_and_looser_values_stay(backend):
  backend('tpu')
  assert TPU_FLOAT32_FLOOR == 5e-4
  assert float32_tolerance(rtol=1e-5, atol=2e-6) == dict(rtol=5e-4, atol=5e-4)
  assert float32_tolerance(rtol=1e-3, atol=1e-5) == dict(rtol=1e-3, atol=5e-4)
  assert float32_tolerance(rtol=1e-5, atol=2e-2) == dict(rtol=5e-4, atol=2e-2)


def test_on_a_tpu_the_floor_is_a_fraction_of_scale_as_atol_is(backend):
  backend('tpu')
  assert float32_tolerance(rtol=0, atol=1e-5, scale=4.0) == dict(
      rtol=5e-4, atol=2e-3)
  assert float32_tolerance(rtol=0, atol=1e-3, scale=4.0)['atol'] == 4e-3
