"""ResNet-50 and Wide ResNet: architecture (abstractly), block formulas, training through Loop."""

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import optimizers
from retrax.layers import convolution
from retrax.models import mlp
from retrax.models import resnet
from retrax.shapes import ShapeDtype
from retrax.shapes import signature
from retrax.supervised import training

RNG = jax.random.PRNGKey(0)


def _abstract(model, input_signature):
  """(weights signature, output signature) without computing anything."""
  w_sig, s_sig = model.weights_and_state_signature(input_signature)
  out = fastmath.abstract_eval(model.pure_fn)(
      input_signature, w_sig, s_sig, ShapeDtype((2,), np.uint32))[0]
  return w_sig, out


def _kernels_and_biases(w_sig):
  """Shapes of conv kernels (4-d leaves) and of the biases right after them."""
  leaves = [l.shape for l in jax.tree_util.tree_leaves(w_sig)]
  kernels = [s for s in leaves if len(s) == 4]
  biases = [b for k, b in zip(leaves, leaves[1:]) if len(k) == 4]
  assert all(b == (k[-1],) for k, b in zip(kernels, biases))
  return kernels, biases, leaves


def test_resnet50_has_resnet50s_weights():
  w_sig, out = _abstract(resnet.Resnet50(), ShapeDtype((2, 224, 224, 3)))
  assert out.shape == (2, 1001)
  kernels, biases, leaves = _kernels_and_biases(w_sig)
  assert len(kernels) == 53  # 49 convolutions + 4 projection shortcuts.
  assert kernels[0] == (7, 7, 3, 64) and kernels[-1] == (1, 1, 512, 2048)
  n_weights = sum(int(np.prod(s)) for s in leaves)
  n_conv_biases = sum(b[0] for b in biases)
  # The reference ResNet-50 (1000 classes, convolutions without biases, two
  # BatchNorm weights per channel) has 25,557,032 weights; Trax's adds conv
  # biases and a 1001st class (2048 weights and a bias).
  assert n_weights - n_conv_biases - (2048 + 1) == 25_557_032


def test_wide_resnet_shapes():
  for n_blocks, widen in ((1, 1), (2, 2)):
    w_sig, out = _abstract(
        resnet.WideResnet(n_blocks=n_blocks, widen_factor=widen,
                          n_output_classes=7), ShapeDtype((3, 32, 32, 3)))
    kernels, _, _ = _kernels_and_biases(w_sig)
    assert out.shape == (3, 7)
    assert len(kernels) == 6 * n_blocks + 4  # With the 3 conv shortcuts.
    assert kernels[-1] == (3, 3, 64 * widen, 64 * widen)


def _ref_conv(x, w, b, stride=1):
  """'SAME' convolution with odd square kernels (NHWC/HWIO), by loops."""
  k = w.shape[0]
  x = np.pad(np.asarray(x, np.float64), [(0, 0), (k // 2, k // 2),
                                         (k // 2, k // 2), (0, 0)])
  h, wd = x.shape[1] - k + 1, x.shape[2] - k + 1
  out = sum(x[:, i:i + h, j:j + wd] @ np.asarray(w[i, j], np.float64)
            for i in range(k) for j in range(k))
  return out[:, ::stride, ::stride] + np.asarray(b, np.float64)


def test_conv_block_and_identity_block_compute_their_formula():
  relu = lambda x: np.maximum(x, 0)
  no_norm = lambda mode: tl.Serial()
  x = np.random.RandomState(0).randn(2, 6, 6, 4).astype(np.float32)
  block = tl.Serial(
      resnet.ConvBlock(3, (3, 2, 5), (2, 2), no_norm, tl.Relu),
      resnet.IdentityBlock(3, (2, 3, 5), no_norm, tl.Relu))
  # Random weights in the tree init would make (no random draws in XLA).
  w_sig, _ = block.weights_and_state_signature(signature(x))
  rng = np.random.RandomState(1)
  weights = jax.tree_util.tree_map(
      lambda s: (0.5 * rng.randn(*s.shape)).astype(np.float32), w_sig)
  p = jax.tree_util.tree_leaves(weights)
  # The shortcut comes first: Residual is Serial(Branch(shortcut, main), Add).
  assert [q.shape for q in p[::2]] == [(1, 1, 4, 5), (1, 1, 4, 3),
                                       (3, 3, 3, 2), (1, 1, 2, 5),
                                       (1, 1, 5, 2), (3, 3, 2, 3),
                                       (1, 1, 3, 5)]
  main = _ref_conv(relu(_ref_conv(relu(_ref_conv(x, p[2], p[3], 2)),
                                  p[4], p[5])), p[6], p[7])
  y = relu(main + _ref_conv(x, p[0], p[1], 2))
  main = _ref_conv(relu(_ref_conv(relu(_ref_conv(y, p[8], p[9])), p[10],
                                  p[11])), p[12], p[13])
  want = relu(y + main)
  got = jax.jit(block.pure_fn)(x, weights, block.state, RNG)[0]
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def stripes(seed, batch=8, size=32):
  """Noisy stripes; the class is their direction (horizontal, vertical, two diagonals)."""
  rng = np.random.RandomState(seed)
  i, j = np.meshgrid(np.arange(size), np.arange(size), indexing='ij')
  while True:
    y = rng.randint(0, 4, size=batch)
    x = 0.5 * rng.randn(batch, size, size, 3).astype(np.float32)
    for b, c in enumerate(y):
      coord = (i, j, i + j, i - j)[c]
      x[b] += ((coord + rng.randint(4)) // 2 % 2)[..., None] - 0.5
    yield x, y.astype(np.int32), np.ones(batch, np.float32)


def _train(model, n_steps, learning_rate):
  task = training.TrainTask(stripes(0), tl.CrossEntropyLossWithLogSoftmax(),
                            optimizers.Adam(learning_rate),
                            n_steps_per_checkpoint=n_steps // 3)
  evals = training.EvalTask(stripes(1), [tl.CrossEntropyLossWithLogSoftmax(),
                                         tl.Accuracy()])
  loop = training.Loop(model, task, eval_tasks=evals, random_seed=0,
                       options=training.LoopOptions(progress_bar=False))
  loop.run(n_steps)
  history = loop.history
  train = [v for _, v in history.get(
      'train', 'metrics/CrossEntropyLossWithLogSoftmax')]
  accuracy = [v for _, v in history.get('eval', 'metrics/Accuracy')]
  return train, accuracy


def test_mlp_learns_stripe_directions_through_loop():
  train, accuracy = _train(mlp.MLP((32, 4)), 30, 0.003)
  assert train[-1] < 0.3 * train[0] and accuracy[-1] >= 0.75


@pytest.mark.slow
def test_wide_resnet_learns_stripe_directions_through_loop():
  train, accuracy = _train(resnet.WideResnet(n_blocks=1, n_output_classes=4),
                           30, 0.01)
  assert train[0] > 1.0 and train[-1] < 0.3 * train[0]
  assert accuracy[-1] >= 0.75


def test_conv_errors_name_their_place_in_the_model():
  model = resnet.WideResnet(n_blocks=1)
  with pytest.raises(tl.LayerError) as info:
    model.init(ShapeDtype((3, 32, 32)))
  assert info.value.path == 'Serial[1] > Conv'
  assert 'expects rank-4 inputs (N, H, W, C)' in str(info.value)
  with pytest.raises(tl.LayerError, match='AvgPool.* pool window of size 8'):
    resnet.WideResnet(n_blocks=1).weights_and_state_signature(
        ShapeDtype((3, 16, 16, 3)))
  assert isinstance(model.sublayers[1], convolution.Conv)
