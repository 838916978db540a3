"""Utilities on nested tuples/lists/dicts of arrays (Trax's weight trees).

These follow `trax.fastmath.numpy`: lists, tuples (namedtuples included) and
dicts are containers, everything else is a leaf, and `None` leaves are skipped
unless `ignore_nones=False`.
"""

import numpy as onp


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
  """A container of `like`'s type (list, tuple, namedtuple) holding `items`."""
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
  raise ValueError(f'nested_map: {obj!r} has no subtree at level {level}.')


def nested_map_multiarg(f, *objs, ignore_nones=True):
  """Maps `f` over the leaves of several trees of the same structure."""
  first = objs[0]
  if isinstance(first, dict):
    return {k: nested_map_multiarg(f, *(o[k] for o in objs),
                                   ignore_nones=ignore_nones) for k in first}
  if isinstance(first, (list, tuple)):
    for o in objs[1:]:
      if not isinstance(o, (list, tuple)) or len(o) != len(first):
        raise ValueError('nested_map_multiarg: trees differ in structure: '
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
    raise ValueError(f'nested_zip needs a non-empty list of trees; got {objs!r}.')
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
  raise ValueError(f'nested_zip: cannot zip {objs!r}.')


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
      if type(tree) is type(c) and tree == c:  # pylint: disable=unidiomatic-typecheck
        return tree, flat
  if isinstance(tree, (list, tuple)):
    new = []
    for t in tree:
      t_new, flat = tree_unflatten(flat, t, copy_from_tree)
      new.append(t_new)
    return (new if isinstance(tree, list) else tuple(new)), flat
  if isinstance(tree, dict):
    new = {}
    for k, t in tree.items():
      new[k], flat = tree_unflatten(flat, t, copy_from_tree)
    return new, flat
  if not flat:
    raise ValueError('tree_unflatten: ran out of leaves to fill the tree.')
  return flat[0], flat[1:]
