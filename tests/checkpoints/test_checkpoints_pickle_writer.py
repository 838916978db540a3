"""Tests for the Trax-compatible pickle emitter."""

import collections
import io
import warnings

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from checkpoint_testlib import pickle_globals
from checkpoint_testlib import ReferenceUnpickler
from checkpoint_testlib import TRAX_IMPORTABLE_GLOBALS
from retrax.checkpoints import pickle_writer
from retrax.checkpoints.records import TraxShapeDtype
from retrax.checkpoints.safe_unpickle import safe_loads


def _sample():
  return {
      'arrays': [np.arange(12, dtype=np.float32).reshape(3, 4),
                 np.array(0.1, np.float32),  # 0-d, like Dropout's state.
                 np.asfortranarray(np.arange(6).reshape(2, 3)),
                 np.arange(4, dtype='>i2'),
                 np.arange(5, dtype=np.float32)[::2],  # Non-contiguous.
                 np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
                 jnp.arange(3, dtype=jnp.int32),
                 np.zeros((0, 2), np.uint8), np.array([True, False])],
      'scalars': (np.float64(4.25), np.int32(-7), 0, 255, 65535, -1, 2**31,
                  -2**200, 1.0 / 3, 'ü' * 300, b'\x00' * 300, None, True,
                  False, ()),
      'history': {'_values': {'eval': collections.defaultdict(
          list, {'metrics/accuracy': [(1, 0.5), (2, 1.0)]})}},
      'sig': (TraxShapeDtype((16, 10), np.int32),
              TraxShapeDtype((None, 4), np.float32)),
  }


def _assert_equal(a, b):
  if isinstance(b, (np.ndarray, np.generic)) or hasattr(b, '__array__'):
    b = np.asarray(b)
    assert isinstance(a, (np.ndarray, np.generic))
    # numpy itself unpickles big-endian data into native order.
    assert a.dtype.newbyteorder('=') == b.dtype.newbyteorder('=')
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.asarray(a), b)
  elif isinstance(b, dict):
    assert type(a) is type(b) and list(a) == list(b)
    for k in b:
      _assert_equal(a[k], b[k])
  elif isinstance(b, (list, tuple)):
    assert type(a) is type(b) and len(a) == len(b)
    for x, y in zip(a, b):
      _assert_equal(x, y)
  elif isinstance(b, TraxShapeDtype):
    assert a.shape == b.shape and a.dtype == b.dtype
  else:
    assert type(a) is type(b) and a == b


def test_only_trax_importable_globals_are_referenced():
  data = pickle_writer.dumps(_sample())
  assert pickle_globals(data) <= TRAX_IMPORTABLE_GLOBALS
  assert ('trax.shapes', 'ShapeDtype') in pickle_globals(data)


def test_restricted_reader_round_trip():
  obj = _sample()
  _assert_equal(safe_loads(pickle_writer.dumps(obj)), obj)


def test_stdlib_unpickler_reads_it_like_trax_would(fake_trax):
  """numpy's own reconstruction + a Trax-like ShapeDtype class as reference."""
  obj = _sample()
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', DeprecationWarning)
    ref = ReferenceUnpickler(io.BytesIO(pickle_writer.dumps(obj))).load()
  sig = ref.pop('sig')
  assert all(type(s) is fake_trax.ShapeDtype for s in sig)
  assert [(s.shape, s.dtype) for s in sig] == [((16, 10), np.int32),
                                               ((None, 4), np.float32)]
  obj.pop('sig')
  _assert_equal(ref, obj)


def test_unsupported_value_names_its_path():
  with pytest.raises(TypeError, match=r"\['a'\]\[1\]"):
    pickle_writer.dumps({'a': [1, object()]})
  with pytest.raises(TypeError, match='factory'):
    pickle_writer.dumps(collections.defaultdict(lambda: 0))
