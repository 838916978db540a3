"""Running layers on several devices: `Accelerate` and Trax's device helpers.

`Accelerate(layer)` splits the batch (axis 0) over the local devices and runs
`layer` on each part with `pmap` (with one device it just compiles `layer`).
Its weights and state carry a leading device axis when there are 2+ devices.
The helpers (`for_n_devices`, `reshape_by_device`, `jit_forward`, `on_cpu`,
`on_accelerator`, `shard`, `unshard`) are Trax's `tl.*` names for the same
data movements.
"""

import jax
import numpy as onp

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.validation import ArgumentValueError


class Accelerate(base.Layer):
  """Runs `layer` data-parallel over `n_devices` (default: all local devices).

  The batch is split on axis 0; a batch not divisible by `n_devices` is
  zero-padded and the padding cut from the outputs (layers mixing examples,
  such as BatchNorm, then see the padding). An initialized `layer` needs no
  further `init`; use `replicate_weights` to give the sublayer new weights.
  """

  def __init__(self, layer, n_devices=None):
    super().__init__(n_in=layer.n_in, n_out=layer.n_out)
    self._sublayers = [layer]
    self._n_devices = n_devices or fastmath.local_device_count()
    self._jit_pure_fn = jit_forward(_unsharding(layer.pure_fn),
                                    self._n_devices, do_mean=False)

  @property
  def sublayer(self):
    """The accelerated layer."""
    return self._sublayers[0]

  def pure_fn(self, x, weights, state, rng, use_cache=False):
    """The sublayer's `pure_fn`, batch split over the devices (padded if needed)."""
    del use_cache
    first = x[0] if isinstance(x, (list, tuple)) else x
    remainder = first.shape[0] % self._n_devices
    if remainder == 0:
      return self._jit_pure_fn(x, weights, state, rng)
    n_pad = self._n_devices - remainder

    def pad(z):
      widths = [(0, 0)] * len(z.shape)
      widths[0] = (0, n_pad)
      return jnp.pad(z, widths, mode='constant')
    padded = type(x)(pad(z) for z in x) if isinstance(x, (list, tuple)) else pad(x)
    padded_y, state = self._jit_pure_fn(padded, weights, state, rng)
    if isinstance(x, (list, tuple)):
      y = type(x)(p[:z.shape[0]] for p, z in zip(padded_y, x))
    else:
      y = padded_y[:x.shape[0]]
    return y, state

  def _prepare_weights(self, weights):
    """Weights sharded (if `base.N_WEIGHTS_SHARDS > 1`) or replicated per device."""
    n_shards = base.N_WEIGHTS_SHARDS
    if n_shards > 1:
      if self._n_devices % n_shards != 0:
        raise ArgumentValueError(f'Accelerate: n_devices ({self._n_devices}) must be '
                                 f'a multiple of the number of weight shards '
                                 f'({n_shards}).')
      return shard(weights, n_shards)
    return for_n_devices(weights, self._n_devices)

  def init_weights_and_state(self, input_signature):
    weights, state = self.sublayer.init(input_signature, use_cache=True)
    self._weights = self._prepare_weights(weights)
    self._state = for_n_devices(state, self._n_devices)

  def replicate_weights(self, weights):
    """Sets the sublayer's weights and this layer's per-device copies."""
    self.sublayer.weights = weights
    self._weights = self._prepare_weights(weights)

  def replicate_state(self, state):
    """Sets the sublayer's state and this layer's per-device copies."""
    self.sublayer.state = state
    self._state = for_n_devices(state, self._n_devices)

  def _unreplicate(self, x):
    """The copy on the first device (`x` itself with one device)."""
    if self._n_devices < 2:
      return x
    return fastmath.nested_map(lambda y: y[0], x)

  @property
  def weights(self):
    """Per-device weights; taken from the sublayer when not set here."""
    if self._weights is base.EMPTY_WEIGHTS:
      self._weights = self._prepare_weights(self.sublayer.weights)
    return self._weights

  @weights.setter
  def weights(self, weights):
    self._weights = weights
    self.sublayer.weights = self._unreplicate(weights)

  @property
  def state(self):
    """Per-device state; taken from the sublayer when not set here."""
    if self._state is base.EMPTY_STATE:
      self._state = for_n_devices(self.sublayer.state, self._n_devices)
    return self._state

  @state.setter
  def state(self, state):
    self._state = state
    self.sublayer.state = self._unreplicate(state)


def _is_numpy():
  return fastmath.is_backend(fastmath.Backend.NUMPY)


def _unsharding(pure_fn):
  """`pure_fn` that first gathers weights sharded by `shard` (inside pmap)."""
  def fn(x, weights, state, rng):
    if base.N_WEIGHTS_SHARDS > 1:
      weights = unshard_in_pmap(weights, base.N_WEIGHTS_SHARDS)
    return pure_fn(x, weights, state, rng)
  return fn


def mean_or_pmean(n_devices, x, axis=None):
  """Mean of a distributed value `x` over `axis` (0 or None: everything)."""
  del n_devices  # The device copies are an axis of `x`; a plain mean does it.
  return jnp.mean(x, axis=axis)


def jit_forward(forward, n_devices, do_mean=True):
  """`forward(x, weights, state, rng)` compiled for `n_devices` (0: the CPU).

  With 2+ devices, `x` is split on the batch axis, `weights` and `state` must
  carry a leading device axis (see `for_n_devices`), the rng is split per
  device, and the outputs are put back into one batch (their mean over the
  devices with `do_mean=True`).
  """
  model_predict = _accelerate(forward, n_devices)
  if n_devices < 2:
    return model_predict

  def predict(x, weights, state, rng):
    res, state = model_predict(
        reshape_by_device(x, n_devices), weights, state,
        jnp.stack(fastmath.random.split(rng, n_devices)))
    res = _combine_devices(res)
    if do_mean:
      return fastmath.nested_map(
          lambda y: mean_or_pmean(n_devices, y, axis=0), res), state
    return res, state
  return predict


def _combine_devices(x_tuple):
  """Merges the (device, batch) leading axes back into one batch axis."""
  def f(x):
    if len(x.shape) < 2:
      return x  # One value per device: the devices are the batch.
    return jnp.reshape(x, (x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))
  return fastmath.nested_map(f, x_tuple)


def _accelerate(f, n_devices):
  """`f` jitted on the CPU (0), jitted (1), or pmapped over the batch (2+)."""
  if n_devices == 0:
    cpu = jax.devices('cpu')[0]
    jitted = fastmath.jit(f)

    def on_cpu_fn(*args):
      with jax.default_device(cpu):
        return jitted(*on_cpu(args))
    return on_cpu_fn
  if n_devices == 1:
    return fastmath.jit(f)
  return fastmath.pmap(f, axis_name='batch')


def reshape_by_device(x, n_devices, pure_np=False):
  """Reshapes each array in `x` from `(batch, ...)` to `(n_devices, batch // n_devices, ...)`."""
  def f(y):
    batch = y.shape[0]
    if batch % n_devices:
      raise InputValueError(f'Number of devices ({n_devices}) does not evenly '
                            f'divide batch size ({batch}).')
    shape = (n_devices, batch // n_devices) + tuple(y.shape[1:])
    return onp.reshape(y, shape) if pure_np else jnp.reshape(y, shape)
  return fastmath.nested_map(f, x)


def for_n_devices(x, n_devices):
  """Each array in `x` copied `n_devices` times on a new leading axis (one copy per device)."""
  if n_devices < 2:
    return x
  on_devices = (not _is_numpy() and
                n_devices <= jax.local_device_count())

  def f(y):
    if not on_devices:
      y = onp.asarray(y) if _is_numpy() else jnp.asarray(y)
      return jnp.broadcast_to(y, (n_devices,) + tuple(y.shape))
    devices = jax.local_devices()[:n_devices]
    mesh = jax.sharding.Mesh(onp.array(devices), ('devices',))
    sharding = jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec('devices'))
    y = jax.numpy.asarray(y)
    return jax.device_put(
        jax.numpy.broadcast_to(y, (n_devices,) + tuple(y.shape)), sharding)
  return fastmath.nested_map(f, x)


def on_cpu(x):
  """`x` moved to CPU memory (JAX backends; `x` itself under NumPy)."""
  if _is_numpy():
    return x
  return jax.device_put(x, jax.devices('cpu')[0])


def on_accelerator(x):
  """`x` moved to the accelerator if there is exactly one GPU or TPU, else `x`."""
  devices = []
  for kind in ('gpu', 'tpu'):
    try:
      devices = jax.devices(kind)
    except RuntimeError:
      continue
    break
  if len(devices) != 1:
    return x
  return jax.device_put(x, devices[0])


def _shard_axis(shape):
  """The axis `shard` splits: 0 for arrays of rank < 3, else the last."""
  return 0 if len(shape) < 3 else -1


def shard(tensors, n_shards=None):
  """Splits each array into `n_shards` parts, part `i % n_shards` for local device `i`.

  Returns numpy arrays with a leading axis of `local_device_count()`; arrays
  of rank < 3 are split on axis 0, others on the last axis.
  """
  n_shards = base.N_WEIGHTS_SHARDS if n_shards is None else n_shards
  n_local = fastmath.local_device_count()

  def f(x):
    axis = _shard_axis(x.shape)
    if int(x.shape[axis]) % n_shards != 0:
      raise InputValueError(f'Cannot split x with shape {tuple(x.shape)} into '
                            f'{n_shards} shards (axis {axis}).')
    parts = onp.split(onp.asarray(x), n_shards, axis=axis)
    return onp.stack([parts[i % n_shards] for i in range(n_local)], axis=0)
  return fastmath.nested_map(f, tensors)


def unshard(tensors, n_shards=None):
  """Inverse of `shard` (outside pmap): numpy arrays joined from the first `n_shards` parts."""
  n_shards = base.N_WEIGHTS_SHARDS if n_shards is None else n_shards

  def f(x):
    parts = list(onp.asarray(x)[:n_shards])
    return onp.concatenate(parts, axis=_shard_axis(parts[0].shape))
  return fastmath.nested_map(f, tensors)


def unshard_in_pmap(tensors, n_shards):
  """Inverse of `shard` inside a pmap over axis 'batch': every device gets the whole arrays."""
  def f(x):
    gathered = jax.lax.all_gather(x, 'batch')[:n_shards]
    return jnp.concatenate(list(gathered), axis=_shard_axis(x.shape))
  return fastmath.nested_map(f, tensors)
