"""Combinators on hand-made inputs with exact expected outputs.

Trax's combinators_test cases and more.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import normalization
from retrax.shapes import ShapeDtype
from tests.layers.combinator_testlib import as_list
from tests.layers.combinator_testlib import Counter
from tests.layers.combinator_testlib import DivideBy
from tests.layers.combinator_testlib import ReturnConst



# --- Serial ------------------------------------------------------------------


def test_serial_none_and_empty_list_are_no_ops():
  xs = [np.array([1, 2, 3, 4]), np.array([10, 20, 30])]
  for layer in (cb.Serial(None), cb.Serial([]), cb.Serial()):
    assert as_list(layer(xs)) == [[1, 2, 3, 4], [10, 20, 30]]
    assert (layer.n_in, layer.n_out) == (1, 1)


def test_serial_flattens_nested_lists_and_drops_none():
  d1, d2, relu = core.Dense(2), core.Dense(3), core.Flatten()
  layer = cb.Serial([d1, [None, relu]], None, [[d2]])
  assert list(layer.sublayers) == [d1, relu, d2]
  with pytest.raises(ValueError, match='non-layer object'):
    cb.Serial(core.Dense(2), 'Dense')


def test_serial_stack_semantics():
  assert as_list(cb.Serial(DivideBy(3))(np.array([3, 6, 9, 12]))) == [1, 2, 3, 4]
  layer = cb.Serial(ReturnConst(np.array([3, 4, 5, 6])))
  assert (layer.n_in, layer.n_out) == (0, 1)
  assert as_list(layer(())) == [3, 4, 5, 6]
  layer = cb.Serial(DivideBy(3), ReturnConst(np.array([3, 4, 5, 6])))
  assert (layer.n_in, layer.n_out) == (1, 2)
  assert as_list(layer(np.array([3, 6, 9, 12]))) == [[3, 4, 5, 6], [1, 2, 3, 4]]
  layer = cb.Serial(ReturnConst(np.array([3, 6, 9, 12])), DivideBy(3))
  assert as_list(layer(())) == [1, 2, 3, 4]
  assert as_list(cb.Serial(DivideBy(2.0), DivideBy(5.0))(
      np.array([10, 20, 30]))) == [1, 2, 3]
  layer = cb.Serial(cb.Dup(), cb.Dup())
  assert (layer.n_in, layer.n_out) == (1, 3)
  assert as_list(layer(np.array([1, 2, 3]))) == [[1, 2, 3]] * 3


def test_serial_n_in_n_out_running_max():
  # Add needs the item below Dense's output: Serial takes 2, gives 1.
  layer = cb.Serial(core.Dense(4), cb.Add())
  assert (layer.n_in, layer.n_out) == (2, 1)
  # Select 3->1, Dup 1->2, Concatenate needs a 4th item from below.
  layer = cb.Serial(cb.Select([0], n_in=3), cb.Dup(), cb.Concatenate(3))
  assert (layer.n_in, layer.n_out) == (4, 1)


def test_serial_extra_stack_items_pass_through():
  layer = cb.Serial(DivideBy(2), cb.Dup())
  ys = layer([np.array([4, 8]), 'n', np.array([7])])
  assert len(ys) == 4
  assert as_list(ys[:2]) == [[2., 4.], [2., 4.]]
  assert ys[2] == 'n' and as_list(ys[3]) == [7]


def test_serial_repr_and_names():
  layer = cb.Serial(cb.Dup(), cb.Dup())
  assert repr(layer) == 'Serial_out3[\n  Dup_out2\n  Dup_out2\n]'
  assert repr(cb.Serial(cb.Dup(), cb.Dup(), name='Branch')).startswith(
      'Branch_out3[')
  nested = cb.Serial(core.Dense(4), cb.Serial(core.Dense(5), cb.Drop()))
  assert repr(nested) == ('Serial_out0[\n  Dense_4\n  Serial_out0[\n'
                          '    Dense_5\n    Drop_out0\n  ]\n]')


def test_serial_weights_and_state_trees():
  model = cb.Serial(core.Dense(4), core.Dense(5), core.Dense(7))
  assert isinstance(model.weights, tuple) and len(model.weights) == 3
  assert isinstance(model.state, tuple) and len(model.state) == 3
  weights, state = model.init(ShapeDtype((2, 3)))
  assert [w.shape for w, _ in weights] == [(3, 4), (4, 5), (5, 7)]
  assert state == ((), (), ())


def test_assign_sublayer_weights_is_seen_by_combinator():
  layer = core.Dense(5, use_bias=False)
  model = cb.Serial(cb.Serial(layer, core.Dense(6)), core.Dense(7))
  model.init(ShapeDtype((5,)))
  new = np.ones((5, 5), np.float32)
  layer.weights = new
  assert model.weights[0][0] is new


def test_init_twice_gives_fresh_weights_with_same_shapes():
  model = cb.Serial(core.Dense(4))
  w1, _ = model.init(ShapeDtype((2, 3)))
  w2, _ = model.init(ShapeDtype((2, 3)))
  assert w1[0][0].shape == w2[0][0].shape == (3, 4)


def test_set_rng_recurses_two_levels():
  layer = cb.Serial(cb.Serial(core.Dense(2), core.Dense(2)),
                    cb.Serial(core.Dense(2), core.Dense(2)))
  layer.init(ShapeDtype((1, 2)), rng=jax.random.PRNGKey(0))
  (w00, _), (w01, _) = layer.weights[0]
  (w10, _), (w11, _) = layer.weights[1]
  for a, b in [(w00, w01), (w10, w11), (w00, w10)]:
    assert not np.array_equal(a, b)


# --- weight sharing ------------------------------------------------------------


def test_shared_layer_second_occurrence_is_cache_marker():
  layer = core.Dense(5)
  for model, index in [
      (cb.Serial(layer, layer), (1,)),
      (cb.Serial(layer, cb.Serial(layer)), (1, 0)),
      (cb.Serial(cb.Serial(layer), cb.Serial(layer)), (1, 0)),
      (cb.Parallel(layer, layer), (1,)),
  ]:
    sig = ShapeDtype((5,)) if model.n_in == 1 else (ShapeDtype((5,)),) * 2
    weights, state = model.init(sig)
    w, s = weights, state
    for i in index:
      w, s = w[i], s[i]
    assert w is base.GET_WEIGHTS_FROM_CACHE
    assert s is base.GET_STATE_FROM_CACHE


def test_shared_serial_runs_and_shares():
  layer = cb.Serial(core.Dense(5), core.Dense(5))
  model = cb.Serial(layer, layer)
  x = np.arange(5, dtype=np.float32)
  weights, _ = model.init(shapes.signature(x))
  assert weights[0] is not base.GET_WEIGHTS_FROM_CACHE
  assert weights[1] is base.GET_WEIGHTS_FROM_CACHE
  np.testing.assert_allclose(model(x), layer(layer(x)), rtol=1e-6)


def test_shared_weights_gradient_flows_through_both_uses():
  d = core.Dense(3)
  model = cb.Serial(d, d)
  x = np.random.RandomState(1).randn(2, 3).astype(np.float32)
  weights, state = model.init(ShapeDtype((2, 3)), rng=jax.random.PRNGKey(2))

  def loss(weights):
    y, _ = model.pure_fn(x, weights, state, jax.random.PRNGKey(0))
    return jnp.sum(y ** 2)

  def reference(wb):
    w, b = wb
    b = b[None]  # Over the batch axis.
    y = (x @ w + b) @ w + b
    return jnp.sum(y ** 2)

  grads = jax.jit(jax.grad(loss))(weights)
  ref = jax.jit(jax.grad(reference))(weights[0])
  assert grads[1] == base.GET_WEIGHTS_FROM_CACHE
  np.testing.assert_allclose(grads[0][0], ref[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grads[0][1], ref[1], rtol=1e-5, atol=1e-6)
  # The shared gradient is the sum of both uses: differs from the first use's.
  first_only = jax.jit(jax.grad(lambda wb: jnp.sum(
      ((x @ wb[0] + wb[1][None]) @ jax.lax.stop_gradient(wb[0])
       + jax.lax.stop_gradient(wb[1][None])) ** 2)))(weights[0])
  assert not np.allclose(grads[0][0], first_only[0])


def test_flatten_unflatten_weights_shared():
  shared = core.Dense(5)
  model = cb.Serial(core.Dense(5), shared, cb.Serial(shared, cb.Dup()))
  model.init(ShapeDtype((2, 3)))
  flat_w, flat_s = base.flatten_weights_and_state(model.weights, model.state)
  assert len(flat_w) == 4 and not flat_s
  model2 = cb.Serial(core.Dense(5), cb.Dup(), core.Dense(5))
  sig = model2.weights_and_state_signature(ShapeDtype((2, 3)))
  w2, s2 = base.unflatten_weights_and_state(flat_w, flat_s, sig)
  assert w2[1] == ()
  np.testing.assert_array_equal(w2[0][0], model.weights[0][0])
  np.testing.assert_array_equal(w2[2][0], model.weights[1][0])
  with pytest.raises(ValueError, match='the tree needs only 4'):
    base.unflatten_weights_and_state(flat_w + [np.zeros(1)], flat_s, sig)


# --- Parallel, Branch, Residual, Select ----------------------------------------


def test_parallel():
  xs = [np.array([1, 2, 3]), np.array([10, 20])]
  layer = cb.Parallel(cb.Dup(), cb.Dup())
  assert (layer.n_in, layer.n_out) == (2, 4)
  assert as_list(layer(xs)) == [[1, 2, 3], [1, 2, 3], [10, 20], [10, 20]]
  layer = cb.Parallel(DivideBy(0.5), DivideBy(3.0))
  assert as_list(layer([np.array([1, 2, 3]), np.array([30, 60])])) == [
      [2, 4, 6], [10, 20]]
  assert as_list(cb.Parallel([], None)(xs)) == [[1, 2, 3], [10, 20]]
  assert repr(cb.Parallel(core.Dense(2), cb.Dup(), name='PD')) == (
      'PD_in2_out3[\n  Dense_2\n  Dup_out2\n]')
  with pytest.raises(ValueError, match='at least two'):
    cb.Parallel(cb.Dup())
  with pytest.raises(ValueError, match='n_in = 0'):
    cb.Parallel(cb.Dup(), ReturnConst(1))


def test_parallel_spans():
  # F: 1 in 1 out, G: 3 in 1 out, H: 2 in 2 out (Trax's docstring example).
  f = base.Fn('F', lambda a: a * 10)
  g = base.Fn('G', lambda b, c, d: b + c + d)
  h = base.Fn('H', lambda e, f_: (e - f_, e * f_), n_out=2)
  layer = cb.Parallel(f, g, h)
  assert (layer.n_in, layer.n_out) == (6, 4)
  ys = layer([np.array(v) for v in (1, 2, 3, 4, 5, 6)])
  assert as_list(ys) == [10, 9, -1, 30]


def test_branch():
  x = np.array([1, 2, 3])
  assert as_list(cb.Branch([], cb.Dup())(x)) == [[1, 2, 3]] * 3
  layer = cb.Branch(cb.Add(), DivideBy(0.5))
  assert as_list(layer([np.array([1, 2, 3]), np.array([10, 20, 30])])) == [
      [11, 22, 33], [2, 4, 6]]
  assert as_list(cb.Branch(DivideBy(0.5))(x)) == [2, 4, 6]
  assert str(cb.Branch(cb.Add(), cb.Add())) == (
      'Branch_in2_out2[\n  Add_in2\n  Add_in2\n]')


def test_branch_with_none_is_identity_branch():
  layer = cb.Branch(DivideBy(2.), None)
  assert (layer.n_in, layer.n_out) == (1, 2)
  assert as_list(layer(np.array([4., 8.]))) == [[2., 4.], [4., 8.]]
  assert repr(layer) == 'Branch_out2[\n  DivideBy\n  None\n]'


def test_branch_of_f_g_h_docstring_example():
  f = base.Fn('F', lambda a: a * 10)
  g = base.Fn('G', lambda a, b, c: a + b + c)
  h = base.Fn('H', lambda a, b: (a - b, a * b), n_out=2)
  layer = cb.Branch(f, g, h)
  assert (layer.n_in, layer.n_out) == (3, 4)
  assert as_list(layer([np.array(1), np.array(2), np.array(3)])) == [
      10, 6, -1, 2]


def test_residual():
  x = np.array([1., 2.])
  layer = cb.Residual(DivideBy(2.))
  assert as_list(layer(x)) == [1.5, 3.]
  assert repr(layer) == ('Serial[\n  Branch_out2[\n    None\n    DivideBy\n'
                         '  ]\n  Add_in2\n]')
  # Several layers run in series.
  layer = cb.Residual(DivideBy(2.), DivideBy(2.))
  assert as_list(layer(x)) == [1.25, 2.5]
  # A shortcut replaces the identity: shortcut(x) + f(x).
  layer = cb.Residual(DivideBy(2.), shortcut=DivideBy(0.1))
  assert as_list(layer(x)) == pytest.approx([10.5, 21.])


def test_select():
  assert cb.Select([0, 0]).n_in == 1 and cb.Select([1, 0]).n_in == 2
  assert cb.Select([2]).n_in == 3 and cb.Select([0], n_in=3).n_in == 3
  xs = [np.array([1, 2, 3]), np.array([10, 20]), np.array([100])]
  assert as_list(cb.Select([0], n_in=3)(xs)) == [1, 2, 3]
  assert as_list(cb.Select([1], n_in=3)(xs)) == [10, 20]
  assert as_list(cb.Select([2, 0, 0])(xs)) == [[100], [1, 2, 3], [1, 2, 3]]
  assert repr(cb.Select([1, 0])) == 'Select[1,0]_in2_out2'
  assert repr(cb.Select((1, 0))) == 'Select(1,0)_in2_out2'
  assert repr(cb.Select([0], n_in=2, name='Pick')) == 'Pick_in2'
  with pytest.raises(ValueError, match='must lie in'):
    cb.Select([2], n_in=2)


def test_dup_drop_swap():
  x, y = np.array([1, 2, 3]), np.array([10, 20, 30])
  assert as_list(cb.Drop()(x)) == []
  assert as_list(cb.Dup()(x)) == [[1, 2, 3], [1, 2, 3]]
  assert as_list(cb.Swap()([x, y])) == [[10, 20, 30], [1, 2, 3]]
  assert [repr(cb.Drop()), repr(cb.Dup()), repr(cb.Swap())] == [
      'Drop_out0', 'Dup_out2', 'Swap_in2_out2']
  # Drop inside a Serial removes the top item.
  assert as_list(cb.Serial(cb.Drop())([x, y])) == [10, 20, 30]


def test_elementwise_combinators():
  a, b, c = np.array([1., 2.]), np.array([10., 20.]), np.array([.25, .5])
  assert as_list(cb.Add()([a, b])) == [11., 22.]
  assert as_list(cb.SubtractTop()([a, b])) == [9., 18.]
  assert as_list(cb.Multiply()([a, b])) == [10., 40.]
  # Gate(memory, gate, candidate) = gate * memory + (1 - gate) * candidate.
  assert as_list(cb.Gate()([a, c, b])) == [.25 * 1 + .75 * 10, .5 * 2 + .5 * 20]
  assert [repr(l) for l in (cb.Add(), cb.SubtractTop(), cb.Multiply(),
                            cb.Gate())] == [
                                'Add_in2', 'SubtractTop_in2', 'Multiply_in2',
                                'Gate_in3']


def test_concatenate():
  xs = [np.array([[1, 2, 3], [4, 5, 6]]), np.array([[10, 20, 30], [40, 50, 60]])]
  assert as_list(cb.Concatenate()(xs)) == [[1, 2, 3, 10, 20, 30],
                                          [4, 5, 6, 40, 50, 60]]
  assert as_list(cb.Concatenate(axis=0)(xs)) == [
      [1, 2, 3], [4, 5, 6], [10, 20, 30], [40, 50, 60]]
  assert as_list(cb.Concatenate(axis=1)(xs)) == as_list(cb.Concatenate()(xs))
  xs3 = xs + [np.array([[100, 200, 300], [400, 500, 600]])]
  assert as_list(cb.Concatenate(n_items=3)(xs3)) == [
      [1, 2, 3, 10, 20, 30, 100, 200, 300], [4, 5, 6, 40, 50, 60, 400, 500, 600]]
  assert [repr(cb.Concatenate()), repr(cb.Concatenate(axis=0)),
          repr(cb.Concatenate(axis=1)), repr(cb.Concatenate(n_items=3))] == [
              'Concatenate_in2', 'Concatenate_axis0_in2',
              'Concatenate_axis1_in2', 'Concatenate_in3']


def test_split():
  x = np.arange(12).reshape(2, 6)
  layer = cb.Split()
  assert (layer.n_in, layer.n_out) == (1, 2)
  assert as_list(layer(x)) == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10, 11]]]
  assert as_list(cb.Split(n_items=3, axis=-1)(x)) == [
      [[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
  assert as_list(cb.Split(axis=0)(x)) == [[[0, 1, 2, 3, 4, 5]],
                                         [[6, 7, 8, 9, 10, 11]]]
  assert repr(cb.Split(n_items=3)) == 'Split_out3'
  with pytest.raises(base.LayerError, match='divisible'):
    cb.Split(n_items=4)(x)


def test_flatten_list():
  xs = [np.array(1), (np.array(2), [np.array(3), (np.array(4),)])]
  ys = cb.FlattenList()(xs)
  assert as_list(ys) == [1, 2, 3, 4]


def test_serial_with_side_outputs():
  def some_layer():
    return cb.Parallel(DivideBy(2.0), DivideBy(5.0))
  layer = cb.SerialWithSideOutputs([some_layer(), some_layer()])
  xs = (np.array([1, 2, 3]), np.array([10, 20, 30, 40, 50]),
        np.array([100, 200]))
  ys = layer(xs)
  assert [y.shape for y in ys] == [(3,), (5,), (2,)]
  # Layers with a main and a side output: x -> (2x, x + 100).
  f = base.Fn('MainSide', lambda x: (2 * x, x + 100), n_out=2)
  layer = cb.SerialWithSideOutputs([f, f])
  assert (layer.n_in, layer.n_out) == (1, 3)
  assert as_list(layer(np.array([1, 2]))) == [[4, 8], [101, 102], [102, 104]]


# --- state, rng, signatures ----------------------------------------------------


def test_call_updates_state():
  c1, c2 = Counter(), Counter()
  model = cb.Serial(c1, c2)
  model.init(ShapeDtype((2,), np.int32))
  assert as_list(model.state) == [0, 0]
  assert as_list(model(np.array([10, 20]))) == [12, 22]
  assert as_list(model.state) == [1, 1]
  assert as_list(model(np.array([10, 20]))) == [14, 24]
  assert as_list(c1.state) == 2
  # pure_fn does not touch the layer's state.
  y, new_state = model.pure_fn(np.array([0, 0]), model.weights, model.state,
                               model.rng)
  assert as_list(y) == [6, 6] and as_list(new_state) == [3, 3]
  assert as_list(model.state) == [2, 2]
  # BatchNorm's running statistics move on each training call.
  bn = normalization.BatchNorm(axis=(0,), momentum=0.5)
  model = cb.Serial(core.Dense(2), bn)
  model.init(ShapeDtype((4, 3)))
  before = np.asarray(bn.state[0])
  model(np.ones((4, 3), np.float32))
  assert not np.array_equal(before, bn.state[0]) and int(bn.state[2]) == 1


def test_rng_determinism():
  sig = ShapeDtype((2, 3))
  def make():
    return cb.Serial(core.Dense(4), core.Dropout(0.5), core.Dense(2))
  m1, m2 = make(), make()
  w1, _ = m1.init(sig, rng=jax.random.PRNGKey(7))
  w2, _ = m2.init(sig, rng=jax.random.PRNGKey(7))
  for a, b in zip(jax.tree_util.tree_leaves(w1), jax.tree_util.tree_leaves(w2)):
    np.testing.assert_array_equal(a, b)
  w3, _ = make().init(sig, rng=jax.random.PRNGKey(8))
  assert not np.array_equal(w1[0][0], w3[0][0])
  x = np.ones((2, 3), np.float32)
  key = jax.random.PRNGKey(3)
  np.testing.assert_array_equal(m1(x, rng=key), m2(x, rng=key))
  assert not np.array_equal(m1(x, rng=key), m1(x, rng=jax.random.PRNGKey(4)))


def test_output_and_weights_signatures():
  model = cb.Serial(core.Dense(4), cb.Dup(), cb.Parallel(None, core.Dense(6)))
  sig = ShapeDtype((2, 3))
  w_sig, s_sig = model.weights_and_state_signature(sig)
  assert w_sig[0] == (ShapeDtype((3, 4)), ShapeDtype((4,)))
  assert w_sig[2][1] == (ShapeDtype((4, 6)), ShapeDtype((6,)))
  assert s_sig == ((), (), ((), ()))
  assert model.weights == ((), (), ((), ()))  # signature leaves no weights
  model.init(sig)
  assert model.output_signature(sig) == (ShapeDtype((2, 4)), ShapeDtype((2, 6)))
  assert cb.Dup().output_signature(sig) == (sig, sig)
  ints = cb.Serial(core.Embedding(10, 3), core.Mean(axis=1))
  ids = ShapeDtype((2, 5), np.int32)
  ints.init(ids)
  assert ints.output_signature(ids) == ShapeDtype((2, 3))


def test_init_accepts_arrays():
  model = cb.Serial(core.Dense(4), cb.Branch(core.Dense(2), None))
  x = np.zeros((2, 3), np.float32)
  weights, _ = model.init(x)
  assert weights[0][0].shape == (3, 4)
  assert model.output_signature(x) == (ShapeDtype((2, 2)), ShapeDtype((2, 4)))
  stacked = cb.Serial(cb.Concatenate())
  stacked.init([np.zeros((2, 3)), np.zeros((2, 1))])
  assert stacked([np.zeros((2, 3)), np.zeros((2, 1))]).shape == (2, 4)


def test_jit_of_pure_fn_matches_eager():
  model = cb.Serial(core.Dense(4), cb.Branch(core.Dense(3), cb.Select([0])),
                    cb.Parallel(None, core.Dense(3)), cb.Add())
  x = np.random.RandomState(0).randn(2, 5).astype(np.float32)
  weights, state = model.init(shapes.signature(x))
  rng = jax.random.PRNGKey(1)
  eager, _ = model.pure_fn(x, weights, state, rng)
  jitted, _ = jax.jit(model.pure_fn)(x, weights, state, rng)
  np.testing.assert_allclose(eager, jitted, rtol=1e-6)
  # The layer object keeps its own weights after tracing.
  assert model.weights[0][0] is weights[0][0]


def test_inputs_from_and_outputs_onto_stack():
  stack = (1, 2, 3)
  assert cb.inputs_from_stack(stack, 1) == 1
  assert cb.inputs_from_stack(stack, 2) == (1, 2)
  assert cb.outputs_onto_stack((7, 8), stack, 2) == (7, 8, 3)
  assert cb.outputs_onto_stack(9, stack, 3) == 9
  assert cb.outputs_onto_stack((), stack, 1) == (2, 3)
