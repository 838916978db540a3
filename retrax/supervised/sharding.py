"""Named device meshes: the batch over every device, weights and slots over `fsdp`.

    Loop(model, tasks, options=LoopOptions(mesh='data=2,fsdp=4'))
    retrax train --mesh data=2,fsdp=4

(or `{'data': 2, 'fsdp': 4}`, or a jax.sharding.Mesh).

A mesh has up to two named axes: `data` and `fsdp` (the product is the
number of devices, over all processes). Every batch is split along its first
dimension over all the devices. Weights and optimizer slots are split over
`fsdp` (FSDP / ZeRO-3): each array gets a `NamedSharding` on its largest axis
whose size `fsdp` divides (arrays with none stay replicated), the jitted step
takes and returns them so, and XLA's SPMD partitioner gathers each layer's
weights where they are used and reduce-scatters their gradients. The step
computes the same function as on one device, so the losses match a one-device
run up to float summation order. Model state (small, per example) stays
replicated.

Trax's `N_WEIGHTS_SHARDS` (`trainer_lib.train(n_weights_shards=k)`) maps onto
the same thing: a mesh `data=D/k, fsdp=k` over the D devices.

A checkpoint of a state split over several processes gathers nothing: each
process writes the pieces it holds (`local_shards`, one copy of each) and
process 0 commits the checkpoint once all have (`gather_ints` is the
barrier);
see `retrax.checkpoints.native`. It restores onto any mesh.
"""

import math
import os

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from retrax.checkpoints.native import Shards
from retrax.errors import UserInputError
from retrax.layers.stacked import StackedLayers
from retrax.optimizers import placement
from retrax.supervised import devices

DATA_AXIS = devices.DATA_AXIS
FSDP_AXIS = 'fsdp'
AXES = (DATA_AXIS, FSDP_AXIS)


class MeshError(UserInputError):
  """A mesh that cannot be built from the run's devices."""


def parse_mesh(spec):
  """`{'data': 2, 'fsdp': 4}` of `'data=2,fsdp=4'` (a dict passes through).

  Raises:
    MeshError: an unknown axis name, a size that is not a positive integer,
      or text not of the form `name=size,...`.
  """
  if isinstance(spec, dict):
    items = list(spec.items())
  else:
    items = []
    for part in str(spec).replace(' ', '').split(','):
      name, sep, value = part.partition('=')
      if not sep:
        raise MeshError(f'mesh {spec!r}: expected axis=size pairs separated '
                        f'by commas, e.g. data=2,fsdp=4; got {part!r}.')
      items.append((name, value))
  axes = {}
  for name, value in items:
    if name not in AXES or name in axes:
      raise MeshError(f'mesh {spec!r}: axis {name!r} is unknown or repeated; '
                      f'the axes are {", ".join(AXES)} (each at most once).')
    try:
      size = int(value)
    except (TypeError, ValueError):
      size = 0
    if size < 1:
      raise MeshError(f'mesh {spec!r}: the size of {name!r} must be a '
                      f'positive integer.')
    axes[name] = size
  return axes


def _process_ordered_devices():
  """All devices, those of process 0 first (each process's rows of the batch
  then land on its own devices)."""
  return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def build_mesh(spec):
  """A `Mesh` with axes `('data', 'fsdp')` of `spec` (string, dict or Mesh)."""
  if isinstance(spec, Mesh):
    unknown = set(spec.axis_names) - set(AXES)
    if unknown:
      raise MeshError(f'mesh axes {sorted(unknown)} are unknown; retrax '
                      f'shards over {", ".join(AXES)}.')
    return spec
  axes = parse_mesh(spec)
  shape = (axes.get(DATA_AXIS, 1), axes.get(FSDP_AXIS, 1))
  all_devices = _process_ordered_devices()
  if math.prod(shape) != len(all_devices):
    given = ','.join(f'{k}={v}' for k, v in axes.items())
    raise MeshError(
        f'mesh {given} needs {math.prod(shape)} devices; this run has '
        f'{len(all_devices)} ({jax.process_count()} process(es)); make the '
        f'sizes multiply to {len(all_devices)}.')
  return Mesh(np.array(all_devices).reshape(shape), AXES)


def fsdp_spec(shape, n_shards):
  """`PartitionSpec` splitting `shape`'s largest axis that `n_shards` divides
  over `fsdp` (the first such axis among equals); replicated if none."""
  best = None
  for axis, size in enumerate(shape):
    if size % n_shards == 0 and size >= n_shards and (
        best is None or size > shape[best]):
      best = axis
  if n_shards == 1 or best is None:
    return PartitionSpec()
  return PartitionSpec(*([None] * best + [FSDP_AXIS]))


class MeshParallel(devices.DataParallel):
  """`DataParallel`'s interface over a named mesh, with FSDP weights.

  Attributes (beyond `DataParallel`'s):
    n_shards: the size of the `fsdp` axis.
  """

  def __init__(self, spec):  # pylint: disable=super-init-not-called
    self.mesh = build_mesh(spec)
    devices_here = [d for d in self.mesh.devices.flat
                    if d.process_index == jax.process_index()]
    self.n_devices = len(devices_here)
    self.n_global_devices = self.mesh.size
    self.n_shards = dict(self.mesh.shape).get(FSDP_AXIS, 1)
    self.replicated = NamedSharding(self.mesh, PartitionSpec())
    names = tuple(n for n in self.mesh.axis_names)
    self.batch = NamedSharding(self.mesh, PartitionSpec(names))
    self._hosts_checked = False

  def describe(self):
    return ','.join(f'{k}={v}' for k, v in dict(self.mesh.shape).items())

  def sharding_of(self, x):
    """The sharding of a weight or slot array like `x` (FSDP or replicated)."""
    shape = np.shape(x)
    return NamedSharding(self.mesh, fsdp_spec(shape, self.n_shards))

  def weight_shardings(self, tree):
    return jax.tree_util.tree_map(self.sharding_of, tree)

  def place_weights(self, tree):
    """Weights or slots put on the mesh split over `fsdp` (never aliasing
    the arrays passed in, which may be donated later)."""
    shardings = self.weight_shardings(tree)
    try:
      return jax.device_put(tree, shardings, may_alias=False)
    except TypeError:  # JAX before 0.4.36: no may_alias.
      return jax.device_put(jax.tree_util.tree_map(np.array, tree), shardings)


def bytes_per_device(tree):
  """`(largest bytes any one device holds, bytes of the whole arrays)` of the
  JAX arrays in `tree`."""
  per_device: dict = {}
  total = 0
  for x in jax.tree_util.tree_leaves(tree):
    if not isinstance(x, jax.Array):
      continue
    total += x.nbytes
    item = x.dtype.itemsize
    for device, index in x.sharding.devices_indices_map(x.shape).items():
      n = math.prod(len(range(*s.indices(dim))) for s, dim in zip(index, x.shape))
      per_device[device] = per_device.get(device, 0) + n * item
  return max(per_device.values(), default=0), total


def report_bytes(placement, train_state, log):
  """Logs the weights+slots bytes per device next to the whole (with a mesh)."""
  if isinstance(placement, MeshParallel):
    log(describe_bytes(placement, (train_state.weights, [
        (t.loss_weights, t.slots) for t in train_state.tasks])))


def describe_bytes(placement, weights_and_slots):
  """One line: weights+slots bytes per device next to the whole."""
  per_device, total = bytes_per_device(weights_and_slots)
  mesh = placement.describe()
  return (f'Weights+slots: {per_device / 2**20:.2f} MiB per device of '
          f'{total / 2**20:.2f} MiB in all ({per_device / max(total, 1):.2f}; '
          f'mesh {mesh}).')


def parallel(n_devices, mesh=None):
  """The `Loop`'s placement: `DataParallel(n_devices)`, or a `MeshParallel`
  of `mesh` when one is given."""
  if mesh is None:
    return devices.DataParallel(n_devices)
  return MeshParallel(mesh)


def weights_shards_mesh(n_weights_shards):
  """Trax's `n_weights_shards` (`N_WEIGHTS_SHARDS`) as a mesh: None for 1,
  else `data=D/k, fsdp=k` over the run's D devices."""
  k = n_weights_shards
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise MeshError(f'n_weights_shards must be a positive int; got {k!r}.')
  if k == 1:
    return None
  n = jax.device_count()
  if n % k:
    raise MeshError(f'n_weights_shards={k} must divide the {n} device(s) of '
                    'this run (weights are split over k of them).')
  return {DATA_AXIS: n // k, FSDP_AXIS: k}


def _needs_gather(x):
  return (isinstance(x, jax.Array) and not x.is_fully_addressable and
          not x.sharding.is_fully_replicated)


def to_host(tree, writes=True):
  """`tree`'s arrays fetched to the host, whole, where `writes`; else None.

  Arrays split over the devices of several processes (FSDP weights and
  slots of a multi-process run) are gathered from all of them first: a
  collective that every process must call at the same point, writing or
  not.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  if any(_needs_gather(x) for x in leaves):
    from jax.experimental import multihost_utils
    leaves = [multihost_utils.process_allgather(x, tiled=True)
              if _needs_gather(x) else x for x in leaves]
    tree = jax.tree_util.tree_unflatten(treedef, leaves)
  return placement.to_host(tree) if writes else None


def split_over_processes(tree):
  """True if an array of `tree` is split over the devices of several
  processes (FSDP over processes): its checkpoints are then sharded."""
  return any(_needs_gather(x) for x in jax.tree_util.tree_leaves(tree))


def local_shards(tree):
  """`tree` on the host without gathering: each array split over processes
  becomes a `Shards` of the pieces this process holds (replica 0 of each, so
  every piece is written once over all processes); the others are fetched.
  Stacked layers become their per-layer tuples, as checkpoints list them."""
  def local(x):
    if not _needs_gather(x):
      return x
    return Shards(x.shape, x.dtype, [
        (s.index, np.asarray(s.data)) for s in x.addressable_shards
        if s.replica_id == 0])
  return _unstacked(placement.to_host(jax.tree_util.tree_map(local, tree)))


def _row(x, r):
  """Row `r` of a stacked leaf: an array's, or a `Shards` of the rows of
  the pieces that hold it (none where another process holds it)."""
  if isinstance(x, Shards):
    pieces = []
    for index, piece in x.pieces:
      start, stop, _ = index[0].indices(x.shape[0])
      if start <= r < stop:
        pieces.append((tuple(index[1:]), piece[r - start]))
    return Shards(x.shape[1:], x.dtype, pieces)
  return x[r] if isinstance(x, (np.ndarray, jax.Array)) else x


def _unstacked(tree):
  """`tree` with each `StackedLayers` (whose iteration cannot slice a
  `Shards`) replaced by the plain tuple of its per-layer trees."""
  def unstack(x):
    if not isinstance(x, StackedLayers):
      return x
    p = x.period
    return tuple(_unstacked(jax.tree_util.tree_map(
        lambda leaf, i=i: _row(leaf, i // p), x.groups[i % p]))
                 for i in range(x.n))
  return jax.tree_util.tree_map(
      unstack, tree, is_leaf=lambda x: isinstance(x, StackedLayers))


def gather_ints(value):
  """`[value of each process]` of an int every process passes (a collective:
  every process calls it at the same point; also a barrier)."""
  from jax.experimental import multihost_utils
  values = multihost_utils.process_allgather(np.asarray(value, np.int32))
  return [int(v) for v in np.ravel(values)]


def shared_token():
  """16 hex digits drawn by process 0, the same on every process (a
  collective): names one save's shards files."""
  from jax.experimental import multihost_utils
  mine = np.frombuffer(os.urandom(8), np.uint8).astype(np.int32)
  agreed = multihost_utils.broadcast_one_to_all(mine)
  return bytes(np.asarray(agreed).astype(np.uint8).tolist()).hex()
