"""Loading real-Trax goldens stored as `NAME/<prefix><i>` leaves (see the generators)."""

import jax
import jax.numpy as jnp
import numpy as np

from retrax import shapes
from tests.backend_tolerance import float32_tolerance


def group(golden, name, prefix):
  """The arrays `NAME/<prefix>0, 1, ...` in order."""
  n = 0
  while f'{name}/{prefix}{n}' in golden:
    n += 1
  return [golden[f'{name}/{prefix}{i}'] for i in range(n)]


def with_leaves(tree, leaves):
  """`tree` with Trax's leaves, which must map one to one (count and shapes)."""
  own = jax.tree_util.tree_leaves(tree)
  assert len(own) == len(leaves), (len(own), len(leaves))
  for a, b in zip(own, leaves):
    assert tuple(np.shape(a)) == b.shape, (np.shape(a), b.shape)
  return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(tree),
                                      [jnp.asarray(x) for x in leaves])


def loaded(golden, name, layer):
  """(inputs, argument, weights, state) of case NAME with Trax's weights and state."""
  inputs = tuple(group(golden, name, 'in'))
  arg = inputs if len(inputs) > 1 else inputs[0]
  weights, state = layer.init(shapes.signature(arg))
  return (inputs, arg, with_leaves(weights, group(golden, name, 'w')),
          with_leaves(state, group(golden, name, 's')))


def close(actual, desired, tol=1e-5, scale=None):
  """Equal to `tol` of the larger of 1 and `scale` (default: the reference's largest magnitude).

  On a TPU `tol` is at least the float32 floor (`float32_tolerance`), as a
  fraction of the same scale. These models amplify float32 rounding: on the
  CPU, weights changed by a relative 1e-6 (~8 ulps) move Hourglass's logits
  by up to 6e-5..1.4e-4 of their scale and its gradients by 5.6e-4; on a v5e
  (2026-12-06) its logits were off Trax's by 4.6e-5..7e-5 of their scale,
  its gradients by 1.9e-4 (0.75 of 3965): within the floor's 5e-4.
  """
  desired = np.asarray(desired)
  scale = np.abs(desired).max() if scale is None else scale
  np.testing.assert_allclose(np.asarray(actual), desired,
                             **float32_tolerance(rtol=0, atol=tol,
                                                 scale=max(1.0, scale)))


def close_trees(actual, desired, tol=1e-5):
  """Leaf by leaf to `tol` of the largest magnitude over all of `desired`.

  Gradients that vanish in exact arithmetic (a key bias under softmax) are
  float32 rounding noise: a per-leaf scale would compare noise with noise.
  """
  actual = jax.tree_util.tree_leaves(actual)
  assert len(actual) == len(desired), (len(actual), len(desired))
  scale = max(float(np.abs(d).max()) for d in desired) if desired else 1.0
  for a, d in zip(actual, desired):
    close(a, d, tol, scale)


def call(layer, arg, weights, state, rng):
  """`layer.pure_fn` jitted (op-by-op dispatch of a whole model is slow)."""
  return jax.jit(layer.pure_fn)(arg, weights, state, rng)


def outputs(y):
  return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def grads(layer, inputs, weights, state, rng, jit=True):
  """Gradients of `sum(first output * ct)` w.r.t. weights and float inputs, given ct."""
  is_float = [x.dtype == np.float32 for x in inputs]

  def run(ct):
    def loss(w, floats):
      it = iter(floats)
      full = tuple(next(it) if f else x for x, f in zip(inputs, is_float))
      a = full if len(full) > 1 else full[0]
      return jnp.sum(outputs(layer.pure_fn(a, w, state, rng)[0])[0] * ct)
    floats = tuple(jnp.asarray(x) for x, f in zip(inputs, is_float) if f)
    grad = jax.grad(loss, argnums=(0, 1))
    return (jax.jit(grad) if jit else grad)(weights, floats)
  return run
