"""Groups of (example, head) units for `EfficientAttentionBase`'s batched pass.

`batch * n_heads` units are cut into groups of `n_parallel_heads` (`Groups`);
`GroupRunner` runs the per-unit function over one group (vmapped) and, for
the backward pass, differentiates it right away (`jax.vjp`).
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax.layers import cotangents

# Largest copy of a group's inputs (one per head) that the batched pass makes
# to run the group's heads as batched matmuls (see `GroupRunner.forward`).
MAX_INPUT_COPY_BYTES = 1 << 20


def is_differentiable(x):
  """True for inexact (float, complex) arrays."""
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


class Todo(NamedTuple):
  """What a pass computes: output, gradients, new state; differentiable inputs."""
  output: bool
  grad: bool
  state: bool
  differentiable: tuple


class Groups(NamedTuple):
  """How the `batch * n_heads` (example, head) units are cut into groups.

  A group holds `heads` heads of `examples` examples; `copy_inputs` says
  whether the group copies its inputs once per head (see `GroupRunner`).
  """
  n_units: int
  heads: int
  examples: int
  n_head_groups: int
  n_example_groups: int
  copy_inputs: bool

  @classmethod
  def plan(cls, layer, inputs, units_at_once):
    """The groups of `units_at_once` units (None: all) for these inputs."""
    batch_size, n_heads = inputs[0].shape[0], layer.n_heads
    n_units = batch_size * n_heads
    group = min(units_at_once or n_units, n_units)
    if n_units % group:
      raise InputValueError(
          f'{layer.name}: n_parallel_heads={layer.n_parallel_heads} must '
          f'divide batch * n_heads = {batch_size} * {n_heads}.')
    heads = min(group, n_heads)
    examples = max(1, group // n_heads)
    n_example_groups = batch_size // examples
    group_input_bytes = heads * sum(
        x.size // n_example_groups * x.dtype.itemsize for x in inputs)
    return cls(n_units, heads, examples, n_heads // heads, n_example_groups,
               group_input_bytes <= MAX_INPUT_COPY_BYTES)

  def check_state(self, layer, state):
    """Raises unless every state leaf has one row per unit."""
    for leaf in jax.tree_util.tree_leaves(state):
      if jnp.ndim(leaf) == 0 or leaf.shape[0] != self.n_units:
        rows = leaf.shape[0] if jnp.ndim(leaf) else 'no'
        raise InputValueError(
            f'{layer.name}: the state has {rows} rows but '
            f'needs batch * n_heads = {self.n_units // layer.n_heads} * '
            f'{layer.n_heads} = {self.n_units} (one per example and head); '
            'initialize the layer with inputs of batch size '
            f'{self.n_units // layer.n_heads} or 1 (a one-example state is '
            'copied for each example).')

  def split_examples(self, a):  # [B, ...] -> [n_eg, E, ...]
    return a.reshape((self.n_example_groups, self.examples) + a.shape[1:])

  def split_heads(self, a):  # [n_heads, ...] -> [n_hg, G, ...]
    return a.reshape((self.n_head_groups, self.heads) + a.shape[1:])

  def split_units(self, a):  # [B * n_heads, ...] -> [n_eg, n_hg, E, G, ...]
    a = a.reshape((self.n_example_groups, self.examples, self.n_head_groups,
                   self.heads) + a.shape[1:])
    return jnp.swapaxes(a, 1, 2)

  def merge_units(self, a):  # [n_eg, n_hg, E, G, ...] -> [B * n_heads, ...]
    return jnp.swapaxes(a, 1, 2).reshape((self.n_units,) + a.shape[4:])


class GroupRunner(NamedTuple):
  """Runs the per-unit function `fn` on one group, forward and maybe backward."""
  fn: Any
  groups: Groups
  todo: Todo

  def forward(self, xs, w, s):
    """All heads of a group: xs [E, ...], w [G, ...], s [E, G, ...].

    Small groups copy their inputs once per head and vmap over heads
    outermost: each head's matmuls then form one batched matmul whose
    results come out head-major, with no transposes of the [heads, examples,
    length, depth] activations (several times faster for small units).
    Larger groups share the inputs between heads (no copy).
    """
    def unit(x_u, w_u, s_u):
      return self.fn(*x_u, weights=w_u, state=s_u)
    if self.groups.heads == 1 and self.groups.examples == 1:
      # One unit: no vmap, whose batch dimensions of size 1 made XLA:CPU
      # copy output-sized cotangents into the layouts of its batched dots.
      out, new_s = unit(tuple(x[0] for x in xs),
                        jax.tree_util.tree_map(lambda a: a[0], w),
                        jax.tree_util.tree_map(lambda a: a[0, 0], s))
      return (out[None].astype(xs[0].dtype),
              jax.tree_util.tree_map(lambda a: a[None, None], new_s))
    with precision.vmapped():  # Its bfloat16 weight gradients on XLA:CPU.
      if self.groups.copy_inputs:
        xs = tuple(jnp.broadcast_to(x, (self.groups.heads,) + x.shape)
                   for x in xs)
        per_example = jax.vmap(unit, in_axes=(0, None, 0))
        out, new_s = jax.vmap(per_example, in_axes=(0, 0, 1),
                              out_axes=(0, 1))(xs, w, s)
        return jnp.sum(out, axis=0).astype(xs[0].dtype), new_s  # [E, L, d]
      per_head = jax.vmap(unit, in_axes=(None, 0, 0))
      out, new_s = jax.vmap(per_head, in_axes=(0, None, 0))(xs, w, s)
      return jnp.sum(out, axis=1).astype(xs[0].dtype), new_s

  def run(self, xs, w, s, ct):
    """`(out, new_state, inputs cotangents, weights cotangent)` of a group."""
    if not self.todo.grad:
      out, new_s = self.forward(xs, w, s)
      return out, new_s, None, None
    s = lax.stop_gradient(s)
    differentiable = self.todo.differentiable
    d_xs = tuple(x for x, d in zip(xs, differentiable) if d)

    def f(d_xs, w):
      d_iter = iter(d_xs)
      full = tuple(next(d_iter) if d else x
                   for x, d in zip(xs, differentiable))
      return self.forward(full, w, s)

    out, vjp_fn, new_s = jax.vjp(f, d_xs, w, has_aux=True)
    d_xs_ct, w_ct = vjp_fn(ct.astype(out.dtype))
    return out, new_s, d_xs_ct, w_ct


def inputs_grad(raw_inputs, dx, differentiable):
  """Input cotangents in the structure of `raw_inputs` (float0 zeros for ints)."""
  single_input = not isinstance(raw_inputs, (tuple, list))
  raw = (raw_inputs,) if single_input else tuple(raw_inputs)
  dx_iter = iter(dx)
  grads = tuple(next(dx_iter).reshape(jnp.shape(x)) if d
                else cotangents.float0_zeros(x)
                for x, d in zip(raw, differentiable))
  if single_input:
    return grads[0]
  return list(grads) if isinstance(raw_inputs, list) else grads
