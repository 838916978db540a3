"""Control-flow and wrapper combinators (Scan, Cond, Chunk, Cache, BatchLeadingAxes,
Bidirectional) on hand-made inputs with exact expected outputs.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance
from tests.layers.combinator_testlib import as_list
from tests.layers.combinator_testlib import DivideBy
from tests.layers.combinator_testlib import jcall
from tests.layers.combinator_testlib import ReturnConst
from tests.layers.combinator_testlib import SmallerThan


# --- Scan ----------------------------------------------------------------------


def AddWithCarry():
  def f(x, carry):
    res = x + carry
    return res, res
  return base.Fn('AddWithCarry', f, n_out=2)


def test_scan_default_axis():
  layer = cb.Scan(AddWithCarry())
  xs = [np.array([[0, 1, 2, 3], [0, 10, 20, 30], [0, 100, 200, 300]]),
        np.array([9000, 8000, 7000, 6000])]
  assert as_list(layer(xs)) == [
      [[9000, 8001, 7002, 6003], [9000, 8011, 7022, 6033],
       [9000, 8111, 7222, 6333]], [9000, 8111, 7222, 6333]]
  assert repr(layer) == 'Scan_in2_out2[\n  AddWithCarry_in2_out2\n]'


def test_scan_axis_1():
  layer = cb.Scan(AddWithCarry(), axis=1)
  xs = [np.array([[0, 1, 2, 3], [0, 10, 20, 30], [0, 100, 200, 300]]),
        np.array([9000, 8000, 7000])]
  assert as_list(layer(xs)) == [
      [[9000, 9001, 9003, 9006], [8000, 8010, 8030, 8060],
       [7000, 7100, 7300, 7600]], [9006, 8060, 7600]]


def test_scan_predict_mode_keeps_carry_in_state():
  layer = cb.Scan(AddWithCarry(), axis=1, mode='predict')
  assert as_list(layer([np.array([[0, 1, 2]]), np.array([90])])) == [
      [[90, 91, 93]], [93]]
  assert as_list(layer([np.array([[3, 4]]), np.array([90])])) == [
      [[96, 100]], [100]]


def test_scan_multi_input_and_no_carry():
  def f(a, b, carry):
    return a + b, b, carry + 1
  layer = cb.Scan(base.Fn('MultiInputFn', f, n_out=3), axis=1)
  xs = [np.array([[0, 1, 2], [0, 10, 20]]), np.array([[4, 5, 6], [40, 50, 60]]),
        np.array([9000, 8000])]
  assert as_list(layer(xs)) == [[[4, 6, 8], [40, 60, 80]],
                                [[4, 5, 6], [40, 50, 60]], [9003, 8003]]
  layer = cb.Scan(base.Fn('AddOne', lambda x: x + 1), n_carry=0)
  assert as_list(layer(np.array([[1, 3, 7], [10, 30, 70]]))) == [
      [2, 4, 8], [11, 31, 71]]


def test_scan_with_weights_equals_python_loop():
  # An RNN-like cell: (x, h) -> (y, h') with h' = tanh(W [x, h] + b), y = h'.
  cell = cb.Serial(cb.Concatenate(), core.Dense(3),
                   base.Fn('Tanh', jnp.tanh), cb.Dup())
  layer = cb.Scan(cell, axis=1)
  xs = np.random.RandomState(0).randn(2, 5, 4).astype(np.float32)
  h0 = np.zeros((2, 3), np.float32)
  layer.init((ShapeDtype((2, 5, 4)), ShapeDtype((2, 3))),
             rng=jax.random.PRNGKey(1))
  ys, h = jcall(layer, (xs, h0))
  w, b = layer.weights[0][1]
  w, b = np.asarray(w, np.float64), np.asarray(b, np.float64)
  h_ref, ys_ref = h0.astype(np.float64), []
  for t in range(5):
    h_ref = np.tanh(np.concatenate([xs[:, t], h_ref], -1) @ w + b)
    ys_ref.append(h_ref)
  tol = float32_tolerance(rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ys, np.stack(ys_ref, 1), **tol)
  np.testing.assert_allclose(h, h_ref, **tol)
  with pytest.raises(ValueError, match='n_carry=2'):
    cb.Scan(core.Dense(3), n_carry=2)


# --- Cond, Chunk, Cache, BatchLeadingAxes, Bidirectional ---------------------


def test_cond_basic_and_functions():
  layer = cb.Cond(ReturnConst(True), ReturnConst([2]), ReturnConst([5]))
  layer.init(())
  assert as_list(layer(())) == 2
  layer = cb.Cond(ReturnConst(False), ReturnConst([2]), ReturnConst([5]))
  layer.init(())
  assert as_list(layer(())) == 5
  xs = (np.array(2.), np.array([4., 12.]))
  layer = cb.Cond(SmallerThan(3.0), DivideBy(2.), DivideBy(4.))
  layer.init(shapes.signature(xs))
  assert as_list(layer(xs)) == [2., 6.]
  xs = (np.array(4.), np.array([4., 12.]))
  assert as_list(layer(xs)) == [1., 3.]
  layer = cb.Cond(SmallerThan(3.0), DivideBy(2.))
  layer.init(shapes.signature(xs))
  assert as_list(layer(xs)) == [4., 12.]
  assert repr(layer) == 'Cond_in2[\n  SmallerThan\n  DivideBy\n  Serial\n]'


def test_cond_rejects_mismatched_branches_and_inputs():
  with pytest.raises(ValueError, match='n_out'):
    cb.Cond(SmallerThan(3.0), DivideBy(2.), cb.Dup())
  with pytest.raises(ValueError, match='n_in'):
    cb.Cond(SmallerThan(3.0), ReturnConst(2.), DivideBy(2.))
  layer = cb.Cond(SmallerThan(3.0), DivideBy(2.), DivideBy(5.))
  with pytest.raises(base.LayerError, match='expects a tuple of 2 inputs'):
    layer.init(ShapeDtype(()))


def test_cond_weights_and_state_under_jit():
  cond, true, false = SmallerThan(3.0), core.Dense(5), core.Dense(5)
  layer = cb.Cond(cond, true, false)
  xs = (np.array(2.), np.array([0., 1., 2.], np.float32))
  weights, state = layer.init(shapes.signature(xs))
  assert len(weights) == 3 and weights[0] == ()
  f = jax.jit(layer.pure_fn)
  rng = jax.random.PRNGKey(0)
  y_true, _ = f(xs, weights, state, rng)
  y_false, _ = f((np.array(5.), xs[1]), weights, state, rng)
  w, b = true.weights
  np.testing.assert_allclose(y_true, xs[1] @ w + b, rtol=1e-6)
  w, b = false.weights
  np.testing.assert_allclose(y_false, xs[1] @ w + b, rtol=1e-6)


def test_chunk_equals_unchunked():
  layer = core.Dense(4)
  x = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 0, 1]], np.float32)
  layer.init(shapes.signature(x))
  y = layer(x)
  for size in (1, 2, 4):
    np.testing.assert_allclose(cb.Chunk(layer, size)(x), y, rtol=1e-6)
  np.testing.assert_allclose(cb.Chunk(layer, 3)(x), y, rtol=1e-6)  # passes
  with pytest.raises(base.LayerError, match='must divide batch size'):
    cb.Chunk(layer, 3, pass_unchunkable=False)(x)
  assert cb.Chunk(layer, 0) is layer
  assert repr(cb.Chunk(core.Dense(4), 2)) == (
      'Serial[\n  ReshapeToChunks\n  Scan[\n    Dense_4\n  ]\n'
      '  ReshapeFromChunks\n]')


def test_cache_runs_sublayer_once():
  layer = cb.Cache(DivideBy(2.))
  layer.init(ShapeDtype((2,)))
  assert layer.state == ((), ())
  assert as_list(layer(np.array([2., 4.]))) == [1., 2.]
  assert as_list(layer(np.array([20., 40.]))) == [1., 2.]  # cached
  assert as_list(layer.state[0]) == [1., 2.]
  layer.state = ((), ())
  assert as_list(layer(np.array([20., 40.]))) == [10., 20.]
  assert repr(layer) == 'Cache[\n  DivideBy\n]'
  dense = core.Dense(3)
  cached = cb.Cache(dense)
  w, _ = cached.init(ShapeDtype((1, 2)))
  assert w[0][0] is dense.weights[0]


def test_batch_leading_axes():
  def id3(x):
    if len(x.shape) != 3:
      raise ValueError(f'rank {len(x.shape)}')
    return x
  layer = cb.BatchLeadingAxes(base.Fn('Id3Dim', id3), n_last_axes_to_keep=2)
  for shape in [(3, 4, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)]:
    assert layer.output_signature(ShapeDtype(shape)) == ShapeDtype(shape)
  assert layer(np.zeros((2, 3, 4, 5))).shape == (2, 3, 4, 5)
  dense = core.Dense(3)
  layer = cb.BatchLeadingAxes(dense)
  x = np.random.RandomState(0).randn(2, 3, 4, 5).astype(np.float32)
  layer.init(shapes.signature(x))
  w, b = dense.weights
  np.testing.assert_allclose(jcall(layer, x), x @ np.asarray(w) + np.asarray(b), rtol=1e-5,
                             atol=1e-6)
  assert repr(layer) == 'BatchLeadingAxes[\n  Dense_3\n]'
  with pytest.raises(ValueError, match='n_out = 1'):
    cb.BatchLeadingAxes(cb.Dup())


def test_bidirectional():
  fwd = core.Dense(2)
  layer = cb.Bidirectional(fwd)
  x = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
  layer.init(shapes.signature(x))
  y = jcall(layer, x)
  assert y.shape == (2, 3, 4)
  w, b = (np.asarray(a) for a in fwd.weights)
  np.testing.assert_allclose(y[..., :2], x @ w + b, rtol=1e-5, atol=1e-6)
  bwd = layer.sublayers[0].sublayers[1].sublayers[1].sublayers[1]
  assert bwd is not fwd
  wb, bb = (np.asarray(a) for a in bwd.weights)
  np.testing.assert_allclose(y[..., 2:], x @ wb + bb, rtol=1e-5, atol=1e-6)
  assert repr(layer) == (
      'Serial[\n  Branch_out2[\n    Dense_2\n    Serial[\n'
      '      _FlipAlongTimeAxis\n      Dense_2\n      _FlipAlongTimeAxis\n'
      '    ]\n  ]\n  Concatenate_in2\n]')
