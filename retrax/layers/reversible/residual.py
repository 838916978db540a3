"""`ReversibleHalfResidual`: `[acc, *ctx] -> [acc + f(ctx), *ctx]`, inverted by subtraction."""

import jax
import jax.numpy as jnp

from retrax.errors import InputValueError
from retrax.layers.attention import groups as attention_groups
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers.cotangents import add_cotangents
from retrax.layers.cotangents import cotangent_like
from retrax.layers import position_chunks as chunks
from retrax.layers.reversible.layer import check_items
from retrax.layers.reversible.layer import ReversibleLayer
from retrax.layers.reversible.serial import tie_to
from retrax.layers.stack import init_layers
from retrax.layers.stack import inputs_from_stack
from retrax.layers.stack import make_tuple
from retrax.layers.stack import n_inputs_n_outputs
from retrax.layers.stack import outputs_onto_stack
from retrax.layers.stack import run_layers
from retrax.layers.stack import split_rngs
from retrax.validation import ArgumentTypeError
from retrax.validation import ArgumentValueError


# From this many accumulator elements on (512K positions of d_model 256:
# half a gigabyte per activation in float32), the fused backward pass runs
# the attention twice: forward to rebuild the input, then backward keeping
# no output. At the peak that is two output-sized buffers fewer (the output
# and the one it is subtracted from), for one more attention forward pass
# per layer (on CPU at 64K the step took ~25% longer), so only where memory
# is what limits the length.
TWO_PASS_MIN_ELEMENTS = 2 ** 27


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
        raise ArgumentTypeError(f'attention_layer must be a Layer or None; got '
                                f'{attention_layer!r}.')
      self._sublayers = (self._compute_residual, attention_layer)
    self._weights = tuple(None for _ in self._sublayers)
    self._state = tuple(None for _ in self._sublayers)
    n_in, n_out = n_inputs_n_outputs(self._sublayers)
    if n_out < 1:
      raise ArgumentValueError(
          f'ReversibleHalfResidual needs layers that leave a residual on the '
          f'stack; {self._sublayers} take {n_in} item(s) and leave {n_out}.')
    self._n_in = self._n_out = n_in + 1

  @property
  def _fused(self):
    return (self._attention_layer is not None and
            hasattr(self._attention_layer, 'forward_and_or_backward'))

  def forward(self, xs):
    check_items(self, xs, 'inputs', 'pure_fn')
    acc, context = xs[0], tuple(xs[1:])
    rngs = split_rngs(self.rng, len(self.sublayers))
    out, new_state = self._residual(context, self.weights, self.state, rngs,
                                    add_to=acc)
    self.state = new_state
    return (out,) + context

  def _residual(self, context, weights, state, rngs, add_to=None):
    """Runs the sublayers on the context stack: returns `(residual, new_state)`.

    With `add_to` (the accumulator), returns `(add_to + residual,
    new_state)`, the residual checked to have its shape. A long sequence
    through a position-wise `f` runs over chunks of positions (see
    `chunks`), each added into `add_to`'s buffer; its state is then
    returned unchanged (the position-wise layers have no state that
    changes).
    """
    n = self._n_chunks(context)
    if n > 1:
      def residual_fn(x):
        return self._residual((x,), weights, state, rngs)[0]
      if add_to is not None:
        _check_residual(self, add_to, jax.eval_shape(residual_fn, context[0]))
      return chunks.chunked_apply(residual_fn, context[0], n,
                                  add_to=add_to), state
    stack, new_state = run_layers(self, self.sublayers, context, weights,
                                  state, rngs, use_cache=False)
    residual = make_tuple(stack)[0]
    if add_to is None:
      return residual, new_state
    _check_residual(self, add_to, residual)
    return add_to + residual, new_state

  def _n_chunks(self, context):
    """Position chunks to run `f` in (1: whole); see `chunks.n_chunks`."""
    if self._attention_layer is not None or not context:
      return 1
    return chunks.n_chunks(self._compute_residual, context[0])

  def reverse(self, output, weights=(), state=(), new_state=(), rng=None):
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    check_items(self, output, 'outputs', 'reverse')
    rngs = split_rngs(rng, len(self.sublayers))
    context = tuple(output[1:])
    if self._fused:
      cr = self._compute_residual
      cr_out, _ = cr.pure_fn(inputs_from_stack(context, cr.n_in),
                             weights[0], state[0], rngs[0])
      stack = outputs_onto_stack(cr_out, context, cr.n_in)
      x0, _, _ = self._attend_and_subtract(
          output[0], inputs_from_stack(stack, self._attention_layer.n_in),
          weights[1], new_state[1], rngs[1], None)
      return (x0,) + context
    residual, _ = self._residual(context, weights, state, rngs)
    return (output[0] - residual,) + context

  def _attend_and_subtract(self, acc_out, attn_inputs, weights, new_state,
                           rng, acc_ct, **kwargs):
    """`(acc_out - attention(attn_inputs), inputs ct, weights ct)` by the fused hook.

    An attention layer that `supports_subtract_from` subtracts its heads
    from `acc_out`'s buffer (no second output-sized array). `kwargs` go to
    `forward_and_or_backward` (a prelude).
    """
    attn = self._attention_layer
    x = make_tuple(attn_inputs)[0]
    kwargs.update(output_grad=acc_ct, compute_output=True, update_state=False)
    if (getattr(attn, 'supports_subtract_from', False) and
        acc_out.shape == x.shape and acc_out.dtype == x.dtype):
      x0, _, in_ct, w_ct = attn.forward_and_or_backward(
          attn_inputs, weights, new_state, rng, subtract_from=acc_out,
          **kwargs)
      return x0, in_ct, w_ct
    residual, _, in_ct, w_ct = attn.forward_and_or_backward(
        attn_inputs, weights, new_state, rng, **kwargs)
    return acc_out - residual, in_ct, w_ct

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    check_items(self, output, 'outputs', 'reverse')
    rngs = split_rngs(rng, len(self.sublayers))
    acc_out, context = output[0], tuple(output[1:])
    acc_ct, context_ct = grad[0], tuple(grad[1:])

    if self._fused:
      prelude = self._prelude(acc_out, context, weights, state, rngs)
      if prelude is not None:
        x0, context_ct, weights_ct = self._folded_input_and_grad(
            prelude, context, context_ct, acc_out, acc_ct, weights,
            new_state, rngs)
      else:
        x0, context_ct_f, weights_ct = self._fused_input_and_grad(
            context, acc_out, acc_ct, weights, state, new_state, rngs)
        context_ct = tuple(add_cotangents(a, b)
                           for a, b in zip(context_ct, context_ct_f))
      return (x0,) + context, ((acc_ct,) + context_ct, weights_ct)
    if self._n_chunks(context) > 1:
      # One chunk of positions at a time: only its activations exist.
      def chunk_fn(x, w):
        return self._residual((x,), w, state, rngs)[0]
      residual, x_ct, weights_ct = chunks.chunked_vjp(
          chunk_fn, context[0], weights, cotangent_like(acc_ct, acc_out),
          self._n_chunks(context))
      ctx_ct_from_f = (x_ct,) + tuple(None for _ in context[1:])
    else:
      def residual_fn(ctx, w):
        return self._residual(ctx, w, state, rngs)[0]
      residual, vjp_fn = jax.vjp(residual_fn, context, weights)
      ctx_ct_from_f, weights_ct = vjp_fn(cotangent_like(acc_ct, residual))

    context_ct = tuple(add_cotangents(a, b)
                       for a, b in zip(context_ct, ctx_ct_from_f))
    x = (acc_out - residual,) + context
    return x, ((acc_ct,) + context_ct, weights_ct)

  def _fused_input_and_grad(self, context, acc_out, acc_ct, weights, state,
                            new_state, rngs):
    """`(acc input, context cotangents, weights cotangents)` by the fused hook.

    The layers before the attention (`f`'s LayerNorm) run forward only here,
    and are differentiated after the attention's passes, their forward
    recomputed then: a `jax.vjp` taken first kept its residuals (LayerNorm's
    centred and normalized inputs and their products, each as large as the
    input; at 1M tokens four `[L, d_model]` arrays of the step's peak, 4 of
    14.4 KB per token where XLA:CPU does not fuse them away) alive through
    both attention passes. The recomputation costs one element-wise pass.
    """
    cr, attn = self._compute_residual, self._attention_layer

    def cr_fn(x, w):
      return cr.pure_fn(x, w, state[0], rngs[0])[0]

    cr_in = inputs_from_stack(context, cr.n_in)
    cr_out = cr_fn(cr_in, weights[0])
    cr_items = make_tuple(cr_out)
    stack = cr_items + context[cr.n_in:]
    attn_inputs = inputs_from_stack(stack, attn.n_in)
    if acc_out.size < TWO_PASS_MIN_ELEMENTS:
      x0, attn_in_ct, attn_w_ct = self._attend_and_subtract(
          acc_out, attn_inputs, weights[1], new_state[1], rngs[1], acc_ct)
    else:
      # Rebuild the input first (forward only), then differentiate keeping
      # no output: the gradient pass is tied to the rebuilt input, so it
      # starts once the attention's output is gone.
      x0, _, _ = self._attend_and_subtract(
          acc_out, attn_inputs, weights[1], new_state[1], rngs[1], None)
      attn_w, attn_rng = tie_to((weights[1], rngs[1]), x0)
      _, _, attn_in_ct, attn_w_ct = attn.forward_and_or_backward(
          attn_inputs, attn_w, new_state[1], attn_rng, output_grad=acc_ct,
          compute_output=False, update_state=False)
    stack_ct = [None] * len(stack)
    for j, ct in enumerate(make_tuple(attn_in_ct)):
      stack_ct[j] = ct
    cr_out_ct = tuple(cotangent_like(c, p)
                      for c, p in zip(stack_ct[:len(cr_items)], cr_items))
    cr_out_ct = cr_out_ct if isinstance(cr_out, (list, tuple)) else cr_out_ct[0]
    # Tied to the attention's input cotangents, the recomputation runs after
    # the attention, and XLA cannot merge it with the forward above (which
    # would keep the residuals alive again).
    _, cr_vjp = jax.vjp(cr_fn, *tie_to((cr_in, weights[0]),
                                       make_tuple(attn_in_ct)))
    cr_in_ct, cr_w_ct = cr_vjp(cr_out_ct)
    ctx_cts: list = [None] * len(context)
    for j, ct in enumerate(make_tuple(cr_in_ct)):
      ctx_cts[j] = ct
    for j in range(len(cr_items), len(stack)):
      k = cr.n_in + j - len(cr_items)
      ctx_cts[k] = add_cotangents(ctx_cts[k], stack_ct[j])
    ctx_ct = tuple(cotangent_like(c, p) for c, p in zip(ctx_cts, context))
    return x0, ctx_ct, (cr_w_ct, attn_w_ct)

  def _prelude(self, acc, context, weights, state, rngs):
    """`f`'s layers before the attention as a `Prelude` it runs group by group, or None.

    For position-wise layers (`chunks.position_wise_width`: a LayerNorm)
    from one input to one output of its shape, before an attention layer
    whose other inputs are masks and that `folds_prelude` for this input
    (heads run one group at a time: the longest sequences). The attention
    then never holds the LayerNorm's whole output or its cotangent beside
    its own work. Only from `TWO_PASS_MIN_ELEMENTS` on, where memory is
    what limits the length: the default ReformerLM's training step at 1M
    tokens plans 13% less memory (8.96 against 10.3 KB a token, XLA:CPU,
    with the feed-forward's chunks added in place), and at 64K on this
    path it took 1.08x as long (31.2 against 28.9 s).
    """
    cr, attn = self._compute_residual, self._attention_layer
    if (acc.size < TWO_PASS_MIN_ELEMENTS or
        cr.n_in != 1 or cr.n_out != 1 or not context or
        any(jnp.issubdtype(x.dtype, jnp.inexact)
            for x in context[1:attn.n_in]) or
        chunks.position_wise_width(cr, context[0].ndim) is None or
        not hasattr(attn, 'folds_prelude') or
        not attn.folds_prelude(context[0].shape)):
      return None

    def cr_fn(x, w):
      return cr.pure_fn(x, w, state[0], rngs[0])[0]
    out = jax.eval_shape(cr_fn, context[0], weights[0])
    if out.shape != context[0].shape or out.dtype != context[0].dtype:
      return None
    return attention_groups.Prelude(cr_fn, weights[0])

  def _folded_input_and_grad(self, prelude, context, context_ct, acc_out,
                             acc_ct, weights, new_state, rngs):
    """`(acc input, context cotangents, weights cotangents)`, `f`'s LayerNorm in the attention.

    The attention runs `prelude` (the LayerNorm) group by group and sums
    the first context item's cotangent onto the one it already has
    (`input_grad_init`), so that neither the LayerNorm's output nor a
    separate cotangent accumulator exists beside the loop.
    """
    attn = self._attention_layer
    attn_inputs = inputs_from_stack(context, attn.n_in)
    # Two passes, as `_fused_input_and_grad` makes them at these sizes: the
    # input rebuilt first, then the gradient pass, tied to it, keeping no
    # output.
    x0, _, _ = self._attend_and_subtract(
        acc_out, attn_inputs, weights[1], new_state[1], rngs[1], None,
        prelude=prelude)
    attn_w, attn_rng = tie_to((weights[1], rngs[1]), x0)
    _, _, attn_in_ct, (pre_w_ct, attn_w_ct) = attn.forward_and_or_backward(
        attn_inputs, attn_w, new_state[1], attn_rng,
        output_grad=cotangent_like(acc_ct, acc_out),
        compute_output=False, update_state=False, prelude=prelude,
        input_grad_init=cotangent_like(context_ct[0], context[0]))
    in_cts = make_tuple(attn_in_ct)
    ctx_ct = (in_cts[0],) + tuple(
        add_cotangents(context_ct[j], in_cts[j] if j < len(in_cts) else None)
        for j in range(1, len(context)))
    ctx_ct = tuple(cotangent_like(c, p) for c, p in zip(ctx_ct, context))
    return x0, ctx_ct, (pre_w_ct, attn_w_ct)

  def init_weights_and_state(self, input_signature):
    input_signature = make_tuple(input_signature)
    check_items(self, input_signature, 'inputs', 'init')
    acc, context = input_signature[0], input_signature[1:]
    stack, weights, self.state = init_layers(self, self.sublayers, context)
    _check_residual(self, acc, make_tuple(stack)[0])
    self.weights = weights


def _check_residual(layer, acc, residual):
  if tuple(acc.shape) != tuple(residual.shape):
    raise InputValueError(
        f'{layer.name}: the residual has shape {tuple(residual.shape)} but the '
        f'accumulator (first input) has shape {tuple(acc.shape)}; they must be '
        f'equal for acc + f(ctx) to be reversible.')
