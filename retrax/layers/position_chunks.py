"""Position-wise layers over chunks of the sequence: the long-sequence memory policy.

Layers that act on each position on its own (the Reformer's feed-forward:
`LayerNorm, Dense(d_ff), Dropout, activation, Dense(d_model), Dropout`; a
model's head: `Concatenate, LayerNorm, Dense(vocab)`) need, run whole, their
`[..., length, width]` activations and cotangents at once: at 1M tokens and
d_ff 1024 that is 4 GiB each. Run over chunks of positions (a `lax.scan`),
only one chunk's exist at a time, and weight gradients are summed over the
chunks (Trax's `ff_chunk_size` and loss chunking, chosen here
automatically). `ReversibleHalfResidual` runs its feed-forward this way, the
training step its model's head and loss (`supervised.loss_chunks`).

The math is unchanged except for the order of the weight gradients' float
sums: every chunk gets the same rng, and dropout is chunked only when its
mask is shared over positions (one mask row, the same in every chunk) or it
is off. Sequences short enough that the widest activation fits in
`CHUNK_ELEMENTS` twice over keep the unchunked path.
"""

import jax
import numpy as np

from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import normalization
from retrax.layers import stack_ops
from retrax.layers.assert_shape import AssertShape

# Elements of the widest per-position activation in one chunk (all leading
# axes together): 2**22 float32s are 16 MiB, e.g. 4096 positions x d_ff 1024.
CHUNK_ELEMENTS = 2 ** 22

# Element-wise activation layers (`tl.Fn`s of `activation_fns`), by name.
_ELEMENTWISE = frozenset({
    'Relu', 'ParametricRelu', 'LeakyRelu', 'Elu', 'Selu', 'Gelu', 'FastGelu',
    'Sigmoid', 'Tanh', 'HardSigmoid', 'HardTanh', 'Softplus', 'Exp', 'Log',
    'Swish'})


def position_wise_width(layer, ndim):
  """The widest output of `layer` per position, or None if it mixes positions.

  For inputs of `ndim` axes, positions on axis `ndim - 2`. Known
  position-wise layers only: Dense, LayerNorm, element-wise activations,
  shape assertions, concatenation along the last axis, and Dropout that is
  off or whose mask is shared over positions, in a Serial.
  """
  if isinstance(layer, (AssertShape, normalization.LayerNorm)):
    return 0
  if isinstance(layer, core.Dense):
    return layer.n_units
  if isinstance(layer, core.Dropout):
    return 0 if ndim >= 2 and layer.same_mask_along(ndim - 2, ndim) else None
  if type(layer) is stack_ops.Concatenate and layer.name == 'Concatenate':
    return 0  # Along the last axis: its inputs' widths summed.
  if type(layer) is base.PureLayer and layer.name in _ELEMENTWISE:
    return 0
  if type(layer) is cb.Serial:
    widths = [position_wise_width(l, ndim) for l in layer.sublayers]
    if any(w is None for w in widths):
      return None
    return max(widths, default=0)
  return None


def n_position_chunks(shape, width):
  """Chunks of positions for activations `[..., length, width]` (1: whole).

  More than one when they hold more than `2 * CHUNK_ELEMENTS` elements:
  then chunks of about `CHUNK_ELEMENTS`.
  """
  rows = int(np.prod(shape[:-1]))
  if rows * width <= 2 * CHUNK_ELEMENTS:
    return 1
  per_position = (rows // shape[-2]) * width
  chunk = max(CHUNK_ELEMENTS // per_position, 1)
  return -(-shape[-2] // chunk)


def n_chunks(layer, x):
  """How many position chunks to run `layer` (one input) over `x` in; 1: whole.

  More than one only for a known position-wise `layer` on a floating
  `[..., length, d]` input whose widest activation exceeds
  `2 * CHUNK_ELEMENTS`.
  """
  shape = getattr(x, 'shape', None)
  if (layer.n_in != 1 or layer.n_out != 1 or shape is None or len(shape) < 2
      or not jnp.issubdtype(x.dtype, jnp.floating)):
    return 1
  width = position_wise_width(layer, len(shape))
  if width is None:
    return 1
  return n_position_chunks(shape, max(width, shape[-1]))


def to_chunks(x, n, axis=-2):
  """`x` cut along `axis` into `n` chunks: `[n, ...]` (zero-padded at the end)."""
  axis %= x.ndim
  length = x.shape[axis]
  chunk = -(-length // n)
  pad = n * chunk - length
  if pad:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    x = jnp.pad(x, widths)
  x = jnp.reshape(x, x.shape[:axis] + (n, chunk) + x.shape[axis + 1:])
  return jnp.moveaxis(x, axis, 0)


def from_chunks(x, length, axis=-2):
  """`to_chunks`' inverse: `[n, ...]` chunks of `axis` joined, cut to `length`."""
  axis %= x.ndim - 1
  x = jnp.moveaxis(x, 0, axis)
  x = jnp.reshape(x, x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) +
                  x.shape[axis + 2:])
  return jax.lax.slice_in_dim(x, 0, length, axis=axis)


def divisor_chunks(length, n):
  """The fewest chunks, `n` or more, that divide `length` evenly; None if over `2 * n`."""
  return next((k for k in range(n, min(2 * n, length) + 1) if length % k == 0),
              None)


def chunk(x, i, k, axis=-2):
  """Chunk `i` (traced or not) of `k` equal chunks of `x` along `axis`."""
  size = x.shape[axis] // k
  return jax.lax.dynamic_slice_in_dim(x, i * size, size, axis=axis)


def update_chunk(x, y, i, k, axis=-2):
  """`x` with chunk `i` of `k` equal chunks along `axis` replaced by `y` (in place)."""
  return jax.lax.dynamic_update_slice_in_dim(x, y, i * (x.shape[axis] // k),
                                             axis=axis)


def chunked_apply(fn, x, n, add_to=None):
  """`fn(x)`, or `add_to + fn(x)`, for a position-wise `fn` over `n` chunks of positions.

  Where some `k` of `n` to `2n` chunks divide the length, a loop writes each
  chunk's output in place, into `add_to`'s buffer when given: neither the
  input's chunks nor the stacked outputs are copied (at 1M tokens each of
  those copies is as large as the input). Otherwise `n` zero-padded chunks
  are mapped over.
  """
  length = x.shape[-2]
  k = divisor_chunks(length, n)
  if k is None:
    y = from_chunks(jax.lax.map(fn, to_chunks(x, n)), length)
    return y if add_to is None else add_to + y
  y0 = jax.eval_shape(fn, chunk(x, 0, k))
  adding = add_to is not None
  if adding:  # The dtype `add_to + fn(x)` would have.
    add_to = add_to.astype(jnp.result_type(add_to, y0))
  else:
    add_to = jnp.zeros(y0.shape[:-2] + (length,) + y0.shape[-1:], y0.dtype)

  def body(i, out):
    y = fn(chunk(x, i, k))
    y = chunk(out, i, k) + y if adding else y
    return update_chunk(out, y.astype(out.dtype), i, k)
  return jax.lax.fori_loop(0, k, body, add_to)


def chunked_vjp(fn, x, weights, ct, n):
  """`(fn(x, weights), x_ct, weights_ct)` of a position-wise `fn` over `n` chunks.

  The vjp of each chunk runs inside a `lax.scan`; the weight cotangents are
  summed over the chunks in float32 (cast to the weights' dtypes at the end).
  """
  def body(acc, chunk):
    xc, ctc = chunk
    y, vjp_fn = jax.vjp(fn, xc, weights)
    x_ct, w_ct = vjp_fn(ctc.astype(y.dtype))
    acc = jax.tree_util.tree_map(lambda a, g: a + g.astype(a.dtype), acc, w_ct)
    return acc, (y, x_ct)

  zeros = jax.tree_util.tree_map(
      lambda w: jnp.zeros(jnp.shape(w), _sum_dtype(w)), weights)
  w_ct, (ys, x_cts) = jax.lax.scan(body, zeros,
                                   (to_chunks(x, n), to_chunks(ct, n)))
  w_ct = jax.tree_util.tree_map(lambda g, w: g.astype(w.dtype), w_ct, weights)
  length = x.shape[-2]
  return from_chunks(ys, length), from_chunks(x_cts, length), w_ct


def _sum_dtype(w):
  return jnp.promote_types(w.dtype, jnp.float32)
