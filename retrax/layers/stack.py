"""The data stack, written once: its packing, the arity check and the layer runner.

A stack is one item (bare) or a tuple of items, top first. `run_layers` and
`init_layers` push a stack through sublayers in order, each taking its
`n_in` items off the top and pushing its `n_out` results; `Serial`,
`ReversibleHalfResidual` and `ReversibleSerial` are built on them.
"""

import jax

from retrax import fastmath
from retrax.layers.errors import in_sublayer
from retrax.layers.errors import input_error
from retrax.shapes import signature


def make_tuple(xs):
  """The stack as a tuple (a bare item becomes a 1-tuple)."""
  return tuple(xs) if isinstance(xs, (list, tuple)) else (xs,)


def single_or_tuple(xs):
  """A 1-item tuple or list as its item; anything else unchanged."""
  return xs[0] if isinstance(xs, (list, tuple)) and len(xs) == 1 else xs


def inputs_from_stack(stack, n):
  """Returns the top `n` items of the stack (one item bare)."""
  return single_or_tuple(make_tuple(stack)[:n])


def outputs_onto_stack(outputs, stack, n):
  """Returns the stack with its top `n` items replaced by `outputs`."""
  return single_or_tuple(make_tuple(outputs) + make_tuple(stack)[n:])


def check_arity(layer, items, n, function_name, what='inputs', exact=False):
  """Raises a LayerError for `layer` unless `items` holds `n` stack items.

  A tuple or list holds its length in items, anything else is one item.
  With `exact=False` more items may follow (a combinator leaves them on the
  stack) and `n <= 1` always passes; with `exact=True` exactly `n` are
  required.
  """
  if n <= 1 and not exact:
    return
  is_tuple = isinstance(items, (list, tuple))
  have = len(items) if is_tuple else 1
  if have == n or (have > n and not exact):
    return
  if not is_tuple:
    message = (f'{layer.name} expects a tuple of {n} {what}; got a single '
               f'{type(items).__name__}: {signature(items)}.')
  else:
    how = f'exactly n_in={n}' if exact else f'{n}'
    message = (f'{layer.name} expects {how} {what}; got {have}: '
               f'{signature(tuple(items))}.')
  raise input_error(layer, function_name, items, message)


def n_inputs_n_outputs(layers):
  """`(n_in, n_out)` of running `layers` in series on one stack."""
  running_max = running_total = 0
  for layer in layers:
    running_total += layer.n_in
    running_max = max(running_max, running_total)
    running_total -= layer.n_out
  return running_max, running_max - running_total


# Eagerly, `jax.random.split` and then indexing its result cost a dispatch
# per key; a combinator splits at every call (~100 per token of a
# predict-mode ReformerLM called in a Python loop): one compiled call instead.
_split_keys = jax.jit(lambda rng, n: tuple(jax.random.split(rng, n)),
                      static_argnums=1)


def split_rngs(rng, n):
  """`n` keys split from `rng` (all None if `rng` is None).

  Under tracing (and the NumPy backend) an array of keys; otherwise a tuple
  of them, made in one dispatch.
  """
  if rng is None:
    return (None,) * n
  if isinstance(rng, jax.core.Tracer) or fastmath.is_backend(
      fastmath.Backend.NUMPY):
    return fastmath.random.split(rng, n)
  return _split_keys(rng, n)


def run_layers(parent, layers, stack, weights, state, rngs, use_cache=True,
               prepare=None):
  """Runs `layers` in order on `stack`; returns `(stack, new_state)`.

  Layer `i` gets `weights[i]`, `state[i]` and `rngs[i]`; errors gain
  `parent[i]` in their path. `prepare(w, rng, stack) -> (w, rng)`, if given,
  may rewrite a layer's weights and key just before it runs.
  """
  if len(rngs) < len(layers):
    # An array of traced keys indexed past its end would clamp silently
    # (sublayers sharing a key).
    raise ValueError(f'{parent.name}: {len(rngs)} keys for its '
                     f'{len(layers)} sublayers.')
  new_state = []
  for i, layer in enumerate(layers):
    w, s, r = weights[i], state[i], rngs[i]
    if prepare is not None:
      w, r = prepare(w, r, stack)
    with in_sublayer(parent, i):
      check_arity(layer, stack, layer.n_in, 'pure_fn')
      inputs = inputs_from_stack(stack, layer.n_in)
      outputs, s = layer.pure_fn(inputs, w, s, r, use_cache=use_cache)
    stack = outputs_onto_stack(outputs, stack, layer.n_in)
    new_state.append(s)
  return stack, tuple(new_state)


def init_layers(parent, layers, stack):
  """Initializes `layers` in order on a stack of signatures.

  Returns `(output_stack, weights, state)`, the last two tuples with one
  entry per layer (cache markers for a layer seen before).
  """
  weights, states = [], []
  for i, layer in enumerate(layers):
    with in_sublayer(parent, i):
      check_arity(layer, stack, layer.n_in, 'init')
      inputs = inputs_from_stack(stack, layer.n_in)
      w, s = layer.init(inputs, use_cache=True)
      outputs = layer.output_signature(inputs)
    stack = outputs_onto_stack(outputs, stack, layer.n_in)
    weights.append(w)
    states.append(s)
  return stack, tuple(weights), tuple(states)
