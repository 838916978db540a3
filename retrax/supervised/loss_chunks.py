"""The forward pass of model + loss that a training step differentiates.

    forward = loss_chunks.forward_fn(model, loss_layer, loss_chunk_size)
    loss, new_state = forward(weights, state, batch, rng)

`weights`/`state` are those of `Serial(model, loss_layer)` (Trax's layout:
`(model_weights, loss_weights)`), `batch` a tuple `(inputs..., targets[,
weights])`. What `forward_fn` returns computes the same loss as
`Serial(model, loss_layer).pure_fn`, in one of three ways:

* `loss_chunk_size > 0`: the model's final `Dense` (plus any `LogSoftmax`
  after it) and the loss run over chunks of that many positions inside a
  rematerialized `lax.scan`, so the `[positions, vocab]` logits never exist
  whole, in the forward or the backward pass. The loss layer must take
  `(output, targets, weights)` and return the weights-weighted mean of a
  per-position loss (Trax's CrossEntropyLoss, WeightedCategoryCrossEntropy,
  L2Loss ...): the chunk means are recombined with the chunks' weight sums,
  which gives the unchunked value.
* `loss_chunk_size` 0 (the default): the same, over chunks of positions,
  chosen automatically for long sequences when the model ends in
  position-wise layers (`Concatenate`, `LayerNorm`, `Dense` ...) and the loss
  is a weighted mean over positions (see `_auto_chunked_forward_fn`).
* otherwise `Serial(model, loss_layer).pure_fn` itself.
"""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np

from retrax import fastmath
from retrax.layers import combinators
from retrax.layers import core
from retrax.layers import position_chunks
from retrax.layers.assert_shape import AssertShape
from retrax.layers.stack import make_tuple
from retrax.layers.stack import single_or_tuple
from retrax.validation import ArgumentValueError


def _forward_fn(model_with_loss):
  """`(weights, state, batch, rng) -> (loss, new_state)` of a model+loss layer."""

  def forward(weights, state, batch, rng):
    return model_with_loss.pure_fn(batch, weights, state, rng)
  return forward


# --- the chunked final dense + loss ------------------------------------------------


def _head_dense_path(layer):
  """For a head sublayer: index path to its Dense inside AssertShape wrappers."""
  if isinstance(layer, core.Dense):
    return ()
  if isinstance(layer, combinators.Serial):
    inner = [i for i, l in enumerate(layer.sublayers)
             if not isinstance(l, AssertShape)]
    if len(inner) == 1:
      sub = _head_dense_path(layer.sublayers[inner[0]])
      if sub is not None:
        return (inner[0],) + sub
  return None


def _split_head(model):
  """Returns `(head_start, [(index, dense_path or None), ...])` for chunking.

  The head is the model's last `Dense` (possibly wrapped by `assert_shape`)
  followed only by `LogSoftmax`/`Softmax`.
  """
  if not isinstance(model, combinators.Serial) or not model.sublayers:
    raise ArgumentValueError(
        'loss_chunk_size > 0 needs a model that is a Serial ending in a Dense '
        f'layer (optionally followed by LogSoftmax); got {model.name}.')
  subs = model.sublayers
  head = []
  for index in range(len(subs) - 1, -1, -1):
    layer = subs[index]
    if layer.name in ('LogSoftmax', 'Softmax'):
      head.append((index, None))
      continue
    path = _head_dense_path(layer)
    if path is None:
      break
    head.append((index, path))
    return index, head[::-1]
  names = [l.name for l in subs[-3:]]
  raise ArgumentValueError(
      'loss_chunk_size > 0 needs the model to end in a Dense layer, optionally '
      f'followed by LogSoftmax/Softmax; its last layers are {names}.')


def _get_path(tree, path):
  for i in path:
    tree = tree[i]
  return tree


def _get_sublayer(layer, path):
  for i in path:
    layer = layer.sublayers[i]
  return layer


def _run_body(layers, stack, weights, state, rngs):
  """Runs `layers` over `stack` exactly as `Serial.forward` does; returns
  `(stack, [new state per layer])`."""
  new_states = []
  for layer, w, s, rng in zip(layers, weights, state, rngs):
    inputs = combinators.inputs_from_stack(stack, layer.n_in)
    outputs, new_s = layer.pure_fn(inputs, w, s, rng, use_cache=True)
    stack = combinators.outputs_onto_stack(outputs, stack, layer.n_in)
    new_states.append(new_s)
  return stack, new_states


@contextlib.contextmanager
def _keeping_weights(model):
  """Puts `model`'s own weights and state back after a forward that ran its
  sublayers with `use_cache=True` (which leaves theirs set)."""
  saved = model.stacked_weights, model.state
  try:
    yield
  finally:
    model.state, model.weights = saved[1], saved[0]


def _run_model_body(model, stop, batch, model_w, model_s, rng):
  """Splits `rng` into the loss's key and one per sublayer (as `Serial` of
  the model and the loss would) and runs `model.sublayers[:stop]` on the
  batch's inputs: returns `(stack, new states, rngs, loss_rng)`."""
  model_rng, loss_rng = fastmath.random.split(rng, 2)
  rngs = fastmath.random.split(model_rng, len(model.sublayers))
  stack, new_states = _run_body(
      model.sublayers[:stop], combinators.inputs_from_stack(batch, model.n_in),
      model_w, model_s, rngs)
  return stack, new_states, rngs, loss_rng


def _position_chunks(x, targets, loss_weights, chunk_size):
  """`(x, targets, weights)` flattened over positions, zero-padded to a
  multiple of `chunk_size` and split into `[n_chunks, chunk_size, ...]`."""
  n = int(np.prod(targets.shape))
  pad = (-n) % chunk_size
  x = jnp.pad(x.reshape((n, x.shape[-1])), ((0, pad), (0, 0)))
  t = jnp.pad(targets.reshape((n,)), (0, pad))
  w = jnp.pad(loss_weights.reshape((n,)), (0, pad))
  n_chunks = (n + pad) // chunk_size
  return (x.reshape((n_chunks, chunk_size, x.shape[-1])),
          t.reshape((n_chunks, chunk_size)), w.reshape((n_chunks, chunk_size)))


def _weighted_mean_over_chunks(head, mean_loss, xs):
  """The weighted mean loss of `(x, targets, weights)` chunks `xs`.

  A rematerialized `lax.scan`: each chunk runs `head(x)` and
  `mean_loss(out, targets, weights)`; the chunks' means times their weight
  sums, summed in float32 and divided by all the weights, are the whole
  batch's weighted mean.
  """
  @jax.checkpoint
  def chunk(carry, chunk_xs):
    xc, tc, wc = chunk_xs
    w_sum = jnp.sum(wc)
    # An all-zero chunk (padding) gets weights 1 so that its mean stays
    # finite; its contribution (and gradient) is then multiplied by 0.
    safe_wc = jnp.where(w_sum > 0, wc, jnp.ones_like(wc))
    mean = mean_loss(head(xc), tc, safe_wc)
    contribution = jnp.where(w_sum > 0, mean * w_sum, 0.0)
    return (carry[0] + contribution.astype(jnp.float32),
            carry[1] + w_sum.astype(jnp.float32)), None

  zero = jnp.zeros((), jnp.float32)
  (total, w_total), _ = jax.lax.scan(chunk, (zero, zero), xs)
  return total / w_total


def _chunked_forward_fn(model, loss_layer, chunk_size):
  """Forward of `Serial(model, loss_layer)` with the head and loss in chunks."""
  if loss_layer.n_in != 3:
    raise ArgumentValueError(
        f'loss_chunk_size > 0 needs a loss layer taking (output, targets, '
        f'weights); {loss_layer.name} takes {loss_layer.n_in} inputs.')
  if model.n_out != 1:
    raise ArgumentValueError(
        f'loss_chunk_size > 0 needs a model with one output; {model.name} has '
        f'{model.n_out}.')
  head_start, head = _split_head(model)
  subs = model.sublayers

  def apply_head(x, model_weights, model_state, rngs):
    for index, path in head:
      layer = subs[index]
      w, s = model_weights[index], model_state[index]
      if path:  # The Dense inside assert_shape's Serial(AssertShape, ...).
        layer = _get_sublayer(layer, path)
        w, s = _get_path(w, path), _get_path(s, path)
      x, _ = layer.pure_fn(x, w, s, rngs[index])
    return x

  def forward(weights, state, batch, rng):
    (model_w, loss_w), (model_s, loss_s) = weights, state
    with _keeping_weights(model):
      x, new_states, rngs, loss_rng = _run_model_body(
          model, head_start, batch, model_w, model_s, rng)
      xs = _position_chunks(x, batch[model.n_in], batch[model.n_in + 1],
                            chunk_size)

      loss = _weighted_mean_over_chunks(
          lambda xc: apply_head(xc, model_w, model_s, rngs),
          lambda out, tc, wc: loss_layer.pure_fn((out, tc, wc), loss_w, loss_s,
                                                 loss_rng)[0], xs)
      new_state = (tuple(new_states) + tuple(model_s[head_start:]), loss_s)
      return loss, new_state

  return forward


# --- the head and loss over chunks of positions, automatically -----------------------

# Losses that are a weights-weighted mean over positions: the chunks' means
# times their weight sums, summed and divided by all the weights, are the
# whole batch's loss.
_WEIGHTED_MEAN_LOSSES = frozenset({
    'WeightedCategoryCrossEntropy', 'CrossEntropyLoss',
    'CrossEntropyLossWithLogSoftmax'})


def _position_wise_head(model):
  """Index of the first of `model`'s last sublayers that all act per position.

  None if there are none (or `model` is not a one-output Serial).
  """
  if not isinstance(model, combinators.Serial) or model.n_out != 1:
    return None
  subs = model.sublayers
  start = len(subs)
  while start and position_chunks.position_wise_width(subs[start - 1],
                                                      3) is not None:
    start -= 1
  return start if start < len(subs) else None


def _head_width(layers):
  return max([position_chunks.position_wise_width(l, 3) for l in layers] + [1])


def _auto_chunked_forward_fn(model, loss_layer, forward):
  """`forward`, but for long sequences with the head and loss over chunks of positions.

  The head is the longest run of position-wise layers (`position_chunks`)
  ending the model (ReformerLM's `Concatenate, LayerNorm, Dropout, Dense`):
  its `[batch, length, width]` activations, the logits and the loss's
  per-position values then exist one chunk of positions at a time (a
  rematerialized `lax.scan`), in the forward and the backward pass. Chosen
  at trace time from the shapes (`position_chunks.n_position_chunks` of the
  head's widest activation); short sequences, other losses and models, and
  weights not of the targets' shape run `forward`.
  """
  start = _position_wise_head(model)
  if (start is None or loss_layer.name not in _WEIGHTED_MEAN_LOSSES or
      loss_layer.n_in != 3):
    return forward
  subs = model.sublayers
  head = subs[start:]

  def run_head(stack, model_w, model_s, rngs):
    return _run_body(head, stack, model_w[start:], model_s[start:],
                     rngs[start:])[0]

  def auto_forward(weights, state, batch, rng):
    targets, loss_weights = batch[model.n_in], batch[model.n_in + 1]
    shape = tuple(np.shape(targets))
    if (len(shape) < 2 or tuple(np.shape(loss_weights)) != shape or
        position_chunks.n_position_chunks(
            shape + (1,), _head_width(head)) == 1):
      return forward(weights, state, batch, rng)  # Short (or not per position).
    (model_w, loss_w), (model_s, loss_s) = weights, state
    with _keeping_weights(model):
      stack, new_states, rngs, loss_rng = _run_model_body(
          model, start, batch, model_w, model_s, rng)
      items = make_tuple(stack)
      width = max(_head_width(head), sum(x.shape[-1] for x in items))
      n = position_chunks.n_position_chunks(shape + (width,), width)
      new_state = (tuple(new_states) + tuple(model_s[start:]), loss_s)
      if n == 1 or any(tuple(x.shape[:-1]) != shape for x in items):
        out = run_head(stack, model_w, model_s, rngs)
        loss, _ = loss_layer.pure_fn((out, targets, loss_weights), loss_w,
                                     loss_s, loss_rng)
        return loss, new_state

      xs = (tuple(position_chunks.to_chunks(x, n) for x in items),
            position_chunks.to_chunks(targets, n, axis=-1),
            position_chunks.to_chunks(loss_weights, n, axis=-1))
      loss = _weighted_mean_over_chunks(
          lambda xc: run_head(single_or_tuple(xc), model_w, model_s, rngs),
          lambda out, tc, wc: loss_layer.pure_fn((out, tc, wc), loss_w, loss_s,
                                                 loss_rng)[0], xs)
      return loss, new_state

  return auto_forward


def forward_fn(model, loss_layer, loss_chunk_size=0):
  """`(weights, state, batch, rng) -> (loss, new_state)` of `Serial(model,
  loss_layer)`, the head and loss in chunks as the module docstring says."""
  if loss_chunk_size and loss_chunk_size > 0:
    return _chunked_forward_fn(model, loss_layer, int(loss_chunk_size))
  return _auto_chunked_forward_fn(
      model, loss_layer, _forward_fn(combinators.Serial(model, loss_layer)))
