"""Per-example layout of a predict-mode state: rows per example of every leaf.

Axis 0 of a per-example leaf holds `m` rows per example, example-major (e.g.
`example * n_heads + head`); `m = 0` marks a leaf shared by all examples.
Layers declare their layout (`retrax.layers.predict_state`). For subtrees of
layers that do not (user layers), the layout is found by tracing `init` and
one predict step at batch sizes 1 and 2 (nothing is computed) and comparing
the leaves' shapes: a leaf whose axis 0 doubles holds that many rows per
example, one whose shape does not change is shared. The traced layout is
taken before and after the first step, which may change the state's
structure (`tl.Cache`).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from retrax.layers import predict_state
from retrax.shapes import ShapeDtype
from retrax.validation import ArgumentValueError


def structs(tree):
  """`tree` with `ShapeDtype` leaves as `jax.ShapeDtypeStruct`s."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree,
      is_leaf=lambda x: isinstance(x, ShapeDtype))


def _is_none(x):
  return x is None


def declared(model, state):
  """Rows per example of `state`'s leaves as the layers declare them (None: undeclared)."""
  return predict_state.declared_rows(model, state)


def is_complete(layout):
  """True if no subtree of `layout` is undeclared."""
  return not any(x is None for x in jax.tree_util.tree_leaves(
      layout, is_leaf=_is_none))


def completed(layout, traced):
  """`layout` with its undeclared (None) subtrees taken from `traced`."""
  return jax.tree_util.tree_map(lambda d, t: t if d is None else d, layout,
                                traced, is_leaf=_is_none)


def abstract_step(model, batch, enc, apply):
  """`(state before, state after one step, logits size)`, traced at `batch`.

  `apply(model, weights, state, tokens, enc, rng)` runs one step.
  """
  tokens = ShapeDtype((batch, 1), np.int32)
  enc_sig = None if enc is None else ShapeDtype((batch,) + enc.shape[1:],
                                                enc.dtype)
  _, state0 = model.weights_and_state_signature(
      tokens if enc is None else (enc_sig, tokens))
  state0 = structs(state0)
  logits, state1 = jax.eval_shape(
      lambda w, s, t, e, r: apply(model, w, s, t, e, r),
      model.stacked_weights, state0, structs(tokens), structs(enc_sig), model.rng)
  return state0, state1, logits.shape[-1]


def _rows_per_example(x1, x2):
  """Rows per example of a state leaf, from its shapes at batch 1 and 2 (0: shared)."""
  s1, s2 = tuple(x1.shape), tuple(x2.shape)
  if s1 == s2:
    return 0
  if len(s1) == len(s2) and s1[1:] == s2[1:] and s2[0] == 2 * s1[0]:
    return s1[0]
  raise ArgumentValueError(f'Cannot tell how a state array of shape {s1} at batch 1 '
                           f'({s2} at batch 2) is laid out per example: decoding '
                           'needs the examples along axis 0.')


def traced(at_batch_1, at_batch_2):
  """The traced layouts `(before, after the first step)` from `abstract_step`s."""
  (a0, a1, _), (b0, b1, _) = at_batch_1, at_batch_2
  return (jax.tree_util.tree_map(_rows_per_example, a0, b0),
          jax.tree_util.tree_map(_rows_per_example, a1, b1))


def matching(state, layouts):
  """The layout among `layouts` with `state`'s tree structure."""
  # Any: jaxlib's PyTreeDef has no type stubs (its == compares structures).
  treedef: Any = jax.tree_util.tree_structure(state)
  for layout in layouts:
    if treedef == jax.tree_util.tree_structure(layout):
      return layout
  raise ArgumentValueError('model.state does not have the structure of this model\'s '
                           'predict-mode state; reset it with the state of a fresh '
                           '`model.init(...)`.')


def batch_sizes(state, layout):
  """The batch sizes the per-example leaves of `state` hold (a set)."""
  sizes = set()
  for x, m in zip(jax.tree_util.tree_leaves(state),
                  jax.tree_util.tree_leaves(layout)):
    if not m:
      continue
    rows = int(np.shape(x)[0]) if np.ndim(x) else 0
    if rows % m:
      raise ArgumentValueError(f'A predict-mode state array of shape {np.shape(x)} '
                               f'is declared to hold {m} rows per example, but its '
                               f'{rows} rows are not a multiple of {m}.')
    sizes.add(rows // m)
  return sizes


def take_examples(state, layout, rows):
  """`state` with its examples replaced by examples `rows` (an int vector)."""
  def take(x, m):
    if not m:
      return x
    x = jnp.asarray(x)
    grouped = jnp.reshape(x, (x.shape[0] // m, m) + x.shape[1:])
    picked = jnp.take(grouped, rows, axis=0)
    return jnp.reshape(picked, (rows.shape[0] * m,) + x.shape[1:])
  return jax.tree_util.tree_map(take, state, layout)
