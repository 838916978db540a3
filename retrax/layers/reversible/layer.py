"""`ReversibleLayer`: the base class of layers that can compute their inputs from their outputs.

See `retrax.layers.reversible` for the reversible layers and how their
backward pass replays randomness.
"""

import contextlib
from typing import Iterator

import jax

from retrax.layers import base
from retrax.layers.cotangents import match_structure
from retrax.layers.cotangents import zero_cotangent
from retrax.layers.stack import check_arity


# How many `plain_autodiff()` contexts are open (read at trace time).
_plain_autodiff_depth = 0


@contextlib.contextmanager
def plain_autodiff() -> Iterator[None]:
  """Within it, reversible layers are differentiated by plain autodiff.

  Traced inside this context, a reversible layer runs its forward pass as
  written and `jax.grad` differentiates it, keeping every layer's
  activations (O(depth) memory) instead of rebuilding them from the outputs.
  The reference for the reconstructing backward pass: the same function,
  weights and randomness, without the reconstruction. It applies to what is
  traced inside: a function jitted before keeps the gradient it was traced
  with.
  """
  global _plain_autodiff_depth
  _plain_autodiff_depth += 1
  try:
    yield
  finally:
    _plain_autodiff_depth -= 1


def _is_empty_tuple(x):
  return isinstance(x, tuple) and not x


def check_items(layer, xs, what, function_name):
  """Raises a LayerError unless `xs` holds exactly `layer.n_in` items (one: any)."""
  if layer.n_in != 1:
    check_arity(layer, xs, layer.n_in, function_name, what=what, exact=True)


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
      return self._forward_with(inputs, w, state, rng)[0]

    y, vjp_fn = jax.vjp(forward_fn, x, weights)
    x_grad, weights_grad = vjp_fn(match_structure(_as_like(grad, y), y))
    return x, (x_grad, weights_grad)

  @property
  def has_backward(self):
    return not _plain_autodiff_depth

  def backward(self, inputs, output, grad, weights, state, new_state, rng):
    """Custom backward pass through `reverse_and_grad`; `inputs` is unused."""
    del inputs
    _, inputs_and_weights_grad = self.reverse_and_grad(
        output, grad, weights, state, new_state, rng)
    return inputs_and_weights_grad

  def _resolve(self, weights, state, new_state, rng):
    """Fills in the defaults of `reverse`/`reverse_and_grad` arguments."""
    if _is_empty_tuple(weights):
      weights = self.stacked_weights
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
      return (match_structure(x_grad, primal_x),
              match_structure(w_grad, weights),
              zero_cotangent(state), zero_cotangent(rng))

    f.defvjp(f_fwd, f_bwd)
    # `self.rng`, not `self._rng`: a None key becomes the layer's own key
    # here, so that forward and backward both see the same one.
    return f(x, self.stacked_weights, self.state, self.rng)


def _as_like(grad, output):
  """Puts a list-or-tuple gradient into the output's container type."""
  if isinstance(output, tuple) and isinstance(grad, list):
    return tuple(grad)
  return grad
