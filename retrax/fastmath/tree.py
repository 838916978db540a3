"""Utilities on nested tuples/lists/dicts of arrays (Trax's weight trees).

These follow `trax.fastmath.numpy`: lists, tuples (namedtuples included) and
dicts are containers, everything else is a leaf, and `None` leaves are skipped
unless `ignore_nones=False`.

This module is retrax's one home for Trax-order trees: `tree_flatten` (the
depth-first, left-to-right leaves, dict values in insertion order; the order
Trax's checkpoints and optimizer slots use), `unflatten_like` (its exact
inverse) and the cache markers that stand for a shared layer's second use.
`retrax.checkpoints`, `retrax.optimizers` and `retrax.layers` import them
from here.
"""

import collections

import numpy as onp

from retrax.validation import ArgumentValueError

EMPTY_WEIGHTS = ()
EMPTY_STATE = ()
# A shared layer's second (and later) occurrence in a weights/state tree.
GET_WEIGHTS_FROM_CACHE = {'__marker_for_cached_weights_': ()}
GET_STATE_FROM_CACHE = {'__marker_for_cached_state_': ()}


def is_weights_cache_marker(x):
  """True for `GET_WEIGHTS_FROM_CACHE` (or an equal dict)."""
  return isinstance(x, dict) and x == GET_WEIGHTS_FROM_CACHE


def is_state_cache_marker(x):
  """True for `GET_STATE_FROM_CACHE` (or an equal dict)."""
  return isinstance(x, dict) and x == GET_STATE_FROM_CACHE


def is_cache_marker(x):
  """True for either cache marker."""
  return is_weights_cache_marker(x) or is_state_cache_marker(x)


def _is_container(x):
  return isinstance(x, (list, tuple, dict))


def _is_namedtuple(x):
  return isinstance(x, tuple) and hasattr(x, '_fields')


def _children(x):
  return list(x.values()) if isinstance(x, dict) else list(x)


def _is_at_level(obj, level):
  """True if `obj` is `level` containers above its leaves (0: a leaf)."""
  is_leaf = not _is_container(obj)
  if level == 0 or is_leaf:
    return (level == 0) == is_leaf
  elems = _children(obj)
  return bool(elems) and all(_is_at_level(x, level - 1) for x in elems)


def _is_made_of_nones(obj):
  leaves = tree_flatten(obj)
  return bool(leaves) and all(x is None for x in leaves)


def _rebuild(like, items):
  """A container of `like`'s type (list, tuple, namedtuple) holding `items`.

  A tuple subclass with a `rebuild(items)` method (`StackedLayers`: stacked
  weights seen as per-layer trees) builds its own.
  """
  if isinstance(like, tuple):
    # Looked up on the type: a namedtuple field named `rebuild` is a property
    # there, not callable, so it never counts as the method.
    rebuild = getattr(type(like), 'rebuild', None)
    if callable(rebuild):
      return rebuild(like, items)
  if _is_namedtuple(like):
    return type(like)(*items)
  if isinstance(like, tuple):
    return tuple(items)
  return list(items)


def nested_map(f, obj, level=0, ignore_nones=True):
  """Maps `f` over `obj`'s subtrees `level` levels above the leaves (0: leaves).

  Args:
    f: function applied to each leaf (or level-`level` subtree).
    obj: a leaf or a nested list/tuple/namedtuple/dict.
    level: how far above the leaves `f` applies.
    ignore_nones: if True, subtrees made only of `None`s map to `None`.

  Returns:
    A tree of `obj`'s structure with `f`'s results in place.
  """
  if _is_at_level(obj, level):
    if ignore_nones and _is_made_of_nones(obj):
      return None
    return f(obj)
  if isinstance(obj, dict):
    return {k: nested_map(f, v, level, ignore_nones) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return _rebuild(obj, [nested_map(f, y, level, ignore_nones) for y in obj])
  raise ArgumentValueError(f'nested_map: {obj!r} has no subtree at level {level}.')


def nested_map_multiarg(f, *objs, ignore_nones=True):
  """Maps `f` over the leaves of several trees of the same structure."""
  first = objs[0]
  if isinstance(first, dict):
    return {k: nested_map_multiarg(f, *(o[k] for o in objs),
                                   ignore_nones=ignore_nones) for k in first}
  if isinstance(first, (list, tuple)):
    for o in objs[1:]:
      if not isinstance(o, (list, tuple)) or len(o) != len(first):
        raise ArgumentValueError('nested_map_multiarg: trees differ in structure: '
                                 f'{first!r} vs {o!r}.')
    return _rebuild(first, [
        nested_map_multiarg(f, *(o[i] for o in objs), ignore_nones=ignore_nones)
        for i in range(len(first))])
  if ignore_nones and all(o is None for o in objs):
    return None
  return f(*objs)


def nested_zip(objs):
  """Zips a list of equally-structured trees into one tree of leaf tuples.

  As in Trax, tuple nodes of the trees come back as lists.
  """
  if not isinstance(objs, (list, tuple)) or not objs:
    raise ArgumentValueError(f'nested_zip needs a non-empty list of trees; got {objs!r}.')
  if _is_at_level(objs, 1):
    return tuple(objs)
  first = objs[0]
  if _is_namedtuple(first):
    return type(first)(*nested_zip([list(o) for o in objs]))
  if isinstance(first, list):
    return [nested_zip([o[i] for o in objs]) for i in range(len(first))]
  if isinstance(first, tuple):
    return nested_zip([list(o) for o in objs])
  if isinstance(first, dict):
    return {k: nested_zip([o[k] for o in objs]) for k in first}
  raise ArgumentValueError(f'nested_zip: cannot zip {objs!r}.')


def nested_stack(objs, axis=0, np_module=onp):
  """Stacks the leaves of a list of equally-structured trees along `axis`."""
  return nested_map(lambda xs: np_module.stack(xs, axis=axis),
                    nested_zip(objs), level=1)


def tree_flatten(tree):
  """Depth-first, left-to-right leaves of a nested list/tuple/dict (dict values in order)."""
  out = []

  def walk(x):
    if isinstance(x, (list, tuple)):
      for y in x:
        walk(y)
    elif isinstance(x, dict):
      for v in x.values():
        walk(v)
    else:
      out.append(x)
  walk(tree)
  return out


def flatten_weights_and_state(weights, state):
  """Returns `(flat_weights, flat_state)`: lists of leaves in Trax's order."""
  return tree_flatten(weights), tree_flatten(state)


def tree_leaves(tree, ignore_nones=True):
  """`tree_flatten`, without `None`s unless `ignore_nones=False`."""
  return [x for x in tree_flatten(tree) if not (ignore_nones and x is None)]


def tree_unflatten(flat, tree, copy_from_tree=None):
  """Fills `tree`'s structure with leaves taken in order from `flat`.

  Subtrees equal to an element of `copy_from_tree` (e.g. `()` for layers
  without weights) are copied from `tree` and consume nothing.

  Returns:
    `(new_tree, rest_of_flat)`.
  """
  if copy_from_tree is not None:
    for c in copy_from_tree:
      if type(tree) is type(c) and tree == c:
        return tree, flat
  if isinstance(tree, (list, tuple)):
    new = []
    for t in tree:
      t_new, flat = tree_unflatten(flat, t, copy_from_tree)
      new.append(t_new)
    return (new if isinstance(tree, list) else tuple(new)), flat
  if isinstance(tree, dict):
    new_dict = {}
    for k, t in tree.items():
      new_dict[k], flat = tree_unflatten(flat, t, copy_from_tree)
    return new_dict, flat
  if not flat:
    raise ArgumentValueError('tree_unflatten: ran out of leaves to fill the tree.')
  return flat[0], flat[1:]


def _is_copied_through(x):
  """Subtrees `unflatten_like` copies from the template: `()` and markers."""
  return (isinstance(x, tuple) and not x) or is_cache_marker(x)


def leaf_paths(tree):
  """The `(path, leaf)` pairs of `tree` in `tree_flatten` order.

  A path is a tuple of indices/keys from the root. `()` subtrees and cache
  markers have no leaves.
  """
  out = []

  def walk(t, path):
    if _is_copied_through(t):
      return
    if isinstance(t, (list, tuple)):
      for i, c in enumerate(t):
        walk(c, path + (i,))
    elif isinstance(t, dict):
      for k, c in t.items():
        walk(c, path + (k,))
    else:
      out.append((path, t))

  walk(tree, ())
  return out


def unflatten_like(flat, tree, leaf_fn=None):
  """Builds a tree shaped like `tree` whose leaves are `flat`, in order.

  The inverse of `tree_flatten`: tuples, lists, namedtuples, dicts and
  OrderedDicts keep their types and keys; `()` and cache markers are copied
  from `tree` and consume nothing.

  Args:
    flat: exactly one item per leaf of `tree` (see `leaf_paths`).
    tree: the template.
    leaf_fn: optional `leaf_fn(item, template_leaf, index, path) -> leaf`
      applied to each placed item (e.g. to check its shape).

  Raises:
    ValueError: `flat` has more or fewer items than `tree` has leaves.
  """
  flat = list(flat)
  n_leaves = len(leaf_paths(tree))
  if len(flat) != n_leaves:
    raise ArgumentValueError(f'Cannot unflatten {len(flat)} leaves into a tree with '
                             f'{n_leaves} leaves.')
  position = [0]

  def build(t, path):
    if _is_copied_through(t):
      return t
    if isinstance(t, (list, tuple)):
      items = [build(c, path + (i,)) for i, c in enumerate(t)]
      return items if isinstance(t, list) else _rebuild(t, items)
    if isinstance(t, dict):
      new = collections.OrderedDict() if isinstance(
          t, collections.OrderedDict) else {}
      for k, c in t.items():
        new[k] = build(c, path + (k,))
      return new
    index = position[0]
    position[0] += 1
    item = flat[index]
    return item if leaf_fn is None else leaf_fn(item, t, index, path)

  return build(tree, ())
