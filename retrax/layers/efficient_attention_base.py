"""`EfficientAttentionBase`: per-head attention batched in memory-bounded groups.

An efficient-attention layer is written for ONE example and ONE head
(`forward_unbatched(*inputs, weights, state, rng, update_state)`); this base
class runs it over all `batch * n_heads` (example, head) units and sums the
heads' outputs. Units are processed in groups of `n_parallel_heads` (vmapped
inside a group, `lax.scan` across groups), so peak memory is that of one group.

The backward pass is custom (Trax's `forward_and_or_backward`): nothing of the
forward pass is kept but the inputs; each group is recomputed and
differentiated right away (forward-backward per group), and the state the
forward pass produced (e.g. LSH buckets) is replayed, not recomputed.

Weights are stacked over heads (`w[h]` is head `h`'s), state over units with
row `example * n_heads + head`. In `mode='predict'` (`incremental=True`) the
state is `(mem_end, mem, per_unit_state)`: `mem` holds the last
`predict_mem_len` inputs and `mem_end` how many are filled.
"""

import functools
import weakref

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from retrax.layers import base
from retrax.layers import validation
from retrax.shapes import ShapeDtype


# Largest copy of a group's inputs (one per head) that the batched pass makes
# to run the group's heads as batched matmuls (see `forward_and_or_backward`).
_MAX_INPUT_COPY_BYTES = 1 << 20


def _tree_stack(trees):
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs, axis=0), *trees)


# Per-layer jitted forward for eager calls (weak keys: dies with the layer).
_EAGER_FORWARD = weakref.WeakKeyDictionary()


def _is_differentiable(x):
  return jnp.issubdtype(jnp.asarray(x).dtype, jnp.inexact)


def _zero_cotangent(x):
  return np.zeros(jnp.shape(x), dtype=jax.dtypes.float0)


def drop_oldest(buf, drop_len):
  """`buf [n, mem_len, ...]` without its first `drop_len` positions, zero-filled."""
  return jnp.concatenate(
      [buf[:, drop_len:], jnp.zeros_like(buf[:, :drop_len])], axis=1)


class EfficientAttentionBase(base.Layer):
  """Base class for memory-efficient attention (Trax's `EfficientAttentionBase`).

  Subclasses override `create_weights_unbatched(input_signature, rng)`,
  `create_state_unbatched(input_signature, rng)` (default: no state),
  `forward_unbatched(*inputs, weights, state, rng, update_state)` and, for
  `mode='predict'`, `_incremental_forward_unbatched(*inputs, q_start, q_len,
  weights, state, rng, update_state)`. Each returns `(output [L, d_model],
  new_state)` for one example and one head.

  Args:
    n_heads: number of attention heads.
    n_in: number of inputs.
    n_parallel_heads: (example, head) units computed at once. None: all of them
      (fastest, most memory); 1: one at a time (least memory); a divisor of
      `n_heads`: that many heads of one example; a multiple of `n_heads`:
      `n_parallel_heads // n_heads` whole examples.
    incremental: fast inference (predict mode) with an input memory.
    predict_mem_len: inputs remembered in predict mode.
    predict_drop_len: inputs forgotten at once when the memory is full.
    use_python_loop: unroll the loop over groups in Python (debugging only).
    use_reference_code: run the plain per-example, per-head Python loop with
      standard autodiff (testing only).
  """

  def __init__(self, n_heads, n_in=1, n_parallel_heads=None, incremental=False,
               predict_mem_len=None, predict_drop_len=None,
               use_python_loop=False, use_reference_code=False):
    super().__init__(n_in=n_in, n_out=1)
    n_heads = validation.check_int(type(self).__name__, 'n_heads', n_heads, 1)
    self._n_heads = n_heads
    self._incremental = incremental
    if incremental:
      if predict_mem_len is None or predict_drop_len is None:
        raise ValueError('Fast inference (mode="predict") needs '
                         'predict_mem_len and predict_drop_len; got '
                         f'{predict_mem_len!r} and {predict_drop_len!r}.')
      if not 0 < predict_drop_len <= predict_mem_len:
        raise ValueError(
            f'Need 0 < predict_drop_len <= predict_mem_len; got '
            f'predict_mem_len={predict_mem_len}, '
            f'predict_drop_len={predict_drop_len}.')
      self._predict_mem_len = predict_mem_len
      self._predict_drop_len = predict_drop_len
    if n_parallel_heads:
      if ((n_parallel_heads > n_heads and n_parallel_heads % n_heads) or
          (n_parallel_heads < n_heads and n_heads % n_parallel_heads)):
        raise ValueError(
            f'n_parallel_heads must be a multiple or a divisor of n_heads '
            f'({n_heads}); got {n_parallel_heads}.')
      self._n_parallel_heads = n_parallel_heads
    else:
      self._n_parallel_heads = None
    self._use_python_loop = use_python_loop
    self._use_reference_code = use_reference_code

  # --- hooks for subclasses ---------------------------------------------------

  def create_weights_unbatched(self, input_signature, rng):
    raise NotImplementedError(
        f'{self.name} must override create_weights_unbatched.')

  def create_state_unbatched(self, input_signature, rng):
    del input_signature, rng
    return ()

  def _roll_predict_state(self, state):
    """The per-unit predict state once the memory dropped its oldest positions.

    Called with the state of all units (`[batch * n_heads, ...]` leaves) when
    the memory forgets its first `predict_drop_len` positions; subclasses
    caching per-position values shift them the same way (`drop_oldest`).
    Default: unchanged.
    """
    return state

  def forward_unbatched(self, *inputs, weights, state, rng, update_state):
    """Attention for one example and one head: returns `(output, new_state)`."""
    raise NotImplementedError(f'{self.name} must override forward_unbatched.')

  def _incremental_forward_unbatched(self, *inputs, q_start, q_len, weights,
                                     state, rng, update_state):
    raise NotImplementedError(
        f'Fast inference is not implemented for {self.name}.')

  def _init_signature(self, input_signature):
    """The input signatures the weights/state are built from (default: all)."""
    return input_signature

  def _predict_mem_signature(self, input_signature):
    """The inputs the predict-mode memory keeps (default: all)."""
    return input_signature

  def _check_inputs(self, inputs, weights):
    """Validates the tuple of inputs against the weights; returns it (normalised).

    Subclasses extend this to check masks and model widths with clear errors.
    """
    del weights
    x = inputs[0]
    if jnp.ndim(x) != 3:
      raise ValueError(f'{self.name} expects inputs of shape [batch, length, '
                       f'd_model]; got shape {jnp.shape(x)}.')
    return inputs

  # --- initialization -----------------------------------------------------------

  def init_weights_and_state(self, input_signature):
    sigs = (tuple(input_signature) if isinstance(input_signature, (tuple, list))
            else (input_signature,))
    sigs = tuple(self._init_signature(sigs))
    if len(sigs[0].shape) != 3:
      raise ValueError(f'{self.name} expects inputs of shape [batch, length, '
                       f'd_model]; got {sigs[0]}.')
    unbatched = tuple(ShapeDtype(s.shape[1:], s.dtype) for s in sigs)
    batch_size = int(sigs[0].shape[0])

    weight_rngs = jax.random.split(self.rng, self._n_heads)
    weights = _tree_stack([self.create_weights_unbatched(unbatched, weight_rngs[i])
                           for i in range(self._n_heads)])
    state_rngs = jax.random.split(self.rng, self._n_heads * batch_size)
    state = jax.vmap(lambda r: self.create_state_unbatched(unbatched, r))(
        state_rngs)
    if self._incremental:
      mem = tuple(
          jnp.zeros(s.shape[:1] + (self._predict_mem_len,) + s.shape[2:],
                    dtype=s.dtype)
          for s in self._predict_mem_signature(sigs))
      state = (jnp.zeros((), dtype=jnp.int32), mem, state)
    self.state = tuple(state)
    self.weights = tuple(weights)

  # --- forward ------------------------------------------------------------------

  def forward(self, inputs):
    if self._use_reference_code:
      return self._reference_forward(inputs)
    args = (inputs, self.weights, self.state, self.rng)
    leaves = jax.tree_util.tree_leaves(args)
    if any(isinstance(a, jax.core.Tracer) for a in leaves):
      output, new_state = self._forward(*args)
    else:
      # An eager call (the blog's token-by-token loop) runs one program
      # compiled per input shape, rather than dispatching every op and
      # compiling its loops (`lax.scan` over head groups) at each call.
      fn = _EAGER_FORWARD.get(self)
      if fn is None:
        ref = weakref.ref(self)
        fn = _EAGER_FORWARD[self] = jax.jit(lambda *a: ref()._forward(*a))  # pylint: disable=protected-access
      output, new_state = fn(*args)
    self.state = new_state
    return output

  def _forward(self, inputs, weights, state, rng):
    output, new_state, _, _ = self.forward_and_or_backward(
        inputs, weights, state, rng, compute_output=True, update_state=True)
    return output, new_state

  def _as_tuple(self, inputs, weights):
    if self.n_in == 1:
      if isinstance(inputs, (tuple, list)):
        raise TypeError(f'{self.name} takes one input array; got a '
                        f'{type(inputs).__name__} of {len(inputs)}.')
      inputs = (inputs,)
    else:
      if not isinstance(inputs, (tuple, list)) or len(inputs) != self.n_in:
        raise TypeError(f'{self.name} takes {self.n_in} inputs; got '
                        f'{base.signature(inputs)}.')
      inputs = tuple(inputs)
    return tuple(self._check_inputs(inputs, weights))

  def _reference_forward(self, inputs):
    """Plain loop over examples and heads (readable; for testing)."""
    weights, state, rng = self.weights, self.state, self.rng
    inputs = self._as_tuple(inputs, weights)
    batch_size, seqlen, d_model = inputs[0].shape
    if self._incremental:
      state, merge_rows = self._predict_state_rows(state, batch_size)
      inputs, state, q_start, new_mem, new_mem_end = self._use_predict_mem(
          inputs, state)
    outputs, new_state = [], []
    for example in range(batch_size):
      acc = jnp.zeros((seqlen, d_model), dtype=inputs[0].dtype)
      for head in range(self._n_heads):
        unit = example * self._n_heads + head
        # pylint: disable=cell-var-from-loop
        x = tuple(a[example] for a in inputs)
        w = jax.tree_util.tree_map(lambda a: a[head], weights)
        s = jax.tree_util.tree_map(lambda a: a[unit], state)
        # pylint: enable=cell-var-from-loop
        if self._incremental:
          out, s = self._incremental_forward_unbatched(
              *x, q_start=q_start, q_len=seqlen, weights=w, state=s, rng=rng,
              update_state=True)
        else:
          out, s = self.forward_unbatched(*x, weights=w, state=s, rng=rng,
                                          update_state=True)
        acc = acc + out
        new_state.append(s)
      outputs.append(acc)
    new_state = _tree_stack(new_state)
    if self._incremental:
      new_state = merge_rows((new_mem_end, tuple(new_mem), new_state))
    self.state = tuple(new_state)
    return jnp.stack(outputs, axis=0)

  def _predict_state_rows(self, state, batch_size):
    """The predict-mode state rows a call of `batch_size` examples runs on.

    The state is sized by the signature the layer was initialized with;
    `init_from_file` without a signature takes the file's (the training
    batch), and Trax then decodes a batch of 1 with it. A smaller batch runs
    on the first `batch_size` examples' rows, as in Trax (whose memory update
    broadcasts a batch-1 input and whose loop reads example 0 only). Returns
    `(state_for_the_call, merge)`; `merge(new_state)` writes the call's rows
    back into the full state, keeping its shape.
    """
    mem_end, mem, units = state
    leaves = jax.tree_util.tree_leaves(units)
    if mem:
      state_batch = jnp.shape(mem[0])[0]
    elif leaves and jnp.ndim(leaves[0]):
      state_batch = jnp.shape(leaves[0])[0] // self._n_heads
    else:
      state_batch = batch_size
    if state_batch == batch_size:
      return state, lambda new_state: new_state
    if batch_size > state_batch:
      raise ValueError(
          f'{self.name}: the predict-mode state holds {state_batch} '
          f'example(s) but the input has batch size {batch_size}; initialize '
          f'the layer (or pass input_signature= to init_from_file) with batch '
          f'size {batch_size}.')
    rows = batch_size * self._n_heads
    sub = (mem_end, tuple(m[:batch_size] for m in mem),
           jax.tree_util.tree_map(lambda a: a[:rows], units))

    def merge(new_state):
      new_end, new_mem, new_units = new_state
      full_mem = tuple(m.at[:batch_size].set(n.astype(m.dtype))
                       for m, n in zip(mem, new_mem))
      full_units = jax.tree_util.tree_map(
          lambda a, n: a.at[:rows].set(n.astype(a.dtype)), units, new_units)
      return (new_end, full_mem, full_units)
    return sub, merge

  def _use_predict_mem(self, inputs, state):
    """Appends `inputs` to the predict-mode memory.

    Returns `(inputs_to_attend, per_unit_state, q_start, new_mem, new_mem_end)`.
    A few new positions (at most `predict_drop_len`) go after the filled part,
    first dropping the oldest `predict_drop_len` if the memory would overflow
    (and rolling the per-unit state alike, see `_roll_predict_state`);
    a long input (a prompt) must come first and refills the memory (a long
    input later is flagged by NaN outputs, as in Trax).
    """
    mem_end, mem, state = state
    seqlen = inputs[0].shape[-2]
    mem_len, drop_len = self._predict_mem_len, self._predict_drop_len
    if seqlen <= drop_len and seqlen < mem_len:
      do_roll = mem_end + seqlen > mem_len
      mem, state = lax.cond(
          do_roll,
          lambda m, s: (tuple(drop_oldest(b, drop_len) for b in m),
                        self._roll_predict_state(s)),
          lambda m, s: (tuple(m), s), tuple(mem), state)
      mem_end = jnp.where(do_roll, mem_end - drop_len, mem_end)
      new_inputs = tuple(
          lax.dynamic_update_slice_in_dim(m, x.astype(m.dtype), mem_end, axis=1)
          for m, x in zip(mem, inputs))
      return new_inputs, state, mem_end, new_inputs, mem_end + seqlen

    new_mem = []
    for x in inputs[:len(mem)]:
      if seqlen >= mem_len:
        new_mem.append(x[:, seqlen - mem_len:])
      else:
        pad = jnp.zeros(x.shape[:1] + (mem_len - seqlen,) + x.shape[2:],
                        dtype=x.dtype)
        new_mem.append(jnp.concatenate([x, pad], axis=1))
    at_start = jnp.equal(mem_end, 0)
    inputs = tuple(
        jnp.where(at_start, x, jnp.nan).astype(x.dtype)
        if jnp.issubdtype(x.dtype, jnp.floating) else x for x in inputs)
    new_mem_end = jnp.asarray(min(seqlen, mem_len), dtype=jnp.int32)
    return inputs, state, 0, tuple(new_mem), new_mem_end

  # --- batched forward and backward ---------------------------------------------

  @property
  def has_backward(self):
    return not self._use_reference_code

  def backward(self, inputs, output, grad, weights, state, new_state, rng=None,
               **kwargs):
    """Gradients by per-group recomputation, replaying the forward's new state."""
    del output, state, kwargs
    _, _, inputs_grad, weights_grad = self.forward_and_or_backward(
        inputs, weights, new_state, rng, output_grad=grad,
        compute_output=False, update_state=False)
    return inputs_grad, weights_grad

  def _loop(self, body, carry, xs, length):
    """`lax.scan(body, carry, xs)`, unrolled in Python when asked or trivial."""
    if not (self._use_python_loop or length == 1):
      return lax.scan(body, carry, xs, length=length)
    ys = []
    for i in range(length):
      carry, y = body(carry, jax.tree_util.tree_map(lambda a: a[i], xs))  # pylint: disable=cell-var-from-loop
      ys.append(y)
    return carry, _tree_stack(ys)

  def forward_and_or_backward(self, inputs, weights, state, rng,
                              output_grad=None, compute_output=True,
                              update_state=True):
    """Batched forward and/or backward pass (Trax's signature).

    Args:
      inputs: the layer's input (an array, or a tuple for several inputs).
      weights: the layer's weights.
      state: the layer's state (for the backward pass, the state the forward
        pass returned, so that LSH buckets are replayed).
      rng: PRNG key, shared by all examples and heads (dropout).
      output_grad: cotangent of the output; the backward pass runs iff given.
      compute_output: whether to return the output.
      update_state: whether to compute and return a new state.

    Returns:
      `(output, new_state, inputs_grad, weights_grad)`, each None when not
      asked for. `inputs_grad` has the structure of `inputs` (float0 zeros for
      integer inputs such as masks).
    """
    single_input = not isinstance(inputs, (tuple, list))
    input_type = type(inputs)
    raw_inputs = (inputs,) if single_input else tuple(inputs)
    inputs = self._as_tuple(inputs, weights)
    batch_size, seqlen, d_model = inputs[0].shape
    compute_grad = output_grad is not None
    if not (compute_output or compute_grad):
      raise ValueError('forward_and_or_backward: nothing to compute (no '
                       'output asked and no output_grad given).')
    if compute_grad and jnp.shape(output_grad) != (batch_size, seqlen, d_model):
      raise ValueError(f'{self.name}: output_grad shape {jnp.shape(output_grad)}'
                       f' differs from the output shape '
                       f'{(batch_size, seqlen, d_model)}.')

    if self._incremental and compute_grad:
      raise NotImplementedError(
          f'{self.name}: gradients in mode="predict" are not supported; use '
          f'mode="train" or "eval" to differentiate.')
    if not self._incremental:
      fn = functools.partial(self.forward_unbatched, rng=rng,
                             update_state=update_state)
    else:
      if not update_state:
        raise ValueError(f'{self.name}: in mode="predict" every call appends '
                         f'to the memory, so update_state must be True.')
      state, merge_rows = self._predict_state_rows(state, batch_size)
      inputs, state, q_start, new_mem, new_mem_end = self._use_predict_mem(
          inputs, state)
      fn = functools.partial(self._incremental_forward_unbatched,
                             q_start=lax.stop_gradient(q_start), q_len=seqlen,
                             rng=rng, update_state=update_state)

    n_units = batch_size * self._n_heads
    group = min(self._n_parallel_heads or n_units, n_units)
    if n_units % group:
      raise ValueError(
          f'{self.name}: n_parallel_heads={self._n_parallel_heads} must divide '
          f'batch * n_heads = {batch_size} * {self._n_heads}.')
    heads_per_group = min(group, self._n_heads)
    examples_per_group = max(1, group // self._n_heads)
    n_head_groups = self._n_heads // heads_per_group
    n_example_groups = batch_size // examples_per_group

    for leaf in jax.tree_util.tree_leaves(state):
      if jnp.ndim(leaf) == 0 or leaf.shape[0] != n_units:
        raise ValueError(
            f'{self.name}: the state has {jnp.shape(leaf)[:1]} rows but needs '
            f'batch * n_heads = {batch_size} * {self._n_heads} = {n_units} '
            f'(one per example and head); initialize the layer with inputs of '
            f'batch size {batch_size}.')
    differentiable = [_is_differentiable(x) for x in inputs]

    # Small groups copy their inputs once per head and vmap over heads
    # outermost: each head's matmuls then form one batched matmul whose
    # results come out head-major, with no transposes of the [heads, examples,
    # length, depth] activations (several times faster for small units).
    # Larger groups share the inputs between heads (no copy).
    group_input_bytes = heads_per_group * sum(
        x.size // n_example_groups * x.dtype.itemsize for x in inputs)
    copy_inputs = group_input_bytes <= _MAX_INPUT_COPY_BYTES

    def group_forward(xs, w, s):
      """All heads of a group: xs [E, ...], w [G, ...], s [E, G, ...]."""
      def unit(x_u, w_u, s_u):
        return fn(*x_u, weights=w_u, state=s_u)
      if copy_inputs:
        xs = tuple(jnp.broadcast_to(x, (heads_per_group,) + x.shape)
                   for x in xs)
        per_example = jax.vmap(unit, in_axes=(0, None, 0))
        out, new_s = jax.vmap(per_example, in_axes=(0, 0, 1),
                              out_axes=(0, 1))(xs, w, s)
        return jnp.sum(out, axis=0).astype(xs[0].dtype), new_s  # [E, L, d]
      per_head = jax.vmap(unit, in_axes=(None, 0, 0))
      out, new_s = jax.vmap(per_head, in_axes=(0, None, 0))(xs, w, s)
      return jnp.sum(out, axis=1).astype(xs[0].dtype), new_s

    def run_group(xs, w, s, ct):
      if not compute_grad:
        out, new_s = group_forward(xs, w, s)
        return out, new_s, None, None
      s = lax.stop_gradient(s)
      d_xs = tuple(x for x, d in zip(xs, differentiable) if d)

      def f(d_xs, w):
        d_iter = iter(d_xs)
        full = tuple(next(d_iter) if d else x
                     for x, d in zip(xs, differentiable))
        return group_forward(full, w, s)

      out, vjp_fn, new_s = jax.vjp(f, d_xs, w, has_aux=True)
      d_xs_ct, w_ct = vjp_fn(ct.astype(out.dtype))
      return out, new_s, d_xs_ct, w_ct

    def split_examples(a):  # [B, ...] -> [n_example_groups, E, ...]
      return a.reshape((n_example_groups, examples_per_group) + a.shape[1:])

    def split_units(a):  # [B * n_heads, ...] -> [n_eg, n_hg, E, G, ...]
      a = a.reshape((n_example_groups, examples_per_group, n_head_groups,
                     heads_per_group) + a.shape[1:])
      return jnp.swapaxes(a, 1, 2)

    xs_r = tuple(split_examples(x) for x in inputs)
    w_r = jax.tree_util.tree_map(
        lambda a: a.reshape((n_head_groups, heads_per_group) + a.shape[1:]),
        weights)
    s_r = jax.tree_util.tree_map(split_units, state)
    ct_r = split_examples(output_grad) if compute_grad else None
    d_inputs = [x for x, d in zip(inputs, differentiable) if d]
    out_dtype = inputs[0].dtype

    def example_body(w_ct_acc, ex):
      xs_e, s_e, ct_e = ex

      def head_body(carry, hd):
        out_acc, dx_acc = carry
        w_h, s_h = hd
        out, new_s, dx_ct, w_ct = run_group(xs_e, w_h, s_h, ct_e)
        out_acc = out_acc + out if compute_output else None
        if compute_grad:
          dx_acc = tuple(a + b for a, b in zip(dx_acc, dx_ct))
        return (out_acc, dx_acc), (new_s if update_state else None, w_ct)

      out0 = (jnp.zeros((examples_per_group, seqlen, d_model), out_dtype)
              if compute_output else None)
      dx0 = (tuple(jnp.zeros((examples_per_group,) + x.shape[1:], x.dtype)
                   for x in d_inputs) if compute_grad else None)
      (out_e, dx_e), (new_s_e, w_ct_e) = self._loop(
          head_body, (out0, dx0), (w_r, s_e), n_head_groups)
      if compute_grad:
        w_ct_acc = jax.tree_util.tree_map(jnp.add, w_ct_acc, w_ct_e)
      return w_ct_acc, (out_e, new_s_e, dx_e)

    w_ct0 = (jax.tree_util.tree_map(jnp.zeros_like, w_r) if compute_grad
             else None)
    w_ct, (out, new_state, dx) = self._loop(
        example_body, w_ct0, (xs_r, s_r, ct_r), n_example_groups)

    output = out.reshape((batch_size, seqlen, d_model)) if compute_output else None
    if update_state:
      new_state = jax.tree_util.tree_map(
          lambda a: jnp.swapaxes(a, 1, 2).reshape((n_units,) + a.shape[4:]),
          new_state)
      if self._incremental:
        new_state = merge_rows((new_mem_end, tuple(new_mem), new_state))
      new_state = tuple(new_state)
    else:
      new_state = None

    inputs_grad = weights_grad = None
    if compute_grad:
      weights_grad = jax.tree_util.tree_map(
          lambda a: a.reshape((self._n_heads,) + a.shape[2:]), w_ct)
      dx_iter = iter(dx)
      inputs_grad = tuple(
          next(dx_iter).reshape(jnp.shape(x)) if d else _zero_cotangent(x)
          for x, d in zip(raw_inputs, differentiable))
      if single_input:
        inputs_grad = inputs_grad[0]
      elif input_type is list:
        inputs_grad = list(inputs_grad)
    return output, new_state, inputs_grad, weights_grad
