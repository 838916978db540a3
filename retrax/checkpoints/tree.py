"""Flattening weight/state trees the way Trax orders checkpoint leaves.

A Trax weights (or state) tree is nested tuples/lists/dicts whose leaves are
arrays. Trax stores it flat: the depth-first, left-to-right leaves, dict values
in insertion order. Empty entries `()` contribute nothing, and the cache
markers (`GET_WEIGHTS_FROM_CACHE`, `GET_STATE_FROM_CACHE`) that stand for a
shared layer's second use are skipped. `None` leaves are kept, as in Trax.

    >>> flatten_weights_and_state(((), (w1, w2), GET_WEIGHTS_FROM_CACHE), ())
    ([w1, w2], [])

To unflatten, walk a tree of the same structure (usually a signature whose
leaves are `ShapeDtype`s) and consume the flat leaves in order.
"""

import ml_dtypes
import numpy as np

from retrax.checkpoints.errors import TreeStructureError
from retrax.fastmath import tree as fastmath_tree
from retrax.fastmath.tree import EMPTY_STATE as EMPTY_STATE
from retrax.fastmath.tree import EMPTY_WEIGHTS as EMPTY_WEIGHTS
from retrax.fastmath.tree import flatten_weights_and_state as flatten_weights_and_state
from retrax.fastmath.tree import GET_STATE_FROM_CACHE as GET_STATE_FROM_CACHE
from retrax.fastmath.tree import GET_WEIGHTS_FROM_CACHE as GET_WEIGHTS_FROM_CACHE
from retrax.fastmath.tree import is_cache_marker as is_cache_marker

# Trax-order leaves (the name checkpoint code uses).
tree_leaves = fastmath_tree.tree_flatten


def format_path(path):
  """Formats a tuple of indices/keys as `[5][0]['w']`; the root as `<root>`."""
  if not path:
    return '<root>'
  return ''.join(f'[{p!r}]' for p in path)


def _shape_of(x):
  shape = getattr(x, 'shape', None)
  if shape is None:
    return None
  try:
    return tuple(shape)
  except TypeError:
    return None


def _dtype_of(x):
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return None
  try:
    return np.dtype(dtype)
  except TypeError:
    return None


def unflatten_like(flat_list, tree, *, what='tree', check_shapes=True):
  """Builds a tree shaped like `tree`, taking its leaves from `flat_list` in order.

  `()` entries and cache markers in `tree` are copied as they are and consume
  nothing. When both the template leaf and the flat leaf have a `shape`, the
  shapes must agree. A `uint16` leaf placed where the template says `bfloat16`
  is bit-cast back (Trax stores bfloat16 that way).

  Args:
    flat_list: sequence of leaves (arrays, usually), in Trax's flat order.
    tree: template: nested tuples/lists/dicts whose leaves are `ShapeDtype`s,
      arrays or anything else (leaves are replaced, not inspected beyond
      `shape`/`dtype`).
    what: name used in error messages, e.g. `'weights'`.
    check_shapes: compare leaf shapes where both sides have one.

  Returns:
    The new tree. Tuples, lists, dicts and namedtuples keep their types.

  Raises:
    TreeStructureError: too few or too many leaves, or a shape mismatch; the
      message names the tree path (e.g. `weights[5][0][1]`) and both shapes.
  """
  flat_list = list(flat_list)
  leaves = fastmath_tree.leaf_paths(tree)
  n_needed = len(leaves)
  if len(flat_list) < n_needed:
    missing_path, missing_leaf = leaves[len(flat_list)]
    raise TreeStructureError(
        f'{what}: the checkpoint has {len(flat_list)} leaves but the tree needs '
        f'{n_needed}; the first missing one is {what}{format_path(missing_path)}'
        f' (expected shape {_shape_of(missing_leaf)}).')
  if len(flat_list) > n_needed:
    extra = flat_list[n_needed]
    raise TreeStructureError(
        f'{what}: the checkpoint has {len(flat_list)} leaves but the tree needs '
        f'only {n_needed}; the first unused one is leaf #{n_needed} with shape '
        f'{_shape_of(extra)}. Is this checkpoint from a different model?')

  def check(leaf, template, index, path):
    return _check_leaf(leaf, template, index, what + format_path(path),
                       check_shapes)

  return fastmath_tree.unflatten_like(flat_list, tree, check)


def _check_leaf(leaf, template, index, where, check_shapes):
  want_shape, got_shape = _shape_of(template), _shape_of(leaf)
  if check_shapes and want_shape is not None and got_shape is not None:
    if _is_legacy_batch_axis(got_shape, want_shape):
      leaf = np.reshape(np.asarray(leaf), want_shape)
    elif want_shape != got_shape:
      raise TreeStructureError(
          f'{where} expects shape {want_shape} but checkpoint leaf #{index} has '
          f'shape {got_shape}.')
  want_dtype, got_dtype = _dtype_of(template), _dtype_of(leaf)
  if (want_dtype is not None and got_dtype == np.uint16 and
      want_dtype.name == 'bfloat16'):
    leaf = np.asarray(leaf).view(np.dtype(ml_dtypes.bfloat16))
  return leaf


def _is_legacy_batch_axis(got_shape, want_shape):
  """True if `got_shape` is `want_shape` with a leading axis of size 1.

  Trax 1.0-1.2 stored `PositionalEncoding` tables as `(1, max_len, d)`
  (its shipped `transformer_copy` checkpoints); Trax 1.4 reads them
  unchanged. Such leaves load, reshaped to the layer's own layout.
  """
  return len(got_shape) == len(want_shape) + 1 and got_shape == (
      (1,) + tuple(want_shape))


def unflatten_weights_and_state(flat_weights, flat_state,
                                weights_and_state_signature,
                                weights_only=False):
  """Rebuilds `(weights, state)` from flat lists and a `(weights, state)` signature.

  Like Trax's function of the same name, but stricter: a leaf count or a leaf
  shape that does not fit the signature raises `TreeStructureError` (Trax
  silently ignores surplus leaves). A leaf with an extra leading axis of size
  1 (Trax 1.0-1.2's `PositionalEncoding` tables) is reshaped to the
  signature's shape. With `weights_only=True` the state is not rebuilt and
  `None` is returned for it.
  """
  weights_tree, state_tree = weights_and_state_signature
  weights = unflatten_like(flat_weights, weights_tree, what='weights')
  state = None
  if not weights_only:
    if flat_state is None:
      raise TreeStructureError(
          'state: the checkpoint holds no state; load with weights_only=True.')
    state = unflatten_like(flat_state, state_tree, what='state')
  return weights, state
