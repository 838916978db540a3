"""`retrax.configurable`: gin names declared without gin, registered on request.

Each test loads its own copy of the module (its declarations and its
registered flag are per process) and declares names under a gin module of
its own, so retrax's names stay unregistered here.
"""

import functools
import importlib.util

import pytest

import retrax.configurable

gin = pytest.importorskip('gin')


def _fresh_configurable():
  spec = importlib.util.spec_from_file_location(
      '_configurable_copy', retrax.configurable.__file__)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _decorated(fn):  # A decorator hiding the signature from getfullargspec.
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    return fn(*args, **kwargs)
  return wrapper


@pytest.fixture(autouse=True)
def clear_gin_config():
  yield
  gin.clear_config()


def test_declared_names_follow_gin_once_registered_and_stay_the_same_objects():
  c = _fresh_configurable()

  @c.configurable('configurable_test_a', denylist=('mode',))
  @_decorated
  def Layer(size, scale=1, mode='train'):
    return (size, scale, mode)

  @c.configurable('configurable_test_a')
  class Cell:
    def __init__(self, units=2):
      self.units = units

  declared = (Layer, Cell)
  assert Layer(3) == (3, 1, 'train') and not c.registered()
  assert c.bound_arguments(Layer) == {}
  c.register(gin)
  c.register(gin)  # Idempotent.
  assert (Layer, Cell) == declared  # Nothing rebound.

  @c.configurable('configurable_test_a')  # Declared after: registered now.
  def schedule(rate=0.5):
    return rate

  gin.parse_config('configurable_test_a.Layer.scale = 5\n'
                   'configurable_test_a.Cell.units = 7\n'
                   'configurable_test_a.schedule.rate = 0.1\n')
  assert Layer(3) == (3, 5, 'train')
  assert Layer(3, 4) == (3, 4, 'train')  # A positional argument wins.
  assert Cell().units == 7 and schedule() == 0.1
  assert c.bound_arguments(Layer) == {'scale': 5}
  configured = gin.get_configurable('configurable_test_a.Layer')
  assert configured is not Layer and c.public_object(configured) is Layer
  assert c.bound_arguments(configured) == {'scale': 5}
  assert c.public_object(Cell) is Cell and c.bound_arguments(len) == {}
  with pytest.raises(ValueError, match='mode'):
    gin.parse_config('configurable_test_a.Layer.mode = "predict"')
  with pytest.raises(ValueError, match='no_such'):
    gin.parse_config('configurable_test_a.Layer.no_such = 1')
  assert ('configurable_test_a', 'schedule') in c.declared_names()


def test_a_function_declared_under_two_modules_is_one_object():
  c = _fresh_configurable()

  def head(n=1):
    return n

  public = c.configurable('configurable_test_b')(head)
  assert c.configurable('configurable_test_b.research')(public) is public
  c.register(gin)
  gin.parse_config('configurable_test_b.head.n = 2\n'
                   'configurable_test_b.research.head.n = 3\n')
  assert public() == 2  # The first module's bindings.
  assert gin.get_configurable('configurable_test_b.research.head')() == 3
  with pytest.raises(TypeError, match='gin module'):
    c.configurable()(head)
