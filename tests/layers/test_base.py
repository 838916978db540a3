"""The Layer model: stack packing, Fn/PureLayer, weights/state/rng, custom gradients."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import shapes
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.shapes import ShapeDtype


def test_layer_without_forward_raises_layer_error():
  layer = base.Layer()
  with pytest.raises(base.LayerError, match='NotImplementedError'):
    layer(np.ones((2, 5)))
  with pytest.raises(NotImplementedError):
    layer.forward(np.ones((2, 5)))


def test_init_of_plain_layer_gives_empty_weights_and_state():
  weights, state = base.Layer().init(ShapeDtype((2, 5)))
  assert weights == () and state == ()


def test_public_attribute_typos_are_rejected():
  layer = base.Layer()
  layer.weights = 1.0
  with pytest.raises(ValueError, match='weighs'):
    layer.weighs = 1.0


def test_names_and_counts():
  layer = base.Layer(n_in=2, n_out=3, name='CustomLayer')
  assert (layer.name, layer.n_in, layer.n_out) == ('CustomLayer', 2, 3)
  assert repr(layer) == 'CustomLayer_in2_out3'
  assert repr(base.Layer()) == 'Layer'
  assert repr(base.Layer(n_in=0, n_out=0)) == 'Layer_in0_out0'


def test_pure_layer_call_forward_and_pure_fn():
  layer = base.PureLayer(lambda x: 2 * x)
  assert layer(np.array([1, 2]), weights=jnp.zeros((2, 3))).tolist() == [2, 4]
  assert layer.weights == ()  # weights given to __call__ are not kept
  assert layer.forward(np.array([3, 4])).tolist() == [6, 8]
  out, state = layer.pure_fn(np.array([5, 6]), (), (), None)
  assert out.tolist() == [10, 12] and state == ()
  assert repr(layer) == 'PureLayer'


def test_fn_infers_n_in_and_packs_outputs():
  layer = base.Fn('SumAndMax', lambda x0, x1: (x0 + x1, jnp.maximum(x0, x1)),
                  n_out=2)
  assert (layer.n_in, layer.n_out) == (2, 2)
  x0, x1 = np.array([1, 2, 3, 4, 5]), np.array([10, 20, 30, 40, 50])
  y0, y1 = layer((x0, x1))
  assert y0.tolist() == [11, 22, 33, 44, 55] and y1.tolist() == x1.tolist()
  (y2, y3), state = layer.pure_fn((x0, x1), (), (), None)
  assert y2.tolist() == y0.tolist() and y3.tolist() == y1.tolist()
  assert state == ()
  assert base.Fn('Zero', lambda: 1.).n_in == 0
  assert repr(base.Fn('', lambda x: x)) == 'Fn'
  layer.init_weights_and_state(None)
  assert layer.weights == () and layer.state == ()


def test_fn_from_bound_method_does_not_count_self():
  class Scaler:
    def __init__(self, k):
      self.k = k

    def scale(self, x, y):
      return self.k * x + y
  layer = base.Fn('Scale', Scaler(3).scale)
  assert layer.n_in == 2
  assert layer((np.array(2), np.array(1))).tolist() == 7


def test_fn_single_input_may_be_a_tuple():
  layer = base.Fn('Len', lambda t: len(t))
  assert layer((1, 2, 3)) == 3
  assert layer((np.array([4, 5]),)) == 2  # a 1-tuple is unpacked


@pytest.mark.parametrize('f, pattern', [
    (lambda x, sth=None: x, 'default arg'),
    (lambda x, **kwargs: x, 'keyword arg'),
    (lambda *args: args[0], 'variable arg'),
    (lambda x, *, y: x, 'keyword-only'),
])
def test_fn_rejects_bad_functions(f, pattern):
  with pytest.raises(ValueError, match=pattern):
    base.Fn('Bad', f)


def test_fn_rejects_non_function_and_bad_n_out():
  with pytest.raises(TypeError, match='must be a function'):
    base.Fn('NotAFunction', 3)
  with pytest.raises(ValueError, match='n_out'):
    base.Fn('NegativeOut', lambda x: x, n_out=-1)


def test_fn_output_count_is_checked():
  with pytest.raises(base.LayerError, match='promises n_out=2'):
    base.Fn('Two', lambda x: x, n_out=2)(np.ones(2))
  # A tuple of another length passes through as Trax's does.
  out = base.Fn('Two', lambda x: (x, x + 1, x + 2), n_out=2)(np.ones(2))
  np.testing.assert_array_equal(np.stack(out), [[1, 1], [2, 2], [3, 3]])
  assert base.Fn('Nothing', lambda x: None, n_out=0)(np.ones(2)) == ()


def test_fn_input_count_is_checked():
  layer = base.Fn('Add', lambda a, b: a + b)
  with pytest.raises(base.LayerError, match='expects a tuple of 2 inputs'):
    layer(np.ones(2))
  with pytest.raises(base.LayerError, match='expects 2 inputs; got 1'):
    layer((np.ones(2),))


def test_call_with_explicit_weights_does_not_overwrite_cached_weights():
  layer = core.Dense(4)
  x = np.array([2., 3.], np.float32)
  layer.init(shapes.signature(x))
  w_init, b_init = layer.weights
  w = np.array([[10000, 20000, 30000, 40000], [100, 200, 100, 200]], np.float32)
  b = np.array([9, 8, 7, 6], np.float32)
  assert layer(x, weights=(w, b)).tolist() == [20309, 40608, 60307, 80606]
  assert layer.weights[0] is w_init and layer.weights[1] is b_init


def test_call_with_explicit_state_sets_it():
  layer = core.Dropout(0.5, mode='train')
  layer.init(ShapeDtype((3,)))
  layer(np.ones(3, np.float32), state=jnp.array(0.25))
  assert float(layer.state) == 0.25


def test_weights_and_state_signature_of_custom_layer():
  class MyLayer(base.Layer):

    def init_weights_and_state(self, input_signature):
      self.weights = jnp.zeros((2, 3))
      self.state = jnp.ones(input_signature.shape)

    def forward(self, inputs):
      return self.weights + self.state

  layer = MyLayer()
  w, s = layer.weights_and_state_signature(jnp.zeros((3, 4)))
  assert (w.shape, s.shape) == ((2, 3), (3, 4))
  assert layer.weights == ()  # nothing was actually initialized


def test_new_weights_and_state_is_init():
  layer = core.Dense(3)
  w, s = layer.new_weights_and_state(ShapeDtype((2, 4)))
  assert w[0].shape == (4, 3) and s == ()
  assert layer.new_weights(ShapeDtype((2, 4)))[0].shape == (4, 3)


def test_rng_is_lazy_settable_and_split_among_sublayers():
  layer = cb.Serial(core.Dense(2), core.Dense(2))
  key = jax.random.PRNGKey(5)
  layer.rng = key
  np.testing.assert_array_equal(layer.rng, key)
  subkeys = jax.random.split(key, 2)
  np.testing.assert_array_equal(layer.sublayers[0].rng, subkeys[0])
  np.testing.assert_array_equal(layer.sublayers[1].rng, subkeys[1])
  assert base.Layer().rng.shape == (2,)


def test_init_with_same_rng_gives_trax_key_split_weights():
  # Dense splits its key in two: W from the first half, b from the second.
  layer = core.Dense(3)
  key = jax.random.PRNGKey(0)
  w, b = layer.init(ShapeDtype((1, 4)), rng=key)[0]
  k_w, k_b = jax.random.split(key, 2)
  lim = np.sqrt(np.float32(3. * 1. / ((4 + 3) / 2)))
  np.testing.assert_array_equal(
      w, jax.random.uniform(k_w, (4, 3), jnp.float32, -lim, lim))
  np.testing.assert_array_equal(
      b, (1e-6 * jax.random.normal(k_b, (3,))).astype(jnp.float32))


def custom_grad_layer(backward_fn):
  class IdWithCustomGrad(base.Layer):

    def forward(self, x):
      return x

    @property
    def has_backward(self):
      return True

    def backward(self, inputs, output, grad, weights, state, new_state, rng):
      return backward_fn(inputs, grad), ()
  return IdWithCustomGrad()


def test_custom_zero_and_identity_gradients():
  x = jax.random.uniform(jax.random.PRNGKey(0), (9, 17), minval=-1., maxval=1.)
  layer = custom_grad_layer(lambda inputs, grad: jnp.zeros_like(grad))
  layer.init(ShapeDtype((9, 17)))
  grad = jax.grad(lambda x: jnp.mean(layer(x)))(x)
  assert grad.shape == (9, 17) and float(jnp.sum(grad * grad)) == 0.0
  layer = custom_grad_layer(lambda inputs, grad: inputs)
  layer.init(ShapeDtype((9, 17)))
  grad = jax.grad(lambda x: jnp.mean(layer(x)))(x)
  np.testing.assert_allclose(grad, x)


def test_custom_gradient_with_weights_and_int_state():
  class Scale(base.Layer):
    """y = w * x with a hand-written backward; counts calls in int state."""

    def init_weights_and_state(self, input_signature):
      self.weights = jnp.array(3., jnp.float32)
      self.state = jnp.zeros((), jnp.int32)

    def forward(self, x):
      self.state = self.state + 1
      return self.weights * x

    @property
    def has_backward(self):
      return True

    def backward(self, inputs, output, grad, weights, state, new_state, rng):
      return weights * grad, jnp.sum(inputs * grad)

  layer = Scale()
  w, s = layer.init(ShapeDtype((4,)))
  x = jnp.arange(4.)
  loss = lambda w, x: jnp.sum(layer.pure_fn(x, w, s, layer.rng)[0] ** 2)
  gw, gx = jax.grad(loss, argnums=(0, 1))(w, x)
  np.testing.assert_allclose(gx, 2 * 3. * 3. * x)
  np.testing.assert_allclose(gw, jnp.sum(2 * 3. * x * x))
  _, new_s = layer.pure_fn(x, w, s, layer.rng)
  assert int(new_s) == 1


def test_flatten_weights_and_state_order_and_markers():
  weights = (((), (np.zeros(1), np.ones(2))), base.GET_WEIGHTS_FROM_CACHE,
             [np.full(3, 2.)])
  state = ((), base.GET_STATE_FROM_CACHE, {'a': np.zeros(4)})
  flat_w, flat_s = base.flatten_weights_and_state(weights, state)
  assert [w.shape for w in flat_w] == [(1,), (2,), (3,)]
  assert [s.shape for s in flat_s] == [(4,)]


def test_to_list_and_copy_layer():
  assert base.to_list(np.array([[1, 2]])) == [[1, 2]]
  assert base.to_list((np.array([1]), np.array([2, 3]))) == [[1], [2, 3]]
  layer = core.Dense(2)
  layer.init(ShapeDtype((1, 3)))
  clone = copy.deepcopy(layer)
  np.testing.assert_array_equal(clone.weights[0], layer.weights[0])
  assert clone.weights[0] is not layer.weights[0]


def test_sublayer_weights_length_mismatch_is_clear():
  model = cb.Serial(core.Dense(2), core.Dense(2))
  with pytest.raises(ValueError, match=r'Number of weight elements \(1\) does '
                     r'not equal the number of sublayers \(2\)'):
    model.weights = ((),)
  with pytest.raises(ValueError, match='Number of state elements'):
    model.state = ((), (), ())


def test_failed_call_restores_weights():
  layer = core.Dense(3)
  layer.init(ShapeDtype((2, 4)))
  w = layer.weights
  with pytest.raises(base.LayerError):
    layer(np.ones((2, 4), np.float32), weights=(np.ones((5, 3)), np.ones(3)))
  assert layer.weights[0] is w[0]


def test_walk_mode_max_len_and_vocab_size_are_public():
  from retrax.layers import attention, position
  emb = core.Embedding(11, 4)
  pos = position.PositionalEncoding(max_len=7, mode='predict')
  drop = core.Dropout(0.1, mode='eval')
  model = cb.Serial(emb, cb.Branch(pos, drop), cb.Add())
  walked = list(model.walk())
  # Pre-order: the Serial, Embedding, Branch's Serial (Select, Parallel
  # (PositionalEncoding, Dropout)), Add.
  assert walked[0] is model and walked[1] is emb
  assert walked.index(pos) < walked.index(drop) < walked.index(walked[-1])
  assert walked[-1].name == 'Add' and len(walked) == 8
  assert [l.mode for l in walked if l.mode] == ['predict', 'eval']
  assert model.mode is None and cb.Serial().max_len is None
  assert emb.vocab_size == 11 and pos.max_len == 7
  assert attention.DotProductCausalAttention(
      max_inference_length=5, mode='predict').max_len == 5
  assert base.Layer(mode='eval').mode == 'eval'
  with pytest.raises(ValueError, match='only allow setting'):
    emb.mode = 'train'


def test_set_path_elements_renames_sublayers_in_error_paths():
  bad = base.Fn('Bad', lambda x: jnp.reshape(x, (7,)))
  inner = cb.Serial(core.Dense(3), bad)
  inner.set_path_elements(lambda i: f'Block{i}')
  assert inner.path_element(1) == 'Block1'
  with pytest.raises(base.LayerError, match=r'Block1 > Bad'):
    inner.init(ShapeDtype((2, 5)))
