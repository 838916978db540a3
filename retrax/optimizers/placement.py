"""Where `optimizers.Trainer`'s arrays live: local devices, shares, host memory.

One step runs as one jitted program over a `jax.sharding.Mesh` of the first
`n_devices` local devices: the batch is split along its first dimension,
everything else is replicated, and XLA inserts the gradient all-reduce, so the
step computes the same function as on one device. `sharded_value_and_grad`
is that step's gradients (optionally per share merged by Adasum), shared with
`supervised.train_step.TrainStep`.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from retrax.errors import InputValueError
from retrax.validation import ArgumentValueError

AXIS = 'batch'


class DeviceMesh:
  """The first `n_devices` local devices (all of them if None)."""

  def __init__(self, n_devices=None):
    local = jax.local_devices()
    n = len(local) if n_devices is None else int(n_devices)
    if not 1 <= n <= len(local):
      raise ArgumentValueError(f'n_devices={n_devices}: this host has {len(local)} '
                               'local device(s); give a number from 1 to that.')
    self.n_devices = n
    if n > 1:
      mesh = Mesh(np.array(local[:n]), (AXIS,))
      self._replicated = NamedSharding(mesh, PartitionSpec())
      self._sharded = NamedSharding(mesh, PartitionSpec(AXIS))

  def replicate(self, tree):
    """`tree` on every device (unchanged on one device)."""
    if self.n_devices == 1:
      return tree
    return jax.device_put(tree, self._replicated)

  def put_batch(self, batch):
    """`batch` (a tuple of arrays or one array) split along axis 0."""
    if self.n_devices == 1:
      return tuple(batch) if isinstance(batch, list) else batch
    for x in jax.tree_util.tree_leaves(batch):
      if not np.shape(x) or np.shape(x)[0] % self.n_devices:
        raise InputValueError(
            f'A batch of shape {np.shape(x)} cannot be split over '
            f'{self.n_devices} devices: its first dimension must be a '
            'multiple of n_devices.')
    batch = tuple(batch) if isinstance(batch, list) else batch
    return jax.device_put(batch, self._sharded)


def to_host(tree):
  """`tree` with every JAX array fetched into host (numpy) memory.

  A replicated array that is not fully addressable (multi-host) is read from
  this host's first copy.
  """
  def fetch(x):
    if not isinstance(x, jax.Array):
      return x
    if not x.is_fully_addressable:
      x = x.addressable_data(0)
    return np.asarray(x)
  return jax.tree_util.tree_map(fetch, tree)


def start_host_copy(tree):
  """Starts copying `tree`'s device arrays to the host; returns `tree`."""
  for x in jax.tree_util.tree_leaves(tree):
    if isinstance(x, jax.Array):
      x.copy_to_host_async()
  return tree


def adasum(per_share_grads):
  """Merges gradients stacked on axis 0 (one per share) with Adasum.

  Adasum (https://arxiv.org/abs/2006.02924) combines two gradients `a, b` as
  `(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b`, array by array, in a
  butterfly over the shares (a power of two of them); the result is divided by
  the number of shares, as Trax does.

  Args:
    per_share_grads: a gradient tree whose arrays have a leading share axis.

  Returns:
    The merged gradient tree (the share axis removed).
  """
  leaves = jax.tree_util.tree_leaves(per_share_grads)
  n = leaves[0].shape[0] if leaves else 1
  if n & (n - 1):
    raise ArgumentValueError(f'adasum needs a power-of-two number of devices; got {n}.')
  shift = 1
  while shift < n:
    partner = np.array([i + shift if i % (2 * shift) < shift else i - shift
                        for i in range(n)])

    def merge(g, partner=partner):
      gp = g[partner]
      axes = tuple(range(1, g.ndim))
      dot = jnp.sum(g * gp, axis=axes, keepdims=True)
      frac1 = dot / (2 * jnp.sum(g * g, axis=axes, keepdims=True) + 1e-30)
      frac2 = dot / (2 * jnp.sum(gp * gp, axis=axes, keepdims=True) + 1e-30)
      return (1 - frac1) * g + (1 - frac2) * gp
    per_share_grads = jax.tree_util.tree_map(merge, per_share_grads)
    shift *= 2
  return jax.tree_util.tree_map(lambda g: jnp.mean(g, axis=0), per_share_grads)


def sharded_value_and_grad(grad_fn, batch, rng, n_shares=1):
  """`grad_fn(batch, rng)`, or over `n_shares` equal shares of `batch` with
  the gradients merged by `adasum`.

  Args:
    grad_fn: `(batch, rng) -> ((loss, state), grads)`, e.g. a
      `jax.value_and_grad(..., has_aux=True)`.
    batch: a tree of arrays whose first dimension `n_shares` divides.
    rng: a PRNG key (split into one key per share).
    n_shares: 1, or the number of shares (a power of two).

  Returns:
    `(loss, state, grads)`: with shares, the mean loss, the first share's
    state and the merged gradients.
  """
  if n_shares == 1:
    (loss, new_state), grads = grad_fn(batch, rng)
    return loss, new_state, grads
  n = n_shares
  shares = jax.tree_util.tree_map(
      lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)
  (losses, states), grads = jax.vmap(grad_fn)(shares,
                                              jax.random.split(rng, n))
  new_state = jax.tree_util.tree_map(lambda s: s[0], states)
  return jnp.mean(losses), new_state, adasum(grads)
