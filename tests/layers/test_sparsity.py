"""SparseFF against a loop-based NumPy reference and Trax 1.4.1's layer tree."""

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes

D_MODEL, D_FF, N, D_LOWRANK = 6, 12, 4, 3
D1 = D_FF // N


def _shape_tree(tree):
  if isinstance(tree, tuple):
    return tuple(_shape_tree(t) for t in tree)
  if isinstance(tree, dict):
    return {k: _shape_tree(v) for k, v in tree.items()}
  return f'A{np.shape(tree)}'


def A(*shape):
  return f'A{shape}'


def _randomize(tree, seed):
  """Replaces every float leaf with N(0, 1) values (init biases are ~1e-6)."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  rng = np.random.default_rng(seed)
  leaves = [rng.normal(size=np.shape(x)).astype(np.float32)
            if np.issubdtype(np.asarray(x).dtype, np.floating) else x
            for x in leaves]
  return jax.tree_util.tree_unflatten(treedef, leaves)


def _init(mode, x, seed=0, **kwargs):
  layer = tl.SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK,
                      mode=mode, **kwargs)
  weights, state = layer.init(shapes.signature(x))
  return layer, _randomize(weights, seed), state


def _parts(weights):
  """(controller, main) weights out of Trax's tree (see test_weight_tree)."""
  chunked = weights[0][1]
  if len(chunked) == 3 and chunked[0] == ():  # Chunk: Serial(_, Scan, _).
    chunked = chunked[1][0]
  return chunked[1], chunked[2]


def _reference(x, weights, multiply=False):
  """Eval-mode SparseFF with explicit loops over rows and blocks."""
  (m1, m2, mb), (w1, w2, b2) = (tuple(np.asarray(a, np.float64) for a in p)
                                for p in _parts(weights))
  rows = np.asarray(x, np.float64).reshape(-1, D_MODEL)
  out = np.zeros_like(rows)
  for b, row in enumerate(rows):
    logits = np.einsum('d,dl,lxy->xy', row, m1, m2) + mb      # [d1, N]
    out[b] = b2
    for blk in range(D1):
      y = np.argmax(logits[blk])
      hidden = max(row @ w1[:, blk, y], 0.0)
      if multiply:
        probs = np.exp(logits[blk] - logits[blk].max())
        hidden *= probs[y] / probs.sum()
      out[b] += hidden * w2[y, blk]
  return out.reshape(np.shape(x))


def test_weight_and_state_tree_is_trax_layout():
  x = np.zeros((2, 5, D_MODEL), np.float32)
  controller = (A(D_MODEL, D_LOWRANK), A(D_LOWRANK, D1, N), A(D1, N))
  main = (A(D_MODEL, D1, N), A(N, D1, D_MODEL), A(D_MODEL))
  # BatchLeadingAxes(Serial(Recall, Serial(Select, controller, main, Select,
  # Dropout, Select), Remember)); Chunk(layer, 0) is the layer itself.
  layer = tl.SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK)
  weights, state = layer.init(shapes.signature(x))
  assert _shape_tree(weights) == (
      ((), ((), controller, main, (), (), ()), ()),)
  # Dropout's rate; the remembered quant mask [rows, d1] and Trax's flag dict.
  assert _shape_tree(state) == (
      ((), ((), (), (), (), A(), ()),
       (A(10, D1), {'running_second_time': ()})),)
  assert np.asarray(jax.tree_util.tree_leaves(state)[-1]).dtype == np.int32
  # Chunked: Serial(ReshapeToChunks, Scan(layer), ReshapeFromChunks).
  chunked = tl.SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK,
                        ff_chunk_size=5)
  weights, _ = chunked.init(shapes.signature(x))
  assert _shape_tree(weights) == (
      ((), ((), (((), controller, main, (), (), ()),), ()), ()),)


@pytest.mark.parametrize('chunk', [0, 5])
def test_eval_forward_matches_reference(chunk):
  x = np.random.default_rng(1).normal(size=(2, 5, D_MODEL)).astype(np.float32)
  layer, weights, state = _init('eval', x, ff_chunk_size=chunk)
  y, _ = jax.jit(layer.pure_fn)(x, weights, state, jax.random.PRNGKey(0))
  np.testing.assert_allclose(np.asarray(y), _reference(x, weights), rtol=1e-4,
                             atol=1e-4)


def test_multiply_by_controller_output_matches_reference():
  x = np.random.default_rng(2).normal(size=(3, 4, D_MODEL)).astype(np.float32)
  layer, weights, state = _init('eval', x, multiply_by_controller_output=True)
  y, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(0))
  np.testing.assert_allclose(np.asarray(y),
                             _reference(x, weights, multiply=True),
                             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('multiply', [False, True])
def test_predict_gather_equals_eval(multiply):
  x = np.random.default_rng(3).normal(size=(2, 1, D_MODEL)).astype(np.float32)
  eval_layer, weights, state = _init(
      'eval', x, multiply_by_controller_output=multiply)
  predict_layer = tl.SparseFF(D_FF, n_elements_in_block=N, d_lowrank=D_LOWRANK,
                              mode='predict',
                              multiply_by_controller_output=multiply)
  _, p_state = predict_layer.init(shapes.signature(x))
  rng = jax.random.PRNGKey(0)
  y_eval, _ = eval_layer.pure_fn(x, weights, state, rng)
  y_pred, _ = predict_layer.pure_fn(x, weights, p_state, rng)
  np.testing.assert_allclose(np.asarray(y_pred), np.asarray(y_eval),
                             rtol=1e-5, atol=1e-5)


def test_train_straight_through_gradient():
  """quant_prob=1, temperature=0: eval's output; straight-through gradient.

  d(sum(g * y)) / d mb[x, y] = sum_rows c[x] p[x, y*] (1{y = y*} - p[x, y]),
  p = softmax(logits), y* the chosen unit, c = relu(x·W1[:, x, y*]) g·W2[y*, x].
  """
  x = np.random.default_rng(4).normal(size=(2, 3, D_MODEL)).astype(np.float32)
  g = np.random.default_rng(5).normal(size=x.shape).astype(np.float32)
  layer, weights, state = _init('train', x, temperature=0.0, quant_prob=1.0)
  rng = jax.random.PRNGKey(0)
  y, _ = layer.pure_fn(x, weights, state, rng)
  np.testing.assert_allclose(np.asarray(y), _reference(x, weights), rtol=1e-4,
                             atol=1e-4)

  def loss(w):
    return (layer.pure_fn(x, w, state, rng)[0] * g).sum()
  grads = jax.jit(jax.grad(loss))(weights)
  grad_mb = np.asarray(_parts(grads)[0][2])

  (m1, m2, mb), (w1, w2, _) = (tuple(np.asarray(a, np.float64) for a in p)
                               for p in _parts(weights))
  expected = np.zeros((D1, N))
  for row, g_row in zip(x.reshape(-1, D_MODEL), g.reshape(-1, D_MODEL)):
    logits = np.einsum('d,dl,lxy->xy', row, m1, m2) + mb
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    for blk in range(D1):
      star = np.argmax(logits[blk])
      c = max(row @ w1[:, blk, star], 0.0) * (g_row @ w2[star, blk])
      expected[blk] += c * p[blk, star] * ((np.arange(N) == star) - p[blk])
  np.testing.assert_allclose(grad_mb, expected, rtol=1e-3, atol=1e-4)


def test_train_soft_mask_steps():
  """quant_prob=0: training steps use the controller's softmax, not argmax."""
  x = np.random.default_rng(6).normal(size=(2, 3, D_MODEL)).astype(np.float32)
  layer, weights, state = _init('train', x, quant_prob=0.0)
  y, _ = layer.pure_fn(x, weights, state, jax.random.PRNGKey(0))
  (m1, m2, mb), (w1, w2, b2) = (tuple(np.asarray(a, np.float64) for a in p)
                                for p in _parts(weights))
  expected = []
  for row in x.reshape(-1, D_MODEL):
    logits = np.einsum('d,dl,lxy->xy', row, m1, m2) + mb
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    hidden = np.maximum(np.einsum('d,dxy->xy', row, w1) * p, 0.0)
    expected.append(np.einsum('xy,yxd->d', hidden, w2) + b2)
  np.testing.assert_allclose(np.asarray(y).reshape(-1, D_MODEL), expected,
                             rtol=1e-4, atol=1e-4)


def test_bad_block_size_is_a_clear_error():
  with pytest.raises(ValueError, match='multiple of n_elements_in_block'):
    tl.SparseFF(10, n_elements_in_block=4)
  layer, weights, state = _init('eval', np.zeros((1, 2, D_MODEL), np.float32))
  with pytest.raises(Exception, match='initialized for inputs of depth 6'):
    layer.pure_fn(np.zeros((1, 2, 5), np.float32), weights, state,
                  jax.random.PRNGKey(0))
