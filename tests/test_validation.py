"""Constructor arguments are checked.

Wrong types and ranges raise an ArgumentError naming the argument. (Models'
vocabulary sizes are checked at init, as Trax: tests/models/test_vocab_layers.py.)
"""

import functools
import math

import numpy as np
import pytest

from retrax import layers as tl
from retrax import lr
from retrax import models
from retrax import optimizers
from retrax import validation
from tests.backend_tolerance import float32_tolerance

NAN = float('nan')
TINY = dict(d_model=8, d_ff=8, n_heads=2, max_len=16)
LSH = functools.partial(tl.LSHSelfAttention, chunk_len=4, n_chunks_before=1)

BAD = {
    'Dense str': (lambda: tl.Dense('4'), 'n_units'),
    'Dense float': (lambda: tl.Dense(4.0), 'n_units'),
    'Dense zero': (lambda: tl.Dense(0), 'n_units'),
    'Embedding vocab float': (lambda: tl.Embedding(1.5, 4), 'vocab_size'),
    'Embedding d_feature': (lambda: tl.Embedding(10, -2), 'd_feature'),
    'Dropout high': (lambda: tl.Dropout(1.5), 'rate'),
    'Dropout one': (lambda: tl.Dropout(1.0), 'rate'),
    'Dropout nan': (lambda: tl.Dropout(NAN), 'rate'),
    'Dropout str': (lambda: tl.Dropout('0.1'), 'rate'),
    'Attention d_feature': (lambda: tl.Attention('8'), 'd_feature'),
    'Attention heads': (lambda: tl.Attention(8, n_heads=0), 'n_heads'),
    'CausalAttention dropout': (lambda: tl.CausalAttention(8, dropout=1.5),
                                'dropout'),
    'DotProductCausalAttention dropout': (
        lambda: tl.DotProductCausalAttention(dropout=-0.1), 'dropout'),
    'PositionalEncoding max_len': (lambda: tl.PositionalEncoding(max_len=0),
                                   'max_len'),
    'PositionalEncoding dropout': (lambda: tl.PositionalEncoding(dropout=2.),
                                   'dropout'),
    'SelfAttention attention_dropout': (
        lambda: tl.SelfAttention(attention_dropout=1.5), 'attention_dropout'),
    'SelfAttention output_dropout': (
        lambda: tl.SelfAttention(output_dropout=NAN), 'output_dropout'),
    'SelfAttention n_heads': (lambda: tl.SelfAttention(n_heads=0), 'n_heads'),
    'SelfAttention d_qk': (lambda: tl.SelfAttention(d_qk='64'), 'd_qk'),
    'LSH attention_dropout': (lambda: LSH(attention_dropout=1.5),
                              'attention_dropout'),
    'LSH n_heads': (lambda: LSH(n_heads=1.5), 'n_heads'),
    'LSH d_v': (lambda: LSH(d_v=0), 'd_v'),
    'TransformerLM n_layers': (
        lambda: models.TransformerLM(32, n_layers=-1, **TINY), 'n_layers'),
    'TransformerLM dropout': (
        lambda: models.TransformerLM(32, dropout=1.5, **TINY), 'dropout'),
    'TransformerLM d_model': (
        lambda: models.TransformerLM(32, d_model=0, n_heads=1), 'd_model'),
    'Transformer n_encoder_layers': (
        lambda: models.Transformer(32, n_encoder_layers=-1, **TINY),
        'n_encoder_layers'),
    'TransformerEncoder n_classes': (
        lambda: models.TransformerEncoder(32, n_classes=0, **TINY),
        'n_classes'),
    'ReformerLM n_layers': (
        lambda: models.ReformerLM(32, n_layers=-1, **TINY), 'n_layers'),
    'ReformerLM dropout': (
        lambda: models.ReformerLM(32, dropout=1.5, **TINY), 'dropout'),
    # The attention layer's own type errors are not mistaken for the dense
    # signature (ApplyAttentionLayer chooses by the signature, not by errors).
    'ReformerLM attention n_heads': (
        lambda: models.ReformerLM(32, attention_type=functools.partial(
            LSH, chunk_len='4'), **TINY), 'chunk_len'),
    'Reformer n_decoder_layers': (
        lambda: models.Reformer(32, n_decoder_layers=-2, **TINY),
        'n_decoder_layers'),
    'Adam lr nan': (lambda: optimizers.Adam(learning_rate=NAN),
                    'learning_rate'),
    'Adam b1 nan': (lambda: optimizers.Adam(b1=NAN), 'b1'),
    'SGD lr inf': (lambda: optimizers.SGD(math.inf), 'learning_rate'),
    'Momentum lr str': (lambda: optimizers.Momentum('0.1'), 'learning_rate'),
    'Adafactor lr nan': (lambda: optimizers.Adafactor(learning_rate=NAN),
                         'learning_rate'),
    'RMSProp lr nan': (lambda: optimizers.RMSProp(learning_rate=NAN),
                       'learning_rate'),
    'SM3 lr nan': (lambda: optimizers.SM3(learning_rate=NAN),
                   'learning_rate'),
    'multifactor constant nan': (lambda: lr.multifactor(constant=NAN),
                                 'constant'),
    'warmup max_value nan': (lambda: lr.warmup(10, NAN), 'max_value'),
    'constant nan': (lambda: lr.constant(NAN), 'value'),
}


@pytest.mark.parametrize('name', sorted(BAD))
def test_bad_argument_raises_naming_it(name):
  make, argument = BAD[name]
  with pytest.raises(validation.ArgumentError) as info:
    make()
  message = str(info.value)
  assert argument in message, message
  assert 'got' in message and '\n' not in message
  # Type mistakes are TypeErrors, range mistakes ValueErrors (as Python's own).
  assert isinstance(info.value, (TypeError, ValueError))


def test_what_trax_accepts_still_works():
  tl.Dense(np.int64(4))
  tl.Embedding(np.int32(10), np.int64(4))
  tl.Dropout(np.float32(0.5))
  tl.Dropout(0)
  LSH(n_heads=np.int64(2), chunk_len=np.int32(4))
  tl.SelfAttention(chunk_len=np.int64(4), attention_dropout=np.float32(0.1))
  optimizers.Adam(np.float32(1e-3))
  optimizers.Adam(learning_rate=np.array(1e-3))
  optimizers.SGD(-0.1)  # Trax allows a negative rate (gradient ascent).
  lr.multifactor(constant=np.float64(0.1))
  # n_layers=0 is a model of embedding, norm and output only, as in Trax.
  model = models.TransformerLM(8, n_layers=0, **TINY)
  x = np.zeros((1, 4), np.int32)
  model.init(x)
  assert model(x).shape == (1, 4, 8)
  models.ReformerLM(8, n_layers=0, **TINY)


def test_checks_return_python_numbers():
  assert validation.check_int('X', 'n', np.int64(3), 1) == 3
  assert type(validation.check_int('X', 'n', np.int64(3), 1)) is int
  assert validation.check_rate('X', 'rate', np.float32(0.5)) == 0.5
  with pytest.raises(validation.ArgumentTypeError, match='X: n must be an int'):
    validation.check_int('X', 'n', True)
  with pytest.raises(validation.ArgumentValueError, match=r'in \[0, 1\)'):
    validation.check_rate('X', 'rate', 1.0)


# --- category targets out of range ------------------------------------------

LOGITS = np.log(np.array([[[0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25],
                           [0.7, 0.1, 0.1, 0.1]]], np.float32))
GOOD = np.array([[3, 1, 0]], np.int32)
WEIGHTS = np.ones((1, 3), np.float32)
CATEGORY_LAYERS = {
    'CategoryCrossEntropy': (tl.CategoryCrossEntropy, False),
    'WeightedCategoryCrossEntropy': (tl.WeightedCategoryCrossEntropy, True),
    'CategoryAccuracy': (tl.CategoryAccuracy, False),
    'WeightedCategoryAccuracy': (tl.WeightedCategoryAccuracy, True),
    'CrossEntropyLoss': (tl.CrossEntropyLoss, True),
    'CrossEntropySum': (tl.CrossEntropySum, True),
    'MaskedSequenceAccuracy': (tl.MaskedSequenceAccuracy, True),
}


def _inputs(targets, weighted, weights=WEIGHTS):
  outputs = LOGITS
  return (outputs, targets, weights) if weighted else (outputs, targets)


@pytest.mark.parametrize('name', sorted(CATEGORY_LAYERS))
@pytest.mark.parametrize('bad', [4, 9, -1])
def test_out_of_range_target_raises_in_eager_calls(name, bad):
  make, weighted = CATEGORY_LAYERS[name]
  layer = make()
  layer.init(_inputs(GOOD, weighted))
  layer(_inputs(GOOD, weighted))  # In range: fine.
  targets = GOOD.copy()
  targets[0, 1] = bad
  with pytest.raises(Exception) as info:
    layer(_inputs(targets, weighted))
  assert isinstance(info.value, (ValueError, tl.LayerError))
  message = str(info.value)
  assert f'target {bad}' in message and '4 categories' in message, message


_RTOL = float32_tolerance(rtol=1e-5, atol=0)['rtol']


def test_out_of_range_target_with_zero_weight_is_allowed():
  layer = tl.WeightedCategoryCrossEntropy()
  targets = np.array([[3, 7, 0]], np.int32)  # 7: padding, weight 0.
  weights = np.array([[1., 0., 1.]], np.float32)
  layer.init((LOGITS, targets, weights))
  got = float(layer((LOGITS, targets, weights)))
  log_probs = LOGITS - np.log(np.exp(LOGITS).sum(-1, keepdims=True))
  assert got == pytest.approx(-(log_probs[0, 0, 3] + log_probs[0, 2, 0]) / 2,
                              rel=_RTOL)


def test_out_of_range_target_under_jit_is_the_documented_zero():
  # Under jit the values are not visible: the documented behaviour (Trax's)
  # is a zero one-hot row, i.e. 0 cross-entropy for that item, never correct.
  import jax
  targets = np.array([[3, 9, 0]], np.int32)
  ce = tl.CategoryCrossEntropy()
  ce.init((LOGITS, targets))
  got = float(jax.jit(lambda x, t: ce.pure_fn((x, t), (), (), ce.rng)[0])(
      LOGITS, targets))
  log_probs = LOGITS - np.log(np.exp(LOGITS).sum(-1, keepdims=True))
  assert got == pytest.approx(-(log_probs[0, 0, 3] + 0 + log_probs[0, 2, 0]) /
                              3, rel=_RTOL)
  acc = tl.CategoryAccuracy()
  acc.init((LOGITS, targets))
  got = float(jax.jit(lambda x, t: acc.pure_fn((x, t), (), (), acc.rng)[0])(
      LOGITS, targets))
  assert got == pytest.approx(2 / 3)


# --- predict mode past max_len -------------------------------------------------


def _predict_steps(layer, x, n):
  """Runs `n` jitted predict steps; returns the outputs and the final state."""
  import jax
  step = jax.jit(layer.pure_fn)
  state, outs = layer.state, []
  for _ in range(n):
    out, state = step(x, layer.weights, state, layer.rng)
    outs.append(out)
  return outs, state, step


def test_positional_encoding_past_max_len_eager_jit_and_checkify():
  from jax.experimental import checkify
  layer = tl.PositionalEncoding(max_len=3, mode='predict')
  x = np.zeros((1, 1, 4), np.float32)
  layer.init(x)
  table = np.asarray(layer.weights).reshape(3, 4)
  # Eager: raises at the 4th position.
  eager = tl.PositionalEncoding(max_len=3, mode='predict')
  eager.init(x)
  for _ in range(3):
    eager(x)
  with pytest.raises(Exception, match='beyond the 3 positions'):
    eager(x)
  # jit: documented clamp, the 4th step reads the last row again.
  outs, state, step = _predict_steps(layer, x, 4)
  np.testing.assert_allclose(np.asarray(outs[3])[0, 0], table[2])
  np.testing.assert_allclose(np.asarray(outs[1])[0, 0], table[1])
  # checkify reports the overflow, and nothing before it.
  checked = checkify.checkify(step, errors=checkify.user_checks)
  err, _ = checked(x, layer.weights, np.asarray(2, np.int32), layer.rng)
  assert err.get() is None
  err, _ = checked(x, layer.weights, np.asarray(3, np.int32), layer.rng)
  assert 'at position 3' in err.get() and 'beyond the 3 positions' in err.get()
  del state


def test_causal_attention_cache_past_max_len_under_checkify():
  from jax.experimental import checkify
  layer = tl.DotProductCausalAttention(max_inference_length=3, mode='predict')
  q = np.ones((2, 1, 4), np.float32)
  layer.init((q, q, q))
  _, state, step = _predict_steps(layer, (q, q, q), 3)
  checked = checkify.checkify(step, errors=checkify.user_checks)
  err, _ = checked((q, q, q), layer.weights, state, layer.rng)
  assert 'max_inference_length=3' in err.get()


def test_transformer_lm_decoding_past_max_len_under_checkify():
  from jax.experimental import checkify
  model = models.TransformerLM(8, n_layers=1, mode='predict', d_model=8,
                               d_ff=8, n_heads=2, max_len=4)
  x = np.zeros((1, 1), np.int32)
  model.init(x)
  _, state, step = _predict_steps(model, x, 4)
  checked = checkify.checkify(step, errors=checkify.user_checks)
  err, _ = checked(x, model.weights, state, model.rng)
  assert 'predict mode is at position 4' in err.get()
