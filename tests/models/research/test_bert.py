"""BERT: a Trax-written checkpoint, the TF-checkpoint mapping, heads, errors.

`fixtures/golden/bert/` was written by real Trax 1.4.1
(`make_bert_goldens.py` there). The TF-checkpoint mapping is checked against
a NumPy BERT computed from the TF-named tensors directly.
"""

import functools
import os

import numpy as np
import pytest
from scipy import special

from retrax import shapes
from retrax.models.research import bert

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'bert')
TINY = dict(d_model=16, vocab_size=30, max_len=16, type_vocab_size=2,
            n_heads=2, d_ff=32, n_layers=2)


def _close(actual, desired, tol=1e-5):
  desired = np.asarray(desired)
  np.testing.assert_allclose(np.asarray(actual), desired, rtol=0,
                             atol=tol * max(1.0, np.abs(desired).max()))


def test_trax_checkpoint_gives_trax_classifier_logits():
  io = np.load(os.path.join(GOLDEN, 'bert_cls.npz'))
  inputs = (io['tokens'], io['types'], io['index'])
  model = bert.BERT(mode='eval', head=functools.partial(
      bert.BERTClassifierHead, 3), **TINY)
  model.init(shapes.signature(inputs))
  model.init_from_file(os.path.join(GOLDEN, 'bert_cls.pkl.gz'),
                       weights_only=False)
  _close(model(inputs), io['logits'])


def _tf_tensors(d, vocab, max_len, n_types, d_ff, n_layers, rs):
  t = {'bert/embeddings/word_embeddings': (vocab, d),
       'bert/embeddings/token_type_embeddings': (n_types, d),
       'bert/embeddings/position_embeddings': (max_len, d),
       'bert/embeddings/LayerNorm/gamma': (d,),
       'bert/embeddings/LayerNorm/beta': (d,),
       'bert/pooler/dense/kernel': (d, d), 'bert/pooler/dense/bias': (d,)}
  for i in range(n_layers):
    p = f'bert/encoder/layer_{i}/'
    for n in ('self/query', 'self/key', 'self/value', 'output/dense'):
      t[p + f'attention/{n}/kernel'] = (d, d)
      t[p + f'attention/{n}/bias'] = (d,)
    t.update({p + 'attention/output/LayerNorm/gamma': (d,),
              p + 'attention/output/LayerNorm/beta': (d,),
              p + 'intermediate/dense/kernel': (d, d_ff),
              p + 'intermediate/dense/bias': (d_ff,),
              p + 'output/dense/kernel': (d_ff, d),
              p + 'output/dense/bias': (d,),
              p + 'output/LayerNorm/gamma': (d,),
              p + 'output/LayerNorm/beta': (d,)})
  return {k: (rs.normal(size=s) * 0.3).astype(np.float32)
          for k, s in sorted(t.items())}


def _ln(x, g, b):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu) ** 2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-12) * g + b


def _numpy_bert(t, tokens, types, n_layers, n_heads):
  """BERT from the TF-named tensors (float64), the published architecture."""
  t = {k: v.astype(np.float64) for k, v in t.items()}
  e = 'bert/embeddings/'
  x = (t[e + 'word_embeddings'][tokens] + t[e + 'token_type_embeddings'][types]
       + t[e + 'position_embeddings'][None, :tokens.shape[1]])
  x = _ln(x, t[e + 'LayerNorm/gamma'], t[e + 'LayerNorm/beta'])
  b, length, d = x.shape
  dh = d // n_heads
  bias = np.where(tokens != 0, 0.0, -1e9)[:, None, None, :]
  for i in range(n_layers):
    p = f'bert/encoder/layer_{i}/attention/'
    q, k, v = (
        (x @ t[p + f'self/{n}/kernel'] + t[p + f'self/{n}/bias']).reshape(
            b, length, n_heads, dh).transpose(0, 2, 1, 3)
        for n in ('query', 'key', 'value'))
    w = special.softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh) + bias, -1)
    ctx = (w @ v).transpose(0, 2, 1, 3).reshape(b, length, d)
    x = _ln(x + ctx @ t[p + 'output/dense/kernel'] + t[p + 'output/dense/bias'],
            t[p + 'output/LayerNorm/gamma'], t[p + 'output/LayerNorm/beta'])
    p = f'bert/encoder/layer_{i}/'
    h = x @ t[p + 'intermediate/dense/kernel'] + t[p + 'intermediate/dense/bias']
    h = 0.5 * h * (1 + special.erf(h / np.sqrt(2)))
    x = _ln(x + h @ t[p + 'output/dense/kernel'] + t[p + 'output/dense/bias'],
            t[p + 'output/LayerNorm/gamma'], t[p + 'output/LayerNorm/beta'])
  pooled = np.tanh(x[:, 0] @ t['bert/pooler/dense/kernel'] +
                   t['bert/pooler/dense/bias'])
  return pooled, x


class _Reader:

  def __init__(self, tensors):
    self.tensors = tensors

  def get_tensor(self, name):
    return self.tensors[name]


def test_tf_checkpoint_weights_give_numpy_bert():
  sizes = dict(d_model=16, vocab_size=20, max_len=8, type_vocab_size=2,
               n_heads=2, d_ff=24, n_layers=2)
  tensors = _tf_tensors(16, 20, 8, 2, 24, 2, np.random.RandomState(0))
  tokens = np.array([[5, 3, 9, 1, 7, 2], [4, 8, 6, 0, 0, 0]], np.int32)
  types = np.array([[0, 0, 0, 1, 1, 1]] * 2, np.int32)
  inputs = (tokens, types, np.zeros((2,), np.int32))
  model = bert.BERT(mode='train', **sizes)
  model.init(shapes.signature(inputs))
  model.load_checkpoint(_Reader(tensors))
  pooled, sequence = model(inputs)
  want_pooled, want_sequence = _numpy_bert(tensors, tokens, types, 2, 2)
  _close(pooled, want_pooled)
  _close(sequence, want_sequence, tol=3e-5)


def test_regression_and_mlm_heads_and_pretraining_loss():
  inputs = (np.array([[3, 4, 5, 0]], np.int32), np.zeros((1, 4), np.int32),
            np.zeros((1,), np.int32))
  small = {**TINY, 'n_layers': 1}
  reg = bert.BERT(head=bert.BERTRegressionHead, **small)
  reg.init(shapes.signature(inputs))
  assert reg(inputs).shape == (1,)
  mlm = bert.BERT(head=functools.partial(bert.BERTMLMHead, 30), **small)
  mlm.init(shapes.signature(inputs))
  assert mlm(inputs).shape == (1, 4, 30)
  rs = np.random.RandomState(2)
  nsp, mlm_logits = (rs.normal(size=(3, 2)).astype(np.float32),
                     rs.normal(size=(3, 5, 7)).astype(np.float32))
  nsp_t, mlm_t = np.array([0, 1, 1]), rs.randint(0, 7, size=(3, 5))
  nsp_w = np.ones((3,), np.float32)
  mlm_w = (rs.uniform(size=(3, 5)) > 0.4).astype(np.float32)
  loss = bert.BERTPretrainingLoss()
  args = (nsp, mlm_logits, nsp_t, nsp_w, mlm_t, mlm_w)
  loss.init(shapes.signature(args))

  def xent(logits, t, w):
    lp = special.log_softmax(logits.astype(np.float64), -1)
    picked = np.take_along_axis(lp, t[..., None], -1)[..., 0]
    return -(picked * w).sum() / w.sum()
  _close(loss(args), xent(nsp, nsp_t, nsp_w) + xent(mlm_logits, mlm_t, mlm_w))


def test_model_name_checkpoint_raises_instead_of_downloading():
  with pytest.raises(ValueError, match='does not download.*storage.googleapis'):
    bert.BERT(mode='train', init_checkpoint='bert-base-uncased', **TINY)
  with pytest.raises(ValueError, match='known names'):
    bert.BERT(mode='train', init_checkpoint='bert-huge', **TINY)
  # Outside training the checkpoint is ignored, as in Trax.
  assert bert.BERT(mode='eval', init_checkpoint='bert-huge',
                   **TINY).init_checkpoint is None


def test_checkpoint_shape_mismatch_names_the_weight():
  tensors = _tf_tensors(16, 20, 8, 2, 24, 2, np.random.RandomState(0))
  model = bert.BERT(mode='eval', **{**TINY, 'd_ff': 24, 'vocab_size': 21,
                                    'max_len': 8})
  model.init(shapes.signature((np.ones((1, 4), np.int32),) * 2 +
                              (np.zeros((1,), np.int32),)))
  with pytest.raises(ValueError, match=r'weight 0 has shape \(21, 16\)'):
    model.load_checkpoint(_Reader(tensors))


def test_bad_arguments():
  with pytest.raises(ValueError, match=r'd_model \(16\) must be a positive '
                     r'multiple of n_heads \(3\)'):
    bert.BERT(**{**TINY, 'n_heads': 3})
  with pytest.raises(ValueError, match='mode must be'):
    bert.BERT(mode='decode', **TINY)
