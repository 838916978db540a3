"""Combinators: layers built from layers by their stack counts alone.

`Serial` runs layers in order on the stack; `Parallel` gives each layer its
own span of inputs; `Branch(F, G)` gives each layer a copy of the inputs it
needs; `Residual(F)` is `Serial(Branch(None, F), Add())`.
"""

import copy

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.fastmath import tree as fastmath_tree
from retrax.layers import base
from retrax.layers import predict_state
from retrax.layers.base import Fn
from retrax.layers.base import in_sublayer
from retrax.layers.stack import check_arity
from retrax.layers.stack import init_layers
from retrax.layers.stack import inputs_from_stack as inputs_from_stack
from retrax.layers.stack import make_tuple
from retrax.layers.stack import n_inputs_n_outputs
from retrax.layers.stack import outputs_onto_stack as outputs_onto_stack
from retrax.layers.stack import run_layers
from retrax.layers.stack import split_rngs
from retrax.layers.stack_ops import Select as Select
from retrax.layers.stack_ops import Drop as Drop
from retrax.layers.stack_ops import Dup as Dup
from retrax.layers.stack_ops import Swap as Swap
from retrax.layers.stack_ops import Add as Add
from retrax.layers.stack_ops import SubtractTop as SubtractTop
from retrax.layers.stack_ops import Multiply as Multiply
from retrax.layers.stack_ops import Gate as Gate
from retrax.layers.stack_ops import Concatenate as Concatenate
from retrax.layers.stack_ops import Split as Split
from retrax.layers.stack_ops import FlattenList as FlattenList
from retrax.layers.stack_ops import deep_flatten
from retrax.shapes import ShapeDtype
from retrax.validation import ArgumentValueError


class Serial(base.Layer):
  """Applies layers serially (function composition) on a data stack.

  Each sublayer takes its `n_in` items off the top of the stack and pushes
  its `n_out` results. `Serial()` with no sublayers is a 1-in 1-out no-op.
  Nested lists of layers are flattened; `None` entries are dropped.
  """

  def __init__(self, *sublayers, name=None, sublayers_to_print=None):
    super().__init__(name=name, sublayers_to_print=sublayers_to_print)
    sublayers = _ensure_flat(sublayers)
    self._sublayers = sublayers
    if sublayers:
      self._n_in, self._n_out = n_inputs_n_outputs(sublayers)
      self._weights = tuple(None for _ in sublayers)
      self._state = tuple(None for _ in sublayers)

  def forward(self, xs):
    if not self.sublayers:
      return xs
    rngs = split_rngs(self.rng, len(self.sublayers))
    # Held weights: a stacked block below is passed on as it is, not sliced.
    outputs, self.state = run_layers(self, self.sublayers, xs,
                                     self.stacked_weights, self.state, rngs)
    return outputs

  def init_weights_and_state(self, input_signature):
    _, weights, self.state = init_layers(self, self.sublayers,
                                         input_signature)
    self.weights = weights


class Parallel(base.Layer):
  """Applies layers in parallel to successive spans of the inputs.

  With F (1 in, 1 out), G (3 in, 1 out) and H (2 in, 2 out),
  `Parallel(F, G, H)` takes a, b, c, d, e, f and gives
  F(a), G(b, c, d), h1, h2 where h1, h2 = H(e, f). `None` is a 1-in no-op.
  """

  def __init__(self, *sublayers, name=None):
    super().__init__(name=name)
    sublayers = _validate_parallel(sublayers)
    self._sublayers = sublayers
    self._n_in = sum(l.n_in for l in sublayers)
    self._n_out = sum(l.n_out for l in sublayers)
    self._weights = tuple(None for _ in sublayers)
    self._state = tuple(None for _ in sublayers)

  def forward(self, inputs):
    sub_inputs = self._allot_to_sublayers(inputs)
    rngs = split_rngs(self.rng, len(self.sublayers))
    outputs, new_state = [], []
    for i, (layer, x, w, s, r) in enumerate(zip(
        self.sublayers, sub_inputs, self.stacked_weights, self.state, rngs)):
      with in_sublayer(self, i):
        out, s = layer.pure_fn(x, w, s, r, use_cache=True)
      if layer.n_out == 1:
        outputs.append(out)
      else:
        outputs.extend(out)
      new_state.append(s)
    self.state = tuple(new_state)
    return outputs[0] if self.n_out == 1 else tuple(outputs)

  def init_weights_and_state(self, input_signature):
    sub_sigs = self._allot_to_sublayers(input_signature)
    inits = []
    for i, (layer, sig) in enumerate(zip(self.sublayers, sub_sigs)):
      with in_sublayer(self, i):
        inits.append(layer.init(sig, use_cache=True))
    weights, state = tuple(zip(*inits))
    self.state = state
    self.weights = weights

  def _allot_to_sublayers(self, inputs):
    inputs = make_tuple(inputs)
    start, sub_inputs = 0, []
    for layer in self.sublayers:
      end = start + layer.n_in
      sub_inputs.append(inputs[start] if layer.n_in == 1 else inputs[start:end])
      start = end
    return tuple(sub_inputs)


def _validate_parallel(layers):
  if len(layers) < 2:
    raise ArgumentValueError(f'Parallel needs at least two layers; got {layers}.')
  layers = list(layers)
  for i, obj in enumerate(layers):
    if obj is None or (isinstance(obj, list) and not obj):
      layers[i] = Serial(None)
    elif isinstance(obj, (list, tuple)):
      layers[i] = Serial(obj)
    elif not isinstance(obj, base.Layer):
      raise ArgumentValueError(f'Found non-layer object ({obj!r}) in layers: {layers}')
    if layers[i].n_in == 0:
      raise ArgumentValueError(f'Sublayer with n_in = 0 not allowed in Parallel: '
                               f'{layers[i]}')
  return layers


def Branch(*layers, name='Branch'):
  """Applies layers in parallel to copies of the inputs.

  With F (1 in, 1 out), G (3 in, 1 out) and H (2 in, 2 out), `Branch(F, G, H)`
  takes a, b, c and gives F(a), G(a, b, c), h1, h2 where h1, h2 = H(a, b).
  `None` is a 1-in 1-out no-op (identity branch).
  """
  if len(layers) == 1:
    return layers[0]
  parallel = Parallel(*layers)
  indices = [list(range(layer.n_in)) for layer in parallel.sublayers]
  branch = Serial(Select(deep_flatten(indices)), parallel, name=name,
                  sublayers_to_print=layers)
  # Error paths read `Branch[i] > ...` for branch i (not `Branch[1] >
  # Parallel[i]`), and just `Branch` when the inputs are missing.
  parallel.set_path_elements(lambda i: f'{name}[{i}]')
  branch.set_path_elements(lambda i: None if i == 1 else name)
  return branch


def Residual(*layers, shortcut=None):
  """Adds the output of `layers` (in series) to the stack-top input (or `shortcut(inputs)`)."""
  layers = _ensure_flat(layers)
  layer = layers[0] if len(layers) == 1 else Serial(layers)
  return Serial(Branch(shortcut, layer), Add())


def SerialWithSideOutputs(layers, n_side_outputs=1):
  """Serial in which each layer puts its last `n_side_outputs` outputs aside (below the stack)."""
  if isinstance(n_side_outputs, int):
    n_side_outputs = [n_side_outputs] * len(layers)
  running_max = running_total = 0
  for layer, n_side in zip(layers, n_side_outputs):
    running_total += layer.n_in
    running_max = max(running_max, running_total)
    running_total -= layer.n_out - n_side
  stack_size = running_max
  serial = []
  for layer, n_side in zip(layers, n_side_outputs):
    serial.append(layer)
    stack_size += layer.n_out - layer.n_in
    back = list(range(layer.n_out - n_side))
    back += [i + layer.n_out for i in range(stack_size - layer.n_out)]
    back += [i + layer.n_out - n_side for i in range(n_side)]
    serial.append(Select(back))
  return Serial(serial)


class Scan(base.Layer):
  """Applies a layer cumulatively along an axis, carrying `n_carry` items (`lax.scan`).

  The layer maps `(x1..xN, carry1..carryM) -> (y1..yK, new_carry1..M)`; the
  scanned layer maps whole sequences along `axis` and returns the last carry.
  """

  def __init__(self, layer, axis=0, n_carry=1, remat=False, mode='train'):
    if layer.n_in < n_carry or layer.n_out < n_carry:
      raise ArgumentValueError(f'Scan with n_carry={n_carry} needs a layer with at '
                               f'least {n_carry} inputs and outputs (the carries); '
                               f'got {layer.name} with n_in={layer.n_in}, '
                               f'n_out={layer.n_out}.')
    super().__init__(n_in=layer.n_in, n_out=layer.n_out, mode=mode)
    self._sublayers = [layer]
    self._n_carry = n_carry
    self._axis = axis
    self._remat = remat
    self._weights = (None,)
    self._state = (None, ())

  @property
  def sublayer(self):
    return self._sublayers[0]

  @property
  def state(self):
    return (self.sublayer.state, self._state[1])

  @state.setter
  def state(self, state):
    if fastmath_tree.is_state_cache_marker(state):
      return
    self._state = (None, state[1])
    self.sublayer.state = state[0]

  def predict_state_layout(self, state):
    """The layer's own, then the carry: one row per example unless scanning axis 0."""
    if self._axis == 0 and predict_state.has_arrays(state[1]):
      return None  # The carry's batch axis is unknown.
    return predict_state.PredictStateLayout(
        (predict_state.declared_rows(self.sublayer, state[0]),
         predict_state.same_rows(state[1], 1)))

  def forward(self, inputs):
    weights = self.weights[0]
    if isinstance(inputs, list):
      inputs = tuple(inputs)
    n_carry = self._n_carry
    rng = self.rng

    def step(carry_and_state, x):
      carry, state, i = carry_and_state
      x_and_carry = (x + carry) if n_carry > 0 else x
      x_and_carry = x_and_carry[0] if len(x_and_carry) == 1 else x_and_carry
      with in_sublayer(self, 0):
        res, new_state = self.sublayer.pure_fn(
            x_and_carry, weights, state, fastmath.random.fold_in(rng, i))
      res = make_tuple(res)
      if n_carry > 0:
        return (res[-n_carry:], new_state, i + 1), res[:-n_carry]
      return ((), new_state, i + 1), res

    inputs = make_tuple(inputs)
    if n_carry > 0:
      xs, carry = inputs[:-n_carry], inputs[-n_carry:]
      if self._mode == 'predict' and self._state[1]:
        carry = self._state[1]
    else:
      xs, carry = inputs, ()
    if self._remat:
      step = fastmath.remat(step)
    xs = tuple(jnp.moveaxis(x, self._axis, 0) for x in xs)
    init = (tuple(carry), self.state[0], jnp.array(0, dtype=jnp.int32))
    (carry, new_state, _), ys = fastmath.scan(step, init, xs)
    ys = tuple(jnp.moveaxis(y, 0, self._axis) for y in ys)
    res = ys + tuple(carry)
    state_carry = tuple(carry) if self._mode == 'predict' and n_carry else ()
    self.state = (new_state, state_carry)
    return res[0] if len(res) == 1 else res

  def init_weights_and_state(self, input_signature):
    n_carry = self._n_carry
    sigs = make_tuple(input_signature)
    xs = sigs[:-n_carry] if n_carry else sigs
    carry = sigs[-n_carry:] if n_carry else ()
    slices = [ShapeDtype(_shape_without_axis(x, self._axis), x.dtype) for x in xs]
    layer_sig = tuple(slices) + tuple(carry)
    layer_sig = layer_sig[0] if len(layer_sig) == 1 else layer_sig
    with in_sublayer(self, 0):
      weights, state = self.sublayer.init(layer_sig, use_cache=True)
    self.state = (state, ())
    self.weights = (weights,)


class Cond(base.Layer):
  """Runs `true(y)` if `cond(x)` else `false(y)` (identity if `false` is None), via `lax.cond`.

  `x` is the top `cond.n_in` stack items, `y` the items below them.
  """

  def __init__(self, cond, true, false=None, name=None):
    super().__init__(name=name)
    self._identity_false = false is None
    false = Serial() if false is None else false
    if cond.n_out != 1:
      raise ArgumentValueError(f'Cond: cond must have n_out=1; got {cond.name} with '
                               f'n_in={cond.n_in}, n_out={cond.n_out}.')
    if true.n_in != false.n_in or true.n_out != false.n_out:
      raise ArgumentValueError(
          f'Cond: true and false must have equal n_in and n_out; got true '
          f'{true.n_in}->{true.n_out} and false {false.n_in}->{false.n_out}.')
    self._cond, self._true, self._false = cond, true, false
    self._sublayers = [cond, true, false]
    self._n_in = cond.n_in + true.n_in
    self._n_out = true.n_out
    self._weights = (None, None, None)
    self._state = (None, None, None)

  def init_weights_and_state(self, input_signature):
    # Cond takes exactly `n_in` items (Trax fails on more, or on fewer).
    check_arity(self, input_signature, self.n_in, 'init', exact=True)
    stack = make_tuple(input_signature)
    weights, states = [], []
    with in_sublayer(self, 0):
      w, s = self._cond.init(inputs_from_stack(stack, self._cond.n_in),
                             use_cache=True)
    weights.append(w)
    states.append(s)
    stack = make_tuple(outputs_onto_stack((), stack, self._cond.n_in))
    for i, layer in ((1, self._true), (2, self._false)):
      with in_sublayer(self, i):
        w, s = layer.init(inputs_from_stack(stack, layer.n_in), use_cache=True)
      weights.append(w)
      states.append(s)
    self.state = tuple(states)
    self.weights = tuple(weights)

  def forward(self, xs):
    check_arity(self, xs, self.n_in, 'pure_fn', exact=True)
    rngs = split_rngs(self.rng, 3)
    weights, state = self.weights, self.state
    with in_sublayer(self, 0):
      c, s0 = self._cond.pure_fn(inputs_from_stack(xs, self._cond.n_in),
                                 weights[0], state[0], rngs[0])
    stack = make_tuple(outputs_onto_stack((), xs, self._cond.n_in))
    n = self._true.n_in
    ins = inputs_from_stack(stack, n)

    def run_true(operand):
      ins, (_, s2) = operand
      with in_sublayer(self, 1):
        out, s1 = self._true.pure_fn(ins, weights[1], state[1], rngs[1])
      return out, (s1, s2)

    def run_false(operand):
      ins, (s1, s2) = operand
      if self._identity_false:
        return ins, (s1, s2)
      with in_sublayer(self, 2):
        out, s2 = self._false.pure_fn(ins, weights[2], s2, rngs[2])
      return out, (s1, s2)

    out, (s1, s2) = fastmath.cond(jnp.reshape(c, ()).astype(bool), run_true,
                                 run_false, (ins, (state[1], state[2])))
    self.state = (s0, s1, s2)
    return outputs_onto_stack(out, stack, n)


def Chunk(layer, chunk_size, pass_unchunkable=True):
  """Runs `layer` on batch chunks of `chunk_size` (one at a time, rematerialized) to save memory."""
  if chunk_size < 1:
    return layer

  def to_chunks(x):
    batch = x.shape[0]
    size, n_chunks = chunk_size, batch // chunk_size
    if batch % chunk_size:
      if not pass_unchunkable:
        raise InputValueError(f'Chunk size {chunk_size} must divide batch size '
                              f'{batch}.')
      size, n_chunks = batch, 1
    return jnp.reshape(x, (n_chunks, size) + tuple(x.shape[1:]))

  def from_chunks(x):
    return jnp.reshape(x, (x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))
  return Serial(
      base.PureLayer(lambda xs: fastmath.nested_map(to_chunks, xs),
                     n_in=layer.n_in, n_out=layer.n_in, name='ReshapeToChunks'),
      Scan(layer, axis=0, n_carry=0, remat=True),
      base.PureLayer(lambda xs: fastmath.nested_map(from_chunks, xs),
                     n_in=layer.n_out, n_out=layer.n_out,
                     name='ReshapeFromChunks'),
  )


class Cache(base.Layer):
  """Runs `layer` on the first call and returns the same outputs afterwards.

  The state is `(cached_outputs, layer_state)`; `cached_outputs` is `()` until
  the first call (e.g. an encoder run once per decoding in predict mode).
  """

  def __init__(self, layer):
    super().__init__(n_in=layer.n_in, n_out=layer.n_out)
    self._sublayers = [layer]
    self._weights = (None,)
    self._state = ((), None)

  @property
  def sublayer(self):
    return self._sublayers[0]

  @property
  def state(self):
    return (self._state[0], self.sublayer.state)

  @state.setter
  def state(self, state):
    if fastmath_tree.is_state_cache_marker(state):
      return
    if not isinstance(state, (list, tuple)) or len(state) != 2:
      raise InputValueError('Cache state must be a pair (cached_outputs, '
                            f'layer_state); got {base.signature(state)}.')
    self._state = (state[0], None)
    self.sublayer.state = state[1]

  def predict_state_layout(self, state):
    """Cached outputs hold one row per example (batch-major); then the layer's own."""
    cached, layer_state = state
    return predict_state.PredictStateLayout(
        (predict_state.same_rows(cached, 1),
         predict_state.declared_rows(self.sublayer, layer_state)))

  def init_weights_and_state(self, input_signature):
    with in_sublayer(self, 0):
      weights, layer_state = self.sublayer.init(input_signature, use_cache=True)
    self.state = ((), layer_state)
    self.weights = (weights,)

  def forward(self, inputs):
    state, weights = self.state, self.weights[0]
    if isinstance(state[0], (tuple, list)) and not state[0]:
      with in_sublayer(self, 0):
        res, layer_state = self.sublayer.pure_fn(inputs, weights, state[1],
                                                 self.rng)
      self.state = (res, layer_state)
      return res
    return state[0]


class BatchLeadingAxes(base.Layer):
  """Runs `layer` with all but the last `n_last_axes_to_keep` axes merged into one batch axis."""

  def __init__(self, layer, n_last_axes_to_keep=1):
    if layer.n_out != 1:
      raise ArgumentValueError('BatchLeadingAxes only works for layers with n_out = 1;'
                               f' got {layer.n_out}.')
    super().__init__(n_in=layer.n_in, n_out=layer.n_out)
    self._sublayers = [layer]
    self._n_keep = n_last_axes_to_keep
    self._weights = (None,)
    self._state = (None,)

  @property
  def sublayer(self):
    return self._sublayers[0]

  def forward(self, inputs):
    xs = make_tuple(inputs)
    lead = tuple(xs[0].shape[:-self._n_keep])
    flat = tuple(jnp.reshape(x, (-1,) + tuple(x.shape[-self._n_keep:]))
                 for x in xs)
    with in_sublayer(self, 0):
      res, s = self.sublayer.pure_fn(flat[0] if self.n_in == 1 else flat,
                                     self.weights[0], self.state[0], self.rng)
    self.state = (s,)
    return jnp.reshape(res, lead + tuple(res.shape[1:]))

  def init_weights_and_state(self, input_signature):
    sigs = make_tuple(input_signature)
    flat = []
    for sig in sigs:
      size = 1
      for d in sig.shape[:-self._n_keep]:
        size *= d
      flat.append(ShapeDtype((size,) + tuple(sig.shape[-self._n_keep:]),
                             sig.dtype))
    with in_sublayer(self, 0):
      w, s = self.sublayer.init(flat[0] if self.n_in == 1 else tuple(flat),
                                use_cache=True)
    self.state = (s,)
    self.weights = (w,)


def Bidirectional(forward_layer, axis=1, merge_layer=None):
  """Runs `forward_layer` forwards and a copy of it on the time-reversed input, then merges."""
  merge_layer = Concatenate() if merge_layer is None else merge_layer
  backward_layer = copy.deepcopy(forward_layer)
  flip = Fn('_FlipAlongTimeAxis', lambda x: jnp.flip(x, axis=axis))
  return Serial(Branch(forward_layer, Serial(flip, backward_layer, flip)),
                merge_layer)


def _shape_without_axis(x, axis):
  axis = axis % len(x.shape)
  return tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])


def _ensure_flat(layers):
  """Flattens nested lists of layers; drops `None`; rejects non-layers."""
  if len(layers) == 1 and layers[0] is None:
    return []
  layers = [l for l in deep_flatten(layers) if l is not None]
  for obj in layers:
    if not isinstance(obj, base.Layer):
      raise ArgumentValueError(f'Found non-layer object ({obj!r}) in layers: {layers}')
  return layers
