"""TensorFlow's test helpers, on numpy and absl, for running Trax's tests."""

import os
import shutil
import tempfile

from absl.testing import absltest
import numpy as np


class TestCase(absltest.TestCase):
  """The `tf.test.TestCase` assertions Trax's tests use."""

  def assertAllClose(self, a, b, rtol=1e-6, atol=1e-6, msg=None):
    np.testing.assert_allclose(_np(a), _np(b), rtol=rtol, atol=atol,
                               err_msg=msg or '')

  def assertAllEqual(self, a, b, msg=None):
    a, b = _np(a), _np(b)
    self.assertEqual(a.shape, b.shape, msg)
    np.testing.assert_array_equal(a, b, err_msg=msg or '')

  def assertNotAllClose(self, a, b, rtol=1e-6, atol=1e-6, msg=None):
    if np.allclose(_np(a), _np(b), rtol=rtol, atol=atol):
      self.fail(msg or f'{a} and {b} are close')

  def assertNear(self, f1, f2, err, msg=None):
    self.assertLessEqual(abs(f1 - f2), err, msg)

  def assertArrayNear(self, a, b, err, msg=None):
    for x, y in zip(a, b):
      self.assertNear(float(x), float(y), err, msg)

  def assertShapeEqual(self, a, b, msg=None):
    self.assertEqual(np.shape(a), np.shape(b), msg)

  def assertAllInSet(self, a, values):
    self.assertTrue(set(np.ravel(_np(a)).tolist()) <= set(values))

  def get_temp_dir(self):
    return get_temp_dir()

  def evaluate(self, x):
    return _np(x)


def _np(x):
  if isinstance(x, (list, tuple)) and x and not np.isscalar(x[0]):
    try:
      return np.asarray(x)
    except ValueError:
      return np.asarray([np.asarray(y) for y in x], dtype=object)
  return np.asarray(x)


def get_temp_dir():
  return tempfile.mkdtemp()


def main():
  absltest.main()


class _GFile:
  """`tf.io.gfile` on the local file system."""
  GFile = staticmethod(open)
  Open = staticmethod(open)
  exists = Exists = staticmethod(os.path.exists)
  listdir = ListDirectory = staticmethod(os.listdir)
  makedirs = MakeDirs = staticmethod(lambda p: os.makedirs(p, exist_ok=True))
  mkdir = MkDir = staticmethod(os.mkdir)
  remove = Remove = staticmethod(os.remove)
  rmtree = DeleteRecursively = staticmethod(shutil.rmtree)
  isdir = IsDirectory = staticmethod(os.path.isdir)
  glob = Glob = staticmethod(lambda p: __import__('glob').glob(p))
  rename = Rename = staticmethod(
      lambda a, b, overwrite=False: os.replace(a, b) if overwrite
      else os.rename(a, b))
  copy = Copy = staticmethod(lambda a, b, overwrite=False: shutil.copy(a, b))


gfile = _GFile()
