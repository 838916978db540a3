"""A sweep over every foundation layer.

Init from a signature, output signature, jit == eager, gradients.

Each case is (id, constructor, input specs). For every case the sweep checks
that `init` works from a signature alone, that the outputs' shapes and dtypes
equal `output_signature`, that `jax.jit(layer.pure_fn)` equals the eager call
(op by op under `fastmath.use_backend('numpy')`, so no XLA is involved),
and, for layers with float outputs and weights (or `grads=True`), that reverse-
mode gradients w.r.t. the float inputs and weights match finite differences
(`jax.test_util.check_grads`, order 1, in float64 via `jax.enable_x64`).
"""

import jax
from jax import test_util as jtu
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import fastmath
from retrax import shapes
from retrax.layers import activation_fns as af
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.layers import metrics
from retrax.layers import normalization as norm
from retrax.shapes import ShapeDtype
from tests.backend_tolerance import float32_tolerance
from tests.float64 import float64


class Spec:
  """An input: its signature and how to draw a value for it."""

  def __init__(self, shape, kind='normal', high=None):
    self.shape, self.kind, self.high = tuple(shape), kind, high

  @property
  def signature(self):
    dtype = {'int': np.int32, 'bool': np.bool_}.get(self.kind, np.float32)
    return ShapeDtype(self.shape, dtype)

  def draw(self, rs):
    if self.kind == 'int':
      return rs.randint(0, self.high, size=self.shape).astype(np.int32)
    if self.kind == 'bool':
      return rs.rand(*self.shape) > 0.3
    if self.kind == 'positive':
      return rs.uniform(0.5, 2.0, size=self.shape).astype(np.float32)
    if self.kind == 'prob':
      return rs.uniform(0.05, 0.95, size=self.shape).astype(np.float32)
    return rs.randn(*self.shape).astype(np.float32)


def F(*shape):
  return Spec(shape)


def I(*shape, high=10):
  return Spec(shape, 'int', high)


def Case(case_id, make, *specs, grads=None):
  return pytest.param(make, specs, grads, id=case_id)


def rnn_cell():
  return cb.Serial(cb.Concatenate(), core.Dense(3), af.Tanh(), cb.Dup())


def main_and_side():
  return base.Fn('MainSide', lambda x: (2 * x, x + 1), n_out=2)


CASES = [
    # Combinators.
    Case('Serial', lambda: cb.Serial(core.Dense(4), af.Relu(), core.Dense(3)),
         F(2, 5)),
    Case('Parallel', lambda: cb.Parallel(core.Dense(3), core.Dense(2)),
         F(2, 4), F(2, 5)),
    Case('Branch', lambda: cb.Branch(core.Dense(3), None, core.Dense(3)),
         F(2, 4)),
    Case('Residual', lambda: cb.Residual(core.Dense(4), af.Tanh(),
                                         core.Dense(4)), F(2, 4)),
    Case('ResidualShortcut', lambda: cb.Residual(core.Dense(4),
                                                 shortcut=core.Dense(4)),
         F(2, 3)),
    Case('Select', lambda: cb.Select([1, 0, 0]), F(2, 3), F(4)),
    Case('Dup', cb.Dup, F(3)),
    Case('Drop', cb.Drop, F(3)),
    Case('Swap', cb.Swap, F(3), F(2)),
    Case('Add', cb.Add, F(2, 3), F(2, 3)),
    Case('SubtractTop', cb.SubtractTop, F(2, 3), F(2, 3)),
    Case('Multiply', cb.Multiply, F(2, 3), F(2, 3), grads=True),
    Case('Gate', cb.Gate, F(3), F(3), F(3), grads=True),
    Case('Concatenate', lambda: cb.Concatenate(n_items=3, axis=0),
         F(2, 3), F(1, 3), F(2, 3)),
    Case('Split', lambda: cb.Split(n_items=2), F(2, 6)),
    Case('Scan', lambda: cb.Scan(rnn_cell(), axis=1), F(2, 4, 3), F(2, 3)),
    Case('Cond', lambda: cb.Cond(base.Fn('Pos', lambda x: jnp.sum(x) > 0),
                                 core.Dense(3), core.Dense(3)),
         F(3), F(2, 4)),
    Case('Chunk', lambda: cb.Chunk(core.Dense(3), 2), F(4, 5)),
    Case('Cache', lambda: cb.Cache(core.Dense(3)), F(2, 4)),
    Case('BatchLeadingAxes', lambda: cb.BatchLeadingAxes(core.Dense(3)),
         F(2, 3, 4)),
    Case('SerialWithSideOutputs', lambda: cb.SerialWithSideOutputs(
        [main_and_side(), main_and_side()]), F(3)),
    Case('Bidirectional', lambda: cb.Bidirectional(core.Dense(3)), F(2, 3, 4)),
    # Core.
    Case('Dense', lambda: core.Dense(5), F(2, 3, 4)),
    Case('DenseNoBias', lambda: core.Dense(5, use_bias=False), F(2, 4)),
    Case('Embedding', lambda: core.Embedding(10, 4), I(2, 3)),
    Case('DropoutTrain', lambda: core.Dropout(0.3), F(4, 5), grads=True),
    Case('DropoutEval', lambda: core.Dropout(0.3, mode='eval'), F(4, 5)),
    Case('Weights', lambda: core.Weights(init.GlorotUniformInitializer(),
                                         (3, 4))),
    Case('RandomUniform', lambda: core.RandomUniform(shape=(3,))),
    Case('Flatten', core.Flatten, F(2, 3, 4), grads=True),
    Case('LogSoftmax', core.LogSoftmax, F(2, 5), grads=True),
    Case('Softmax', lambda: core.Softmax(axis=0), F(3, 4), grads=True),
    Case('LogSumExp', core.LogSumExp, F(2, 5), grads=True),
    Case('ToFloat', core.ToFloat, I(3, 2)),
    Case('Mean', lambda: core.Mean(axis=0), F(3, 4), grads=True),
    Case('Min', core.Min, F(3, 4), grads=True),
    Case('Max', lambda: core.Max(keepdims=True), F(3, 4), grads=True),
    Case('Sum', core.Sum, F(3, 4), grads=True),
    Case('ArgMax', core.ArgMax, F(3, 4)),
    Case('ThresholdToBinary', core.ThresholdToBinary, F(5)),
    Case('Negate', core.Negate, F(2, 3), grads=True),
    Case('StopGradient', core.StopGradient, F(2, 3)),
    Case('PrintShape', lambda: core.PrintShape(n_in=2), F(2), I(3)),
    Case('ShiftRight', core.ShiftRight, I(2, 5)),
    Case('ShiftRightFloat', lambda: core.ShiftRight(2), F(2, 5, 3),
         grads=True),
    Case('PaddingMask', core.PaddingMask, I(2, 5, high=3)),
    Case('EncoderDecoderMask', core.EncoderDecoderMask, F(2, 3, 4),
         Spec((2, 1, 1, 5), 'bool')),
    # Activations.
    *[Case(f.__name__, f, F(3, 4), grads=True) for f in (
        af.Relu, af.ParametricRelu, af.LeakyRelu, af.Elu, af.Selu, af.Gelu,
        af.FastGelu, af.Sigmoid, af.Tanh, af.HardSigmoid, af.HardTanh,
        af.Softplus, af.Exp, af.Swish, af.Glu)],
    Case('Log', af.Log, Spec((3, 4), 'positive'), grads=True),
    Case('ThresholdedLinearUnit', af.ThresholdedLinearUnit, F(3, 4)),
    # Normalization.
    Case('LayerNorm', norm.LayerNorm, F(2, 3, 6)),
    Case('LayerNormNoCenter', lambda: norm.LayerNorm(center=False), F(2, 6)),
    Case('BatchNorm', lambda: norm.BatchNorm(axis=(0, 1)), F(4, 3, 5)),
    Case('BatchNormEval', lambda: norm.BatchNorm(axis=(0,), mode='eval'),
         F(4, 5)),
    Case('FilterResponseNorm', norm.FilterResponseNorm, F(2, 3, 4, 5)),
    Case('FilterResponseNormLearnEps',
         lambda: norm.FilterResponseNorm(learn_epsilon=True), F(2, 3, 4)),
    # Metrics (float model outputs, int targets, float weights).
    Case('CrossEntropyLoss', metrics.CrossEntropyLoss, F(3, 5, 7),
         I(3, 5, high=7), Spec((3, 5), 'positive'), grads=True),
    Case('CrossEntropyLossWithLogSoftmax',
         metrics.CrossEntropyLossWithLogSoftmax, F(3, 5, 7), I(3, 5, high=7),
         Spec((3, 5), 'positive'), grads=True),
    Case('WeightedCategoryCrossEntropy',
         lambda: metrics.WeightedCategoryCrossEntropy(label_smoothing=0.1),
         F(3, 5, 7), I(3, 5, high=7), Spec((3, 5), 'positive'), grads=True),
    Case('CategoryCrossEntropy', metrics.CategoryCrossEntropy, F(4, 6),
         I(4, high=6), grads=True),
    Case('Accuracy', metrics.Accuracy, F(3, 5, 7), I(3, 5, high=7), F(3, 5)),
    Case('WeightedCategoryAccuracy', metrics.WeightedCategoryAccuracy,
         F(3, 7), I(3, high=7), F(3)),
    Case('CategoryAccuracy', metrics.CategoryAccuracy, F(3, 7), I(3, high=7)),
    Case('SequenceAccuracy', metrics.SequenceAccuracy, F(3, 5, 7),
         I(3, 5, high=7), F(3, 5)),
    Case('MaskedSequenceAccuracy', metrics.MaskedSequenceAccuracy, F(3, 5, 7),
         I(3, 5, high=7), F(3, 5)),
    Case('L2Loss', metrics.L2Loss, F(4, 3), F(4, 3), Spec((4, 3), 'positive'),
         grads=True),
    Case('SmoothL1Loss', metrics.SmoothL1Loss, F(4, 3), F(4, 3),
         Spec((4, 3), 'positive'), grads=True),
    Case('BinaryCrossEntropy', metrics.BinaryCrossEntropy, F(6),
         I(6, high=2), grads=True),
    Case('BinaryCrossEntropyLoss', metrics.BinaryCrossEntropyLoss,
         Spec((6, 1), 'prob'), I(6, 1, high=2), Spec((6, 1), 'positive'),
         grads=True),
    Case('MacroAveragedFScore', metrics.MacroAveragedFScore, F(8, 4),
         I(8, high=4)),
    Case('WeightedFScore', metrics.WeightedFScore, F(8, 4), I(8, high=4)),
    Case('WeightedSum', metrics.WeightedSum, F(5), F(5), grads=True),
    Case('CrossEntropySum', metrics.CrossEntropySum, F(3, 7), I(3, high=7),
         F(3), grads=True),
    Case('BinaryCrossEntropySum', metrics.BinaryCrossEntropySum,
         Spec((6, 1), 'prob'), I(6, 1, high=2), F(6, 1), grads=True),
]


def pack(items):
  """Stack packing: no item -> (), one -> bare, several -> tuple."""
  return items[0] if len(items) == 1 else tuple(items)


def is_float(x):
  return hasattr(x, 'dtype') and jnp.issubdtype(x.dtype, jnp.floating)


def to64(tree):
  return jax.tree_util.tree_map(
      lambda x: jnp.asarray(x, jnp.float64) if is_float(x) else x, tree)


def check_gradients(layer, inputs, weights, state, rng):
  """Reverse-mode grads w.r.t. float inputs and float weights vs finite differences."""
  float_pos = [i for i, x in enumerate(inputs) if is_float(x)]

  with float64():
    fixed = list(inputs)

    def f(float_inputs, w):
      xs = list(fixed)
      for i, x in zip(float_pos, float_inputs):
        xs[i] = x
      y, _ = layer.pure_fn(pack(xs), w, state, rng)
      return y

    args = (to64([inputs[i] for i in float_pos]), to64(weights))
    jtu.check_grads(jax.jit(f), args, order=1, modes=("rev",), atol=1e-5,
                    rtol=1e-5,
                    eps=1e-6)


def setup_case(make, specs):
  layer = make()
  rs = np.random.RandomState(0)
  sig = pack([s.signature for s in specs]) if specs else ()
  inputs = [s.draw(rs) for s in specs]
  x = pack(inputs) if inputs else ()
  weights, state = layer.init(sig, rng=jax.random.PRNGKey(0))
  return layer, sig, inputs, x, weights, state


def wants_grads(grads, weights, outputs):
  """Gradient check for layers with weights and float outputs, or if asked."""
  if grads is not None:
    return grads
  has_weights = any(is_float(w) for w in jax.tree_util.tree_leaves(weights))
  return has_weights and all(
      is_float(y) for y in jax.tree_util.tree_leaves(outputs))


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
  leaves_a, leaves_b = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(leaves_a) == len(leaves_b)
  for x, y in zip(leaves_a, leaves_b):
    np.testing.assert_allclose(np.asarray(x, np.float64),
                               np.asarray(y, np.float64), rtol=rtol, atol=atol)


@pytest.mark.parametrize('make, specs, grads', CASES)
def test_signature_jit_and_eager_agree(make, specs, grads, capsys):
  """Output signature == jitted outputs' signature; jit == eager (NumPy backend)."""
  del grads
  layer, sig, _, x, weights, state = setup_case(make, specs)
  rng = jax.random.PRNGKey(1)
  expected_sig = layer.output_signature(sig)
  jitted, jit_state = jax.jit(layer.pure_fn)(x, weights, state, rng)
  assert shapes.signature(jitted) == expected_sig
  # Eager, op by op, on NumPy: the same numbers without XLA.
  with fastmath.use_backend('numpy'):
    eager, new_state = layer.pure_fn(x, weights, state, rng)
    assert_trees_close((eager, new_state), (jitted, jit_state),
                       **float32_tolerance(rtol=1e-5, atol=1e-6))
    # __call__ gives pure_fn's outputs with the layer's own weights and
    # stores the new state.
    layer.state = state
    called = layer(x, rng=rng)
    assert_trees_close(called, eager, rtol=0, atol=0)
    assert_trees_close(layer.state, new_state, rtol=0, atol=0)
  capsys.readouterr()  # PrintShape output


WEIGHTED = [c for c in CASES if c.values[2] is None]
FORCED = [c for c in CASES if c.values[2]]


@pytest.mark.parametrize('make, specs, grads', WEIGHTED)
def test_gradients_of_layers_with_weights(make, specs, grads):
  layer, _, inputs, x, weights, state = setup_case(make, specs)
  rng = jax.random.PRNGKey(1)
  outputs, _ = layer.pure_fn(x, weights, state, rng)
  if wants_grads(grads, weights, outputs):
    check_gradients(layer, inputs, weights, state, rng)


@pytest.mark.slow
@pytest.mark.parametrize('make, specs, grads', FORCED)
def test_gradients_of_weightless_layers(make, specs, grads):
  layer, _, inputs, _, weights, state = setup_case(make, specs)
  assert grads
  check_gradients(layer, inputs, weights, state, jax.random.PRNGKey(1))


def test_registry_covers_the_foundation_layers():
  ids = {c.id for c in CASES}
  for name in ['Serial', 'Parallel', 'Branch', 'Residual', 'Select', 'Dup',
               'Drop', 'Swap', 'Add', 'SubtractTop', 'Multiply', 'Gate',
               'Concatenate', 'Split', 'Scan', 'Cond', 'Chunk', 'Cache',
               'BatchLeadingAxes', 'SerialWithSideOutputs', 'Bidirectional',
               'Dense', 'Embedding', 'Weights', 'Flatten', 'LogSoftmax',
               'Softmax', 'LogSumExp', 'ToFloat', 'Mean', 'Min', 'Max', 'Sum',
               'ArgMax', 'Negate', 'StopGradient', 'PrintShape', 'ShiftRight',
               'PaddingMask', 'EncoderDecoderMask', 'ThresholdedLinearUnit',
               'LayerNorm', 'BatchNorm', 'FilterResponseNorm', 'Log',
               'CrossEntropyLoss', 'WeightedCategoryCrossEntropy',
               'CategoryCrossEntropy', 'Accuracy', 'L2Loss', 'SmoothL1Loss',
               'BinaryCrossEntropy', 'BinaryCrossEntropyLoss',
               'MacroAveragedFScore', 'WeightedFScore', 'WeightedSum',
               'CrossEntropySum', 'BinaryCrossEntropySum']:
    assert name in ids, name
