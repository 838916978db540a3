"""`ReversibleSerial`: a `Serial` of reversible layers whose backward pass stores no activations."""

from typing import Tuple

import jax
import numpy as np

from retrax.fastmath.tree import is_weights_cache_marker
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers.base import in_sublayer
from retrax.layers.base import LAYER_WEIGHTS
from retrax.layers.reversible.layer import ReversibleLayer
from retrax.layers.reversible.repeats import declared_period
from retrax.layers.stacked import stack_groups
from retrax.layers.stacked import stack_layers
from retrax.layers.stacked import stackable
from retrax.layers.stacked import StackedLayers
from retrax.layers.stacked import StackedRow
from retrax.layers.stacked import tree_spec
from retrax.layers.stacked import unstack_groups
from retrax.layers.stack import check_arity
from retrax.layers.stack import inputs_from_stack
from retrax.layers.stack import outputs_onto_stack
from retrax.layers.stack import run_layers
from retrax.layers.stack import split_rngs
from retrax.validation import ArgumentValueError



class ReversibleSerial(ReversibleLayer, cb.Serial):
  """A `Serial` of reversible layers whose backward pass stores no activations.

  Under `jax.grad` it keeps only its outputs from the forward pass; the
  backward pass walks the layers last to first, rebuilding each layer's
  input from its output (`reverse_and_grad`) and accumulating the weight
  gradients, so memory does not grow with depth.

  `repeats=k` declares the layers `k` copies of one block, built by the same
  code with the same configuration (the model builders do: ReformerLM,
  Reformer, Terraformer); see `repeats.declared_period`. The copies' weights
  are then held stacked once, as a `StackedLayers` (`stacked_weights`; what
  the training step passes to `jax.jit`), and run as one `lax.scan` over
  them: no copy of the weights or their gradients per block, and the block
  compiled once. `weights` is Trax's per-layer tree, sliced from the stack
  when read, and each weighted layer below holds a `StackedRow` (its rows
  of the stack) rather than arrays of its own: the stack is the one copy.
  A layer below given weights of its own (a per-layer trainer) is taken
  back into the stack at the next read. A stack that decodes (a layer
  below in `mode='predict'`) holds its weights per layer: it runs one
  position at a time, never scans, and would slice the rows at every call.
  """

  def __init__(self, *layers, repeats=None):
    super().__init__(*layers)
    self._predict_mode = None
    self._period = declared_period(self.sublayers, repeats)
    self._stacked = None  # The concrete StackedLayers held, or None.
    self._traced = None  # Weights set under tracing (for this layer's run).
    # (layer below, the StackedRow it holds) pairs.
    self._rows: Tuple[Tuple[base.Layer, StackedRow], ...] = ()
    for i, layer in enumerate(self.sublayers):
      if not isinstance(layer, ReversibleLayer):
        raise ArgumentValueError(
            f'Sublayer {i} of ReversibleSerial is not reversible (not a '
            f'ReversibleLayer): {layer.name}. Wrap residual computations in '
            f'ReversibleHalfResidual and use ReversibleSwap/ReversibleSelect '
            f'for stack moves.')

  @property
  def weights(self):
    """The per-layer weights (Trax's tree), sliced from the stack if held stacked.

    Under tracing, the weights this layer was given (its own run reads them).
    """
    held = self.stacked_weights
    if self._traced is None and isinstance(held, StackedLayers):
      return tuple(held)
    return held

  @weights.setter
  def weights(self, weights):
    if is_weights_cache_marker(weights):
      return
    if _has_tracer(weights):
      # Under tracing, only this layer's scan or loop reads them.
      self._traced = weights
      return
    self._traced = None
    stacked = self._stacked_if_repeated(weights)
    if stacked is None:
      self._stacked, self._rows = None, ()
      LAYER_WEIGHTS.fset(self, weights)
    else:
      self._stacked = stacked
      self._hold_rows()

  @property
  def stacked_weights(self):
    """The weights as held: one `StackedLayers` for declared repeats, else per layer."""
    if self._traced is not None:
      return self._traced
    if self._stacked is not None and any(layer.held_weights is not row
                                         for layer, row in self._rows):
      # A layer below was given weights of its own: stack them in.
      self.weights = LAYER_WEIGHTS.fget(self)
    if self._stacked is not None:
      return self._stacked
    return self._gather_from_sublayers('stacked_weights', self._weights)

  @property
  def held_weights(self):
    if self._traced is None and self._stacked is None:
      return self._gather_from_sublayers('held_weights', self._weights)
    return self.stacked_weights

  def _stacked_if_repeated(self, weights):
    """`weights` as a concrete `StackedLayers` of the declared block, or None.

    None (held per layer) unless repeats were declared, no layer decodes
    (`mode='predict'`), every leaf is a float array, the copies' trees
    match, and every weighted layer below can hold rows of the stack.
    """
    n, period = len(self.sublayers), self._period
    if period is None or self._decodes():
      # Decoding never scans (one position at a time), and each block's
      # rows sliced out of the stack would be copied at every call.
      return None
    if isinstance(weights, StackedLayers):
      ok = (weights.n == n and
            all(isinstance(x, (np.ndarray, jax.Array))
                for x in jax.tree_util.tree_leaves(weights)) and
            stackable(weights, period, floats=True))
      return weights if ok and self._row_paths(weights) is not None else None
    if (not isinstance(weights, (list, tuple)) or len(weights) != n or
        not jax.tree_util.tree_leaves(weights) or
        not stackable(weights, period, floats=True) or
        self._row_paths(weights) is None):
      return None
    return stack_layers(tuple(weights), period)

  def _row_paths(self, weights):
    """`(layer, i, path)` for each weighted layer below, or None if one cannot hold rows.

    `path` leads from layer `i`'s tree in `weights` to the layer's own
    weights. A layer that keeps its weights its own way (overriding
    `weights`) cannot hold a `StackedRow`.
    """
    found = []

    def walk(layer, tree, i, path):
      if not jax.tree_util.tree_leaves(tree):
        return True  # Weightless, or a shared layer's cache marker.
      if type(layer).weights is not LAYER_WEIGHTS:
        return False
      if not layer.sublayers:
        found.append((layer, i, path))
        return True
      return all(walk(sub, tree[k], i, path + (k,))
                 for k, sub in enumerate(layer.sublayers))
    groups = weights.groups if isinstance(weights, StackedLayers) else None
    for i, layer in enumerate(self.sublayers):
      tree = groups[i % len(groups)] if groups is not None else weights[i]
      if not walk(layer, tree, i, ()):
        return None
    return found

  def _hold_rows(self):
    """Points each weighted layer below at its rows of the held stack."""
    rows = []
    for layer, i, path in self._row_paths(self._stacked):
      row = StackedRow(self._stacked, i, path)
      layer.weights = row
      rows.append((layer, row))
    self._rows = tuple(rows)

  def _put_rows_back(self):
    """After a run: the layers below hold their rows again, not the run's weights.

    Combinators run their sublayers with `use_cache`, which leaves the
    weights of the run (traced ones, under `jax.jit`) on them.
    """
    for layer, row in self._rows:
      layer.weights = row

  def forward(self, xs):
    """Runs the layers in order, each one's work tied to its inputs (see `tie_to`).

    Under tracing, declared repeats become one `lax.scan` over their stacked
    weights (see `_scan_period`).
    """
    if not self.sublayers:
      return xs
    weights = self.stacked_weights
    rngs = split_rngs(self.rng, len(self.sublayers))
    try:
      period = self._scan_period(xs, weights, (self.state,), rngs)
      if period:
        outputs, states = jax.lax.scan(
            self._block_fn(period), xs,
            _groups(period, weights, self.state, rngs))
        self.state = unstack_groups(states, len(self.sublayers) // period)
        return outputs
      prepare = None if self._decodes() else (
          lambda w, r, stack: tie_to((w, r), stack))
      outputs, self.state = run_layers(self, self.sublayers, xs, weights,
                                       self.state, rngs, prepare=prepare)
      return outputs
    finally:
      self._put_rows_back()

  def _scan_period(self, stack, weights, states, rngs):
    """The block length to scan over, or None to run the layers in a loop.

    Scans when tracing (not decoding) `>= 2` declared copies of one block
    (`repeats.declared_period`) whose weights, states and keys stack, and the
    block maps the stack to a stack of the same shapes and dtypes. Compile
    time then stays flat in depth.
    """
    period = self._period
    if (period is None or self._decodes() or rngs[0] is None or
        not any(isinstance(x, jax.core.Tracer) for x in
                jax.tree_util.tree_leaves((stack, weights, rngs))) or
        not stackable(weights, period, floats=True) or
        not all(stackable(s, period) for s in states)):
      return None
    out, _ = jax.eval_shape(self._block_fn(period), stack, (
        weights[:period], states[0][:period], tuple(rngs[:period])))
    return period if tree_spec(out) == tree_spec(stack) else None

  def _block_fn(self, period):
    """`(stack, (weights, state, keys)) -> (stack, new_state)` of the first block."""
    block = self.sublayers[:period]

    def block_fn(stack, group):
      weights, state, rngs = group
      return run_layers(self, block, stack, weights, state, rngs,
                        use_cache=False)
    return block_fn

  def _decodes(self):
    """True if a sublayer is in 'predict' mode.

    Decoding runs one position at a time, so there is no depth-sized work to
    hold back, and the tie would cost a pass over all weights per token.
    """
    if self._predict_mode is None:
      self._predict_mode = any(layer.mode == 'predict' for layer in self.walk())
    return self._predict_mode

  def _walk_back(self, output, grad, weights, state, new_state, rng):
    """Shared loop of `reverse` (grad None) and `reverse_and_grad`."""
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    n = len(self.sublayers)
    if not n:
      return output, (grad, ())
    try:
      return self._walk_back_blocks(output, grad, weights, state, new_state,
                                    split_rngs(rng, n))
    finally:
      self._put_rows_back()

  def _walk_back_blocks(self, output, grad, weights, state, new_state, rngs):
    """`_walk_back` of the layers: one scan over declared repeats, else a loop."""
    n = len(self.sublayers)
    period = self._scan_period(output, weights, (state, new_state), rngs)
    if not period:
      stack, (stack_ct, weights_ct) = _walk_back_layers(
          self, self.sublayers, output, grad, weights, state, new_state, rngs)
      if isinstance(weights, StackedLayers) and grad is not None:
        weights_ct = stack_layers(weights_ct, weights.period)
      return stack, (stack_ct, weights_ct)
    block = self.sublayers[:period]

    def back_block(carry, group):
      stack, (stack_ct, weights_ct) = _walk_back_layers(self, block, *carry,
                                                        *group)
      return (stack, stack_ct), weights_ct
    (stack, stack_ct), weights_ct = jax.lax.scan(
        back_block, (output, grad),
        _groups(period, weights, state, new_state, rngs), reverse=True)
    if isinstance(weights, StackedLayers):
      return stack, (stack_ct, StackedLayers(weights_ct, n))
    return stack, (stack_ct, unstack_groups(weights_ct, n // period))

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    return self._walk_back(output, None, weights, state, new_state, rng)[0]

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    if grad is None:
      raise ArgumentValueError('ReversibleSerial.reverse_and_grad needs a gradient; '
                               'got None (use reverse() to only reconstruct).')
    return self._walk_back(output, grad, weights, state, new_state, rng)


def _walk_back_layers(parent, layers, stack, stack_ct, weights, state,
                      new_state, rngs):
  """Walks `layers` last to first from their output `stack`.

  Returns `(input stack, (input cotangents, weight cotangents))`; with
  `stack_ct` None it only reconstructs (`(stack, (None, (None, ...)))`).
  """
  n = len(layers)
  weights_ct = [None] * n
  for i in reversed(range(n)):
    layer = layers[i]
    w, s, ns, r = weights[i], state[i], new_state[i], rngs[i]
    if stack_ct is not None:
      # Layer i's recomputation may start only once layer i+1's gradients
      # (inputs and weights) exist; otherwise XLA may run all
      # reconstructions first and keep O(depth) activations alive.
      prev_w_ct = weights_ct[i + 1] if i + 1 < n else ()
      w, r = tie_to((w, r), (stack, stack_ct, prev_w_ct))
    with in_sublayer(parent, i):
      check_arity(layer, stack, layer.n_out, 'reverse',
                  what='outputs to reverse')
      y = inputs_from_stack(stack, layer.n_out)
      if stack_ct is None:
        x = layer.reverse(y, w, s, ns, r)
      else:
        ct = inputs_from_stack(stack_ct, layer.n_out)
        x, (x_ct, weights_ct[i]) = layer.reverse_and_grad(y, ct, w, s, ns, r)
        stack_ct = outputs_onto_stack(x_ct, stack_ct, layer.n_out)
    stack = outputs_onto_stack(x, stack, layer.n_out)
  return stack, (stack_ct, tuple(weights_ct))


def _groups(period, *per_layer):
  """Each per-layer tuple (keys: an array) stacked into `period` groups.

  Weights held as a `StackedLayers` of this period are used as they are.
  """
  return tuple(stack_groups(trees, period) for trees in per_layer)


def _has_tracer(tree):
  return any(isinstance(x, jax.core.Tracer)
             for x in jax.tree_util.tree_leaves(tree))


def tie_to(tree, data):
  """Returns `tree` (weights, rng) made data-dependent on `data`, values unchanged.

  XLA may schedule work that depends only on weights or rngs (bias
  broadcasts, dropout masks, the backward pass's recomputations) for all
  layers up front and keep it alive: O(depth) memory. An optimization
  barrier does not prevent this on XLA:CPU, which removes barriers before
  scheduling; a data dependency does, on every backend. Here
  every float leaf is multiplied by `1 + (e - e)` and every uint32 key is
  XORed with `(e - e) != 0`, where `e` ranges over one element of each float
  array in `data`: exactly the same values unless a probed element is NaN
  or inf (when the outputs are not finite anyway), but the layer's work can
  start only once `data` exists. Costs one elementwise pass over a layer's
  weights. Gradients through the tie are exact (the probe's are zero).
  """
  if not any(isinstance(x, jax.core.Tracer)
             for x in jax.tree_util.tree_leaves((tree, data))):
    return tree
  probes = [x for x in jax.tree_util.tree_leaves(data)
            if isinstance(x, jax.Array) and x.size and
            jnp.issubdtype(x.dtype, jnp.floating)]
  if not probes:
    return tree
  zero = sum(_probe(x) for x in probes)  # 0.0, or NaN for a non-finite probe
  one, flag = 1.0 + zero, zero != 0.0

  def tie(x):
    if not isinstance(x, jax.Array):
      return x
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      data_ = jax.random.key_data(x)
      return jax.random.wrap_key_data(data_ ^ flag.astype(data_.dtype),
                                      impl=jax.random.key_impl(x))
    if jnp.issubdtype(x.dtype, jnp.floating):
      return x * one.astype(x.dtype)
    if x.dtype == jnp.uint32:
      return x ^ flag.astype(x.dtype)
    return x
  return jax.tree_util.tree_map(tie, tree)


def _probe(x):
  """`e - e` of the first elements `e` of `x` (0.0, or NaN if not finite).

  A reduction over two elements, not a one-element slice: XLA computes it
  as a scalar of its own, where it fuses a slice into every tie's multiply
  and so keeps each probed array alive until the last tie has run (an
  in-place update of the array, e.g. a reversible layer rebuilding its
  input in its output's buffer, must then copy it).
  """
  flat = jnp.reshape(x, (-1,))
  e = jnp.max(jax.lax.slice(flat, (0,), (min(2, flat.shape[0]),)))
  return e.astype(jnp.float32) - e.astype(jnp.float32)
