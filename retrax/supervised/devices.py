"""Hosts, devices and data parallelism through `jax.sharding`.

Training runs as ONE jitted program over a `Mesh` with a single `'data'`
axis: every batch is split along its first (batch) dimension across the
devices, weights, optimizer slots and model state are replicated, and XLA
inserts the gradient all-reduce. The program computes the same function as on
one device, so the losses match a one-device run (up to float summation
order).

Multi-host training: start one process per host, call
`initialize_distributed` (or `jax.distributed.initialize()`; the CLI's
`--coordinator/--num_processes/--process_id`) BEFORE creating a `Loop` or
`Trainer`, give every host the same `random_seed`, and let each host's data
stream yield its own share of the global batch (global batch / number of
hosts examples; `host_shard` cuts it from a global stream). The first batch
is checked: identical batches on two hosts are an error. The mesh then spans
the devices of all hosts; each host's
local batch becomes its shard of the global array
(`jax.make_array_from_process_local_data`), and only host 0 (the chief) writes
checkpoints and logs.
"""

import hashlib
import os
import random
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.errors import UserInputError
from retrax.supervised import peers
from retrax.validation import ArgumentValueError

DATA_AXIS = 'data'

# Environment variables read by `initialize_distributed` when no argument is
# given (the names JAX documents); SLURM, Open MPI and other clusters that JAX
# detects itself are joined through `jax.distributed.initialize()`.
ENV_COORDINATOR = 'JAX_COORDINATOR_ADDRESS'
ENV_NUM_PROCESSES = 'JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'JAX_PROCESS_ID'


class ClusterConfigError(UserInputError):
  """Multi-process flags or environment variables that are missing or invalid."""


def _cluster_size(env):
  """How many processes the launcher's variables describe (1 when none).

  A variable's presence is not a cluster: every single-host TPU VM sets
  `TPU_WORKER_HOSTNAMES=localhost`, a one-task SLURM job sets
  `SLURM_JOB_ID`. Only a count above one makes this process one of several,
  and only then is JAX's own detection (which may ask a TPU metadata server
  that a single VM cannot reach) worth running.
  """
  hosts = env.get('TPU_WORKER_HOSTNAMES', '')
  sizes = [len([h for h in hosts.split(',') if h.strip()])]
  for name in ('SLURM_NTASKS', 'SLURM_NPROCS', 'OMPI_COMM_WORLD_SIZE',
               'PMI_SIZE'):
    try:
      sizes.append(int(env.get(name, '1')))
    except ValueError:
      raise ClusterConfigError(
          f'{name}={env[name]!r} is not an integer.') from None
  return max(sizes + [1])


def _env_int(env, name):
  value = env.get(name)
  if value is None:
    return None
  try:
    return int(value)
  except ValueError:
    raise ClusterConfigError(f'{name}={value!r} is not an integer.') from None


def _check_coordinator(address):
  """`HOST:PORT` with a port in 1..65535 (else the processes wait for a
  service that cannot be)."""
  host, _, port = str(address).rpartition(':')
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ClusterConfigError(
        f'--coordinator must be HOST:PORT with a port in 1..65535 (process '
        f'0 serves there, the others connect to it); got {address!r:.100}.')


def initialize_distributed(coordinator=None, num_processes=None,
                           process_id=None, env=None):
  """Joins a multi-process (multi-host) run with `jax.distributed.initialize`.

  Arguments left None are read from `JAX_COORDINATOR_ADDRESS`,
  `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`; with none of them set and a
  launcher's variables naming more than one process (a multi-host TPU slice's
  `TPU_WORKER_HOSTNAMES`, SLURM, Open MPI, PMI), JAX's own detection is used.
  One host, one task or no launcher is a single process.
  Call it before anything touches a device. A process that dies later
  stops the others with one line (`peers.PeerLostError`), see `peers`.

  Returns:
    True if this process joined a multi-process run, False for a single
    process (nothing given and no cluster found).

  Raises:
    ClusterConfigError: a partial or inconsistent setting (names what is missing).
  """
  env = os.environ if env is None else env
  coordinator = coordinator or env.get(ENV_COORDINATOR) or None
  if num_processes is None:
    num_processes = _env_int(env, ENV_NUM_PROCESSES)
  if process_id is None:
    process_id = _env_int(env, ENV_PROCESS_ID)
  given = {'--coordinator': coordinator, '--num_processes': num_processes,
           '--process_id': process_id}
  if all(v is None for v in given.values()):
    if _cluster_size(env) <= 1:
      return False
    try:
      jax.distributed.initialize()
    except Exception as e:  # JAX's detection: metadata servers, sockets.
      raise ClusterConfigError(
          f'this looks like a {_cluster_size(env)}-process cluster '
          f'(TPU_WORKER_HOSTNAMES, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE or '
          f'PMI_SIZE), but jax.distributed.initialize() failed: '
          f'{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ""}. '
          f'Give --coordinator/--num_processes/--process_id, or unset those '
          f'variables to run as one process.') from None
    return jax.process_count() > 1
  missing = [k for k, v in given.items() if v is None]
  if missing:
    raise ClusterConfigError(
        f'a multi-process run needs --coordinator, --num_processes and '
        f'--process_id (or {ENV_COORDINATOR}, {ENV_NUM_PROCESSES}, '
        f'{ENV_PROCESS_ID}); missing {", ".join(missing)}.')
  _check_coordinator(coordinator)
  if num_processes < 1 or not 0 <= process_id < num_processes:
    raise ClusterConfigError(
        f'process_id must be in [0, num_processes); got process_id='
        f'{process_id}, num_processes={num_processes}.')
  if num_processes == 1:
    return False
  peers.join(coordinator, num_processes, process_id)
  return True


def host_shard(batches, host_id=None, n_hosts=None):
  """Yields this host's rows of each global batch (rows split evenly by host).

  Every host reads the same global stream and keeps rows
  `[host_id * b, (host_id + 1) * b)` with `b = global rows / n_hosts`, so a
  multi-host run trains on exactly the batches of a one-process run.
  """
  host_id = jax.process_index() if host_id is None else host_id
  n_hosts = jax.process_count() if n_hosts is None else n_hosts
  for batch in batches:
    rows = np.shape(batch[0])[0]
    if rows % n_hosts:
      raise ArgumentValueError(f'the global batch size {rows} is not divisible by the '
                               f'number of processes ({n_hosts}).')
    b = rows // n_hosts
    yield tuple(x[host_id * b:(host_id + 1) * b] for x in batch)


def global_signature(signature, n_processes=None):
  """`signature` (of this process's batch) with its batch sizes made global.

  Every process feeds its share of each global batch, but the jitted step
  runs on the whole global array: layers whose state has one row per example
  (LSH attention's hash keys, caches) must be initialized for the global
  batch, on every process alike.
  """
  n = jax.process_count() if n_processes is None else n_processes
  if n == 1:
    return signature
  return type(signature)(
      s if not s.shape else s.replace(shape=(s.shape[0] * n,) + s.shape[1:])
      for s in signature)


def check_hosts_differ(batch):
  """Raises if two processes hold identical batches (each must feed its share).

  A collective: every process must call it with its own batch.
  """
  h = hashlib.sha256()
  for x in batch:
    x = np.ascontiguousarray(x)
    h.update(str((x.shape, x.dtype.str)).encode())
    h.update(x.tobytes())
  digest = np.frombuffer(h.digest()[:8], np.int64)
  digests = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1)
  if len(set(digests.tolist())) < len(digests):
    same = [i for i, d in enumerate(digests.tolist())
            if digests.tolist().count(d) > 1]
    raise InputValueError(
        f'processes {same} feed identical batches; in a multi-process run '
        f'each process must yield its own share of the global batch (e.g. '
        f'with retrax.supervised.devices.host_shard), not the whole batch.')


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
    raise ArgumentValueError(
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
    self._hosts_checked = False

  def check_batch(self, batch, step=None):
    """Raises a clear error unless every item's batch size splits evenly."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in batch}
    where = f'Step {step}: ' if step is not None else ''
    if None in sizes:
      raise InputValueError(
          f'{where}every batch item needs a leading batch dimension; got '
          f'shapes {[np.shape(x) for x in batch]}.')
    if len(sizes) != 1:
      raise InputValueError(
          f'{where}batch items disagree on the batch size: shapes '
          f'{[np.shape(x) for x in batch]}.')
    size = sizes.pop()
    if size % self.n_devices:
      raise InputValueError(
          f'{where}the batch size {size} is not divisible by the number of '
          f'devices ({self.n_devices}); use a batch size that is a multiple of '
          f'{self.n_devices} or pass n_devices= to use fewer devices.')

  def put_batch(self, batch):
    """Places a host batch (this host's share) as arrays sharded over 'data'."""
    if jax.process_count() == 1:
      return jax.device_put(tuple(batch), self.batch)
    if not self._hosts_checked:  # Once: the first batch of every process.
      check_hosts_differ(batch)
      self._hosts_checked = True
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

  # Weights and slots are replicated here; `sharding.MeshParallel` splits them.

  def weight_shardings(self, tree):
    """The sharding of every weight or slot array of `tree` (replicated)."""
    return jax.tree_util.tree_map(lambda _: self.replicated, tree)

  def place_weights(self, tree):
    """Weights or optimizer slots on the mesh (here: `replicate`)."""
    return self.replicate(tree)
