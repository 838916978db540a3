"""BERT (Devlin et al. 2018) with Trax 1.4.1's layer tree and heads.

`BERT(...)` maps `(token_ids, type_ids, index)` (the index is dropped) to
`(pooled, sequence)`: the tanh-pooled first position `[B, d_model]` and the
encoder output `[B, L, d_model]`; a `head` layer may follow. Trax checkpoints
load leaf for leaf. Google's TF BERT checkpoints load from a local path with
`init_checkpoint` (this needs TensorFlow to read them); retrax downloads
nothing.
"""

import os

import jax
import numpy as np

from retrax import layers as tl
from retrax.checkpoints.errors import TreeStructureError
from retrax.configurable import configurable
from retrax.fastmath import numpy as jnp
from retrax import validation
from retrax.models import registry
from retrax.validation import ArgumentValueError

# Trax's known model names and where Google publishes them.
MODEL_LINKS = {
    'bert-base-uncased':
        'https://storage.googleapis.com/bert_models/2018_10_18/'
        'uncased_L-12_H-768_A-12.zip',
}


class AddBias(tl.Layer):
  """`x + b`, `b` a learned vector over the last axis (zeros at init)."""

  def forward(self, inputs):
    bias = jnp.reshape(self.weights, (1,) * (inputs.ndim - 1) + (-1,))
    return inputs + bias

  def init_weights_and_state(self, input_signature):
    self.weights = jnp.zeros(input_signature.shape[-1], dtype=jnp.float32)


def _head_dense(n_units):
  return tl.Dense(n_units,
                  kernel_initializer=tl.RandomNormalInitializer(0.02),
                  bias_initializer=tl.RandomNormalInitializer(1e-6))


@configurable('trax.models.research.bert')
@registry.register
def BERTClassifierHead(n_classes):
  """`(pooled, sequence) -> [B, n_classes]` logits from the pooled vector."""
  return tl.Serial([tl.Select([0], n_in=2), _head_dense(n_classes)])


@configurable('trax.models.research.bert')
@registry.register
def BERTRegressionHead():
  """`(pooled, sequence) -> [B]`: one scalar per example."""
  return tl.Serial([tl.Select([0], n_in=2), _head_dense(1),
                    tl.Fn('RemoveAxis', lambda x: jnp.squeeze(x, axis=1))])


@configurable('trax.models.research.bert')
def BERTMLMHead(vocab_size=30522):
  """`(pooled, sequence) -> [B, L, vocab_size]` masked-LM logits."""
  return tl.Serial([tl.Select([1], n_in=2), _head_dense(vocab_size)])


@configurable('trax.models.research.bert')
def BERTPretrainingLoss():
  """`(nsp_logits, mlm_logits, nsp_t, nsp_w, mlm_t, mlm_w) -> loss` (sum of two)."""
  nsp_loss = [tl.Select([0, 2, 3], n_in=6), tl.WeightedCategoryCrossEntropy()]
  mlm_loss = [tl.Select([1, 4, 5], n_in=6), tl.WeightedCategoryCrossEntropy()]
  return tl.Serial(tl.Branch(nsp_loss, mlm_loss), tl.Add())


@configurable('trax.models.research.bert')
def BERTPretrainingHead(n_classes):
  """Classifier and masked-LM heads side by side (a 1-tuple, as in Trax)."""
  return tl.Branch(BERTClassifierHead(n_classes), BERTMLMHead()),


def _squeeze_mask(x):
  return jnp.squeeze(x, (1, 2))


def _first_and_all(x):
  return x[:, 0, :], x


def _encoder_layer(d_model, d_ff, n_heads, mode, eps):
  d_head = d_model // n_heads
  attention = tl.SelfAttention(n_heads=n_heads, d_qk=d_head, d_v=d_head,
                               bias=True, masked=True, mode=mode)
  return [
      tl.Select([0, 1, 1]),  # vectors mask mask
      tl.Residual(attention, AddBias()),
      tl.LayerNorm(epsilon=eps),
      tl.Residual(tl.Dense(d_ff), tl.Gelu(), tl.Dense(d_model)),
      tl.LayerNorm(epsilon=eps),
  ]


@registry.register
def BERT(d_model=768, vocab_size=30522, max_len=512, type_vocab_size=2,
         n_heads=12, d_ff=3072, n_layers=12, head=None, init_checkpoint=None,
         mode='eval'):
  """BERT encoder and pooler (defaults: bert-base-uncased's sizes).

  Args:
    head: None, or a function returning a layer applied to `(pooled,
      sequence)` (e.g. `functools.partial(BERTClassifierHead, 2)`).
    init_checkpoint: a local TF BERT checkpoint (a path containing
      `os.sep`, e.g. `./uncased_L-12_H-768_A-12/bert_model.ckpt`) whose
      weights replace the initial ones; read in mode 'train' only, as in
      Trax. A bare model name raises: retrax downloads nothing.
  """
  validation.check_choice('BERT', 'mode', mode, ('train', 'eval', 'predict'))
  validation.check_multiple('BERT', 'd_model', d_model, 'n_heads', n_heads)
  eps = 1e-12
  embeddings = [
      tl.Select([0, 1, 0], n_in=3),  # drops the index input
      tl.Parallel(tl.Embedding(vocab_size, d_model),
                  tl.Embedding(type_vocab_size, d_model),
                  [tl.PaddingMask(), tl.Fn('Squeeze', _squeeze_mask)]),
      tl.Add(),
      tl.PositionalEncoding(max_len, mode=mode),
      tl.LayerNorm(epsilon=eps),
  ]
  encoder = [_encoder_layer(d_model, d_ff, n_heads, mode, eps)
             for _ in range(n_layers)]
  pooler = [tl.Fn('FirstAndAll', _first_and_all, n_out=2),
            tl.Dense(d_model), tl.Tanh()]
  init_checkpoint = init_checkpoint if mode == 'train' else None
  bert: tl.Layer = PretrainedBERT(embeddings + encoder + [tl.Select([0], n_in=2)] +
                        pooler, init_checkpoint=init_checkpoint,
                        n_layers=n_layers, d_head=d_model // n_heads)
  if head is not None:
    bert = tl.Serial(bert, head())
  return bert


def _checkpoint_path(init_checkpoint):
  if init_checkpoint is None or os.path.sep in init_checkpoint:
    return init_checkpoint
  known = (f'; {init_checkpoint!r} is published at '
           f'{MODEL_LINKS[init_checkpoint]}' if init_checkpoint in
           MODEL_LINKS else f'; known names: {sorted(MODEL_LINKS)}')
  raise ArgumentValueError(
      f'PretrainedBERT: init_checkpoint={init_checkpoint!r} is a model name, '
      f'and retrax does not download checkpoints{known}. Download and unzip '
      'it yourself and pass the checkpoint path (e.g. '
      "'./uncased_L-12_H-768_A-12/bert_model.ckpt').")


def _tf_reader(path):
  try:
    import tensorflow as tf
  except ImportError as e:
    raise ImportError(
        f'PretrainedBERT: reading the TF checkpoint {path!r} needs '
        'TensorFlow (pip install tensorflow-cpu); retrax does not depend on '
        'it.') from e
  return tf.train.load_checkpoint(path)


def bert_checkpoint_leaves(reader, n_layers=12, d_head=64):
  """The weight leaves (BERT's order) from a TF BERT checkpoint `reader`.

  `reader.get_tensor(name)` returns the array of a TF variable name
  (`tf.train.load_checkpoint(path)` is one).
  """
  def get(name):
    return np.asarray(reader.get_tensor(name))

  def qkv(name):  # [d_model, n_heads * d_head] -> [n_heads, d_model, d_head]
    x = get(name)
    return x.reshape((x.shape[0], -1, d_head)).swapaxes(0, 1)

  def out(name):  # [n_heads * d_head, d_model] -> [n_heads, d_head, d_model]
    x = get(name)
    return x.reshape((-1, d_head, x.shape[-1]))

  def head_bias(name):
    return get(name).reshape((-1, d_head))

  leaves = [get('bert/embeddings/word_embeddings'),
            get('bert/embeddings/token_type_embeddings'),
            get('bert/embeddings/position_embeddings'),  # [max_len, d]
            get('bert/embeddings/LayerNorm/gamma'),
            get('bert/embeddings/LayerNorm/beta')]
  for i in range(n_layers):
    p = f'bert/encoder/layer_{i}/'
    leaves += [qkv(p + 'attention/self/query/kernel'),
               qkv(p + 'attention/self/key/kernel'),
               qkv(p + 'attention/self/value/kernel'),
               out(p + 'attention/output/dense/kernel'),
               head_bias(p + 'attention/self/query/bias'),
               head_bias(p + 'attention/self/key/bias'),
               head_bias(p + 'attention/self/value/bias')]
    leaves += [get(p + name) for name in (
        'attention/output/dense/bias', 'attention/output/LayerNorm/gamma',
        'attention/output/LayerNorm/beta', 'intermediate/dense/kernel',
        'intermediate/dense/bias', 'output/dense/kernel', 'output/dense/bias',
        'output/LayerNorm/gamma', 'output/LayerNorm/beta')]
  return leaves + [get('bert/pooler/dense/kernel'),
                   get('bert/pooler/dense/bias')]


class PretrainedBERT(tl.Serial):
  """A Serial whose init loads a TF BERT checkpoint (when `init_checkpoint` is set)."""

  def __init__(self, *sublayers, init_checkpoint=None, n_layers=12, d_head=64):
    super().__init__(*sublayers)
    self._init_checkpoint = _checkpoint_path(init_checkpoint)
    self._n_encoder_layers, self._d_head = n_layers, d_head

  @property
  def init_checkpoint(self):
    return self._init_checkpoint

  def init_weights_and_state(self, input_signature):
    super().init_weights_and_state(input_signature)
    if self._init_checkpoint is not None:
      self.load_checkpoint(_tf_reader(self._init_checkpoint))

  def load_checkpoint(self, reader):
    """Sets the weights from a TF BERT checkpoint reader (`get_tensor(name)`)."""
    new = bert_checkpoint_leaves(reader, self._n_encoder_layers,
                                 self._d_head)
    leaves, treedef = jax.tree_util.tree_flatten(self.weights)
    if len(new) != len(leaves):
      raise TreeStructureError(f'PretrainedBERT: the checkpoint gives {len(new)} '
                               f'weights; the model has {len(leaves)}')
    for i, (a, b) in enumerate(zip(leaves, new)):
      if np.shape(a) != np.shape(b):
        raise TreeStructureError(f'PretrainedBERT: weight {i} has shape '
                                 f'{np.shape(a)}; the checkpoint gives {b.shape}')
    self.weights = jax.tree_util.tree_unflatten(
        treedef, [jnp.asarray(b, dtype=jnp.asarray(a).dtype)
                  for a, b in zip(leaves, new)])
