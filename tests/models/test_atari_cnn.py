"""AtariCnn, AtariCnnBody and FrameStackMLP: shapes and the frame-stacking formula."""

import jax
import numpy as np

from retrax import fastmath
from retrax.models import atari_cnn
from retrax.shapes import ShapeDtype
from retrax.shapes import signature

RNG = jax.random.PRNGKey(0)


def _numpy_weights(model, input_signature, seed=0):
  """Random weights in the tree `init` would make, without XLA random draws."""
  w_sig, _ = model.weights_and_state_signature(input_signature)
  rng = np.random.RandomState(seed)
  return jax.tree_util.tree_map(
      lambda s: (0.1 * rng.randn(*s.shape)).astype(np.float32), w_sig)


def test_atari_cnn_maps_frame_sequences_to_features():
  model = atari_cnn.AtariCnn(hidden_sizes=(4, 4), output_size=6)
  # As in Trax's test: initialized on one frame, run on (B, T + 1) frames.
  weights = _numpy_weights(model, ShapeDtype((1, 1, 28, 28, 3)))
  kernels = [w.shape for w in jax.tree_util.tree_leaves(weights)]
  assert kernels == [(5, 5, 12, 4), (4,), (5, 5, 4, 4), (4,), (196, 6), (6,)]
  x = np.arange(2 * 3 * 28 * 28 * 3).reshape(2, 3, 28, 28, 3) % 256
  y = jax.jit(model.pure_fn)(x, weights, model.state, RNG)[0]
  assert y.shape == (2, 3, 6) and np.all(np.asarray(y) >= 0)


def test_atari_cnn_body_shapes():
  model = atari_cnn.AtariCnnBody(hidden_sizes=(4, 5, 6), output_size=7)
  sig = ShapeDtype((2, 3, 36, 36, 3), np.uint8)
  w_sig, s_sig = model.weights_and_state_signature(sig)
  out = fastmath.abstract_eval(model.pure_fn)(
      sig, w_sig, s_sig, ShapeDtype((2,), np.uint32))[0]
  # VALID convolutions: 36 -> 8 (8x8/4) -> 3 (4x4/2) -> 1 (3x3/1).
  assert out.shape == (2, 3, 7)
  assert [w.shape for w in jax.tree_util.tree_leaves(w_sig)][::2] == [
      (8, 8, 12, 4), (4, 4, 4, 5), (3, 3, 5, 6), (6, 7)]


def test_frame_stack_mlp_stacks_each_frame_with_its_predecessors():
  model = atari_cnn.FrameStackMLP(n_frames=3, hidden_sizes=(), output_size=5)
  x = np.random.RandomState(1).randn(2, 4, 2).astype(np.float32)
  weights = _numpy_weights(model, signature(x))
  w, b = jax.tree_util.tree_leaves(weights)
  assert w.shape == (6, 5)
  # Frame t sees [x_t, x_{t-1}, x_{t-2}] (zeros before the start).
  padded = np.concatenate([np.zeros((2, 2, 2)), x], axis=1)
  stacked = np.concatenate([padded[:, 2:], padded[:, 1:-1], padded[:, :-2]],
                           axis=-1)
  got = jax.jit(model.pure_fn)(x, weights, model.state, RNG)[0]
  np.testing.assert_allclose(got, stacked @ np.asarray(w, np.float64) + b,
                             rtol=1e-5, atol=1e-6)
