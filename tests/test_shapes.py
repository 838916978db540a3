"""ShapeDtype and signature(): construction, equality, repr, pickling, nesting."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.shapes import ShapeDtype


def test_constructor_and_defaults():
  sd = ShapeDtype((2, 3), np.int32)
  assert sd.shape == (2, 3) and sd.dtype == np.int32
  assert ShapeDtype((2, 3)).dtype == np.float32
  assert ShapeDtype([4, 5]).shape == (4, 5)  # lists become tuples
  assert ShapeDtype((None, 7)).shape == (None, 7)
  assert ShapeDtype((np.int64(2),)).shape == (2,)
  assert ShapeDtype((2,), 'int32').dtype == np.dtype('int32')
  assert ShapeDtype((2,), jnp.bfloat16).dtype == jnp.bfloat16
  with pytest.raises(TypeError, match='shape must be a tuple or list'):
    ShapeDtype(3)


def test_equality_hash_len_repr():
  a, b = ShapeDtype((2, 3)), ShapeDtype((2, 3), np.float32)
  assert a == b and not a != b and hash(a) == hash(b)
  assert a != ShapeDtype((2, 3), np.int32) and a != ShapeDtype((3, 2))
  assert a != (2, 3)
  assert len(a) == 1
  # As Trax's: the dtype spelled as given (the default is the type np.float32).
  assert repr(a) == "ShapeDtype{shape:(2, 3), dtype:<class 'numpy.float32'>}"
  assert repr(ShapeDtype((2,), np.dtype('int32'))) == (
      'ShapeDtype{shape:(2,), dtype:int32}')
  assert len({a, b, ShapeDtype((1,))}) == 2


def test_as_tuple_and_replace():
  sd = ShapeDtype((2, 3), np.int32)
  assert sd.as_tuple() == ((2, 3), np.int32)
  assert sd.replace(shape=(5,)) == ShapeDtype((5,), np.int32)
  assert sd.replace(dtype=np.float32) == ShapeDtype((2, 3))
  assert sd == ShapeDtype((2, 3), np.int32)  # replace does not mutate


def test_pickle_roundtrip_and_trax_state():
  sd = ShapeDtype((2, 3), np.int32)
  assert pickle.loads(pickle.dumps(sd)) == sd
  restored = ShapeDtype.__new__(ShapeDtype)
  restored.__setstate__({'shape': [1, 64], 'dtype': np.int32})  # Trax's state
  assert restored == ShapeDtype((1, 64), np.int32)


def test_signature_of_arrays_and_nests():
  array = np.array([[2, 3, 5, 7], [11, 13, 17, 19]], dtype=np.int16)
  assert shapes.signature(array) == ShapeDtype((2, 4), np.int16)
  assert shapes.signature(jnp.zeros((3,), jnp.bfloat16)) == ShapeDtype(
      (3,), jnp.bfloat16)
  assert shapes.signature(jax.ShapeDtypeStruct((1, 2), np.float32)) == (
      ShapeDtype((1, 2)))
  x1, x2 = np.array([1, 2, 3]), np.array([10., 20.])
  assert len(shapes.signature(())) == 0
  assert len(shapes.signature(x1)) == 1
  sig = shapes.signature((x1, [x2, {'k': x1}]))
  assert isinstance(sig, tuple) and isinstance(sig[1], list)
  assert sig == (ShapeDtype((3,), x1.dtype),
                 [ShapeDtype((2,), np.float64), {'k': ShapeDtype((3,), x1.dtype)}])
  assert shapes.signature(ShapeDtype((1,))) == ShapeDtype((1,))
  # Non-array stack items (the RevNet lab's 'n') keep their value.
  assert shapes.signature((x1, 'n')) == (ShapeDtype((3,), x1.dtype), 'n')


def test_splice_signatures():
  sds = [ShapeDtype((i,)) for i in range(1, 6)]
  spliced = shapes.splice_signatures(sds[0], tuple(sds[1:4]), (), sds[4])
  assert spliced == tuple(sds)
  assert shapes.splice_signatures((), sds[2]) == sds[2]


def test_shape_assertions():
  x = np.zeros((2, 3))
  shapes.assert_shape_equals(x, (2, 3))
  shapes.assert_same_shape(x, np.ones((2, 3)))
  with pytest.raises(AssertionError, match=r'Invalid shape \(2, 3\); expected '
                     r'\(3, 2\)'):
    shapes.assert_shape_equals(x, (3, 2))
  with pytest.raises(AssertionError):
    shapes.assert_same_shape(x, np.ones(3))
