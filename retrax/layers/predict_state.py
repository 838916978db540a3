"""The predict-state contract: how a layer's predict-mode state is laid out per example.

Decoding (`retrax.supervised.decoding`) runs a model built with
`mode='predict'` one token at a time and needs to know, for every leaf of
`model.state`, which rows belong to which example (to tile a batch-1 state,
follow beams, reorder examples) and how many positions the caches have
left. A layer that holds such state declares it with a method

    def predict_state_layout(self, state) -> PredictStateLayout | None

returning, for a state of this layer's structure (concrete arrays or
abstract ones: only shapes are read), a `PredictStateLayout`:

* `rows`: a tree like `state`; each leaf is the number of rows per example
  on axis 0 of the state leaf (`1`: axis 0 is the batch; `n_heads`: axis 0 is
  `batch * n_heads`, example-major), or `0` for a leaf shared by all
  examples (counters, random keys);
* `positions_used`: the state leaf (an int scalar) counting the positions fed
  so far, or None;
* `max_positions`: how many positions the state can hold (a hard limit, as
  a key/value cache's length), or None when there is none (memories that
  forget their oldest positions).

Returning None means "not declared" (e.g. a layer that cannot know its heads).

Layers need not declare anything when their state has no arrays or only
scalars (shared by all examples, e.g. `Dropout`'s rate). A
combinator whose state is the tuple of its sublayers' states (the
`base.Layer.state` property, not overridden) is declared when all its
sublayers are. Anything else is undeclared: decoding then falls back to
tracing the model at batch sizes 1 and 2 and comparing the state's shapes
(see `retrax.supervised.decoding.state_layout`), and, for a layer with an int
`max_len` in predict mode, to reading the last integer scalar of its state as
the positions used.
"""

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from retrax.layers import base


class PredictStateLayout(NamedTuple):
  """A layer's declared predict-state layout (see the module docstring)."""
  rows: Any
  positions_used: Any = None
  max_positions: Optional[int] = None


def same_rows(state, rows):
  """A tree like `state` with `rows` at every leaf."""
  return jax.tree_util.tree_map(lambda _: rows, state)


def has_arrays(state):
  """True if `state` has any leaves (cache markers and `()` have none)."""
  return bool(jax.tree_util.tree_leaves(state))


def declared_layout(layer, state):
  """`layer`'s own declaration for `state`, or None (not declared)."""
  declare = getattr(layer, 'predict_state_layout', None)
  return None if declare is None else declare(state)


def declared_rows(layer, state):
  """Rows per example of each leaf of `layer`'s `state`, as declared.

  Returns a tree like `state` whose undeclared subtrees are None.
  """
  if not has_arrays(state):
    return state
  layout = declared_layout(layer, state)
  if layout is not None:
    return layout.rows
  if (layer.sublayers and getattr(layer, 'predict_state_layout', None) is None
      and type(layer).state is base.Layer.state
      and isinstance(state, (tuple, list))
      and len(state) == len(layer.sublayers)):
    return type(state)(declared_rows(sub, s)
                       for sub, s in zip(layer.sublayers, state))
  if all(jnp.ndim(x) == 0 for x in jax.tree_util.tree_leaves(state)):
    return same_rows(state, 0)  # Scalars have no rows: shared.
  return None
