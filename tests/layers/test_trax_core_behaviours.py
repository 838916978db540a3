"""Core behaviours as in Trax 1.4.1.

AssertShape specs, Cond's input count, TFNP float64, flat weights.
"""

import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import shapes

# The tensorflow-numpy backend warns that it computes with JAX; expected here.
pytestmark = pytest.mark.filterwarnings('ignore:retrax has no TensorFlow backend')


@pytest.mark.parametrize('spec', ['b......c,2', 'b..c,2', '...c...,2'])
def test_assert_shape_refuses_more_than_one_ellipsis(spec):
  layer = tl.AssertShape(spec)  # as in Trax, the spec is checked when run
  with pytest.raises(tl.LayerError, match='at most one'):
    layer([np.ones((2, 3, 4, 5)), np.zeros(2)])


def test_assert_shape_one_ellipsis_still_matches():
  layer = tl.AssertShape('b...c,2')
  xs = [np.ones((2, 3, 4, 5)), np.zeros(2)]
  assert layer(xs) is xs


def _cond():
  return tl.Cond(tl.Fn('Small', lambda x: x < 3.), tl.Fn('Two', lambda: 2.),
                 tl.Fn('Five', lambda: 5.))


def test_cond_runs_with_exactly_n_in_inputs():
  layer = _cond()
  assert layer.n_in == 1
  layer.init(shapes.signature(np.array(4.)))
  assert float(layer(np.array(4.))) == 5.
  assert float(layer(np.array(1.))) == 2.


@pytest.mark.parametrize('xs', [(), (np.array(4.), np.array([4., 12.]))])
def test_cond_with_other_input_counts_raises(xs):
  with pytest.raises(tl.LayerError, match='exactly n_in=1 inputs'):
    layer = _cond()
    layer.init(shapes.signature(xs))
    layer(xs)


def test_cond_inside_serial_leaves_lower_stack_items():
  model = tl.Serial(_cond(), tl.Add())
  x = (np.array(1.), np.array(10.))
  model.init(shapes.signature(x))
  assert float(model(x)) == 12.


@pytest.mark.parametrize('layer_fn', [tl.BatchNorm, tl.LayerNorm])
@pytest.mark.parametrize('dtype', [np.float32, np.float64])
def test_tfnp_backend_keeps_the_input_float_type(layer_fn, dtype):
  x = np.random.RandomState(0).normal(size=(3, 2, 7)).astype(dtype)
  with fastmath.use_backend(fastmath.Backend.TFNP):
    layer = layer_fn()
    layer.init(shapes.signature(x))
    y = layer(x)
  assert y.dtype == dtype
  if layer_fn is tl.LayerNorm:  # closed form, with unit scale and zero bias
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(
        x.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, want, rtol=1e-12 if dtype == np.float64
                               else 1e-4, atol=1e-12 if dtype == np.float64
                               else 1e-5)
  assert fastmath.numpy.ones(2).dtype == np.float32  # 32-bit again outside


def test_tfnp_random_draws_equal_jax_s():
  key = fastmath.random.get_prng(3)
  want = [fastmath.random.normal(key, (4,)),
          fastmath.random.uniform(key, (4,), minval=-1., maxval=2.),
          fastmath.random.randint(key, (4,), 0, 9)]
  with fastmath.use_backend('tensorflow-numpy'):
    got = [fastmath.random.normal(key, (4,)),
           fastmath.random.uniform(key, (4,), minval=-1., maxval=2.),
           fastmath.random.randint(key, (4,), 0, 9)]
  for g, w in zip(got, want):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(g, w)


def test_set_backend_tfnp_turns_x64_on_and_back_off():
  import jax
  assert not jax.config.jax_enable_x64
  fastmath.set_backend('tensorflow-numpy')
  try:
    assert jax.config.jax_enable_x64
    assert fastmath.numpy.asarray(np.ones(2)).dtype == np.float64
  finally:
    fastmath.set_backend(None)
  assert not jax.config.jax_enable_x64


def test_flatten_weights_and_state_skip_empty_and_shared():
  shared = tl.Dense(2)
  model = tl.Serial(shared, tl.Relu(), shared, tl.BatchNorm(axis=(0,)))
  model.init(shapes.ShapeDtype((3, 2)))
  flat_w, flat_s = tl.flatten_weights_and_state(model.weights, model.state)
  # Dense (w, b) once (its second use is a cache marker), BatchNorm (beta, gamma).
  assert [w.shape for w in flat_w] == [(2, 2), (2,), (2,), (2,)]
  assert len(flat_s) == 3 and flat_s[-1].shape == ()  # mean, var, count
  w, s = tl.unflatten_weights_and_state(
      flat_w, flat_s, (model.weights, model.state))
  np.testing.assert_array_equal(w[0][0], model.weights[0][0])


def test_fastmath_backend_table_matches_backend():
  from retrax.fastmath import ops
  table = ops._backend_dict
  assert set(table) == set(ops.Backend)
  for b in ops.Backend:
    assert table[b]['name'] == b.value
    with fastmath.use_backend(b):
      assert fastmath.backend()['np'] is table[b]['np']


def test_layers_namespace_carries_shapes_and_fastmath():
  # In Trax, `from trax.layers.base import *` exports the modules base.py
  # imports: notebooks call `tl.shapes.signature(...)`.
  assert tl.shapes is shapes and tl.fastmath is fastmath
  sig = tl.shapes.signature((np.zeros((2, 3), np.int32), np.ones(4)))
  assert sig == (shapes.ShapeDtype((2, 3), np.int32),
                 shapes.ShapeDtype((4,), np.float64))
