"""`StackedLayers`: the weights of repeated layers, stored stacked once.

A `ReversibleSerial` of `n` layers that repeat with period `p` (a block of
`p` layers, `n // p` times) runs its blocks as one `lax.scan` over their
stacked weights. Stacking per-layer arrays inside the jitted gradient
copies every weight (forward and backward), and the scan's stacked weight
gradients are copied again into per-layer outputs: memory that grows with
depth. Holding the weights stacked to begin with removes those copies:
`jax.grad` reads the stacked arrays directly and returns stacked gradients.

`StackedLayers` is what JAX sees as `p` stacked trees (entry `j`: the
leaves of layers `j, j + p, j + 2p, ...` stacked on a new axis 0), and what
Trax-order code sees as a tuple of the `n` per-layer trees: it is a `tuple`
subclass whose length, indexing and iteration give per-layer views (slices
taken on demand). So `retrax.fastmath.tree_flatten` (checkpoints, optimizer
slots) walks the same leaves in the same order as for the plain per-layer
tuple, and `weights[i]` is layer `i`'s weights as before.
"""

import copy
import operator

import jax
import numpy as np

from retrax.fastmath import numpy as jnp


def _is_array(x):
  return isinstance(x, (np.ndarray, jax.Array))


def _row(x, k):
  """Entry `k` of a stacked leaf: an array row, or a shape/dtype without the axis."""
  if _is_array(x):
    return x[k]
  shape, dtype = getattr(x, 'shape', None), getattr(x, 'dtype', None)
  if shape is not None and dtype is not None:
    return type(x)(tuple(shape)[1:], dtype)
  return x


# Row `k` of every leaf of a tree of concrete arrays, in one dispatch (reads
# of `weights`, checkpoints): taken leaf by leaf, a slice and a squeeze each,
# a 6-layer ReformerLM's rows took ~40 ms when its predict-mode stack still
# held them (~0.5 ms a leaf).
_take_rows = jax.jit(
    lambda tree, k: jax.tree_util.tree_map(lambda x: x[k], tree))


def rows(tree, k):
  """Entry `k` of every stacked leaf of `tree` (see `_row`)."""
  leaves = jax.tree_util.tree_leaves(tree)
  if leaves and all(isinstance(x, jax.Array) and
                    not isinstance(x, jax.core.Tracer) for x in leaves):
    return _take_rows(tree, k)
  return jax.tree_util.tree_map(lambda x: _row(x, k), tree)


class StackedLayers(tuple):
  """The weight trees of `n` layers, held as `period` stacked trees.

  Attributes:
    groups: `period` trees; entry `j` holds the leaves of layers `j`,
      `j + period`, ... stacked on a new leading axis (`n // period` rows).
    n: the number of layers.

  As a sequence it is the `n` per-layer trees (each a view: one row of
  every stacked leaf). Equality is identity; build one with `stack_layers`.
  Called with the per-layer items alone (`type(t)(items)`, as generic tree
  code rebuilds a tuple) it gives the plain tuple of them.
  """

  groups: tuple
  n: int

  def __new__(cls, groups, n=None):
    if n is None:  # `type(t)(items)`, as tree code rebuilds tuples: per-layer.
      return tuple(groups)
    self = super().__new__(cls)
    self.groups = tuple(groups)
    self.n = n
    return self

  @property
  def period(self):
    return len(self.groups)

  def __len__(self):
    return self.n

  def __bool__(self):
    return self.n > 0

  def __getitem__(self, index):
    if isinstance(index, slice):
      return tuple(self[i] for i in range(*index.indices(self.n)))
    i = operator.index(index)
    if i < 0:
      i += self.n
    if not 0 <= i < self.n:
      raise IndexError(f'layer {index} of {self.n} stacked layers')
    p = self.period
    return rows(self.groups[i % p], i // p)

  def __iter__(self):
    return (self[i] for i in range(self.n))

  def __eq__(self, other):
    return self is other

  def __ne__(self, other):
    return self is not other

  def __hash__(self):
    return id(self)

  def __repr__(self):
    return f'StackedLayers(n={self.n}, period={self.period})'

  def __reduce__(self):
    return (tuple, (tuple(self),))

  def __deepcopy__(self, memo):
    # Stays stacked (`__reduce__`, for pickles, gives the per-layer tuple).
    return StackedLayers(copy.deepcopy(self.groups, memo), self.n)

  def rebuild(self, items):
    """A tree like this one from `n` per-layer `items` (Trax-order rebuilding).

    Stacks them when every leaf is an array (or tracer) of matching shape;
    otherwise (e.g. `ShapeDtype` signatures) returns the plain tuple.
    """
    items = tuple(items)
    if len(items) == self.n and stackable(items, self.period):
      return stack_layers(items, self.period)
    return items


class StackedRow:
  """The weights of one layer inside a stacked block, held as rows of the stack.

  A stacked `ReversibleSerial` gives each weighted layer below it one of
  these instead of arrays of its own, so the stack is the only copy of the
  weights; `get()` slices the layer's rows out (made when read, not kept).

  Attributes:
    stacked: the `StackedLayers` the rows belong to.
    index: which of its `n` per-layer trees holds them.
    path: the sublayer indices from that tree down to this layer's weights.
  """

  __slots__ = ('stacked', 'index', 'path')

  def __init__(self, stacked, index, path):
    self.stacked, self.index, self.path = stacked, index, path

  def get(self):
    """This layer's weights: one row of each stacked leaf."""
    stacked = self.stacked
    if not isinstance(stacked, StackedLayers):
      # Unpickled: `StackedLayers` pickles as its per-layer tuple.
      tree = stacked[self.index]
      for k in self.path:
        tree = tree[k]
      return tree
    tree = stacked.groups[self.index % stacked.period]
    for k in self.path:
      tree = tree[k]
    row = self.index // stacked.period
    return rows(tree, row)


def _flatten(stacked):
  return stacked.groups, stacked.n


def _unflatten(n, groups):
  return StackedLayers(groups, n)


jax.tree_util.register_pytree_node(StackedLayers, _flatten, _unflatten)


def tree_spec(tree):
  """A tree's structure with its leaves' shapes and dtypes: equal specs stack."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  return treedef, tuple((np.shape(x), np.dtype(x.dtype)) for x in leaves)


def stackable(trees, period, floats=False):
  """True if the per-layer `trees` (one per layer) stack into `period` groups.

  Every leaf must be an array (with `floats`, a float array: weights, whose
  gradients stack too), and the layers `period` apart must have trees of the
  same structure, shapes and dtypes. A `StackedLayers` of this period is
  stacked already.
  """
  if isinstance(trees, StackedLayers):
    leaves = jax.tree_util.tree_leaves(trees.groups)
    return trees.period == period and all(
        not floats or jnp.issubdtype(x.dtype, jnp.floating) for x in leaves)
  leaves = jax.tree_util.tree_leaves(trees)
  if not all(_is_array(x) and
             (not floats or jnp.issubdtype(x.dtype, jnp.floating))
             for x in leaves):
    return False
  return all(tree_spec(trees[i]) == tree_spec(trees[i % period])
             for i in range(period, len(trees)))


def stack_groups(trees, period):
  """`period` trees, entry `j` the leaves of `trees[j::period]` stacked on a new axis 0.

  A `StackedLayers` of this period gives its groups as they are (no copy).
  """
  if isinstance(trees, StackedLayers) and trees.period == period:
    return trees.groups
  trees = tuple(trees)
  return tuple(jax.tree_util.tree_map(lambda *xs: jnp.stack(xs),
                                      *trees[j::period])
               for j in range(period))


def per_layer(tree):
  """`tree` with each `StackedLayers` in it as the plain tuple of its per-layer trees.

  Trax's tree of the same weights (`Layer.weights` of a model whose
  `stacked_weights` is `tree`); the rows are sliced out (copies).
  """
  return jax.tree_util.tree_map(
      lambda x: tuple(x) if isinstance(x, StackedLayers) else x, tree,
      is_leaf=lambda x: isinstance(x, StackedLayers))


def stack_layers(trees, period):
  """The per-layer `trees` as a `StackedLayers` of `period` groups."""
  return StackedLayers(stack_groups(trees, period), len(trees))


def unstack_groups(stacked, n_groups):
  """Inverse of `stack_groups`: the per-layer trees, in layer order."""
  return tuple(jax.tree_util.tree_map(lambda x, k=k: x[k], tree)
               for k in range(n_groups) for tree in stacked)
