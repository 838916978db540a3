"""Activation layers against NumPy re-statements of Trax's formulas."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.layers import activation_fns as af
from retrax.layers import base
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance

X = np.linspace(-4., 4., 41).astype(np.float32)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_LAMBDA = 1.0507009873554804934193349852946


def sigmoid(x):
  return 1. / (1. + np.exp(-x))


def gelu(x):
  return x * 0.5 * (1. + np.vectorize(math.erf)(x / math.sqrt(2.)))


REFERENCES = [
    (af.Relu, {}, lambda x: np.where(x <= 0, 0., x)),
    (af.ParametricRelu, {'a': .25}, lambda x: np.maximum(.25 * x, 0.)),
    (af.ParametricRelu, {}, lambda x: np.maximum(x, 0.)),
    (af.LeakyRelu, {'a': .125}, lambda x: np.where(x >= 0, x, .125 * x)),
    (af.LeakyRelu, {}, lambda x: np.where(x >= 0, x, .01 * x)),
    (af.Elu, {}, lambda x: np.where(x > 0, x, np.expm1(x))),
    (af.Elu, {'a': .5}, lambda x: np.where(x > 0, x, .5 * np.expm1(x))),
    (af.Selu, {}, lambda x: SELU_LAMBDA * np.where(
        x > 0, x, SELU_ALPHA * np.expm1(x))),
    (af.Gelu, {}, gelu),
    (af.FastGelu, {}, lambda x: 0.5 * x * (1 + np.tanh(
        x * 0.7978845608 * (1 + 0.044715 * x * x)))),
    (af.Sigmoid, {}, sigmoid),
    (af.Tanh, {}, np.tanh),
    (af.HardSigmoid, {}, lambda x: np.maximum(0, np.minimum(1, 1 + x))),
    (af.HardTanh, {}, lambda x: np.maximum(-1, np.minimum(1, x))),
    (af.Softplus, {}, lambda x: np.log1p(np.exp(x))),
    (af.Exp, {}, np.exp),
    (af.Swish, {}, lambda x: x * sigmoid(x)),
]


@pytest.mark.parametrize('make, kwargs, ref', REFERENCES,
                         ids=[f'{m.__name__}{k}' for m, k, _ in REFERENCES])
def test_activation_matches_numpy(make, kwargs, ref):
  layer = make(**kwargs)
  x = X.reshape(41, 1) * np.ones((1, 3), np.float32)
  y = layer(x)
  assert y.shape == x.shape and y.dtype == jnp.float32
  np.testing.assert_allclose(y, ref(x.astype(np.float64)),
                             **float32_tolerance(rtol=1e-5, atol=1e-6))


def test_log():
  x = np.array([.5, 1., 4.], np.float32)
  np.testing.assert_allclose(af.Log()(x), np.log(x), rtol=1e-6)


def test_trax_test_values():
  x = np.array([-2.0, -1.0, 0.0, 2.0, 3.0, 5.0])
  assert base.to_list(af.Relu()(x)) == [0.0, 0.0, 0.0, 2.0, 3.0, 5.0]
  assert base.to_list(af.ParametricRelu(a=.25)(x)) == [0.0, 0.0, 0.0, .5, .75,
                                                       1.25]
  assert base.to_list(af.LeakyRelu(a=.125)(x)) == [-.25, -.125, 0.0, 2.0, 3.0,
                                                   5.0]
  x = np.array([-1.5, -.5, -.25, 0.0, .25, .5, 1.5])
  assert base.to_list(af.HardSigmoid()(x)) == [0.0, 0.5, 0.75, 1.0, 1.0, 1.0,
                                               1.0]
  assert base.to_list(af.HardTanh()(x)) == [-1.0, -.5, -.25, 0.0, .25, .5, 1.0]


def test_glu():
  x = np.random.RandomState(0).randn(2, 3, 8).astype(np.float32)
  y = af.Glu()(x)
  a, b = x[..., :4], x[..., 4:]
  np.testing.assert_allclose(y, a * sigmoid(b.astype(np.float64)), rtol=1e-5,
                             atol=1e-6)
  with pytest.raises(base.LayerError, match='odd'):
    af.Glu()(np.ones((2, 5), np.float32))


def test_activations_are_wrapped_in_assert_shape_as_in_trax():
  layer = af.Relu()
  assert repr(layer) == 'Serial[\n  Relu\n]'
  assert layer.init(ShapeDtype((2, 3)))[0] == ((), (), ())
  assert repr(af.Glu()) == 'Serial[\n  Glu\n]'


def test_thresholded_linear_unit():
  layer = af.ThresholdedLinearUnit()
  w, _ = layer.init(ShapeDtype((3,)))
  assert w.shape == () and float(w) == 0.
  x = np.array([-1., 0.5, 2.], np.float32)
  assert layer(x).tolist() == [0., 0.5, 2.]
  assert layer(x, weights=jnp.array(1.)).tolist() == [1., 1., 2.]
  grad = jax.grad(lambda t: jnp.sum(layer.pure_fn(x, t, (), None)[0]))(
      jnp.array(1.))
  assert float(grad) == 2.  # two inputs below the threshold
