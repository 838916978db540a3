"""Research positional encodings (Trax's `layers.research.position_encodings`).

Besides the axial, sin-cos and fixed-base encodings (defined in
`retrax.layers.position`, re-exported here), this module has:

- `InfinitePositionalEncoding`: `cos(2π · cycles[t, c])` features with
  geometrically spaced frequencies plus a fixed pseudorandom walk, so that any
  position, however far, gets a distinct code; optionally a random phase per
  call (`affine`) and a learned `any`/`diag` transform.
- `TimeBinPositionalEncoding`: writes three time-bin features of the position
  into the last three channels of its input.

The random walk is the one Trax draws: increment `u[t, c]` is the first word
of threefry-2x32 under a fixed key at counter `(t·width + c, 0)`, scaled to
`[0, 2·sqrt(3)]`; `noise[t] = u[0] + ... + u[t]`. retrax sums the raw words
exactly (int32 limbs) and scales once, so eval mode (a cumulative sum) and
predict mode (any positions, possibly traced under `jit`, summed in blocks)
give bit-identical codes; Trax's float32 running sum rounds differently, by
a few ulps of `noise[t]` (about `1e-7 · t` in the codes). Positions up to
2^20 are supported.

In 'predict' mode both layers keep the next position of each batch element
in `state` and encode the next `length` positions per call, so predict mode
agrees with eval mode on every prefix (Trax's versions encode one position
per call).
"""

import jax
from jax import lax
import jax.extend.random as jex_random
import numpy as np

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init
from retrax.layers import predict_state
from retrax.layers.position import AxialPositionalEncoding as AxialPositionalEncoding
from retrax.layers.position import FixedBasePositionalEncoding as FixedBasePositionalEncoding
from retrax.layers.position import SinCosPositionalEncoding as SinCosPositionalEncoding
from retrax.validation import ArgumentValueError

_MODES = ('train', 'eval', 'predict', 'viz')
_NOISE_SEED = 234234535  # Trax's fixed seed for the random walk.
_BLOCK = 512  # Positions summed per step when accumulating predict-mode noise.
_MAX_POSITIONS = 2**20  # The walk's int32 limb sums stay exact below this.


def _check_mode(name, mode):
  if mode not in _MODES:
    raise ArgumentValueError(f'{name}: mode must be one of {_MODES}; got {mode!r}.')


def _check_3d(layer, x):
  if len(x.shape) != 3:
    raise InputValueError(f'{layer.name} expects (batch, length, d_feature) '
                          f'activations; got shape {tuple(x.shape)}.')


def threefry_2x32_prf(key, x):
  """Threefry-2x32 of each counter pair: `uint32[2]` key, `uint32[..., 2]` x."""
  if key.shape != (2,) or key.dtype != jnp.uint32:
    raise InputTypeError(f'key must be uint32[2]; got {key.dtype}{list(key.shape)}.')
  if x.shape[-1:] != (2,) or x.dtype != jnp.uint32:
    raise InputTypeError(f'x must be uint32[..., 2]; got {x.dtype}{list(x.shape)}.')
  flat = jnp.moveaxis(x, -1, 0).reshape(-1)
  y = jex_random.threefry_2x32(key, flat)
  return jnp.moveaxis(jnp.reshape(y, (2,) + x.shape[:-1]), 0, -1)


def threefry_2x32_prange(key, lo=0, hi=2):
  """Keys `lo .. hi-1` of the little-endian counter stream of `key`."""
  if key.shape != (2,) or key.dtype != jnp.uint32:
    raise InputValueError(f'key must be uint32[2]; got {key.dtype}{list(key.shape)}.')
  if hi >= 2**32:
    raise NotImplementedError('only 32-bit counters are supported')
  counters = jnp.arange(lo, hi, dtype=jnp.uint32)
  return threefry_2x32_prf(
      key, jnp.stack([counters, jnp.zeros_like(counters)], axis=-1))


def _noise_key():
  """Trax's walk key: `split(PRNGKey(234234535))[0]` with JAX's original split.

  Spelled out so it does not depend on `jax_threefry_partitionable`.
  """
  seed_key = jnp.array([0, _NOISE_SEED], dtype=jnp.uint32)
  return jex_random.threefry_2x32(seed_key, jnp.arange(4, dtype=jnp.uint32))[:2]


def _step_bits(rows, width):
  """The walk's raw steps: uint32 `[*rows.shape, width]`."""
  steps = jnp.arange(width, dtype=jnp.uint32).reshape((1,) * rows.ndim + (width,))
  counters = rows[..., None].astype(jnp.uint32) * np.uint32(width) + steps
  return threefry_2x32_prf(
      _noise_key(), jnp.stack([counters, jnp.zeros_like(counters)], -1))[..., 0]


def _limbs(bits):
  """uint32 -> three int32 11-bit limbs (high to low): sums of up to 2^20 fit."""
  return ((bits >> 22).astype(jnp.int32),
          ((bits >> 11) & 0x7FF).astype(jnp.int32),
          (bits & 0x7FF).astype(jnp.int32))


def _from_limbs(high, mid, low):
  """The summed steps as floats, `Σ bits / (2^31 - 1) · sqrt(3)`."""
  total = (high.astype(jnp.float32) * np.float32(2**22) +
           mid.astype(jnp.float32) * np.float32(2**11) +
           low.astype(jnp.float32))
  return total / np.float32(2**31 - 1) * np.float32(3**.5)


def random_walk(length, width):
  """`noise[0 .. length-1, :width]`: exact integer running sums, then scaled."""
  if length > _MAX_POSITIONS:
    raise InputValueError(f'InfinitePositionalEncoding encodes at most '
                          f'{_MAX_POSITIONS} positions; got length {length}.')
  limbs = _limbs(_step_bits(jnp.arange(length), width))
  return _from_limbs(*(jnp.cumsum(l, axis=0) for l in limbs))


def random_walk_at(positions, width):
  """`noise[positions, :width]` for an int array of any (traced) positions.

  The same integer sums as `random_walk`, accumulated in blocks, so the
  values are bit-identical to it.
  """
  flat = jnp.reshape(positions, (-1,))
  n_blocks = jnp.max(flat, initial=-1) // _BLOCK + 1

  def body(i, acc):
    rows = i * _BLOCK + jnp.arange(_BLOCK)
    take = (rows[None, :] <= flat[:, None])[..., None]       # [n, block, 1]
    return tuple(a + jnp.sum(jnp.where(take, l[None], 0), axis=1)
                 for a, l in zip(acc, _limbs(_step_bits(rows, width))))

  zeros = jnp.zeros((flat.shape[0], width), jnp.int32)
  acc = lax.fori_loop(0, n_blocks, body, (zeros, zeros, zeros))
  return jnp.reshape(_from_limbs(*acc), positions.shape + (width,))


def _trax_geomspace(start, stop, num):
  """`num` geometric steps from start to stop, as Trax's float32 geomspace rounds them.

  log10 as `log(x) / log(10)`, a float32 linspace `a + i·(b - a)/(num - 1)`
  ending exactly at b, and `10^x` rounded to float32 (bits equal JAX
  0.4.13's values in most entries, within a few ulps in the others).
  """
  f32 = np.float32
  log10 = lambda v: f32(f32(np.log(np.float64(f32(v)))) / f32(np.log(10.0)))
  a, b = log10(start), log10(stop)
  xs = [a]
  if num > 1:
    delta = f32(f32(b - a) / f32(num - 1))
    xs = [f32(a + f32(f32(i) * delta)) for i in range(num - 1)] + [b]
  return np.array([f32(10.0 ** np.float64(x)) for x in xs], np.float32)


def _time_bin_features(t, bin_length):
  """`[1 / (1 + bin), fraction within the bin, bin parity]` of positions t."""
  inter_bin, intra_bin = jnp.divmod(t, bin_length)
  return jnp.stack([1 / (1 + inter_bin),
                    intra_bin / bin_length,
                    (inter_bin % 2).astype(jnp.float32)], -1).astype(jnp.float32)


@configurable('trax.layers', denylist=('mode',))
class InfinitePositionalEncoding(base.Layer):
  """Adds `cos(2π · cycles)` codes of unbounded positions (Trax's layout).

  For channel `c` (pair `k = c // 2`, `c` odd is the quarter-shifted sine):
  `cycles[t, c] = (c % 2) / 4 + f_k · t + sqrt(drift) · noise[t, k] / 4`,
  `f_k` geometric from 1/2 to `drift'^2 / 2` (`drift' = drift^(ceil(d/2) /
  floor(d/2))` for d > 2). With `affine`, a uniform random phase per channel
  (from the layer's rng) is added. The code is then mapped by the weights:
  `transform='any'` a `(d, d)` matrix (orthogonal init), 'diag' a `(d,)`
  scale through softplus, 'none' no weights. With `time_bin_length`, the
  last 3 channels hold the `TimeBinPositionalEncoding` features instead.
  """

  def __init__(self, drift=.03, affine=True, transform='any',
               time_bin_length=None, mode='train'):
    super().__init__(mode=mode)
    if transform not in ('any', 'diag', 'none'):
      raise ArgumentValueError(f"InfinitePositionalEncoding: transform must be 'any', "
                               f"'diag' or 'none'; got {transform!r}.")
    if not drift > 0:
      raise ArgumentValueError(f'InfinitePositionalEncoding: drift must be > 0; got '
                               f'{drift}.')
    if time_bin_length is not None and time_bin_length < 1:
      raise ArgumentValueError('InfinitePositionalEncoding: time_bin_length must be a '
                               f'positive int or None; got {time_bin_length}.')
    _check_mode('InfinitePositionalEncoding', mode)
    self._drift = drift
    self._affine = affine
    self._transform = transform
    self._time_bin_length = time_bin_length

  def predict_state_layout(self, state):
    """Per-example positions (one row each) and a shared key."""
    index, predict_rng = state
    return predict_state.PredictStateLayout(
        (predict_state.same_rows(index, 1),
         predict_state.same_rows(predict_rng, 0)))

  def _codes(self, t, noise, depth, rng):
    """Codes `[..., depth]` of positions t (int, `[...]`) with their noise."""
    half = (depth + 1) // 2
    drift = self._drift
    if depth > 2:
      drift = drift**(half / (depth // 2))
    pair = np.arange(depth) // 2
    freq = _trax_geomspace(.5, .5 * drift**2, half)[pair]
    noise = noise * np.float32(self._drift**.5)
    times = t[..., None].astype(jnp.float32)
    rank = lambda x: fastmath.with_rank(x, max(times.ndim, jnp.ndim(noise)))
    cycles = (rank((np.arange(depth) % 2) / 4) + rank(freq) * rank(times) +
              rank(noise[..., pair] / 4))
    if self._affine:
      cycles = cycles + rank(fastmath.random.uniform(rng, (1, depth), minval=0,
                                                     maxval=1))
    codes = jnp.cos(jnp.pi * 2 * cycles).astype(jnp.float32)
    if self._time_bin_length is not None:
      codes = jnp.concatenate(
          [codes[..., :-3], _time_bin_features(t, self._time_bin_length)], -1)
    return codes

  def forward(self, inputs):
    _check_3d(self, inputs)
    batch, length, depth = inputs.shape
    if self._time_bin_length is not None and depth < 3:
      raise InputValueError(f'{self.name} with time_bin_length needs depth >= 3; '
                            f'got {depth}.')
    half = (depth + 1) // 2
    if self._mode == 'predict':
      index, predict_rng = self.state
      t = index[:, None] + jnp.arange(length)[None]          # [batch, length]
      emb = self._codes(t, random_walk_at(t, half), depth, predict_rng)
      self.state = (index + length, predict_rng)
    else:
      t = jnp.arange(length)
      emb = self._codes(t, random_walk(length, half), depth, self.rng)[None]
    del batch
    if self._transform == 'diag':
      emb = emb * fastmath.with_rank(jax.nn.softplus(self.weights), emb.ndim)
    elif self._transform == 'any':
      emb = emb @ self.weights
    return inputs + emb.astype(inputs.dtype)

  def init_weights_and_state(self, input_signature):
    depth = input_signature.shape[-1]
    if self._transform == 'diag':
      self.weights = jnp.full((depth,), 1e-4, dtype=jnp.float32)
    elif self._transform == 'any':
      self.weights = init.OrthogonalInitializer()((depth, depth), self.rng)
    if self._mode == 'predict':
      self.state = (jnp.zeros((input_signature.shape[0],), dtype=jnp.int32),
                    self.rng)


@configurable('trax.layers', denylist=('mode',))
class TimeBinPositionalEncoding(base.Layer):
  """Replaces the last 3 channels with time-bin features of the position.

  For position t and bin `b = t // time_bin_length`: `1 / (1 + b)`,
  `(t % time_bin_length) / time_bin_length` and `b % 2`. Inputs with fewer
  than 3 channels keep the last of these features. No weights.
  """
  num_features = 3

  def __init__(self, time_bin_length, mode='train'):
    super().__init__(mode=mode)
    if not isinstance(time_bin_length, (int, np.integer)) or time_bin_length < 1:
      raise ArgumentValueError('TimeBinPositionalEncoding: time_bin_length must be a '
                               f'positive int; got {time_bin_length!r}.')
    _check_mode('TimeBinPositionalEncoding', mode)
    self._time_bin_length = int(time_bin_length)

  def predict_state_layout(self, state):
    """Per-example positions, one row each."""
    return predict_state.PredictStateLayout(predict_state.same_rows(state, 1))

  def forward(self, inputs):
    _check_3d(self, inputs)
    batch, length, depth = inputs.shape
    if self._mode == 'predict':
      t = self.state[:, None] + jnp.arange(length)[None]
      self.state = self.state + length
    else:
      t = jnp.broadcast_to(jnp.arange(length), (batch, length))
    features = _time_bin_features(t, self._time_bin_length).astype(inputs.dtype)
    out = jnp.concatenate([inputs[..., :-self.num_features], features], -1)
    return out[..., -depth:]

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      self.state = jnp.zeros((input_signature.shape[0],), dtype=jnp.int32)
