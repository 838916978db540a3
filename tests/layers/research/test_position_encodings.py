"""InfinitePositionalEncoding / TimeBinPositionalEncoding: Trax goldens, closed forms, predict."""

import functools
import os

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax.layers.research import position_encodings as pe
from tests.layers import predict_utils

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'research', 'position_encodings.npz')

# Same constructor arguments as make_position_goldens.py (run under Trax).
CASES = {
    'inf_default': dict(),
    'inf_fixed_none': dict(affine=False, transform='none'),
    'inf_odd_diag': dict(affine=False, transform='diag', drift=.1),
    'inf_timebin': dict(affine=True, transform='none', time_bin_length=4),
    'timebin5': dict(time_bin_length=5),
}



def _make(name, mode):
  cls = (pe.TimeBinPositionalEncoding if name.startswith('timebin')
         else pe.InfinitePositionalEncoding)
  return cls(mode=mode, **CASES[name])


@pytest.mark.parametrize('name', sorted(CASES))
def test_outputs_match_trax(name, threefry_not_partitionable):
  del threefry_not_partitionable  # Trax's draws for the phase and init.
  golden = np.load(GOLDEN)
  x = golden[name + '/x']
  layer = _make(name, 'eval')
  layer.init(x, rng=fastmath.random.get_prng(1234))
  if name + '/w' in golden:
    np.testing.assert_allclose(layer.weights, golden[name + '/w'], atol=1e-6)
  _assert_close_to_trax(layer(x), golden[name + '/y'])


def _assert_close_to_trax(got, want):
  """1e-5, plus Trax's float32 running-sum rounding, which grows with position.

  retrax sums the walk exactly; Trax's float32 cumulative sum is off by a
  few ulps of `noise[t]` (about 1.7 t), i.e. up to ~5e-7 t in the codes.
  """
  t = np.arange(np.shape(want)[1])[None, :, None]
  err = np.abs(np.asarray(got) - want)
  assert np.all(err <= 1e-5 + 6e-7 * t), f'max error {err.max()}'


def test_random_walk_does_not_depend_on_threefry_mode():
  """The fixed walk (no phase, no weights) matches Trax under JAX's defaults."""
  golden = np.load(GOLDEN)
  x = golden['inf_fixed_none/x']
  layer = _make('inf_fixed_none', 'eval')
  layer.init(x)
  _assert_close_to_trax(layer(x), golden['inf_fixed_none/y'])


def test_codes_are_cosines_with_the_stated_frequencies():
  """Without noise, phase and transform: cos(2π((c % 2)/4 + f_{c//2} t))."""
  x = np.zeros((1, 50, 6), np.float32)
  layer = pe.InfinitePositionalEncoding(affine=False, transform='none',
                                        mode='eval')
  layer.init(x)
  y = np.asarray(layer(x))[0]
  # Remove the walk: it is the only part that is not closed form.
  t = np.arange(50)[:, None]
  c = np.arange(6)[None, :]
  drift = .03 ** (3 / 3)
  freq = np.geomspace(.5, .5 * drift**2, num=3)[c // 2]
  walk = np.asarray(pe.random_walk(50, 3))[:, c[0] // 2] * .03**.5 / 4
  want = np.cos(2 * np.pi * ((c % 2) / 4 + freq * t + walk))
  np.testing.assert_allclose(y, want, atol=2e-5)
  # The walk's steps lie in [0, 2 sqrt 3] and it is their running sum.
  steps = np.diff(np.asarray(pe.random_walk(50, 3)), axis=0)
  assert steps.min() >= 0 and steps.max() <= 2 * 3**.5 + 1e-4
  assert steps.std() > 0.5


def test_block_sum_equals_cumulative_sum():
  """Predict mode's blocked walk at any positions equals the prefix cumsum."""
  prefix = np.asarray(pe.random_walk(1300, 5))
  positions = np.array([[0, 1, 511], [512, 1023, 1299]])
  got = np.asarray(jax.jit(pe.random_walk_at, static_argnums=1)(positions, 5))
  np.testing.assert_array_equal(got, prefix[positions])


def test_time_bin_features_closed_form():
  x = np.random.RandomState(1).randn(2, 13, 5).astype(np.float32)
  layer = pe.TimeBinPositionalEncoding(time_bin_length=4)
  layer.init(x)
  y = np.asarray(layer(x))
  t = np.arange(13)
  want = np.stack([1 / (1 + t // 4), (t % 4) / 4, (t // 4) % 2], -1)
  np.testing.assert_allclose(y[..., :2], x[..., :2])
  np.testing.assert_allclose(y[..., 2:], np.broadcast_to(want, (2, 13, 3)),
                             atol=1e-7)
  narrow = np.zeros((1, 13, 2), np.float32)
  layer.init(narrow)
  np.testing.assert_allclose(np.asarray(layer(narrow))[0], want[:, 1:])


@pytest.mark.parametrize('make', [
    functools.partial(pe.InfinitePositionalEncoding, affine=False),
    functools.partial(pe.InfinitePositionalEncoding, affine=False,
                      transform='diag', time_bin_length=3),
    functools.partial(pe.TimeBinPositionalEncoding, time_bin_length=3),
], ids=['infinite', 'infinite_diag_timebin', 'timebin'])
def test_predict_equals_eval_on_every_prefix(make):
  x = np.random.RandomState(2).randn(2, 12, 8).astype(np.float32)
  predict_utils.assert_eval_equals_predict(make, x, atol=1e-5)
  predict_utils.assert_eval_equals_predict(make, x, atol=1e-5, first_chunk=5)


def test_predict_far_positions_equal_eval():
  """Past the 512-position block of the predict-mode walk."""
  make = functools.partial(pe.InfinitePositionalEncoding, affine=False,
                           transform='none')
  x = np.random.RandomState(3).randn(1, 530, 4).astype(np.float32)
  predict_utils.assert_eval_equals_predict(make, x, atol=1e-5,
                                           first_chunk=520)


def test_affine_phase_predict_uses_the_init_rng():
  """With `affine`, predict (phase from state) equals eval given the init rng."""
  x = np.random.RandomState(4).randn(2, 6, 8).astype(np.float32)
  rng = fastmath.random.get_prng(7)
  layer_eval = pe.InfinitePositionalEncoding(mode='eval')
  w, s = layer_eval.init(x, rng=rng)
  want = np.asarray(layer_eval.pure_fn(x, w, s, rng)[0])
  other = np.asarray(layer_eval.pure_fn(x, w, s, fastmath.random.get_prng(8))[0])
  assert np.abs(other - want).max() > 1e-3  # The phase is random per rng.
  layer_pred = pe.InfinitePositionalEncoding(mode='predict')
  _, state = layer_pred.init(x[:, :1], rng=rng)
  step = jax.jit(layer_pred.pure_fn)
  for i in range(6):
    y, state = step(x[:, i:i + 1], w, state, fastmath.random.get_prng(99))
    np.testing.assert_allclose(y, want[:, i:i + 1], atol=1e-5)


def test_weights_layout():
  x = np.zeros((1, 4, 6), np.float32)
  assert tl.InfinitePositionalEncoding().init(x)[0].shape == (6, 6)
  w = tl.InfinitePositionalEncoding(transform='diag').init(x)[0]
  np.testing.assert_allclose(w, np.full(6, 1e-4))
  assert tl.InfinitePositionalEncoding(transform='none').init(x)[0] == ()
  w = tl.InfinitePositionalEncoding().init(x)[0]
  np.testing.assert_allclose(np.asarray(w) @ np.asarray(w).T, np.eye(6),
                             atol=1e-5)
  _, state = tl.InfinitePositionalEncoding(mode='predict').init(
      np.zeros((3, 1, 6), np.float32))
  assert state[0].shape == (3,) and state[0].dtype == np.int32
  assert state[1].shape == (2,)


@pytest.mark.parametrize('make,match', [
    (lambda: pe.InfinitePositionalEncoding(transform='full'), 'transform'),
    (lambda: pe.InfinitePositionalEncoding(drift=0), 'drift'),
    (lambda: pe.InfinitePositionalEncoding(mode='test'), 'mode'),
    (lambda: pe.TimeBinPositionalEncoding(time_bin_length=0), 'time_bin_length'),
    (lambda: pe.TimeBinPositionalEncoding(time_bin_length=2.5),
     'time_bin_length'),
])
def test_bad_arguments(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_bad_inputs():
  layer = pe.InfinitePositionalEncoding(time_bin_length=3)
  with pytest.raises(tl.LayerError, match='depth >= 3'):
    layer.init(np.zeros((1, 4, 2), np.float32))
    layer(np.zeros((1, 4, 2), np.float32))
  with pytest.raises(tl.LayerError, match=r'\(batch, length, d_feature\)'):
    pe.TimeBinPositionalEncoding(3)(np.zeros((4, 2), np.float32))
