"""Each model's weight tree is Trax 1.4.1's, node for node and leaf for leaf.

The expected trees below are written by hand from the Trax 1.4.1 source (not
computed by retrax): one helper per Trax layer, named after it, returning that
layer's weights with every array replaced by its shape. Rules of Trax's trees
they encode:

  * `Serial` holds a tuple with one entry per sublayer; nested Python lists of
    layers are flattened into it (they add no nesting), `Serial(x)` does.
  * Weightless layers (Select, Dropout, Fn, Concatenate, ...) hold `()`.
  * A *function* decorated with `@assert_shape` (Relu, FastGelu, Sigmoid,
    ShiftRight, PaddingMask, SplitIntoHeads, MergeHeads, Attention,
    AttentionQKV, CausalAttention, ConfigurableAttention, PositionalEncoder,
    SparseDenseWithOptions) and `AssertFunction` return
    `Serial(AssertShape, layer, AssertShape)`: `((), w, ())`. Decorated
    *classes* (Dense, Embedding, Dropout, PositionalEncoding, ...) are not
    wrapped.
  * `Branch(a, b, ...)` is `Serial(Select, Parallel(a, b, ...))`; `Branch(a)` is
    `a`; `Parallel` wraps list (or `[]`/None) arguments in `Serial`.
  * `Residual(*layers, shortcut=s)` is `Serial(Branch(s, Serial(layers)), Add)`.
  * `Chunk(layer, n)` is `layer` for n < 1, else `Serial(Reshape, Scan(layer),
    Reshape)`; `Scan`, `BatchLeadingAxes` and `Cache` hold `(w,)`.
  * A layer object used a second time gets `GET_WEIGHTS_FROM_CACHE`.
"""

import functools

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.models.research import configurable_transformer as ct

V, V_OUT, D, D_FF, H, MAX_LEN = 16, 12, 8, 16, 2, 32
B, L = 2, 8
CACHED = {'__marker_for_cached_weights_': ()}  # GET_WEIGHTS_FROM_CACHE


def shape_tree(tree):
  """Replaces arrays by 'A(shape)' strings, keeping tuples, lists and dicts."""
  if isinstance(tree, (tuple, list)):
    return type(tree)(shape_tree(t) for t in tree)
  if isinstance(tree, dict):
    return {k: shape_tree(v) for k, v in tree.items()}
  return f'A{tuple(np.shape(tree))}'


def A(*shape):
  return f'A{tuple(shape)}'


def leaves(tree):
  if isinstance(tree, (tuple, list)):
    return [x for t in tree for x in leaves(t)]
  if isinstance(tree, dict):
    return [x for t in tree.values() for x in leaves(t)]
  return [tree]


# ---- Trax 1.4.1 layers, as weight trees -------------------------------------

E = ()  # A weightless layer.


def asserted(w):  # Function under @assert_shape, or AssertFunction.
  return ((), w, ())


FN = asserted(E)  # Relu, FastGelu, Sigmoid, ShiftRight, PaddingMask, ...


def dense(d_in, d_out):  # core.Dense: (w, b).
  return (A(d_in, d_out), A(d_out))


def layer_norm(d):  # normalization.LayerNorm: (scale, bias), also center=False.
  return (A(d), A(d))


def branch(*ws):  # Serial(Select, Parallel(*layers)).
  return (E, tuple(ws))


def residual(*ws, shortcut=E):  # Serial(Branch(shortcut, Serial(*ws)), Add).
  return (branch(shortcut, ws[0] if len(ws) == 1 else tuple(ws)), E)


def attention_qkv(d):
  # Serial(Parallel(Dense, Dense, Dense), PureAttention, Dense).
  return asserted(((dense(d, d), dense(d, d), dense(d, d)), E, dense(d, d)))


def attention(d):  # Attention: Serial(Select([0, 0, 0]), AttentionQKV).
  return asserted((E, attention_qkv(d)))


def causal_attention(d):  # CausalAttention -> ConfigurableAttention.
  q_k_v = branch((dense(d, d), FN), (dense(d, d), FN), (dense(d, d), FN))
  # Branch([q, SplitIntoHeads], ...), DotProductCausalAttention,
  # MergeHeads, Dense.
  return asserted(asserted((q_k_v, E, FN, dense(d, d))))


def efficient_attention(d, h, d_qk, d_v, share_qk=False):
  """SelfAttention / LSHSelfAttention: per-head weights stacked on axis 0."""
  qk = (A(h, d, d_qk),) if share_qk else (A(h, d, d_qk), A(h, d, d_qk))
  return qk + (A(h, d, d_v), A(h, d_v, d))


def positional_encoder(w):  # configurable_transformer.PositionalEncoder.
  return asserted(w)


def sru(n):  # rnn.SRU: one Dense(3n); the Sigmoid is used twice.
  return (branch(dense(n, 3 * n), E),        # Branch(Dense(3n), [])
          E,                                 # Split
          (FN, CACHED),                      # Parallel(sigmoid, sigmoid)
          E,                                 # Fn
          (E, E, branch(E, E)),              # Parallel([], [], Branch(...))
          (E,),                              # Scan(InnerSRUCell)
          E,                                 # Select
          E)                                 # FinalSRUGate


def ct_feed_forward(d, d_ff, act=FN):
  # LayerNorm, Dense, Dropout, activation, Dense, Dropout.
  return (layer_norm(d), dense(d, d_ff), E, act, dense(d_ff, d), E)


def rev_half_residual(residual_w, attention_w=None):
  """ReversibleHalfResidual: (Serial(residual_layers), [attention_layer])."""
  return (residual_w,) if attention_w is None else (residual_w, attention_w)


# ---- Models -----------------------------------------------------------------


def _ints(*shape):
  return shapes.ShapeDtype(shape, np.int32)


def _check(model, signature, expected):
  weights, _ = model.init(signature)
  got = shape_tree(weights)
  assert leaves(got) == leaves(expected)  # Flat checkpoint order first.
  assert got == expected


def _transformer_ff(d, d_ff):  # transformer._FeedForwardBlock in a Residual.
  return residual(layer_norm(d), dense(d, d_ff), FN, E, dense(d_ff, d), E)


def test_mlp():
  model = models.MLP(layer_widths=(D, 4, 3), mode='eval')
  # Flatten, Dense, Relu, Dense, Relu, Dense.
  expected = (E, dense(5 * 6, D), FN, dense(D, 4), FN, dense(4, 3))
  _check(model, shapes.ShapeDtype((B, 5, 6)), expected)
  model = models.MLP(layer_widths=(D,), out_activation=True, flatten=False)
  _check(model, shapes.ShapeDtype((B, 6)), (dense(6, D), FN))


def test_transformer_encoder():
  model = models.TransformerEncoder(V, n_classes=3, d_model=D, d_ff=D_FF,
                                    n_layers=2, n_heads=H, max_len=MAX_LEN,
                                    mode='eval')
  block = (residual(layer_norm(D), attention(D), E), _transformer_ff(D, D_FF))
  expected = ((branch(E, FN),                 # Branch([], PaddingMask())
               A(V, D), E, A(MAX_LEN, D))     # Embedding, Dropout, PosEnc
              + block + block
              + (E, layer_norm(D), E, dense(D, 3)))  # Select, LN, Mean, Dense
  _check(model, _ints(B, L), expected)


@pytest.mark.parametrize('vocab', [V, None])
def test_transformer_decoder(vocab):
  model = models.TransformerDecoder(vocab, d_model=D, d_ff=D_FF, n_layers=2,
                                    n_heads=H, max_len=MAX_LEN, mode='eval')
  block = (residual(layer_norm(D), causal_attention(D), E),
           _transformer_ff(D, D_FF))
  embed = A(V, D) if vocab else dense(5, D)
  expected = (embed, E, A(MAX_LEN, D)) + block + block + (layer_norm(D),)
  signature = _ints(B, L) if vocab else shapes.ShapeDtype((B, L, 5))
  _check(model, signature, expected)


def test_transformer_lm():
  model = models.TransformerLM(V, d_model=D, d_ff=D_FF, n_layers=1, n_heads=H,
                               max_len=MAX_LEN, mode='eval')
  block = (residual(layer_norm(D), causal_attention(D), E),
           _transformer_ff(D, D_FF))
  expected = ((FN, A(V, D), E, A(MAX_LEN, D)) + block
              + (layer_norm(D), dense(D, V)))
  _check(model, _ints(B, L), expected)


@pytest.mark.parametrize('out_vocab', [None, V_OUT])
def test_transformer(out_vocab):
  model = models.Transformer(V, out_vocab, d_model=D, d_ff=D_FF,
                             n_encoder_layers=1, n_decoder_layers=2, n_heads=H,
                             max_len=MAX_LEN, mode='eval')
  enc_block = (residual(layer_norm(D), attention(D), E),
               _transformer_ff(D, D_FF))
  dec_block = (residual(layer_norm(D), causal_attention(D), E),
               # LN, Select([0, 2, 2, 1, 2]), AttentionQKV, Dropout
               residual(layer_norm(D), E, attention_qkv(D), E),
               _transformer_ff(D, D_FF))
  encoder = (A(V, D), E, A(MAX_LEN, D)) + enc_block + (layer_norm(D),)
  # A shared in/out embedding is the same layer object used twice.
  out_embedding = CACHED if out_vocab is None else A(V_OUT, D)
  expected = ((E,                              # Select([0, 1, 1])
               branch(E, FN),                  # Branch([], PaddingMask())
               encoder,
               E, FN,                          # Select([2, 1, 0]), ShiftRight
               out_embedding, E, A(MAX_LEN, D),
               branch(E, E))                   # Branch([], EncoderDecoderMask)
              + dec_block + dec_block
              + (layer_norm(D), E, dense(D, out_vocab or V)))
  _check(model, (_ints(B, L), _ints(B, L)), expected)


def _reformer_enc_dec_expected(out_vocab, ff):
  """Reformer (encoder-decoder) with `ff` the feed-forward residual's tree."""
  d_head = D // H
  self_attention = efficient_attention(D, H, d_head, d_head)
  enc_block = (rev_half_residual((layer_norm(D),), self_attention), E,
               rev_half_residual(ff), E)
  enc_dec_attention = (A(H, D, d_head), A(H, D, d_head), A(H, D, d_head),
                       A(H, d_head, D))
  dec_block = (rev_half_residual((layer_norm(D),), self_attention), E,
               rev_half_residual((layer_norm(D),), enc_dec_attention), E,
               rev_half_residual(ff), E)
  # EmbeddingAndPositionalEncodings: AssertFunction(spec, [Embedding, Dropout,
  # PositionalEncoder]) flattens the list into Serial(Assert, ..., Assert).
  in_encoder = ((), A(V, D), E, positional_encoder(A(MAX_LEN, D)), ())
  if out_vocab is None:  # The embedding and its Dropout are the same objects.
    out_encoder = ((), CACHED, CACHED, positional_encoder(A(MAX_LEN, D)), ())
  else:
    out_encoder = ((), A(out_vocab, D), E,
                   positional_encoder(A(MAX_LEN, D)), ())
  encoder = (in_encoder, E, enc_block + enc_block, E, layer_norm(D))
  return (E,                                   # Select([0, 1, 1])
          branch(E, (FN, E)),                  # Branch([], [PaddingMask, Fn])
          encoder,
          E, FN,                               # Select([2, 0, 1]), ShiftRight
          out_encoder,
          E,                                   # Dup
          dec_block,                           # ReversibleSerial
          E, layer_norm(D), E,                 # XYAvg, LayerNorm, Select
          dense(D, out_vocab or V))


@pytest.mark.parametrize('out_vocab', [None, V_OUT])
def test_reformer_encoder_decoder(out_vocab):
  model = models.Reformer(V, out_vocab, d_model=D, d_ff=D_FF,
                          n_encoder_layers=2, n_decoder_layers=1, n_heads=H,
                          max_len=MAX_LEN, mode='eval')
  ff = ct_feed_forward(D, D_FF)  # ff_activation=Relu
  _check(model, (_ints(B, L), _ints(B, L)),
         _reformer_enc_dec_expected(out_vocab, ff))


def test_reformer_lm_options():
  """Axial positions, a list of attention types, chunked attention and FF."""
  d_k, d_v = 4, 6
  attention_types = [tl.SelfAttention,
                     functools.partial(tl.LSHSelfAttention, chunk_len=4)]
  model = models.ReformerLM(
      V, d_model=D, d_ff=D_FF, d_attention_key=d_k, d_attention_value=d_v,
      n_layers=4, n_heads=H, max_len=MAX_LEN, attention_type=attention_types,
      pos_type='axial', pos_axial_shape=(4, 2), pos_d_axial_embs=(3, 5),
      ff_chunk_size=4, attention_chunk_size=1, mode='eval')
  # FeedForwardWithOptions with ff_chunk_size: BatchLeadingAxes(Chunk(Serial(
  # LN, Dense, Dropout, FastGelu, Dense, Dropout))).
  ff = ((((), (ct_feed_forward(D, D_FF),), ()),),)
  def block(attention_w):
    chunked_attention = ((), (attention_w,), ())  # Chunk(attention, 1)
    return (rev_half_residual((layer_norm(D),), chunked_attention), E,
            rev_half_residual(ff), E)
  blocks = (block(efficient_attention(D, H, d_k, d_v))
            + block(efficient_attention(D, H, d_k, d_v, share_qk=True))) * 2
  expected = (FN,                                          # ShiftRight
              A(V, D), E,                                  # Embedding, Dropout
              positional_encoder((A(1, 4, 1, 3), A(1, 1, 2, 5))),
              E,                                           # Dup
              blocks,                                      # ReversibleSerial
              E, layer_norm(2 * D), E,             # Concatenate, LN, Dropout
              asserted(dense(2 * D, V)))           # SparseDenseWithOptions
  _check(model, _ints(B, L), expected)


def test_reformer_shorten_lm():
  d_emb, d_k, d_v, factor = 6, 4, 4, 2
  model = models.ReformerShortenLM(
      V, shorten_factor=factor, d_embedding=d_emb, d_model=D, d_ff=D_FF,
      d_attention_key=d_k, d_attention_value=d_v, n_layers=1, n_heads=H,
      max_len=MAX_LEN, mode='eval')
  blocks = (rev_half_residual((layer_norm(D),),
                              efficient_attention(D, H, d_k, d_v)), E,
            rev_half_residual(ct_feed_forward(D, D_FF)), E)
  expected = (FN,                                        # ShiftRight
              A(V, d_emb), E,                            # Embedding, Dropout
              positional_encoder(A(MAX_LEN, d_emb)),
              E, FN, E,                          # Dup, ShiftRight, Shorten
              dense(factor * d_emb, D),
              E,                                         # Dup
              blocks,                                    # ReversibleSerial
              E, layer_norm(D), E,                       # Select, LN, Dropout
              dense(D, factor * d_emb),
              E, E,                              # ProlongBack, Concatenate
              (A(3, 2 * d_emb, d_emb), A(d_emb)),        # CausalConv(d_emb)
              FN,                                        # Relu
              sru(d_emb),
              dense(d_emb, V))
  _check(model, _ints(B, L), expected)


# ---- FeedForwardWithOptions: ff_use_sru and ff_sparsity ----------------------


def _sru_ff(d, d_ff, n_layers, n_units, res):
  """Residual(LN, Dense(n), SRU(n) x k, Dense(d), shortcut=res)."""
  block = ((layer_norm(d), dense(d, n_units)) + (sru(n_units),) * n_layers
           + (dense(n_units, d),))
  return residual(*block, shortcut=res)


def _sparse_ff(d, d_ff, n, d_lowrank):
  """SparseFF: BatchLeadingAxes(Serial(Recall, Chunk(...), Remember))."""
  d1 = d_ff // n
  controller = (A(d, d_lowrank), A(d_lowrank, d1, n), A(d1, n))
  main = (A(d, d1, n), A(n, d1, d), A(d))
  return ((E, (E, controller, main, E, E, E), E),)


@pytest.mark.parametrize('ff_use_sru,n_layers,n_units', [(1, 1, 32),
                                                         ((2, 4), 2, 4)])
def test_reformer_lm_ff_use_sru(ff_use_sru, n_layers, n_units):
  model = models.ReformerLM(V, d_model=D, d_ff=D_FF, d_attention_key=4,
                            d_attention_value=4, n_layers=1, n_heads=H,
                            max_len=MAX_LEN, ff_use_sru=ff_use_sru, mode='eval')
  ff = _sru_ff(D, D_FF, n_layers, n_units, ct_feed_forward(D, D_FF))
  attention_w = efficient_attention(D, H, 4, 4)
  blocks = (rev_half_residual((layer_norm(D),), attention_w), E,
            rev_half_residual((ff,)), E)
  expected = (FN, A(V, D), E, positional_encoder(A(MAX_LEN, D)), E, blocks,
              E, layer_norm(2 * D), E, asserted(dense(2 * D, V)))
  _check(model, _ints(B, L), expected)


@pytest.mark.parametrize('ff_sparsity,n,d_lowrank', [(4, 4, D_FF // 4),
                                                     ('2 3', 2, 3),
                                                     ((4, 5, 0.2, 0.5), 4, 5)])
def test_reformer_encoder_decoder_ff_sparsity(ff_sparsity, n, d_lowrank):
  model = models.Reformer(V, V_OUT, d_model=D, d_ff=D_FF, n_encoder_layers=2,
                          n_decoder_layers=1, n_heads=H, max_len=MAX_LEN,
                          ff_sparsity=ff_sparsity, mode='eval')
  # [LayerNorm, SparseFF]: SparseFF brings its own Dropout (no trailing one).
  ff = (layer_norm(D), _sparse_ff(D, D_FF, n, d_lowrank))
  _check(model, (_ints(B, L), _ints(B, L)),
         _reformer_enc_dec_expected(V_OUT, ff))


def test_ff_sparsity_rejects_unknown_types():
  with pytest.raises(ValueError, match="ff_sparsity_type must be"):
    ct.FeedForwardWithOptions(D, D_FF, 0.0, [-2], tl.Relu, None, 0, 0, 4, True,
                              'eval', ff_sparsity_type='Bogus')


def _np_layer_norm(x, scale, bias):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def _np_sru(x, w, b):
  """Trax's SRU: c_t = f c_{t-1} + (1 - f) y; h = r c + (1 - r) x sqrt(3)."""
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  r, f, y = np.split(x @ w + b, 3, axis=-1)
  r, f = sigmoid(r), sigmoid(f)
  c = np.zeros_like(x[:, 0])
  h = np.zeros_like(x)
  for t in range(x.shape[1]):
    c = f[:, t] * c + (1 - f[:, t]) * y[:, t]
    h[:, t] = r[:, t] * c + (1 - r[:, t]) * x[:, t] * np.sqrt(3)
  return h


def test_ff_use_sru_forward_matches_numpy():
  n_units = 4
  layer = tl.Serial(ct.FeedForwardWithOptions(
      D, D_FF, 0.1, [-2], tl.FastGelu, None, 0, (2, n_units), 0, True, 'eval'))
  x = np.random.default_rng(0).normal(size=(B, L, D)).astype(np.float32)
  weights, state = layer.init(shapes.signature(x))
  rng = np.random.default_rng(1)
  leaves, treedef = jax.tree_util.tree_flatten(weights)
  leaves = [rng.normal(size=np.shape(w)).astype(np.float32) * 0.5
            for w in leaves]
  weights = jax.tree_util.tree_unflatten(treedef, leaves)
  y, _ = jax.jit(layer.pure_fn)(x, weights, state, jax.random.PRNGKey(0))

  p = [np.asarray(w, np.float64) for w in leaves]
  # Flat order: shortcut (LN, Dense(d_ff), Dense(d_model)), then LN,
  # Dense(n), SRU Dense(3n) x 2, Dense(d_model).
  xs = np.asarray(x, np.float64)
  h = _np_layer_norm(xs, p[0], p[1]) @ p[2] + p[3]
  gelu = 0.5 * h * (1 + np.tanh(h * 0.7978845608 * (1 + 0.044715 * h * h)))
  shortcut = gelu @ p[4] + p[5]
  s = _np_layer_norm(xs, p[6], p[7]) @ p[8] + p[9]
  s = _np_sru(_np_sru(s, p[10], p[11]), p[12], p[13])
  expected = shortcut + s @ p[14] + p[15]
  np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-4)


def test_ff_use_sru_predict_equals_eval():
  """Token by token in 'predict' mode (SRUs carry their state) equals 'eval'."""
  def make(mode):
    return models.ReformerLM(V, d_model=D, d_ff=D_FF, d_attention_key=4,
                             d_attention_value=4, n_layers=1, n_heads=H,
                             max_len=MAX_LEN, ff_use_sru=(1, 4), mode=mode)
  tokens = np.random.default_rng(0).integers(1, V, size=(B, L)).astype(np.int32)
  model_eval, model_predict = make('eval'), make('predict')
  weights, state = model_eval.init(shapes.signature(tokens))
  _, p_state = model_predict.init(shapes.signature(tokens[:, :1]))
  rng = jax.random.PRNGKey(0)
  want, _ = jax.jit(model_eval.pure_fn)(tokens, weights, state, rng)
  step = jax.jit(model_predict.pure_fn)
  fed = np.concatenate([np.zeros((B, 1), np.int32), tokens[:, :-1]], axis=1)
  for t in range(L):
    got, p_state = step(fed[:, t:t + 1], weights, p_state, rng)
    np.testing.assert_allclose(np.asarray(got)[:, 0], np.asarray(want)[:, t],
                               atol=1e-4)
