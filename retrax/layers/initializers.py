"""Weight initializers with Trax's names: each returns `init(shape, rng) -> array`."""

import numpy as np
import jax
import jax.numpy as jnp


def _pure_shape(shape):
  return tuple(int(x) for x in shape)


def _get_fans(shape, out_dim=-1, in_dim=-2, nonreceptive_dims=None):
  """Fan-in and fan-out of a weight shape (receptive field included)."""
  if len(shape) >= 2:
    nonreceptive = [in_dim, out_dim] + list(nonreceptive_dims or [])
    receptive_field = int(np.prod(np.delete(np.array(shape), nonreceptive)))
    fan_in = shape[in_dim] * receptive_field
    fan_out = shape[out_dim] * receptive_field
  elif len(shape) == 1:
    fan_in = fan_out = shape[0]
  else:
    fan_in = fan_out = 1.
  return fan_in, fan_out


def InitializerFromFile(path):  # pylint: disable=invalid-name
  """Loads a parameter array from a `.npy` file (no pickle)."""
  def init(shape, rng):
    del rng
    params = np.load(path, allow_pickle=False)
    if tuple(params.shape) != tuple(shape):
      raise ValueError(f'{path}: expected shape {tuple(shape)}, got '
                       f'{params.shape}.')
    return jnp.asarray(params)
  return init


def RandomNormalInitializer(stddev=1e-2):  # pylint: disable=invalid-name
  """Normal(0, stddev²) coefficients."""
  return lambda shape, rng: (stddev * jax.random.normal(
      rng, _pure_shape(shape))).astype(jnp.float32)


def RandomUniformInitializer(lim=1.0):  # pylint: disable=invalid-name
  """Uniform(-lim, lim) coefficients."""
  return lambda shape, rng: jax.random.uniform(
      rng, _pure_shape(shape), jnp.float32, -lim, lim)


def ScaledInitializer(out_dim, in_dim, scale, mode, distribution):  # pylint: disable=invalid-name
  """Variance-scaling initializer (fan_in / fan_out / fan_avg; normal, uniform, truncated_normal)."""
  if scale <= 0.:
    raise ValueError(f'scale must be a positive float, got {scale}.')
  if mode not in ('fan_in', 'fan_out', 'fan_avg'):
    raise ValueError(f"Invalid mode {mode!r}: use 'fan_in', 'fan_out' or "
                     "'fan_avg'.")
  if distribution not in ('normal', 'uniform', 'truncated_normal'):
    raise ValueError(f"Invalid distribution {distribution!r}: use 'normal', "
                     "'uniform' or 'truncated_normal'.")

  def init(shape, rng, nonreceptive_dims=None):
    shape = _pure_shape(shape)
    fan_in, fan_out = _get_fans(shape, out_dim, in_dim, nonreceptive_dims)
    gain = scale / {'fan_in': fan_in, 'fan_out': fan_out,
                    'fan_avg': (fan_in + fan_out) / 2}[mode]
    if distribution == 'truncated_normal':
      stddev = np.sqrt(gain) / .87962566103423978
      return (jax.random.truncated_normal(rng, -2, 2, shape) *
              stddev).astype(jnp.float32)
    if distribution == 'normal':
      return (jax.random.normal(rng, shape) * np.sqrt(gain)).astype(jnp.float32)
    lim = np.sqrt(3. * gain)
    return jax.random.uniform(rng, shape, jnp.float32, -lim, lim)
  return init


def GlorotNormalInitializer(out_dim=-1, in_dim=-2, scale=1.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_avg', 'normal')


def GlorotUniformInitializer(out_dim=-1, in_dim=-2, scale=1.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_avg', 'uniform')


def LeCunNormalInitializer(out_dim=-1, in_dim=-2, scale=1.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_in', 'normal')


def LeCunUniformInitializer(out_dim=-1, in_dim=-2, scale=1.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_in', 'uniform')


def KaimingNormalInitializer(out_dim=-1, in_dim=-2, param=0.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, 2.0 / np.sqrt(1 + param**2),
                           'fan_in', 'normal')


def KaimingUniformInitializer(out_dim=-1, in_dim=-2, param=0.):  # pylint: disable=invalid-name
  return ScaledInitializer(out_dim, in_dim, 2.0 / np.sqrt(1 + param**2),
                           'fan_in', 'uniform')


def OrthogonalInitializer(stddev=1.0):  # pylint: disable=invalid-name
  """Orthogonal matrices (QR of a normal matrix, signs fixed by R's diagonal)."""
  def init(shape, rng):
    cur = list(shape)
    while len(cur) < 2:
      cur = [1] + cur
    n_rows = int(np.prod(cur[:-1]))
    n_cols = cur[-1]
    flat = (n_cols, n_rows) if n_rows < n_cols else (n_rows, n_cols)
    q, r = jnp.linalg.qr(jax.random.normal(rng, flat, dtype=jnp.float32))
    q = q * jnp.sign(jnp.diag(r))
    if n_rows < n_cols:
      q = q.T
    return stddev * jnp.reshape(q, shape)
  return init


def AtariConvInit(kernel_shape, rng, dtype=jnp.float32):  # pylint: disable=invalid-name
  """Uniform(±1/sqrt(fan_in·h·w)) for (h, w, in, out) conv kernels."""
  h, w, fan_in, _ = kernel_shape
  std = 1 / np.sqrt(fan_in * h * w)
  return jax.random.uniform(rng, kernel_shape, dtype, minval=-std, maxval=std)
