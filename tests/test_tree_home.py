"""One home for Trax-order trees and cache markers (retrax.fastmath.tree)."""

import collections

import numpy as np
import pytest

from retrax import checkpoints
from retrax import layers as tl
from retrax.checkpoints import tree as ckpt_tree
from retrax.fastmath import tree
from retrax.layers import base
from retrax.optimizers import base as opt_base


def _reference_leaves(t):
  """Trax's order, re-stated: tuples/lists in order, dict values in order."""
  if isinstance(t, (list, tuple)):
    return sum([_reference_leaves(c) for c in t], [])
  if isinstance(t, dict):
    return sum([_reference_leaves(c) for c in t.values()], [])
  return [t]


Pair = collections.namedtuple('Pair', ['a', 'b'])


def _tree():
  return ((), [1, (2, 3)], {'z': 4, 'a': Pair(5, None)},
          tree.GET_WEIGHTS_FROM_CACHE, collections.OrderedDict(k=6))


def test_markers_and_flatten_have_one_definition():
  for name in ('EMPTY_WEIGHTS', 'EMPTY_STATE', 'GET_WEIGHTS_FROM_CACHE',
               'GET_STATE_FROM_CACHE'):
    assert getattr(base, name) is getattr(tree, name)
    assert getattr(tl, name) is getattr(tree, name)
    assert getattr(ckpt_tree, name) is getattr(tree, name)
  assert checkpoints.GET_WEIGHTS_FROM_CACHE is tree.GET_WEIGHTS_FROM_CACHE
  assert opt_base.tree_flatten is tree.tree_flatten
  assert ckpt_tree.tree_leaves is tree.tree_flatten
  assert opt_base.tree_unflatten is tree.unflatten_like


def test_flatten_order_matches_trax_order():
  t = _tree()
  assert tree.tree_flatten(t) == _reference_leaves(t) == [1, 2, 3, 4, 5, None, 6]
  assert [p for p, _ in tree.leaf_paths(t)] == [
      (1, 0), (1, 1, 0), (1, 1, 1), (2, 'z'), (2, 'a', 0), (2, 'a', 1),
      (4, 'k')]


def test_unflatten_like_inverts_flatten_keeping_types():
  t = _tree()
  new = tree.unflatten_like(list('abcdefg'), t)
  assert new == ((), ['a', ('b', 'c')], {'z': 'd', 'a': Pair('e', 'f')},
                 tree.GET_WEIGHTS_FROM_CACHE, {'k': 'g'})
  assert isinstance(new[1], list) and isinstance(new[2]['a'], Pair)
  assert isinstance(new[4], collections.OrderedDict)
  assert new[3] is t[3]  # markers are copied through
  with pytest.raises(ValueError, match='7 leaves'):
    tree.unflatten_like(list('abc'), t)


def test_unflatten_like_leaf_fn_sees_index_and_path():
  seen = []
  tree.unflatten_like([10, 20], ({'w': 0}, [1]),
                      lambda x, t, i, p: seen.append((x, t, i, p)))
  assert seen == [(10, 0, 0, (0, 'w')), (20, 1, 1, (1, 0))]


def test_cache_marker_predicates():
  assert tree.is_weights_cache_marker({'__marker_for_cached_weights_': ()})
  assert not tree.is_weights_cache_marker(tree.GET_STATE_FROM_CACHE)
  assert tree.is_state_cache_marker(tree.GET_STATE_FROM_CACHE)
  assert tree.is_cache_marker(tree.GET_STATE_FROM_CACHE)
  assert not tree.is_cache_marker({'__marker_for_cached_weights_': []})
  assert not tree.is_cache_marker(())


def test_checkpoint_unflatten_errors_name_the_path():
  template = ((), {'w': np.zeros((2, 3))})
  with pytest.raises(checkpoints.TreeStructureError, match=r"weights\[1\]\['w'\]"):
    checkpoints.unflatten_like([], template, what='weights')
  with pytest.raises(checkpoints.TreeStructureError, match=r'expects shape \(2, 3\)'):
    checkpoints.unflatten_like([np.zeros((3, 2))], template, what='weights')
  with pytest.raises(checkpoints.TreeStructureError, match='only 1'):
    checkpoints.unflatten_like([np.zeros((2, 3))] * 2, template)
