"""Groups of (example, head) units for `EfficientAttentionBase`'s batched pass.

`batch * n_heads` units are cut into groups of `n_parallel_heads` (`Groups`);
`GroupRunner` runs the per-unit function over one group (vmapped) and, for
the backward pass, differentiates it right away (`jax.vjp`).
`run_projected` runs layers whose per-unit function is an input projection,
a core and an output projection (`UnitStages`) with the projections of all
heads at once and only the core per group. `PreludeRunner` runs a group
of such a layer after position-wise layers of its own (`Prelude`: the
LayerNorm before a reversible half-residual's attention).
"""

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from retrax.errors import InputValueError
from retrax.fastmath import precision
from retrax.layers import cotangents
from retrax.layers import position_chunks

# Largest copy of a group's inputs (one per head) that the batched pass makes
# to run the group's heads as batched matmuls (see `GroupRunner.forward`).
MAX_INPUT_COPY_BYTES = 1 << 20
# Matmul precision of `PreludeRunner`'s output-projection transpose (`d_o`
# and the weights' cotangent), the products that take the stream's
# cotangent in every group. At the default precision a TPU rounds that
# `[L, d_model]` cotangent to bfloat16, and XLA hoisted the copy out of the
# loop over groups: live through the whole attention backward pass, 1 GiB
# of the default model's 2M step (the chip's plan: 15.00 -> 14.03 GiB at
# 'highest'). Full precision makes no copy; by the FLOP count it costs
# ~0.5% of the default model's 1M step on a TPU (not yet timed there), and
# nothing on a CPU, whose float32 matmuls are full precision anyway.
TRANSPOSE_PRECISION = 'highest'


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


class UnitStages(NamedTuple):
  """A per-unit function as projection, core and output projection.

  `project(inputs, weights)`: the float inputs of every unit, a tuple of
  `[batch * n_heads, ...]` arrays (row `example * n_heads + head`), linear
  in the layer's inputs up to a bias; `core(*units, *extras, state, rng,
  update_state) -> (o, new_state)` for one unit, `extras` being the layer's
  non-float inputs (masks) of the unit's example; `combine(o, weights,
  rng)`: the layer's output `[batch, ...]` from every unit's `o` (`[batch *
  n_heads, ...]`), linear in `o` (its output dropout included: the `rng`
  all units share gives every unit the same mask). `unit_depth`: the
  summed last dimension of `project`'s arrays (what their memory is
  planned by).
  """
  project: Callable[..., Any]
  core: Callable[..., Any]
  combine: Callable[..., Any]
  unit_depth: int


class Prelude(NamedTuple):
  """Position-wise layers that run, group by group, before the attention.

  `fn(x, weights)` maps the layer's first input, position by position, to
  what the attention attends over, with its shape and dtype (a reversible
  half-residual's LayerNorm); `weights` are `fn`'s.
  """
  fn: Callable[..., Any]
  weights: Any


class PreludeRunner(NamedTuple):
  """Runs a group as `prelude`, then `stages` (`UnitStages`, core and combine
  bound to the layer's rng).

  The prelude and the input projection run over `n_chunks` chunks of
  positions (a loop writing each chunk's projections in place), in both
  passes; the backward pass recomputes each chunk and adds its input's
  cotangent into the accumulator it is given. So neither the prelude's
  output nor its cotangent exists whole (at 1M tokens each is as large as
  the layer's input: two `[L, d_model]` arrays of the reversible step's
  peak), for one more prelude and projection pass per group. The cores
  run per unit (vmapped), the output projection as in `run_projected`.
  Only the first input is differentiable (the others, masks, go to the
  cores as they are).
  """
  prelude: Prelude
  stages: UnitStages
  groups: Groups
  todo: Todo
  n_chunks: int

  def _chunk(self, a, i):
    """Chunk `i` of `a`'s positions (axis -2)."""
    return position_chunks.chunk(a, i, self.n_chunks)

  def _project_chunk(self, xc, w_pre, w):
    """The units' projections of positions `xc [E, c, M]`: `[E * G, c, d]` each."""
    return self.stages.project((self.prelude.fn(xc, w_pre),), w)

  def _project(self, x, w_pre, w):
    """The units' projections `[E * G, L, d]` each, chunk by chunk."""
    shapes = jax.eval_shape(self._project_chunk, self._chunk(x, 0), w_pre, w)
    units0 = tuple(jnp.zeros(a.shape[:-2] + (x.shape[-2],) + a.shape[-1:],
                             a.dtype) for a in shapes)

    def body(i, units):
      new = self._project_chunk(self._chunk(x, i), w_pre, w)
      return tuple(position_chunks.update_chunk(u, n, i, self.n_chunks)
                   for u, n in zip(units, new))
    return lax.fori_loop(0, self.n_chunks, body, units0)

  def _cores(self, units, xs, s):
    """`(the units' core outputs [E * G, L, d], new state [E, G, ...])`."""
    n_units = self.groups.examples * self.groups.heads
    extras = tuple(jnp.repeat(x, self.groups.heads, axis=0) for x in xs[1:])
    s = jax.tree_util.tree_map(
        lambda a: a.reshape((n_units,) + a.shape[2:]), s)
    o, new_s = run_cores(self.stages.core, units, extras, s)
    new_s = jax.tree_util.tree_map(
        lambda a: a.reshape((self.groups.examples, self.groups.heads) +
                            a.shape[1:]), new_s)
    return o, new_s

  def _combine(self, o, w, dtype):
    return self.stages.combine(o, w).astype(dtype)

  def run(self, xs, w, s, ct, w_pre, dx_acc):
    """`(out, new_state, dx_acc, weights cotangent, prelude's weights cotangent)`.

    `xs [E, ...]`, `w [G, ...]`, `s [E, G, ...]`; `dx_acc`: the first
    input's cotangent so far (returned with this group's added), None
    without a backward pass (the cotangents are None then).
    """
    x = xs[0]
    units = self._project(x, w_pre, w)
    if not self.todo.grad:
      o, new_s = self._cores(units, xs, s)
      return self._combine(o, w, x.dtype), new_s, None, None, None
    s = lax.stop_gradient(s)
    o, cores_vjp, new_s = jax.vjp(lambda u: self._cores(u, xs, s), units,
                                  has_aux=True)
    out = self._combine(o, w, x.dtype)
    ct = ct.astype(x.dtype)
    # The output projection is linear in `o`: its vjp at `o` is its transpose.
    with jax.default_matmul_precision(TRANSPOSE_PRECISION):
      _, combine_vjp = jax.vjp(lambda o: self._combine(o, w, x.dtype), o)
    (d_units,) = cores_vjp(combine_vjp(ct)[0])

    # Every weight cotangent of a chunk's positions (summed in float32), its
    # input's added into `dx_acc` in place (whole, the output projection's
    # weight cotangent made XLA:CPU copy `ct` transposed, another
    # input-sized array).
    def body(i, carry):
      dx_acc, w_pre_ct, w_ct = carry
      _, chunk_vjp = jax.vjp(self._project_chunk, self._chunk(x, i), w_pre, w)
      xc_ct, w_pre_ct_c, w_ct_in = chunk_vjp(
          tuple(self._chunk(d, i) for d in d_units))
      with jax.default_matmul_precision(TRANSPOSE_PRECISION):
        _, combine_w_vjp = jax.vjp(
            lambda w: self._combine(self._chunk(o, i), w, x.dtype), w)
      (w_ct_out,) = combine_w_vjp(self._chunk(ct, i))
      dx_acc = position_chunks.update_chunk(
          dx_acc, self._chunk(dx_acc, i) + xc_ct, i, self.n_chunks)
      add = lambda acc, *cts: jax.tree_util.tree_map(
          lambda a, *gs: a + sum(g.astype(a.dtype) for g in gs), acc, *cts)
      return dx_acc, add(w_pre_ct, w_pre_ct_c), add(w_ct, w_ct_in, w_ct_out)

    zeros = lambda t: jax.tree_util.tree_map(
        lambda a: jnp.zeros(a.shape, jnp.promote_types(a.dtype, jnp.float32)),
        t)
    cast = lambda sums, t: jax.tree_util.tree_map(
        lambda g, a: g.astype(a.dtype), sums, t)
    dx_acc, w_pre_ct, w_ct = lax.fori_loop(
        0, self.n_chunks, body, (dx_acc, zeros(w_pre), zeros(w)))
    return out, new_s, dx_acc, cast(w_ct, w), cast(w_pre_ct, w_pre)


def run_cores(core, units, extras, state):
  """`core(*units_u, *extras_u, state=s_u)` of every unit (row): `(o, new_state)`.

  Vmapped over the rows; one row runs without vmap (see `GroupRunner.forward`).
  """
  def unit(units_u, extras_u, s_u):
    return core(*units_u, *extras_u, state=s_u)
  if jax.tree_util.tree_leaves(units)[0].shape[0] > 1:
    return jax.vmap(unit)(units, extras, state)
  first = lambda t: jax.tree_util.tree_map(lambda a: a[0], t)
  out = unit(first(units), first(extras), first(state))
  return jax.tree_util.tree_map(lambda a: a[None], out)


def run_projected(stages, n_heads, group_size, inputs, weights, state, rng,
                  todo, output_grad, subtract_from, loop):
  """`(out, new_state, inputs cotangents, weights cotangent)` by `stages`.

  The projections of all units are two matmuls of the whole batch (input
  and output), not one pair per unit: a unit's own `[L, d_model] @
  [d_model, d_head]` projection read the whole input and added an `[L,
  d_model]` output into an accumulator, once per head in both passes (on
  a TPU v5e, 62 of the paper-size training step's 257 ms at 16K; the step
  took 194 ms with this). The cores run `group_size` units at a time
  (`loop`: `lax.scan` or its Python unrolling); the backward pass
  recomputes them and differentiates each group right away, as
  `GroupRunner` does. Costs the projected inputs of
  all units, their cotangents and the cores' outputs in memory (about
  three copies of the layer's input for `n_heads * d_head == d_model`).
  `state` holds one row per unit; `new_state` comes back the same way.
  """
  batch = inputs[0].shape[0]
  n_units = batch * n_heads
  n_groups = n_units // group_size
  differentiable = todo.differentiable
  extras = tuple(jnp.repeat(x, n_heads, axis=0)
                 for x, d in zip(inputs, differentiable) if not d)
  d_xs = tuple(x for x, d in zip(inputs, differentiable) if d)

  def project(d_xs, w):
    d_iter = iter(d_xs)
    full = tuple(next(d_iter) if d else x for x, d in zip(inputs, differentiable))
    return stages.project(full, w)

  if todo.grad:
    units, project_vjp = jax.vjp(project, d_xs, weights)
  else:
    units = project(d_xs, weights)
  combine = lambda o, w: stages.combine(o, w, rng).astype(inputs[0].dtype)

  def group_fn(units_g, extras_g, s_g):
    return run_cores(functools.partial(stages.core, rng=rng,
                                       update_state=todo.state),
                     units_g, extras_g, s_g)

  split = lambda t: jax.tree_util.tree_map(
      lambda a: a.reshape((n_groups, group_size) + a.shape[1:]), t)
  merge = lambda t: jax.tree_util.tree_map(
      lambda a: a.reshape((n_units,) + a.shape[2:]), t)
  s = lax.stop_gradient(state)
  d_o = None
  if todo.grad:
    o_shape = jax.eval_shape(lambda: group_fn(
        *jax.tree_util.tree_map(lambda a: a[:group_size],
                                (units, extras, s)))[0])
    # `combine` is linear in `o`: its vjp at zeros is its transpose (the
    # forward product at zeros is unused, and XLA drops it).
    _, d_o_vjp = jax.vjp(
        lambda o: combine(o, weights),
        jnp.zeros((n_units,) + o_shape.shape[1:], o_shape.dtype))
    (d_o,) = d_o_vjp(output_grad.astype(inputs[0].dtype))

  def body(carry, xs):
    units_g, extras_g, s_g, d_o_g = xs
    if not todo.grad:
      o, new_s = group_fn(units_g, extras_g, s_g)
      return carry, (o, new_s if todo.state else None, None)
    o, vjp_fn, new_s = jax.vjp(lambda u: group_fn(u, extras_g, s_g), units_g,
                               has_aux=True)
    (d_units,) = vjp_fn(d_o_g.astype(o.dtype))
    return carry, (o, new_s if todo.state else None, d_units)

  _, (o, new_state, d_units) = loop(
      body, None, split((units, extras, s, d_o)), n_groups)
  o = merge(o)
  new_state = merge(new_state) if todo.state else None
  out = None
  if todo.output:
    out = combine(o, weights)
    if subtract_from is not None:
      out = subtract_from - out
  if not todo.grad:
    return out, new_state, None, None
  _, combine_vjp = jax.vjp(lambda w: combine(o, w), weights)
  (w_ct_out,) = combine_vjp(output_grad.astype(inputs[0].dtype))
  dx, w_ct_in = project_vjp(merge(d_units))
  w_ct = jax.tree_util.tree_map(jnp.add, w_ct_in, w_ct_out)
  return out, new_state, dx, w_ct


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
