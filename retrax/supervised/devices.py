"""Hosts, devices and data parallelism through `jax.sharding`.

Training runs as ONE jitted program over a `Mesh` with a single `'data'`
axis: every batch is split along its first (batch) dimension across the
devices, weights, optimizer slots and model state are replicated, and XLA
inserts the gradient all-reduce. The program computes the same function as on
one device, so the losses match a one-device run (up to float summation
order).

Multi-host training: start one process per host, call
`jax.distributed.initialize()` (with the coordinator address, process count
and id, or from the cluster's environment) BEFORE creating a `Loop` or
`Trainer`, give every host the same `random_seed`, and let each host's data
stream yield its own share of the global batch (global batch / number of
hosts examples). The mesh then spans the devices of all hosts; each host's
local batch becomes its shard of the global array
(`jax.make_array_from_process_local_data`), and only host 0 (the chief) writes
checkpoints and logs.
"""

import random
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from retrax import fastmath

DATA_AXIS = 'data'


def init_random_number_generators(seed=None):
  """Seeds Python's and NumPy's global generators; returns a JAX PRNG key.

  With `seed=None` a seed is drawn from Python's (time-seeded) generator,
  as Trax does.
  """
  random.seed(seed)
  if seed is None:
    seed = random.randint(0, 2**31 - 1)
  np.random.seed(seed)
  return fastmath.random.get_prng(seed)


def init_host_and_devices(n_devices=None, random_seed=None):
  """Returns `(is_chief, n_hosts, n_devices, rng)` as Trax's function does.

  Args:
    n_devices: local devices to use; None for all of this host's devices.
    random_seed: the seed of everything random in training; None draws one
      (from the time and host id when there are several hosts).

  Raises:
    ValueError: if `n_devices` is not between 1 and the local device count.
  """
  host_id, n_hosts = jax.process_index(), jax.process_count()
  local = jax.local_device_count()
  if n_devices is None:
    n_devices = local
  if isinstance(n_devices, bool) or not isinstance(
      n_devices, (int, np.integer)) or not 1 <= n_devices <= local:
    raise ValueError(
        f'n_devices must be an int between 1 and the {local} local device(s) '
        f'of this host; got {n_devices!r}.')
  if random_seed is None and n_hosts > 1:
    random_seed = int(1e6 * (host_id + time.time())) % 2**31
  return host_id == 0, n_hosts, int(n_devices), init_random_number_generators(
      random_seed)


class DataParallel:
  """The mesh and shardings for data-parallel training on `n_devices` per host.

  Attributes:
    mesh: a `Mesh` with axis `'data'` over the chosen devices of every host.
    replicated: sharding that copies an array to every device.
    batch: sharding that splits an array's first dimension across devices.
  """

  def __init__(self, n_devices):
    if jax.process_count() == 1:
      devices = jax.local_devices()[:n_devices]
    else:
      devices = [d for p in range(jax.process_count())
                 for d in [x for x in jax.devices() if x.process_index == p]
                 [:n_devices]]
    self.n_devices = n_devices
    self.n_global_devices = len(devices)
    self.mesh = Mesh(np.array(devices), (DATA_AXIS,))
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    self.batch = NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

  def check_batch(self, batch, step=None):
    """Raises a clear error unless every item's batch size splits evenly."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in batch}
    where = f'Step {step}: ' if step is not None else ''
    if None in sizes:
      raise ValueError(
          f'{where}every batch item needs a leading batch dimension; got '
          f'shapes {[np.shape(x) for x in batch]}.')
    if len(sizes) != 1:
      raise ValueError(
          f'{where}batch items disagree on the batch size: shapes '
          f'{[np.shape(x) for x in batch]}.')
    size = sizes.pop()
    if size % self.n_devices:
      raise ValueError(
          f'{where}the batch size {size} is not divisible by the number of '
          f'devices ({self.n_devices}); use a batch size that is a multiple of '
          f'{self.n_devices} or pass n_devices= to use fewer devices.')

  def put_batch(self, batch):
    """Places a host batch (this host's share) as arrays sharded over 'data'."""
    if jax.process_count() == 1:
      return jax.device_put(tuple(batch), self.batch)
    return tuple(jax.make_array_from_process_local_data(self.batch, np.asarray(x))
                 for x in batch)

  def replicate(self, tree):
    """Copies every array of `tree` to every device of the mesh.

    The result never shares buffers with `tree`, so donating it to a training
    step deletes nothing the caller still holds.
    """
    try:
      return jax.device_put(tree, self.replicated, may_alias=False)
    except TypeError:  # JAX before 0.4.36: no may_alias.
      return jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True),
                                    jax.device_put(tree, self.replicated))
