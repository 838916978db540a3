"""The training step's automatic head and loss over chunks of positions (`loss_chunks`).

With `loss_chunk_size=0` a long sequence runs the model's position-wise
head (here `Concatenate, LayerNorm, Dropout, Dense`) and a weighted-mean
loss over chunks of positions; the loss and its gradients must equal the
plain forward's. `position_chunks.CHUNK_ELEMENTS` is lowered so that a short
sequence counts as long.
"""

import jax
import numpy as np

from retrax import layers as tl
from retrax.layers import position_chunks
from retrax.shapes import signature
from retrax.supervised import loss_chunks

VOCAB, D = 16, 8


def _model_loss_and_batch(length=37, batch=2):
  model = tl.Serial(
      tl.Embedding(VOCAB, D), tl.Dup(), tl.Parallel(tl.Dense(D), tl.Relu()),
      tl.Concatenate(), tl.LayerNorm(),
      tl.Dropout(0.3, shared_axes=[-2], mode='train'), tl.Dense(VOCAB))
  loss = tl.WeightedCategoryCrossEntropy()
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, VOCAB, (batch, length)).astype(np.int32)
  weights = (rng.rand(batch, length) < 0.7).astype(np.float32)
  weights[:, -9:] = 0.0  # a chunk with no weight at all, and the padding
  data = (tokens, tokens, weights)
  net = tl.Serial(model, loss)
  net.init(signature(data), rng=jax.random.PRNGKey(1))
  return model, loss, net, data


def _value_and_grad(forward, net, data):
  def f(weights):
    return forward(weights, net.state, data, jax.random.PRNGKey(2))[0]
  return jax.jit(jax.value_and_grad(f))(net.weights)


def test_head_and_loss_in_chunks_of_positions_equal_the_plain_step(
    monkeypatch):
  model, loss, net, data = _model_loss_and_batch()
  assert loss_chunks._position_wise_head(model) == 3  # Concatenate onwards
  plain = loss_chunks._forward_fn(net)
  auto = loss_chunks._auto_chunked_forward_fn(model, loss, plain)
  want = _value_and_grad(plain, net, data)
  short = _value_and_grad(auto, net, data)  # short: the plain step itself
  np.testing.assert_array_equal(short[0], want[0])
  # 2 examples x 16 (the concatenation's width) x 4 positions per chunk:
  # 10 chunks, the last padded.
  monkeypatch.setattr(position_chunks, 'CHUNK_ELEMENTS', 2 * 16 * 4)
  jaxpr = str(jax.make_jaxpr(lambda w: auto(w, net.state, data,
                                            jax.random.PRNGKey(2)))(net.weights))
  assert 'scan' in jaxpr or 'while' in jaxpr
  got = _value_and_grad(auto, net, data)
  for a, b in zip(jax.tree_util.tree_leaves(got),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_other_losses_and_models_keep_the_plain_step():
  model, _, net, _ = _model_loss_and_batch()
  plain = loss_chunks._forward_fn(net)
  assert loss_chunks._auto_chunked_forward_fn(model, tl.L2Loss(), plain) is plain
  mixing = tl.Serial(tl.Embedding(VOCAB, D), tl.CausalConv(D))
  assert loss_chunks._position_wise_head(mixing) is None
  assert loss_chunks._auto_chunked_forward_fn(
      mixing, tl.WeightedCategoryCrossEntropy(), plain) is plain
