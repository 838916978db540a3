"""`ReversibleHalfResidual`: `[acc, *ctx] -> [acc + f(ctx), *ctx]`, inverted by subtraction."""

import jax

from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers.cotangents import add_cotangents
from retrax.layers.cotangents import cotangent_like
from retrax.layers.reversible.layer import check_items
from retrax.layers.reversible.layer import ReversibleLayer
from retrax.layers.stack import init_layers
from retrax.layers.stack import inputs_from_stack
from retrax.layers.stack import make_tuple
from retrax.layers.stack import n_inputs_n_outputs
from retrax.layers.stack import outputs_onto_stack
from retrax.layers.stack import run_layers
from retrax.layers.stack import split_rngs


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
    n_in, n_out = n_inputs_n_outputs(self._sublayers)
    if n_out < 1:
      raise ValueError(
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
    residual, new_state = self._residual(context, self.weights, self.state,
                                         rngs)
    _check_residual(self, acc, residual)
    self.state = new_state
    return (acc + residual,) + context

  def _residual(self, context, weights, state, rngs):
    """Runs the sublayers on the context stack: returns `(residual, new_state)`."""
    stack, new_state = run_layers(self, self.sublayers, context, weights,
                                  state, rngs, use_cache=False)
    return make_tuple(stack)[0], new_state

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
      attn = self._attention_layer
      residual, _, _, _ = attn.forward_and_or_backward(
          inputs_from_stack(stack, attn.n_in), weights[1], new_state[1],
          rngs[1], output_grad=None, compute_output=True, update_state=False)
    else:
      residual, _ = self._residual(context, weights, state, rngs)
    return (output[0] - residual,) + context

  def reverse_and_grad(self, output, grad, weights=(), state=(), new_state=(),
                       rng=None):
    weights, state, new_state, rng = self._resolve(weights, state, new_state,
                                                   rng)
    check_items(self, output, 'outputs', 'reverse')
    rngs = split_rngs(rng, len(self.sublayers))
    acc_out, context = output[0], tuple(output[1:])
    acc_ct, context_ct = grad[0], tuple(grad[1:])

    if self._fused:
      residual, ctx_ct_from_f, weights_ct = self._fused_residual_and_grad(
          context, acc_ct, weights, state, new_state, rngs)
    else:
      def residual_fn(ctx, w):
        return self._residual(ctx, w, state, rngs)[0]
      residual, vjp_fn = jax.vjp(residual_fn, context, weights)
      ctx_ct_from_f, weights_ct = vjp_fn(cotangent_like(acc_ct, residual))

    context_ct = tuple(add_cotangents(a, b)
                       for a, b in zip(context_ct, ctx_ct_from_f))
    x = (acc_out - residual,) + context
    return x, ((acc_ct,) + context_ct, weights_ct)

  def _fused_residual_and_grad(self, context, acc_ct, weights, state,
                               new_state, rngs):
    """Residual and gradients through the attention layer's fused hook."""
    cr, attn = self._compute_residual, self._attention_layer

    def cr_fn(x, w):
      return cr.pure_fn(x, w, state[0], rngs[0])[0]

    cr_in = inputs_from_stack(context, cr.n_in)
    cr_out, cr_vjp = jax.vjp(cr_fn, cr_in, weights[0])
    cr_items = make_tuple(cr_out)
    stack = cr_items + context[cr.n_in:]
    residual, _, attn_in_ct, attn_w_ct = attn.forward_and_or_backward(
        inputs_from_stack(stack, attn.n_in), weights[1], new_state[1],
        rngs[1], output_grad=acc_ct, compute_output=True, update_state=False)
    stack_ct = [None] * len(stack)
    for j, ct in enumerate(make_tuple(attn_in_ct)):
      stack_ct[j] = ct
    cr_out_ct = tuple(cotangent_like(c, p)
                      for c, p in zip(stack_ct[:len(cr_items)], cr_items))
    cr_out_ct = cr_out_ct if isinstance(cr_out, (list, tuple)) else cr_out_ct[0]
    cr_in_ct, cr_w_ct = cr_vjp(cr_out_ct)
    ctx_cts: list = [None] * len(context)
    for j, ct in enumerate(make_tuple(cr_in_ct)):
      ctx_cts[j] = ct
    for j in range(len(cr_items), len(stack)):
      k = cr.n_in + j - len(cr_items)
      ctx_cts[k] = add_cotangents(ctx_cts[k], stack_ct[j])
    ctx_ct = tuple(cotangent_like(c, p) for c, p in zip(ctx_cts, context))
    return residual, ctx_ct, (cr_w_ct, attn_w_ct)

  def init_weights_and_state(self, input_signature):
    input_signature = make_tuple(input_signature)
    check_items(self, input_signature, 'inputs', 'init')
    acc, context = input_signature[0], input_signature[1:]
    stack, weights, self.state = init_layers(self, self.sublayers, context)
    _check_residual(self, acc, make_tuple(stack)[0])
    self.weights = weights


def _check_residual(layer, acc, residual):
  if tuple(acc.shape) != tuple(residual.shape):
    raise ValueError(
        f'{layer.name}: the residual has shape {tuple(residual.shape)} but the '
        f'accumulator (first input) has shape {tuple(acc.shape)}; they must be '
        f'equal for acc + f(ctx) to be reversible.')
