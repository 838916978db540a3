"""Tests of positional encodings against NumPy formulas and eval-vs-predict equivalence."""

import functools
import math

import jax
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import initializers as init
from retrax.layers import position
from retrax.shapes import ShapeDtype

try:
  from tests.layers import predict_utils
except ImportError:  # tests/ is not a package: import the sibling module.
  import predict_utils

RNG = jax.random.PRNGKey(0)


_JITTED = {}


def fwd(layer, x, rng=RNG):
  """Runs `layer` on `x` under jit with its own weights and state."""
  if layer not in _JITTED:
    _JITTED[layer] = jax.jit(layer.pure_fn)
  return _JITTED[layer](x, layer.weights, layer.state, rng)[0]


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def np_interleaved_table(max_len, d):
  """pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos(p / 10000^(2i/d))."""
  pe = np.zeros((max_len, d))
  for p in range(max_len):
    for j in range(d):
      angle = p / 10000.0**((j - j % 2) / d)
      pe[p, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
  return pe


def np_concat_sincos(positions, d):
  """[sin(p / 10000^(2i/d)) for i] + [cos(...) for i], per position."""
  freqs = np.array([10000.0**(-2 * i / d) for i in range(d // 2)])
  angles = np.asarray(positions, np.float64)[..., None] * freqs
  return np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)


# --- PositionalEncoding ----------------------------------------------------------


@pytest.mark.parametrize('d', [8, 7])
def test_positional_table_is_the_sin_cos_formula(d):
  layer = position.PositionalEncoding(max_len=50)
  w, s = layer.init(ShapeDtype((2, 10, d)))
  assert w.shape == (50, d) and w.dtype == np.float32
  np.testing.assert_allclose(w, np_interleaved_table(50, d), atol=1e-6)
  assert s == ()


def test_positional_encoding_default_table_long_positions():
  table = position.sin_cos_table(2048, 16)
  np.testing.assert_allclose(table[[0, 777, 2047]],
                             np_interleaved_table(2048, 16)[[0, 777, 2047]],
                             atol=1e-5)


@pytest.mark.parametrize('d', [16, 7])
def test_a_table_in_blocks_is_the_one_pass_table(monkeypatch, d):
  # Long tables are filled in blocks of rows on threads; every value must be
  # the one-pass float64 formula's, rounded once to float32.
  whole = position.sin_cos_table(1000, d)
  monkeypatch.setattr(position, '_TABLE_BLOCK_ROWS', 64)
  table = position.sin_cos_table(1000, d)
  np.testing.assert_array_equal(table, whole)
  positions = np.arange(1000)[:, None]
  angles = positions / 10000.0**((np.arange(d) - np.arange(d) % 2) / d)
  want = np.where(np.arange(d) % 2 == 0, np.sin(angles), np.cos(angles))
  assert table.dtype == np.float32
  np.testing.assert_allclose(table, want, rtol=0, atol=6e-8)


def test_positional_encoding_eval_adds_table_rows():
  x = randn(2, 6, 8)
  layer = position.PositionalEncoding(max_len=10, mode='eval')
  layer.init(ShapeDtype(x.shape))
  np.testing.assert_allclose(fwd(layer, x), x + np_interleaved_table(10, 8)[:6],
                             atol=1e-6)


def test_positional_encoding_rejects_too_long_inputs():
  layer = position.PositionalEncoding(max_len=4, mode='eval')
  layer.init(ShapeDtype((1, 4, 2)))
  with pytest.raises(base.LayerError, match='encodes 4 positions'):
    layer(np.zeros((1, 5, 2), np.float32))


def test_positional_encoding_train_dropout_broadcast_over_positions():
  x = np.zeros((3, 5, 16), np.float32)
  layer = position.PositionalEncoding(max_len=8, dropout=0.5, mode='train')
  layer.init(ShapeDtype(x.shape))
  y = fwd(layer, x)
  table = np_interleaved_table(8, 16)[:5]
  # Default dropout_broadcast_dims=(-2,): one keep/drop per feature, shared
  # by all positions and examples; kept ones are scaled by 1/(1-rate).
  keep = np.asarray(jax.random.bernoulli(RNG, 0.5, (1, 1, 16)))
  np.testing.assert_allclose(y, np.broadcast_to(table * keep / 0.5, y.shape),
                             atol=1e-6)
  assert 0 < keep.sum() < 16


def test_positional_encoding_random_start_offset_in_train():
  x = np.zeros((1, 4, 6), np.float32)
  layer = position.PositionalEncoding(max_len=20, start_from_zero_prob=0.0,
                                      max_offset_to_add=10, mode='train')
  layer.init(ShapeDtype(x.shape))
  table = np_interleaved_table(20, 6)
  starts = set()
  for seed in range(8):
    y = fwd(layer, x, jax.random.PRNGKey(seed))
    matches = [s for s in range(10)
               if np.allclose(y[0], table[s:s + 4], atol=1e-6)]
    assert len(matches) == 1
    starts.add(matches[0])
  assert len(starts) > 1


def test_positional_encoding_with_d_feature_projects_table():
  x = randn(2, 5, 6)
  layer = position.PositionalEncoding(max_len=9, d_feature=4, mode='eval')
  (table, ff), _ = layer.init(ShapeDtype(x.shape))
  assert table.shape == (9, 4) and ff.shape == (4, 6)
  np.testing.assert_allclose(
      fwd(layer, x), x + np_interleaved_table(9, 4)[:5] @ np.float64(ff), atol=1e-5)


def test_positional_encoding_bfloat16_weights():
  layer = position.PositionalEncoding(max_len=9, use_bfloat16=True)
  w, _ = layer.init(ShapeDtype((1, 3, 4)))
  assert w.dtype == jax.numpy.bfloat16


@pytest.mark.parametrize('d_feature', [None, 4])
def test_positional_encoding_eval_equals_predict(d_feature):
  make = functools.partial(position.PositionalEncoding, max_len=12,
                           d_feature=d_feature)
  predict_utils.assert_eval_equals_predict(make, randn(2, 12, 6), atol=1e-6,
                                           first_chunk=3)


def test_positional_encoding_predict_state_and_overflow():
  layer = position.PositionalEncoding(max_len=3, mode='predict')
  _, state = layer.init(ShapeDtype((1, 1, 2)))
  assert int(state) == 0 and state.dtype == np.int32
  x = np.zeros((1, 2, 2), np.float32)
  layer(x)
  assert int(layer.state) == 2
  with pytest.raises(base.LayerError, match='beyond the 3 positions'):
    layer(x)


def test_positional_encoding_bad_arguments():
  with pytest.raises(ValueError, match='dropout must be'):
    position.PositionalEncoding(dropout=1.0)
  with pytest.raises(ValueError, match='mode'):
    position.PositionalEncoding(mode='test')


# --- AxialPositionalEncoding -------------------------------------------------------


def np_axial(weights, shape, length):
  """Row p: concat over axes a of weights[a] at p's coordinate on axis a."""
  rows = []
  for p in range(length):
    coords = np.unravel_index(p, shape)
    rows.append(np.concatenate([np.asarray(w).reshape(shape[a], -1)[coords[a]]
                                for a, w in enumerate(weights)]))
  return np.array(rows)


def test_axial_weights_and_eval_output():
  shape, d_embs = (2, 3, 4), (3, 2, 5)
  x = randn(2, 24, 10)
  layer = position.AxialPositionalEncoding(shape=shape, d_embs=d_embs,
                                           mode='eval')
  w, s = layer.init(ShapeDtype(x.shape))
  assert [tuple(a.shape) for a in w] == [(1, 2, 1, 1, 3), (1, 1, 3, 1, 2),
                                         (1, 1, 1, 4, 5)]
  assert s == ()
  np.testing.assert_allclose(fwd(layer, x), x + np_axial(w, shape, 24), atol=1e-6)
  # Shorter inputs use the first positions.
  np.testing.assert_allclose(fwd(layer, x[:, :7]), x[:, :7] + np_axial(w, shape, 7),
                             atol=1e-6)


def test_axial_initializer_draws_each_axis_from_its_own_key():
  layer = position.AxialPositionalEncoding(
      shape=(2, 3), d_embs=(2, 2), kernel_initializer=init.RandomNormalInitializer(1.0))
  w, _ = layer.init(ShapeDtype((1, 6, 4)), rng=RNG)
  rngs = jax.random.split(RNG, 2)
  np.testing.assert_allclose(w[0], jax.random.normal(rngs[0], (1, 2, 1, 2)))
  np.testing.assert_allclose(w[1], jax.random.normal(rngs[1], (1, 1, 3, 2)))


def test_axial_validation_errors():
  with pytest.raises(ValueError, match='one embedding depth per axis'):
    position.AxialPositionalEncoding(shape=(2, 3), d_embs=(4,))
  layer = position.AxialPositionalEncoding(shape=(2, 3), d_embs=(2, 2))
  with pytest.raises(base.LayerError, match=r'sum\(d_embs\).*= 4 must equal.*5'):
    layer.init(ShapeDtype((1, 6, 5)))
  layer = position.AxialPositionalEncoding(shape=(2, 3), d_embs=(2, 2),
                                           mode='eval')
  layer.init(ShapeDtype((1, 6, 4)))
  with pytest.raises(base.LayerError, match='encodes 6 positions'):
    layer(np.zeros((1, 7, 4), np.float32))


def test_axial_train_dropout_broadcast_dims():
  shape, d_embs = (2, 4), (3, 3)
  x = np.zeros((2, 8, 6), np.float32)
  layer = position.AxialPositionalEncoding(
      shape=shape, d_embs=d_embs, dropout=0.5, dropout_broadcast_dims=(0, 1, 2),
      mode='train')
  w, _ = layer.init(ShapeDtype(x.shape))
  y = fwd(layer, x)
  keep = np.asarray(jax.random.bernoulli(RNG, 0.5, (1, 1, 1, 6)))
  want = np_axial(w, shape, 8) * keep.reshape(6) / 0.5
  np.testing.assert_allclose(y, np.broadcast_to(want, y.shape), atol=1e-6)


def test_axial_eval_equals_predict():
  make = functools.partial(position.AxialPositionalEncoding, shape=(3, 4),
                           d_embs=(2, 4))
  predict_utils.assert_eval_equals_predict(make, randn(2, 12, 6), atol=1e-6,
                                           first_chunk=2)


def test_axial_predict_overflow_raises():
  layer = position.AxialPositionalEncoding(shape=(2,), d_embs=(3,),
                                           mode='predict')
  layer.init(ShapeDtype((1, 1, 3)))
  x = np.zeros((1, 1, 3), np.float32)
  layer(x)
  layer(x)
  with pytest.raises(base.LayerError, match='beyond the 2 positions'):
    layer(x)


# --- SinCosPositionalEncoding -----------------------------------------------------


def test_sincos_eval_is_concatenated_sin_cos():
  x = randn(2, 5, 8)
  layer = position.SinCosPositionalEncoding(mode='eval')
  w, _ = layer.init(ShapeDtype(x.shape))
  assert w == ()
  np.testing.assert_allclose(fwd(layer, x), x + np_concat_sincos(np.arange(5), 8),
                             atol=1e-5)


def test_sincos_train_offsets_positions():
  x = np.zeros((1, 3, 4), np.float32)
  layer = position.SinCosPositionalEncoding(add_offset=50,
                                            start_from_zero_one_in=1000,
                                            mode='train')
  layer.init(ShapeDtype(x.shape))
  y = fwd(layer, x)
  matches = [s for s in range(50)
             if np.allclose(y[0], np_concat_sincos(np.arange(3) + s, 4),
                            atol=1e-5)]
  assert len(matches) == 1 and matches[0] > 0


def test_sincos_eval_equals_predict():
  make = position.SinCosPositionalEncoding
  predict_utils.assert_eval_equals_predict(make, randn(2, 9, 6), atol=1e-5,
                                           first_chunk=4)


# --- FixedBasePositionalEncoding ---------------------------------------------------


def np_fixed_base(weights, bases, n_digits, positions):
  base_weights, start_vec = weights
  out = 0.0
  for bn, b in enumerate(bases):
    digits = [((positions // b**i) % b)[..., None] *
              np.asarray(base_weights[bn][i])[0] for i in range(n_digits)]
    out = out + np.concatenate(digits, axis=-1)
  out[..., 0, :] += np.asarray(start_vec)[0, 0]
  return out


def test_fixed_base_eval_matches_numpy_digits():
  bases, n_digits = (3, 5), 4
  x = randn(2, 30, 8)
  layer = position.FixedBasePositionalEncoding(
      bases=bases, n_digits=n_digits, mode='eval',
      initializer=init.RandomUniformInitializer(1.0))
  w, _ = layer.init(ShapeDtype(x.shape))
  assert len(w[0]) == 2 and len(w[0][0]) == 4 and w[0][0][0].shape == (1, 2)
  assert w[1].shape == (1, 1, 8)
  want = np_fixed_base(w, bases, n_digits, np.arange(30))
  np.testing.assert_allclose(fwd(layer, x), x + want, atol=1e-5)


def test_fixed_base_eval_equals_predict():
  make = functools.partial(position.FixedBasePositionalEncoding, bases=(3, 4),
                           n_digits=3,
                           initializer=init.RandomUniformInitializer(1.0))
  predict_utils.assert_eval_equals_predict(make, randn(2, 8, 6), atol=1e-5,
                                           first_chunk=1)


def test_fixed_base_rejects_indivisible_depth():
  layer = position.FixedBasePositionalEncoding(n_digits=3)
  with pytest.raises(base.LayerError, match='multiple of n_digits'):
    layer.init(ShapeDtype((1, 4, 8)))
