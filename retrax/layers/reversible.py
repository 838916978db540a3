"""Reversible layers: layers that can compute their inputs from their outputs.

In a series of reversible layers the backward pass needs no stored
activations: it rebuilds each layer's input from its output, last layer
first (RevNet, https://arxiv.org/abs/1707.04585; Reformer,
https://arxiv.org/abs/2001.04451). `ReversibleSerial` does this under
`jax.custom_vjp`, so plain `jax.grad` of any loss through it keeps O(1) layer
activations alive instead of O(depth).

The building block is `ReversibleHalfResidual` (RHR), which maps

    [acc, *ctx] -> [acc + f(ctx), *ctx]

and is inverted by `acc = out - f(ctx)`. Reformer's block is
`[RHR(attention), ReversibleSwap(), RHR(feed_forward), ReversibleSwap()]`.

Randomness is replayed exactly: the backward pass recomputes each `f` with
the rng and the *pre-forward* state that the forward pass used, so dropout
masks and state-drawn randomness (e.g. LSH hashing keys) are the same and the
gradients equal those of the same network without custom gradients.

Calling `reverse`/`reverse_and_grad` with the defaults `weights=()`,
`state=()`, `rng=None` uses the layer's own weights, state and rng;
`new_state=()` means "same as `state`".
"""

import jax
import numpy as np

from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers.base import in_sublayer

_split_rngs = cb._split_rngs  # pylint: disable=protected-access


# --- small tree helpers -------------------------------------------------------


def _is_empty_tuple(x):
  return isinstance(x, tuple) and not x


def _is_int_like(x):
  dtype = getattr(x, 'dtype', None)
  if dtype is None:
    return False
  return not jnp.issubdtype(dtype, jnp.inexact)


def _float0_zeros(x):
  return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


def _zero_cotangent(tree):
  """Zero cotangents for a tree of primal values (float0 for integer leaves)."""
  def zero(x):
    x = x if hasattr(x, 'dtype') else jnp.asarray(x)
    if _is_int_like(x):
      return _float0_zeros(x)
    return jnp.zeros_like(x)
  return jax.tree_util.tree_map(zero, tree)


def _is_no_grad(x):
  return x is None or getattr(x, 'dtype', None) == jax.dtypes.float0


def _add_cotangents(x, y):
  """Adds two cotangents; `None` and float0 arrays count as zero."""
  if _is_no_grad(x):
    return y
  if _is_no_grad(y):
    return x
  return x + y


def _cotangent_like(ct, primal):
  """Casts a cotangent to the primal's dtype, or float0 for integer primals."""
  if _is_int_like(primal):
    return _float0_zeros(primal)
  dtype = jax.dtypes.canonicalize_dtype(primal.dtype)
  if ct is None or _is_no_grad(ct):
    return jnp.zeros(np.shape(primal), dtype)
  ct = jnp.asarray(ct)
  return ct.astype(dtype) if ct.dtype != dtype else ct


def _match_structure(ct, primal):
  """Gives the cotangent tree `ct` the container types and dtypes of `primal`."""
  if isinstance(primal, (list, tuple)):
    if not isinstance(ct, (list, tuple)) or len(ct) != len(primal):
      raise ValueError(
          f'Cotangent structure {jax.tree_util.tree_structure(ct)} does not '
          f'match the primal structure {jax.tree_util.tree_structure(primal)}.')
    return type(primal)(_match_structure(c, p) for c, p in zip(ct, primal))
  if isinstance(primal, dict):
    return {k: _match_structure(ct[k], v) for k, v in primal.items()}
  if primal is None:
    return None
  return _cotangent_like(ct, primal)


def _tie_to(tree, data):
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
  e = jax.lax.slice(jnp.reshape(x, (-1,)), (0,), (1,))[0].astype(jnp.float32)
  return e - e


def _as_tuple(xs):
  return tuple(xs) if isinstance(xs, (list, tuple)) else (xs,)


def _check_n_items(layer, xs, what):
  """Raises a clear error unless `xs` holds `layer.n_in` items."""
  n = layer.n_in
  if n == 1:
    return
  if not isinstance(xs, (list, tuple)):
    raise TypeError(f'{layer.name} expects {what} as a tuple of {n} items; '
                    f'got one {type(xs).__name__} {base.signature(xs)}.')
  if len(xs) != n:
    raise ValueError(f'{layer.name} expects {what} as a tuple of {n} items; '
                     f'got {len(xs)}: {base.signature(tuple(xs))}.')


# --- the base class -------------------------------------------------------------


class ReversibleLayer(base.Layer):
  """A layer whose inputs can be computed from its outputs.

  Subclasses define `forward` and `reverse`; they may override
  `reverse_and_grad` to fuse the reconstruction with the backward pass. Used
  on its own inside a network, a reversible layer's gradient comes from
  `reverse_and_grad` (it stores only its outputs for the backward pass).
  """

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    """Computes the layer's input from its output.

    Args:
      output: the layer's output (one array, or a tuple for `n_out > 1`).
      weights: the weights the forward pass used (default: the layer's own).
      state: the state the forward pass started from (default: the layer's own).
      new_state: the state the forward pass returned (default: `state`).
      rng: the PRNG key the forward pass used (default: the layer's own).

    Returns:
      The reconstructed input.
    """
    raise NotImplementedError(
        f'{self.name} is a ReversibleLayer but does not define reverse().')

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    """Reconstructs the input and back-propagates `grad` through the layer.

    The default reconstructs with `reverse` and differentiates `forward` at
    the reconstructed input (with the pre-forward `state` and `rng`, so any
    randomness is replayed).

    Args:
      output: the layer's output.
      grad: cotangent of the output (same structure as `output`).
      weights, state, new_state, rng: as in `reverse`.

    Returns:
      `(reconstructed_x, (x_grad, weights_grad))`.
    """
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    x = self.reverse(output, weights, state, new_state, rng)

    def forward_fn(inputs, w):
      return self._pure_forward(inputs, w, state, rng)

    y, vjp_fn = jax.vjp(forward_fn, x, weights)
    x_grad, weights_grad = vjp_fn(_match_structure(_as_like(grad, y), y))
    return x, (x_grad, weights_grad)

  @property
  def has_backward(self):
    return True

  def backward(self, inputs, output, grad, weights, state, new_state, rng):
    """Custom backward pass through `reverse_and_grad`; `inputs` is unused."""
    del inputs
    _, inputs_and_weights_grad = self.reverse_and_grad(
        output, grad, weights, state, new_state, rng)
    return inputs_and_weights_grad

  def _pure_forward(self, x, weights, state, rng):
    """Runs `self.forward` with the given weights, state and rng; returns the output."""
    old = self.weights, self.state, self._rng
    self.weights, self.state, self._rng = weights, state, rng
    try:
      return self.forward(x)
    finally:
      self.weights, self.state, self._rng = old

  def _resolve(self, weights, state, new_state, rng):
    """Fills in the defaults of `reverse`/`reverse_and_grad` arguments."""
    if _is_empty_tuple(weights):
      weights = self.weights
    if _is_empty_tuple(state):
      state = self.state
    if _is_empty_tuple(new_state):
      new_state = state
    if rng is None:
      rng = self.rng
    return weights, state, new_state, rng

  def _do_custom_gradients(self, x):
    """Runs `forward` under `jax.custom_vjp`, keeping only the outputs for `backward`."""
    if isinstance(x, list):
      x = tuple(x)
    primal_x = x

    @jax.custom_vjp
    def f(inputs, weights, state, rng):
      return self._forward_with(inputs, weights, state, rng)

    def f_fwd(inputs, weights, state, rng):
      out, new_state = self._forward_with(inputs, weights, state, rng)
      return (out, new_state), (out, weights, state, new_state, rng)

    def f_bwd(residuals, grads):
      out, weights, state, new_state, rng = residuals
      x_grad, w_grad = self.backward(None, out, grads[0], weights, state,
                                     new_state, rng)
      return (_match_structure(x_grad, primal_x),
              _match_structure(w_grad, weights),
              _zero_cotangent(state), _zero_cotangent(rng))

    f.defvjp(f_fwd, f_bwd)
    # `self.rng`, not `self._rng`: a None key becomes the layer's own key
    # here, so that forward and backward both see the same one.
    return f(x, self.weights, self.state, self.rng)


def _as_like(grad, output):
  """Puts a list-or-tuple gradient into the output's container type."""
  if isinstance(output, tuple) and isinstance(grad, list):
    return tuple(grad)
  return grad


# --- stack operations -------------------------------------------------------------


class ReversibleSelect(ReversibleLayer):
  """Reversible `Select`: reorders (and may copy) stack items; every input must be kept.

  `ReversibleSelect([1, 0])` swaps the top two items; its reverse picks each
  input back from its (first) position in `indices`.
  """

  def __init__(self, indices, n_in=None, name=None):
    indices = list(indices)
    if not indices:
      raise ValueError('ReversibleSelect needs at least one index; got [].')
    if n_in is None:
      n_in = max(indices) + 1
    if max(indices) >= n_in or min(indices) < 0:
      raise ValueError(f'ReversibleSelect indices {indices} must lie in '
                       f'[0, n_in={n_in}).')
    if name is None:
      name = f'ReversibleSelect{indices}'.replace(' ', '')
    super().__init__(n_in=n_in, n_out=len(indices), name=name)
    self._indices = indices
    missing = [i for i in range(n_in) if i not in indices]
    if missing:
      raise ValueError(
          f'To be reversible, all inputs to Select must be in indices; '
          f'indices {indices} miss input(s) {missing} of n_in={n_in}.')
    self._reverse_indices = [indices.index(i) for i in range(n_in)]

  def forward(self, inputs):
    _check_n_items(self, inputs, 'inputs')
    inputs = _as_tuple(inputs)
    selected = tuple(inputs[i] for i in self._indices)
    return selected[0] if len(selected) == 1 else selected

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    output = _as_tuple(output)
    if len(output) != self.n_out:
      raise ValueError(f'{self.name}.reverse expects {self.n_out} outputs; '
                       f'got {len(output)}.')
    selected = tuple(output[i] for i in self._reverse_indices)
    return selected[0] if len(selected) == 1 else selected


def ReversibleSwap():  # pylint: disable=invalid-name
  """Swaps the top two stack items; its own reverse: `(x1, x2) -> (x2, x1)`."""
  return ReversibleSelect([1, 0], name='ReversibleSwap')


class ReversibleConcatenatePair(ReversibleLayer):
  """Maps `(x, y) -> (xy, xy)` with `xy` their concatenation on the last axis.

  The reverse splits the first output in two equal halves, so `x` and `y`
  must have the same last dimension.
  """

  def __init__(self):
    super().__init__(n_in=2, n_out=2)

  def forward(self, inputs):
    _check_n_items(self, inputs, 'inputs')
    x, y = inputs
    if x.shape[-1] != y.shape[-1]:
      raise ValueError(f'{self.name} needs equal last dimensions to be '
                       f'reversible; got shapes {x.shape} and {y.shape}.')
    pair = jnp.concatenate((x, y), axis=-1)
    return pair, pair

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    pair, _ = output
    x, y = jnp.split(pair, 2, axis=-1)
    return x, y


class ReversibleReshape(ReversibleLayer):
  """Reshapes `n_in` items' leading axes from `shape1` to `shape2` (reverse: back).

  Each input's leading `len(shape1)` axes are replaced by `shape2`; the
  trailing axes are kept.
  """

  def __init__(self, shape1, shape2, n_in=1):
    name = f'ReversibleReshape_{shape1}_{shape2}'
    super().__init__(n_in=n_in, n_out=n_in, name=name)
    self._shape1 = list(shape1)
    self._shape2 = list(shape2)

  @staticmethod
  def _reshape(xs, from_shape, to_shape):
    res = []
    for x in _as_tuple(xs):
      lead = list(x.shape)[:len(from_shape)]
      if any(f != -1 and f != d for f, d in zip(from_shape, lead)):
        raise ValueError(f'ReversibleReshape expects leading axes {from_shape};'
                         f' got an input of shape {tuple(x.shape)}.')
      res.append(jnp.reshape(x, to_shape + list(x.shape)[len(from_shape):]))
    return res[0] if len(res) == 1 else tuple(res)

  def forward(self, inputs):
    _check_n_items(self, inputs, 'inputs')
    return self._reshape(inputs, self._shape1, self._shape2)

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    return self._reshape(output, self._shape2, self._shape1)


class ReversiblePrintShape(ReversibleLayer):
  """Prints the shapes and dtypes of its `n_in` inputs and returns them unchanged."""

  def __init__(self, n_in=1, msg=''):
    super().__init__(n_in=n_in, n_out=n_in)
    self._msg = msg

  def forward(self, xs):
    _check_n_items(self, xs, 'inputs')
    shapes = ', '.join(f'{x.shape}[{x.dtype}]' for x in _as_tuple(xs))
    print(f'PrintShape: {self._msg}: [{shapes}]')
    return xs

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    del weights, state, new_state, rng
    return output


# --- the half-residual --------------------------------------------------------------


class ReversibleHalfResidual(ReversibleLayer):
  """Half of a RevNet residual: `[acc, *ctx] -> [acc + f(ctx), *ctx]`.

  `f` is `Serial(*residual_layers)`, followed by `attention_layer` if given;
  it runs on the context stack `ctx` and its top output is the residual,
  which must have the accumulator's shape. `n_in = n_out` is one more than
  the stack depth `f` needs. The weights are `(serial_weights,)`, or
  `(serial_weights, attention_weights)` with an attention layer (Trax's tree).

  Fused backward hook: if `attention_layer` has a method
  `forward_and_or_backward(inputs, weights, state, rng, output_grad=None,
  compute_output=True, update_state=True) -> (output, new_state, inputs_grad,
  weights_grad)`, the backward pass calls it once (with the state the
  forward pass returned and `update_state=False`, as Trax does, so that e.g.
  LSH attention reuses its forward-pass hash buckets) to get both the
  residual and its gradients, instead of differentiating the layer.
  """

  def __init__(self, *residual_layers, attention_layer=None, name=None):
    super().__init__(name=name)
    self._compute_residual = cb.Serial(*residual_layers)
    self._attention_layer = attention_layer
    if attention_layer is None:
      self._sublayers = (self._compute_residual,)
    else:
      if not isinstance(attention_layer, base.Layer):
        raise TypeError(f'attention_layer must be a Layer or None; got '
                        f'{attention_layer!r}.')
      self._sublayers = (self._compute_residual, attention_layer)
    self._weights = tuple(None for _ in self._sublayers)
    self._state = tuple(None for _ in self._sublayers)
    running_max = running_total = 0
    for layer in self._sublayers:
      running_total += layer.n_in
      running_max = max(running_max, running_total)
      running_total -= layer.n_out
    if running_max - running_total < 1:
      raise ValueError(
          f'ReversibleHalfResidual needs layers that leave a residual on the '
          f'stack; {self._sublayers} take {running_max} item(s) and leave '
          f'{running_max - running_total}.')
    self._n_in = self._n_out = running_max + 1

  @property
  def _fused(self):
    return (self._attention_layer is not None and
            hasattr(self._attention_layer, 'forward_and_or_backward'))

  def forward(self, xs):
    _check_n_items(self, xs, 'inputs')
    acc, context = xs[0], tuple(xs[1:])
    rngs = _split_rngs(self.rng, len(self.sublayers))
    residual, new_state = self._residual(context, self.weights, self.state,
                                         rngs)
    _check_residual(self, acc, residual)
    self.state = new_state
    return (acc + residual,) + context

  def _residual(self, context, weights, state, rngs):
    """Runs the sublayers on the context stack: returns `(residual, new_state)`."""
    stack = context
    new_state = []
    for i, (layer, w, s, r) in enumerate(
        zip(self.sublayers, weights, state, rngs)):
      with in_sublayer(self, i):
        inputs = cb.inputs_from_stack(stack, layer.n_in)
        outputs, s = layer.pure_fn(inputs, w, s, r)
      stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
      new_state.append(s)
    residual = stack[0] if isinstance(stack, (list, tuple)) else stack
    return residual, tuple(new_state)

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    _check_n_items(self, output, 'outputs')
    rngs = _split_rngs(rng, len(self.sublayers))
    context = tuple(output[1:])
    if self._fused:
      cr = self._compute_residual
      cr_out, _ = cr.pure_fn(cb.inputs_from_stack(context, cr.n_in),
                             weights[0], state[0], rngs[0])
      stack = cb.outputs_onto_stack(cr_out, context, cr.n_in)
      attn = self._attention_layer
      residual, _, _, _ = attn.forward_and_or_backward(
          cb.inputs_from_stack(stack, attn.n_in), weights[1], new_state[1],
          rngs[1], output_grad=None, compute_output=True, update_state=False)
    else:
      residual, _ = self._residual(context, weights, state, rngs)
    return (output[0] - residual,) + context

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    _check_n_items(self, output, 'outputs')
    rngs = _split_rngs(rng, len(self.sublayers))
    acc_out, context = output[0], tuple(output[1:])
    acc_ct, context_ct = grad[0], tuple(grad[1:])

    if self._fused:
      residual, ctx_ct_from_f, weights_ct = self._fused_residual_and_grad(
          context, acc_ct, weights, state, new_state, rngs)
    else:
      def residual_fn(ctx, w):
        return self._residual(ctx, w, state, rngs)[0]
      residual, vjp_fn = jax.vjp(residual_fn, context, weights)
      ctx_ct_from_f, weights_ct = vjp_fn(_cotangent_like(acc_ct, residual))

    context_ct = tuple(_add_cotangents(a, b)
                       for a, b in zip(context_ct, ctx_ct_from_f))
    x = (acc_out - residual,) + context
    return x, ((acc_ct,) + context_ct, weights_ct)

  def _fused_residual_and_grad(self, context, acc_ct, weights, state,
                               new_state, rngs):
    """Residual and gradients through the attention layer's fused hook."""
    cr, attn = self._compute_residual, self._attention_layer

    def cr_fn(x, w):
      return cr.pure_fn(x, w, state[0], rngs[0])[0]

    cr_in = cb.inputs_from_stack(context, cr.n_in)
    cr_out, cr_vjp = jax.vjp(cr_fn, cr_in, weights[0])
    cr_items = _as_tuple(cr_out)
    stack = cr_items + context[cr.n_in:]
    residual, _, attn_in_ct, attn_w_ct = attn.forward_and_or_backward(
        cb.inputs_from_stack(stack, attn.n_in), weights[1], new_state[1],
        rngs[1], output_grad=acc_ct, compute_output=True, update_state=False)
    stack_ct = [None] * len(stack)
    for j, ct in enumerate(_as_tuple(attn_in_ct)):
      stack_ct[j] = ct
    cr_out_ct = tuple(_cotangent_like(c, p)
                      for c, p in zip(stack_ct[:len(cr_items)], cr_items))
    cr_out_ct = cr_out_ct if isinstance(cr_out, (list, tuple)) else cr_out_ct[0]
    cr_in_ct, cr_w_ct = cr_vjp(cr_out_ct)
    ctx_ct = [None] * len(context)
    for j, ct in enumerate(_as_tuple(cr_in_ct)):
      ctx_ct[j] = ct
    for j in range(len(cr_items), len(stack)):
      k = cr.n_in + j - len(cr_items)
      ctx_ct[k] = _add_cotangents(ctx_ct[k], stack_ct[j])
    ctx_ct = tuple(_cotangent_like(c, p) for c, p in zip(ctx_ct, context))
    return residual, ctx_ct, (cr_w_ct, attn_w_ct)

  def init_weights_and_state(self, input_signature):
    input_signature = _as_tuple(input_signature)
    _check_n_items(self, input_signature, 'inputs')
    acc, stack = input_signature[0], input_signature[1:]
    weights, states = [], []
    for i, layer in enumerate(self.sublayers):
      with in_sublayer(self, i):
        inputs = cb.inputs_from_stack(stack, layer.n_in)
        w, s = layer.init(inputs, use_cache=True)
        outputs = layer.output_signature(inputs)
      stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
      weights.append(w)
      states.append(s)
    residual = stack[0] if isinstance(stack, (list, tuple)) else stack
    _check_residual(self, acc, residual)
    self.state = tuple(states)
    self.weights = tuple(weights)


def _check_residual(layer, acc, residual):
  if tuple(acc.shape) != tuple(residual.shape):
    raise ValueError(
        f'{layer.name}: the residual has shape {tuple(residual.shape)} but the '
        f'accumulator (first input) has shape {tuple(acc.shape)}; they must be '
        f'equal for acc + f(ctx) to be reversible.')


# --- the reversible serial combinator ---------------------------------------------


class ReversibleSerial(ReversibleLayer, cb.Serial):
  """A `Serial` of reversible layers whose backward pass stores no activations.

  Under `jax.grad` it keeps only its outputs from the forward pass; the
  backward pass walks the layers last to first, rebuilding each layer's
  input from its output (`reverse_and_grad`) and accumulating the weight
  gradients, so memory does not grow with depth.
  """

  def __init__(self, *layers):
    super().__init__(*layers)
    self._predict_mode = None
    for i, layer in enumerate(self.sublayers):
      if not isinstance(layer, ReversibleLayer):
        raise ValueError(
            f'Sublayer {i} of ReversibleSerial is not reversible (not a '
            f'ReversibleLayer): {layer.name}. Wrap residual computations in '
            f'ReversibleHalfResidual and use ReversibleSwap/ReversibleSelect '
            f'for stack moves.')

  def forward(self, xs):
    """Runs the layers in order, each one's work tied to its inputs (see `_tie_to`)."""
    n = len(self.sublayers)
    if not n:
      return xs
    _check_depth(self, xs, self.n_in, 'inputs')
    weights, state = self.weights, self.state
    rngs = _split_rngs(self.rng, n)
    stack, new_state = xs, []
    tie = not self._decodes()
    for i, layer in enumerate(self.sublayers):
      w, s, r = weights[i], state[i], rngs[i]
      if tie:
        w, r = _tie_to((w, r), stack)
      with in_sublayer(self, i):
        _check_depth(layer, stack, layer.n_in, 'inputs')
        inputs = cb.inputs_from_stack(stack, layer.n_in)
        outputs, s = layer.pure_fn(inputs, w, s, r, use_cache=True)
      stack = cb.outputs_onto_stack(outputs, stack, layer.n_in)
      new_state.append(s)
    self.state = tuple(new_state)
    return stack

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
    rngs = _split_rngs(rng, n)
    stack, stack_ct = output, grad
    weights_ct = [None] * n
    for i in reversed(range(n)):
      layer = self.sublayers[i]
      w, s, ns, r = weights[i], state[i], new_state[i], rngs[i]
      if grad is not None:
        # Layer i's recomputation may start only once layer i+1's gradients
        # (inputs and weights) exist; otherwise XLA may run all
        # reconstructions first and keep O(depth) activations alive.
        prev_w_ct = weights_ct[i + 1] if i + 1 < n else ()
        w, r = _tie_to((w, r), (stack, stack_ct, prev_w_ct))
      with in_sublayer(self, i):
        _check_depth(layer, stack, layer.n_out, 'outputs to reverse')
        y = cb.inputs_from_stack(stack, layer.n_out)
        if grad is None:
          x = layer.reverse(y, w, s, ns, r)
        else:
          ct = cb.inputs_from_stack(stack_ct, layer.n_out)
          x, (x_ct, weights_ct[i]) = layer.reverse_and_grad(y, ct, w, s, ns, r)
          stack_ct = cb.outputs_onto_stack(x_ct, stack_ct, layer.n_out)
      stack = cb.outputs_onto_stack(x, stack, layer.n_out)
    return stack, (stack_ct, tuple(weights_ct))

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    return self._walk_back(output, None, weights, state, new_state, rng)[0]

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    if grad is None:
      raise ValueError('ReversibleSerial.reverse_and_grad needs a gradient; '
                       'got None (use reverse() to only reconstruct).')
    return self._walk_back(output, grad, weights, state, new_state, rng)


def _check_depth(layer, stack, n, what):
  """Raises a clear error if the stack holds fewer than `n` items for `layer`."""
  have = len(stack) if isinstance(stack, (list, tuple)) else 1
  if have < n:
    raise ValueError(f'{layer.name} needs {n} {what} but the stack holds '
                     f'{have}: {base.signature(stack)}.')
