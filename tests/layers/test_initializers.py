"""Initializers: shapes, dtypes, Trax's draw sequence and variance statistics vs the formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.layers import initializers as init

KEY = jax.random.PRNGKey(0)

# (initializer, expected variance for shape (in=400, out=600)).
FAN_IN, FAN_OUT = 400, 600
FAN_AVG = (FAN_IN + FAN_OUT) / 2
VARIANCE_CASES = [
    ('GlorotNormal', init.GlorotNormalInitializer(), 1. / FAN_AVG),
    ('GlorotUniform', init.GlorotUniformInitializer(), 1. / FAN_AVG),
    ('GlorotUniform_scale2', init.GlorotUniformInitializer(scale=2.),
     2. / FAN_AVG),
    ('LeCunNormal', init.LeCunNormalInitializer(), 1. / FAN_IN),
    ('LeCunUniform', init.LeCunUniformInitializer(), 1. / FAN_IN),
    ('KaimingNormal', init.KaimingNormalInitializer(), 2. / FAN_IN),
    ('KaimingUniform', init.KaimingUniformInitializer(param=1.),
     2. / np.sqrt(2.) / FAN_IN),
    ('ScaledFanOutTruncated', init.ScaledInitializer(-1, -2, 3., 'fan_out',
                                                     'truncated_normal'),
     3. / FAN_OUT),
    ('RandomNormal', init.RandomNormalInitializer(0.05), 0.05 ** 2),
    ('RandomUniform', init.RandomUniformInitializer(0.3), 0.3 ** 2 / 3),
]


@pytest.mark.parametrize('name, initializer, variance', VARIANCE_CASES,
                         ids=[c[0] for c in VARIANCE_CASES])
def test_variance_matches_formula(name, initializer, variance):
  w = np.asarray(initializer((FAN_IN, FAN_OUT), KEY), np.float64)
  assert w.shape == (FAN_IN, FAN_OUT)
  assert initializer((FAN_IN, FAN_OUT), KEY).dtype == jnp.float32, name
  # 240,000 draws: the sample variance is within ~0.6% (2 sigma ~ 0.6%).
  np.testing.assert_allclose(w.var(), variance, rtol=0.02)
  assert abs(w.mean()) < 4 * np.sqrt(variance / w.size)


def test_uniform_limits_and_truncation():
  w = init.GlorotUniformInitializer()((FAN_IN, FAN_OUT), KEY)
  lim = np.sqrt(3. / FAN_AVG)
  assert float(jnp.max(jnp.abs(w))) <= lim
  assert float(jnp.max(jnp.abs(w))) > 0.99 * lim
  std = np.sqrt(1. / FAN_IN) / .87962566103423978
  w = init.ScaledInitializer(-1, -2, 1., 'fan_in', 'truncated_normal')(
      (FAN_IN, FAN_OUT), KEY)
  assert float(jnp.max(jnp.abs(w))) <= 2 * std * (1 + 1e-6)


def test_draws_follow_trax_call_sequence():
  # Trax: uniform(rng, shape, float32, -lim, lim), lim = sqrt(3 gain) in f32.
  w = init.LeCunUniformInitializer()((3, 5), KEY)
  lim = jnp.sqrt(3. * (1. / 3))
  np.testing.assert_array_equal(
      w, jax.random.uniform(KEY, (3, 5), jnp.float32, -lim, lim))
  w = init.GlorotNormalInitializer()((3, 5), KEY)
  np.testing.assert_array_equal(
      w, (jax.random.normal(KEY, (3, 5)) * jnp.sqrt(1. / 4)).astype(
          jnp.float32))
  w = init.RandomNormalInitializer(0.1)((4,), KEY)
  np.testing.assert_array_equal(w, 0.1 * jax.random.normal(KEY, (4,)))


def test_fans_are_trax_fans_without_receptive_field():
  # Trax's _GetFans multiplies the receptive field in only for 0-d shapes, so
  # a (3, 3, 20, 40) conv kernel has fan_in 20 and fan_out 40.
  assert init._get_fans((3, 3, 20, 40)) == (20, 40)
  assert init._get_fans((7, 9), out_dim=0, in_dim=1) == (9, 7)
  assert init._get_fans((6,)) == (6, 6)
  assert init._get_fans(()) == (1., 1.)
  w = np.asarray(init.LeCunNormalInitializer()((5, 5, 200, 300), KEY))
  np.testing.assert_allclose(w.var(), 1. / 200, rtol=0.02)


def test_scalar_and_vector_shapes():
  assert init.GlorotUniformInitializer()((), KEY).shape == ()
  w = np.asarray(init.LeCunNormalInitializer()((50000,), KEY))
  np.testing.assert_allclose(w.var(), 1. / 50000, rtol=0.03)


def test_scaled_initializer_rejects_bad_arguments():
  with pytest.raises(ValueError, match='positive'):
    init.ScaledInitializer(-1, -2, 0., 'fan_in', 'normal')
  with pytest.raises(ValueError, match='mode'):
    init.ScaledInitializer(-1, -2, 1., 'fan_x', 'normal')
  with pytest.raises(ValueError, match='distribution'):
    init.ScaledInitializer(-1, -2, 1., 'fan_in', 'cauchy')


@pytest.mark.parametrize('shape', [(6, 4), (4, 6), (2, 3, 5), (7,)])
def test_orthogonal(shape):
  w = np.asarray(init.OrthogonalInitializer(stddev=2.)(shape, KEY), np.float64)
  assert w.shape == shape
  flat = w.reshape(-1, shape[-1]) if len(shape) > 1 else w.reshape(1, -1)
  gram = flat.T @ flat if flat.shape[0] >= flat.shape[1] else flat @ flat.T
  np.testing.assert_allclose(gram, 4. * np.eye(gram.shape[0]), atol=1e-5)


def test_initializer_from_file(tmp_path):
  path = tmp_path / 'emb.npy'
  arr = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.save(path, arr)
  np.testing.assert_array_equal(init.InitializerFromFile(str(path))((2, 3),
                                                                    KEY), arr)
  with pytest.raises(ValueError, match=r'expected shape \(3, 2\)'):
    init.InitializerFromFile(str(path))((3, 2), KEY)
  np.save(path, arr.astype(np.float64))  # kept as stored, as in Trax
  loaded = init.InitializerFromFile(str(path))((2, 3), KEY)
  assert loaded.dtype == np.float64 and loaded.tolist() == arr.tolist()


def test_atari_conv_init():
  w = init.AtariConvInit((8, 8, 4, 32), KEY)
  bound = 1 / np.sqrt(4 * 8 * 8)
  assert w.shape == (8, 8, 4, 32) and w.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(w))) <= bound
  np.testing.assert_allclose(float(jnp.var(w)), bound ** 2 / 3, rtol=0.05)
