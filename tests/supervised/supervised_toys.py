"""Small models, losses, data and references for the training tests.

Also imported by the scripts that tests run in subprocesses (kill/resume,
multi-device), so it depends on nothing from pytest.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from retrax import layers as tl

VOCAB = 16
BATCH = 8
LENGTH = 10
D_EMB = 8
D_HIDDEN = 16


def _weighted_ce(log_probs, targets, weights):
  ce = -jnp.sum(log_probs * jax.nn.one_hot(targets, log_probs.shape[-1]),
                axis=-1)
  return jnp.sum(ce * weights) / jnp.sum(weights)


def WeightedCrossEntropy():
  """Trax's CrossEntropyLoss: weighted mean of -log p(target); takes log-probs."""
  return tl.Fn('WeightedCrossEntropy', _weighted_ce)


def WeightedAccuracy():
  return tl.Fn('WeightedAccuracy', lambda lp, t, w: jnp.sum(
      (jnp.argmax(lp, axis=-1) == t).astype(w.dtype) * w) / jnp.sum(w))


def SumOfWeights():
  return tl.Fn('SumOfWeights', lambda lp, t, w: jnp.sum(w))


def copy_batches(seed, batch_size=BATCH, length=LENGTH, vocab=VOCAB):
  """The blog's copy task `0 w 0 w` with loss weights on the second half."""
  rng = np.random.RandomState(seed)
  half = length // 2
  while True:
    w = rng.randint(1, vocab - 1, size=(batch_size, half - 1))
    zero = np.zeros((batch_size, 1), np.int32)
    x = np.concatenate([zero, w, zero, w], axis=1).astype(np.int32)
    weights = np.concatenate([np.zeros((batch_size, half - 1)),
                              np.ones((batch_size, half + 1))],
                             axis=1).astype(np.float32)
    yield x, x, weights


def mlp(mode='train', dropout=0.0, vocab=VOCAB):
  """Embedding -> Dropout -> Dense -> Relu -> Dense -> LogSoftmax."""
  return tl.Serial(tl.Embedding(vocab, D_EMB), tl.Dropout(dropout, mode=mode),
                   tl.Dense(D_HIDDEN), tl.Relu(), tl.Dense(vocab),
                   tl.LogSoftmax())


def mlp_reference_loss(weights, batch):
  """The loss of `Serial(mlp(), WeightedCrossEntropy())`, written out in jnp."""
  (emb, _, (w1, b1), _, (w2, b2), _), _ = weights
  x, targets, loss_weights = batch
  h = jnp.maximum(emb[x] @ w1 + b1[None, None], 0.0)
  log_probs = jax.nn.log_softmax(h @ w2 + b2[None, None])
  return _weighted_ce(log_probs, targets, loss_weights)


def adam_reference(weights, grads, slots, step, lr, b1=0.9, b2=0.999, eps=1e-5,
                   weight_decay_rate=1e-5):
  """Trax's Adam update of one array, in numpy (float64)."""
  m, v = slots
  m = (1 - b1) * grads + b1 * m
  v = (1 - b2) * grads**2 + b2 * v
  mhat = m / (1 - b1**(step + 1))
  vhat = v / (1 - b2**(step + 1))
  return ((1 - weight_decay_rate) * weights - lr * mhat / (np.sqrt(vhat) + eps),
          (m, v))


def leaves(tree):
  """Numpy leaves of a weight tree in Trax's order (() and markers skipped)."""
  out = []

  def walk(x):
    if isinstance(x, (tuple, list)):
      for y in x:
        walk(y)
    elif isinstance(x, dict):
      for y in x.values():
        walk(y)
    else:
      out.append(np.asarray(x))
  walk(tree)
  return out


def file_bytes(directory):
  """`{path relative to directory: contents}` of every file below it."""
  out = {}
  for root, _, names in os.walk(directory):
    for name in names:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, directory)] = f.read()
  return out
