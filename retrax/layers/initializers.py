"""Weight initializers with Trax's names: each returns `init(shape, rng) -> array`.

Random draws go through `fastmath.random` with Trax's call sequence (and
scales computed in float32 as Trax does), so a given key gives Trax's numbers.
"""

import numpy as np

from retrax.configurable import configurable
from retrax.errors import UserInputError
from retrax.fastmath import numpy as jnp
from retrax.fastmath import random
from retrax.validation import ArgumentValueError


def _pure_shape(shape):
  return tuple(int(x) for x in shape)


def _get_fans(shape, out_dim=-1, in_dim=-2, nonreceptive_dims=None):
  """Fan-in and fan-out of a weight shape, as Trax computes them.

  For 2+ dimensions these are `shape[in_dim]` and `shape[out_dim]`: Trax
  (through v1.4.1 and HEAD) computes the receptive field but, by its
  indentation, multiplies it in only for 0-d shapes, where it is 1. A 1-d
  shape has fan-in = fan-out = its length; a 0-d shape has 1 and 1.
  """
  del nonreceptive_dims  # Only feeds the receptive field, which is unused.
  if len(shape) >= 2:
    return shape[in_dim], shape[out_dim]
  if len(shape) == 1:
    return shape[0], shape[0]
  return 1., 1.


def InitializerFromFile(path):
  """Loads a parameter array from a `.npy` file (no pickle); checks its shape.

  The array comes back as stored (a numpy array of the file's dtype), as in
  Trax.
  """
  def init(shape, rng):
    del rng
    params = np.load(path, allow_pickle=False)
    if tuple(params.shape) != tuple(shape):
      raise UserInputError(f'{path}: expected shape {tuple(shape)}, got '
                           f'{params.shape}.')
    return params
  return init


def RandomNormalInitializer(stddev=1e-2):
  """Normal(0, stddev²) coefficients, float32."""
  return lambda shape, rng: (stddev * random.normal(
      rng, _pure_shape(shape))).astype(np.float32)


def RandomUniformInitializer(lim=1.0):
  """Uniform(-lim, lim) coefficients, float32."""
  return lambda shape, rng: random.uniform(
      rng, _pure_shape(shape), np.float32, -lim, lim)


def ScaledInitializer(out_dim, in_dim, scale, mode, distribution):
  """Variance-scaling initializer: variance `scale / fan`, float32.

  Args:
    out_dim: axis of the output units (fan-out).
    in_dim: axis of the input units (fan-in).
    scale: positive variance multiplier.
    mode: 'fan_in', 'fan_out' or 'fan_avg' (mean of the two fans).
    distribution: 'normal' (stddev sqrt(var)), 'uniform' (limits
      ±sqrt(3·var)) or 'truncated_normal' (±2 stddev, rescaled to var).

  Returns:
    `init(shape, rng, nonreceptive_dims=None) -> array`.
  """
  if scale <= 0.:
    raise ArgumentValueError(f'ScaledInitializer: scale must be a positive number; got '
                             f'{scale!r}.')
  if mode not in ('fan_in', 'fan_out', 'fan_avg'):
    raise ArgumentValueError("ScaledInitializer: mode must be 'fan_in', 'fan_out' "
                             f"or 'fan_avg'; got {mode!r}.")
  if distribution not in ('normal', 'uniform', 'truncated_normal'):
    raise ArgumentValueError("ScaledInitializer: distribution must be 'normal', "
                             "'uniform' or 'truncated_normal'; got "
                             f'{distribution!r}.')

  def init(shape, rng, nonreceptive_dims=None):
    shape = _pure_shape(shape)
    fan_in, fan_out = _get_fans(shape, out_dim, in_dim, nonreceptive_dims)
    gain = scale
    if mode == 'fan_in':
      gain /= fan_in
    elif mode == 'fan_out':
      gain /= fan_out
    else:
      gain /= (fan_in + fan_out) / 2
    if distribution == 'truncated_normal':
      # .8796... is the std of a standard normal truncated to [-2, 2].
      stddev = jnp.sqrt(gain) / .87962566103423978
      return (random.truncated_normal(rng, -2, 2, shape) *
              stddev).astype(np.float32)
    if distribution == 'normal':
      return (random.normal(rng, shape) * jnp.sqrt(gain)).astype(np.float32)
    lim = jnp.sqrt(3. * gain)
    return random.uniform(rng, shape, np.float32, -lim, lim)
  return init


def GlorotNormalInitializer(out_dim=-1, in_dim=-2, scale=1.):
  """Glorot/Xavier normal: variance scale / mean(fan_in, fan_out)."""
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_avg', 'normal')


def GlorotUniformInitializer(out_dim=-1, in_dim=-2, scale=1.):
  """Glorot/Xavier uniform: limits ±sqrt(3·scale / mean(fan_in, fan_out))."""
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_avg', 'uniform')


def LeCunNormalInitializer(out_dim=-1, in_dim=-2, scale=1.):
  """LeCun normal: variance scale / fan_in."""
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_in', 'normal')


def LeCunUniformInitializer(out_dim=-1, in_dim=-2, scale=1.):
  """LeCun uniform: limits ±sqrt(3·scale / fan_in)."""
  return ScaledInitializer(out_dim, in_dim, scale, 'fan_in', 'uniform')


def KaimingNormalInitializer(out_dim=-1, in_dim=-2, param=0.):
  """He-normal: variance 2/sqrt(1 + param²) / fan_in (Trax's formula)."""
  return ScaledInitializer(out_dim, in_dim, 2.0 / jnp.sqrt(1 + param**2),
                           'fan_in', 'normal')


def KaimingUniformInitializer(out_dim=-1, in_dim=-2, param=0.):
  """He-uniform: variance 2/sqrt(1 + param²) / fan_in (Trax's formula)."""
  return ScaledInitializer(out_dim, in_dim, 2.0 / jnp.sqrt(1 + param**2),
                           'fan_in', 'uniform')


def OrthogonalInitializer(stddev=1.0):
  """`stddev` times an orthogonal matrix (QR of a normal draw, signs fixed by R's diagonal).

  Shapes with more than two axes are flattened to (prod(shape[:-1]),
  shape[-1]) first; rows (or columns, whichever are fewer) are orthonormal.
  """
  def init(shape, rng):
    cur = list(shape)
    while len(cur) < 2:
      cur = [1] + cur
    n_rows = int(np.prod(cur[:-1]))
    n_cols = cur[-1]
    flat = (n_cols, n_rows) if n_rows < n_cols else (n_rows, n_cols)
    a = random.normal(rng, flat, dtype=np.float32)
    q, r = jnp.linalg.qr(a)
    q = q * jnp.sign(jnp.diag(r))[None, :]
    if n_rows < n_cols:
      q = jnp.transpose(q)
    return stddev * jnp.reshape(q, shape)
  return init


@configurable('trax.layers')
def AtariConvInit(kernel_shape, rng, dtype=np.float32):
  """Uniform(±1/sqrt(fan_in·h·w)) for (h, w, in, out) conv kernels."""
  h, w, fan_in, _ = kernel_shape
  std = 1 / jnp.sqrt(fan_in * h * w)
  return random.uniform(rng, kernel_shape, dtype, minval=-std, maxval=std)
