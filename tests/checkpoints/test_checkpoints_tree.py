"""Tests for retrax.checkpoints.tree: Trax's flat leaf order and unflattening."""

import collections

import ml_dtypes
import numpy as np
import pytest

from checkpoint_testlib import Shape
from checkpoint_testlib import readme_reformerlm_copy_tree
from retrax.checkpoints import tree as ctree
from retrax.checkpoints.errors import TreeStructureError
from retrax.checkpoints.trax_format import read_trax_checkpoint


def _trax_tree_flatten(tree):
  """Trax's `fastmath.tree_flatten` (lists, tuples, dict values), re-stated."""
  if isinstance(tree, (list, tuple)):
    return sum([_trax_tree_flatten(t) for t in tree], [])
  if isinstance(tree, dict):
    return sum([_trax_tree_flatten(v) for v in tree.values()], [])
  return [tree]


def test_flatten_skips_empty_and_markers_keeps_none_and_dict_order():
  a, b, c, d, e = (np.full((i + 1,), i) for i in range(5))
  weights = ((), (a, ((), b)), ctree.GET_WEIGHTS_FROM_CACHE, {'z': c, 'a': d},
             [None, e])
  state = (ctree.GET_STATE_FROM_CACHE, (), (a,))
  flat_w, flat_s = ctree.flatten_weights_and_state(weights, state)
  assert [x is None for x in flat_w] == [False] * 4 + [True, False]
  # Insertion order of dict values ('z' before 'a'), not sorted keys.
  assert [x.shape for x in flat_w if x is not None] == [(1,), (2,), (3,), (4,),
                                                        (5,)]
  assert len(flat_s) == 1 and flat_s[0] is a
  # Same as Trax's recursive flatten followed by its empty/marker filter.
  reference = [w for w in _trax_tree_flatten(weights)
               if not ((isinstance(w, tuple) and not w) or
                       (isinstance(w, dict) and
                        w == ctree.GET_WEIGHTS_FROM_CACHE))]
  assert len(reference) == len(flat_w)
  assert all(x is y for x, y in zip(reference, flat_w))


def test_readme_tree_flattens_to_golden_weight_shapes(golden):
  """The README's reformerlm_copy tree, flattened, lists the file's shapes."""
  template = readme_reformerlm_copy_tree()
  shapes = [leaf.shape for leaf in ctree.tree_leaves(template)]
  ckpt = read_trax_checkpoint(golden / 'reformerlm_copy' / 'model.pkl.gz')
  assert shapes == [w.shape for w in ckpt['flat_weights']]
  assert len(shapes) == 30


def test_unflatten_places_golden_weights_by_readme_tree(golden):
  ckpt = read_trax_checkpoint(golden / 'reformerlm_copy' / 'model.pkl.gz')
  flat = ckpt['flat_weights']
  tree = ctree.unflatten_like(flat, readme_reformerlm_copy_tree(),
                              what='weights')
  assert tree[0] == ((), (), ())
  assert tree[1] is flat[0] and tree[1].shape == (32, 32)  # Embedding.
  assert tree[3][1] is flat[1] and tree[3][1].shape == (64, 32)  # Positions.
  assert tree[5][0][1][0] is flat[4]  # First layer's w_q.
  assert tree[5][4][1][3].shape == (2, 16, 32)  # Second layer's w_o.
  assert tree[9][1][0] is flat[-2] and tree[9][1][0].shape == (64, 32)
  # Flattening again gives back the same objects in the same order.
  assert all(x is y for x, y in zip(ctree.tree_leaves(tree), flat))


def test_unflatten_copies_empties_and_markers_and_keeps_types():
  point = collections.namedtuple('Point', 'x y')
  template = (ctree.GET_WEIGHTS_FROM_CACHE, (), point(Shape(2), [Shape(3)]),
              collections.OrderedDict(k=Shape(1)), {'a': None})
  a, b, c, d = np.zeros(2), np.zeros(3), np.zeros(1), np.ones(4)
  out = ctree.unflatten_like([a, b, c, d], template)
  assert out[0] == ctree.GET_WEIGHTS_FROM_CACHE and out[1] == ()
  assert type(out[2]) is point and out[2].x is a and out[2].y == [b]
  assert isinstance(out[3], collections.OrderedDict) and out[3]['k'] is c
  assert out[4] == {'a': d}  # A None template leaf takes a value, as in Trax.


def test_wrong_shape_names_path_and_shapes(golden):
  ckpt = read_trax_checkpoint(golden / 'reformerlm_copy' / 'model.pkl.gz')
  flat = list(ckpt['flat_weights'])
  flat[5] = np.zeros((2, 32, 8), np.float32)  # w_k of the first layer.
  with pytest.raises(TreeStructureError) as e:
    ctree.unflatten_like(flat, readme_reformerlm_copy_tree(), what='weights')
  msg = str(e.value)
  assert 'weights[5][0][1][1]' in msg
  assert '(2, 32, 16)' in msg and '(2, 32, 8)' in msg and '#5' in msg


def test_too_short_and_too_long_lists():
  template = ((Shape(2),), [(), Shape(3), {'w': Shape(4)}])
  leaves = [np.zeros(2), np.zeros(3), np.zeros(4)]
  with pytest.raises(TreeStructureError) as e:
    ctree.unflatten_like(leaves[:2], template, what='state')
  assert "state[1][2]['w']" in str(e.value) and '(4,)' in str(e.value)
  assert 'has 2 leaves but the tree needs 3' in str(e.value)
  with pytest.raises(TreeStructureError) as e:
    ctree.unflatten_like(leaves + [np.zeros(7)], template, what='state')
  assert 'needs only 3' in str(e.value) and '(7,)' in str(e.value)


def test_uint16_bits_become_bfloat16_where_template_says_so():
  values = np.array([1.5, -2.25, 3.0], dtype=ml_dtypes.bfloat16)
  template = (np.zeros(3, ml_dtypes.bfloat16), np.zeros(3, np.uint16))
  bits = values.view(np.uint16)
  out = ctree.unflatten_like([bits, bits], template)
  assert out[0].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(out[0].astype(np.float32), [1.5, -2.25, 3.0])
  assert out[1].dtype == np.uint16  # Genuine uint16 stays.


def test_unflatten_weights_and_state():
  sig = ((Shape(2), ()), (ctree.GET_STATE_FROM_CACHE, Shape()))
  w, s = np.zeros(2), np.float32(0.1)
  weights, state = ctree.unflatten_weights_and_state([w], [s], sig)
  assert weights[0] is w and weights[1] == ()
  assert state[0] == ctree.GET_STATE_FROM_CACHE and state[1] is s
  weights, state = ctree.unflatten_weights_and_state([w], None, sig,
                                                     weights_only=True)
  assert weights[0] is w and state is None
  with pytest.raises(TreeStructureError, match='weights_only=True'):
    ctree.unflatten_weights_and_state([w], None, sig)
