"""Utilities on nested tuples/lists/dicts of arrays (Trax's weight trees)."""

import jax


def _is_container(x):
  return isinstance(x, (list, tuple, dict))


def nested_map(f, obj, level=0, ignore_nones=True):
  """Maps `f` over the leaves of a nested tuple/list/dict, keeping its structure."""
  if isinstance(obj, list):
    return [nested_map(f, y, level, ignore_nones) for y in obj]
  if isinstance(obj, tuple):
    return tuple(nested_map(f, y, level, ignore_nones) for y in obj)
  if isinstance(obj, dict):
    return {k: nested_map(f, v, level, ignore_nones) for k, v in obj.items()}
  if obj is None and ignore_nones:
    return None
  return f(obj)


def nested_map_multiarg(f, *objs, ignore_nones=True):
  """Maps `f` over the leaves of several trees of equal structure."""
  first = objs[0]
  if isinstance(first, (list, tuple)):
    out = [nested_map_multiarg(f, *ys, ignore_nones=ignore_nones)
           for ys in zip(*objs)]
    return out if isinstance(first, list) else tuple(out)
  if isinstance(first, dict):
    return {k: nested_map_multiarg(f, *(o[k] for o in objs),
                                   ignore_nones=ignore_nones) for k in first}
  if first is None and ignore_nones:
    return None
  return f(*objs)


def nested_zip(objs):
  """Zips a list of trees into a tree of tuples."""
  return nested_map_multiarg(lambda *xs: tuple(xs), *objs)


def nested_stack(objs, axis=0, np_module=None):
  """Stacks the leaves of a list of equally-shaped trees along `axis`."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  np_module = np_module or jnp
  return nested_map_multiarg(lambda *xs: np_module.stack(xs, axis=axis), *objs)


def tree_flatten(tree):
  """Depth-first, left-to-right leaves of a nested tuple/list/dict (dict values in order)."""
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
  return [x for x in tree_flatten(tree) if not (ignore_nones and x is None)]


def tree_unflatten(flat, tree, copy_from_tree=None):
  """Fills `tree`'s structure with leaves from `flat`; returns (tree, rest).

  Subtrees equal to one of `copy_from_tree` are copied as they are.
  """
  copy_from_tree = copy_from_tree or []
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
  return flat[0], flat[1:]


tree_map = jax.tree_util.tree_map
