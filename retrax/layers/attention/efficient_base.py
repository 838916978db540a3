"""`EfficientAttentionBase`: per-head attention batched in memory-bounded groups.

An efficient-attention layer is written for ONE example and ONE head
(`forward_unbatched(*inputs, weights, state, rng, update_state)`); this base
class runs it over all `batch * n_heads` (example, head) units and sums the
heads' outputs. Units are processed in groups of `n_parallel_heads` (vmapped
inside a group, `lax.scan` across groups), so peak memory is that of one group.
A layer that splits its unit into input projection, core and output
projection (`_unit_stages`: `LSHSelfAttention`, `SelfAttention`) has the
projections of all heads computed at once and only the cores run per group
(`groups.run_projected`), up to `projected_max_bytes()` of projections.

The backward pass is custom (Trax's `forward_and_or_backward`): nothing of the
forward pass is kept but the inputs; each group is recomputed and
differentiated right away (forward-backward per group), and the state the
forward pass produced (e.g. LSH buckets) is replayed, not recomputed.

Weights are stacked over heads (`w[h]` is head `h`'s), state over units with
row `example * n_heads + head`. In `mode='predict'` (`incremental=True`) the
state is `(mem_end, mem, per_unit_state)`: `mem` holds the last
`predict_mem_len` inputs and `mem_end` how many are filled. A state made for
one example serves any batch: each example gets a copy of its rows (so row
`i` of a batch computes what example `i` alone does), as `retrax.load_run`'s
models, initialised at batch 1, are called with the user's batch.
"""

import functools
from typing import Any
import weakref

import jax
import jax.numpy as jnp
from jax import lax

from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.fastmath import xla_cpu
from retrax.layers import base
from retrax.layers.attention import chunked_kernel
from retrax.layers.attention import groups as groups_lib
from retrax.layers.attention import ops as attention_ops
from retrax.layers import position_chunks
from retrax.layers import predict_state
from retrax import validation
from retrax.shapes import ShapeDtype
from retrax.validation import ArgumentValueError


def _tree_stack(trees):
  return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs, axis=0), *trees)


# Per-layer jitted forward for eager calls (weak keys: dies with the layer).
_EAGER_FORWARD: 'weakref.WeakKeyDictionary[Any, Any]' = (
    weakref.WeakKeyDictionary())


def drop_oldest(buf, drop_len):
  """`buf [n, mem_len, ...]` without its first `drop_len` positions, zero-filled."""
  return jnp.concatenate(
      [buf[:, drop_len:], jnp.zeros_like(buf[:, :drop_len])], axis=1)


def fit_to_memory(rows, mem_len):
  """The last `mem_len` of `rows [n, ...]`, zero-padded at the end to `mem_len`.

  A prompt's per-position cache: the memory keeps the prompt's last
  `mem_len` positions, from its start.
  """
  rows = rows[-mem_len:]
  return jnp.pad(rows, ((0, mem_len - rows.shape[0]),) +
                 ((0, 0),) * (rows.ndim - 1))


# CPUs' and TPUs' group budget: small units batched, large ones one at a time.
SMALL_GROUP_BYTES = 16 << 20


@functools.lru_cache(maxsize=None)
def group_memory_bytes():
  """Working memory one group of units may take: 0 means one unit at a time.

  CPUs and TPUs batch units up to `SMALL_GROUP_BYTES` (16 MiB) and run
  larger ones one at a time, as Trax did. A unit of a small model is a few
  microseconds of work behind each of the loop's dozens of ops, so the
  loop's overhead is the step: Trax's blog ReformerLM (8 heads, batch 16 x
  10 tokens) took 13.7 ms a step on this CPU one unit at a time, 4.7 ms
  batched; compiled for a TPU v5e, the README's default job's step is
  18,838 device ops one unit at a time and 833 batched (the blog's 21,960
  and 1,486), where the chip spends ~1.2 us on each small op. Large units
  keep the loop: on XLA:CPU batched heads cost layout copies of per-head
  cotangents (the default ReformerLM step at 4K, 40 MiB a unit, took 2.36 s
  with its 4 heads batched, 1.65 s one by one); on a TPU v5e (JAX 0.10.2,
  2026-12-06) the paper-size LSH layer at 16K (16 heads, 136 MiB each,
  forward and backward) took 19.7 ms one head at a time, 37.3 ms four at a
  time and 57.7 ms all 16 at once: the batched row gathers and sorts of all
  heads cost more than the loop (`benchmarks/step_profile.py --units`).
  Elsewhere (GPUs) units are batched up to 1/4 of the device's memory; 3/4
  are left for the model's weights, optimizer slots and other activations.
  """
  device = jax.local_devices()[0]
  if device.platform in ('cpu', 'tpu'):
    return SMALL_GROUP_BYTES
  limit = (device.memory_stats() or {}).get('bytes_limit')
  return limit // 4 if limit else 1 << 30


def projected_max_bytes():
  """Largest projected inputs of all units for which a pass projects all heads at once.

  (`UnitStages.unit_depth` floats per unit and position; see
  `groups.run_projected`.) Projecting all heads at once holds the projected
  inputs, their cotangents and the cores' outputs of every unit: for the
  default ReformerLM (4 heads of 64 over d_model 256) XLA:CPU plans 16.3
  KB of temporaries a token at 256K against 10.4 one head at a time. On
  a TPU v5e it made the paper-size step 1.33x faster at 16K and 1.38x at
  64K (2026-12-06); on a CPU it is neutral for speed (the default model's
  step, 1K-16K). So 1 GiB on accelerators (the paper-size model, 16 heads
  of 64 + 64, up to 128K tokens; the default model up to 512K) and 256 MiB
  on a CPU (128K and 32K). Longer inputs keep the per-unit loop's smaller
  working set (1M tokens fit a 16 GB chip with it).
  """
  return 1 << 28 if jax.default_backend() == 'cpu' else 1 << 30


def prelude_chunks(shape):
  """Chunks of positions a `groups.Prelude` runs in over inputs of `shape`.

  About `position_chunks.CHUNK_ELEMENTS` elements of the input a chunk, the
  count rounded up to one that divides the length (1, whole, if none up to
  twice the count does).
  """
  n = position_chunks.n_position_chunks(shape, shape[-1])
  return position_chunks.divisor_chunks(shape[-2], n) or 1


def units_that_fit(batch_size, n_heads, unit_bytes, budget_bytes):
  """The largest group the planner admits whose units fit `budget_bytes`.

  Candidates are the divisors of `n_heads` (heads of one example) and
  `k * n_heads` for divisors `k` of `batch_size` (whole examples); at
  least 1.
  """
  candidates = [h for h in range(1, n_heads + 1) if n_heads % h == 0]
  candidates += [k * n_heads for k in range(2, batch_size + 1)
                 if batch_size % k == 0]
  fitting = [c for c in candidates if c * unit_bytes <= budget_bytes]
  return max(fitting, default=1)


def repeat_rows(tree, n):
  """Every leaf of `tree` (rows first) repeated `n` times along its rows."""
  return jax.tree_util.tree_map(
      lambda a: jnp.tile(a, (n,) + (1,) * (jnp.ndim(a) - 1)), tree)


def _forward_of(layer_ref):
  """`(inputs, weights, state, rng) -> (output, new_state)` of `layer_ref()`."""
  def forward(inputs, weights, state, rng):
    output, new_state, _, _ = layer_ref().forward_and_or_backward(
        inputs, weights, state, rng, compute_output=True, update_state=True)
    return output, new_state
  return forward


class EfficientAttentionBase(base.Layer):
  """Base class for memory-efficient attention (Trax's `EfficientAttentionBase`).

  Subclasses override `create_weights_unbatched(input_signature, rng)`,
  `create_state_unbatched(input_signature, rng)` (default: no state),
  `forward_unbatched(*inputs, weights, state, rng, update_state)` and, for
  `mode='predict'`, `_incremental_forward_unbatched(*inputs, q_start, q_len,
  weights, state, rng, update_state)`. Each returns `(output [L, d_model],
  new_state)` for one example and one head. Predict-mode caches may be
  rolled (`_roll_predict_state`); a decoding step may be computed for all
  units at once (`_all_units_step`).

  Args:
    n_heads: number of attention heads.
    n_in: number of inputs.
    n_parallel_heads: (example, head) units computed at once. None: as many
      as fit `group_memory_bytes()` by `unit_bytes`' estimate (on a GPU
      all of them at ordinary lengths, fewer as sequences grow; on a CPU
      or a TPU those of small models, larger ones one at a time, measured
      fastest there); 1: one at a time (least
      memory); a divisor of `n_heads`: that many heads of one example; a
      multiple of `n_heads`: `n_parallel_heads // n_heads` whole examples.
      A predict-mode call of one position computes all units at once.
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
        raise ArgumentValueError('Fast inference (mode="predict") needs '
                                 'predict_mem_len and predict_drop_len; got '
                                 f'{predict_mem_len!r} and {predict_drop_len!r}.')
      if not 0 < predict_drop_len <= predict_mem_len:
        raise ArgumentValueError(
            f'Need 0 < predict_drop_len <= predict_mem_len; got '
            f'predict_mem_len={predict_mem_len}, '
            f'predict_drop_len={predict_drop_len}.')
      self._predict_mem_len = predict_mem_len
      self._predict_drop_len = predict_drop_len
    if n_parallel_heads:
      if ((n_parallel_heads > n_heads and n_parallel_heads % n_heads) or
          (n_parallel_heads < n_heads and n_heads % n_parallel_heads)):
        raise ArgumentValueError(
            f'n_parallel_heads must be a multiple or a divisor of n_heads '
            f'({n_heads}); got {n_parallel_heads}.')
      self._n_parallel_heads = n_parallel_heads
    else:
      self._n_parallel_heads = None
    self._use_python_loop = use_python_loop
    self._use_reference_code = use_reference_code
    # XLA ops unless `_record_chunking` resolves another (layers without
    # chunked attention, e.g. `EncDecAttention`, never run the kernel).
    self._implementation = 'xla'
    # Until a subclass records its own (what `unit_bytes` reads): one hash
    # round, no chunks (each query sees the whole length). Head depths have
    # no default: every subclass records them.
    self._n_hashes = 1
    self._chunk_len: Any = None  # An int once recorded.
    self._n_chunks_before = self._n_chunks_after = 0

  def _record_depths_and_dropout(self, d_qk, d_v, mode, attention_dropout,
                                 output_dropout):
    """Keeps the head depths, the mode and the dropout rates (0 unless training)."""
    self._d_qk = d_qk
    self._d_v = d_v
    self._mode = mode
    train = mode == 'train'
    self._attention_dropout = attention_dropout if train else 0.0
    self._output_dropout = output_dropout if train else 0.0

  def _record_chunking(self, causal, masked, chunk_len, n_chunks_before,
                       n_chunks_after, implementation=None):
    """Keeps the causality, the mask input, the chunk window and the implementation.

    `implementation`: the layer's argument, resolved as the `implementation`
    property describes.
    """
    self._causal = causal
    self._masked = masked
    self._chunk_len = chunk_len
    self._n_chunks_before = n_chunks_before
    self._n_chunks_after = n_chunks_after
    self._implementation = chunked_kernel.implementation_of(
        type(self).__name__, implementation)

  @property
  def implementation(self):
    """The chunked attention's implementation, resolved when the layer was built.

    The `implementation` argument of `SelfAttention` and `LSHSelfAttention`:
    'xla' (XLA ops), 'pallas' (the Pallas TPU kernel of `chunked_kernel`,
    interpreted off a TPU: for tests), 'auto' (the kernel on a TPU, XLA
    elsewhere), or None (the default): the environment variable
    `RETRAX_ATTENTION_IMPL` as it is when the layer is built (unset: 'xla';
    for models built from configs, e.g. benchmarks). Later changes of the
    variable do not change a built layer; this property says what it runs.
    The default stays 'xla' on every backend until a TPU measures the
    kernel faster (docs/benchmarks.md). Layers that do not wire in the
    kernel (`EncDecAttention`, `PureLSHSelfAttention`) are always 'xla'.
    """
    return self._implementation

  def _runs_own(self, cls, *names):
    """Whether this layer's methods `names` are `cls`'s own, no subclass's.

    The all-heads fast paths of `cls` stand in for those methods, so they
    run only where a subclass has not replaced one of them.
    """
    return all(getattr(getattr(self, name), '__func__', None) is
               getattr(cls, name) for name in names)

  def _runs_kernel(self):
    """Whether chunked attention runs the Pallas kernel on this backend."""
    return attention_ops.runs_kernel(self.implementation)

  @property
  def n_heads(self):
    """Number of attention heads."""
    return self._n_heads

  @property
  def n_parallel_heads(self):
    """(example, head) units computed at once (None: as many as fit)."""
    return self._n_parallel_heads

  def unit_bytes(self, length, projected=False):
    """Estimated working memory of one (example, head) unit's forward-backward.

    What a group's vjp keeps: per attended row (`n_hashes` rounds of
    `length` positions) its window of scores, probabilities and their
    cotangent (only one block's rows where the blocks of
    `attention_ops.in_blocks` are rematerialized), and its gathered
    queries, keys, values and their cotangents, in float32. Calibrated
    against `memory_analysis()` of the compiled pass
    (tests/layers/attention/test_parallel_heads.py). The
    Pallas kernel (`chunked_kernel`) keeps no scores at all. `projected`:
    the unit's core alone (`groups.run_projected`, all heads projected at
    once), whose vjp keeps about 3/4 of the scores and 2/5 of the
    per-depth arrays of a whole unit's (no per-head copies of the input and
    its cotangent).
    """
    rows = self._n_hashes * length
    chunk = self._chunk_len or length
    window = min(length,
                 chunk * (1 + self._n_chunks_before + self._n_chunks_after))
    depth = self._d_qk + self._d_v
    logit_rows = rows
    if self._runs_kernel():
      logit_rows = 0
    elif (attention_ops.in_blocks(rows // chunk, chunk, window) and
          attention_ops.remat_blocks(rows // chunk, chunk, window)):
      logit_rows = attention_ops.BLOCK_CHUNKS * chunk
    if projected:
      return 4 * (logit_rows * 3 * window + rows * 5 * depth // 2)
    return 4 * (logit_rows * 4 * window + rows * 6 * depth)

  def hash_length(self, length):
    """`length`, or in predict mode the memory's (what LSH bucket counts follow)."""
    return self._predict_mem_len if self._incremental else length

  def predict_state_layout(self, state):
    """Per-unit leaves hold `n_heads` rows per example, the memory one; its end is shared.

    The memory forgets its oldest positions when full, so there is no
    position limit.
    """
    if not self._incremental:
      return predict_state.PredictStateLayout(
          predict_state.same_rows(state, self._n_heads))
    mem_end, mem, units = state
    return predict_state.PredictStateLayout(
        (predict_state.same_rows(mem_end, 0), predict_state.same_rows(mem, 1),
         predict_state.same_rows(units, self._n_heads)))

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

  def _all_units_step(self, inputs, weights, state, q_start, q_len):
    """A predict-mode call computed for all units at once, or None.

    Called with the memory `inputs` (this call's positions at `[q_start,
    q_start + q_len)`) and all units' state (`[batch * n_heads, ...]`
    leaves). A subclass returns `(output [batch, q_len, d_model],
    new_state)` for the calls it batches by hand (a decoding step: one
    in-place cache write read by one batched attention, where the vmapped
    per-unit functions made XLA copy the caches every step). An
    implementation returns None when `type(self)` overrides the per-unit
    step it batches (`_incremental_forward_unbatched`), so that the
    subclass's own step runs. Default: None, the per-unit function runs.
    """
    del inputs, weights, state, q_start, q_len
    return None

  def _unit_stages(self, shape):
    """`groups.UnitStages` splitting `forward_unbatched`, or None (the default).

    A subclass whose per-unit function projects its inputs, runs a core and
    projects the core's output returns the three (and the forward pass
    then projects all heads at once: `groups.run_projected`); None where a
    pass must run `forward_unbatched` whole (e.g. a subclass's own
    `forward_unbatched`). `shape`: the first input's, `[batch, length,
    d_model]`.
    """
    del shape
    return None

  # `*inputs: Any, **kwargs: Any`: a subclass names its own inputs (`x, mask`,
  # `qk, v`, ...) and takes the keyword arguments listed in the class
  # docstring; mypy accepts any signature overriding this one.
  def forward_unbatched(self, *inputs: Any, **kwargs: Any) -> Any:
    """Attention for one example and one head: returns `(output, new_state)`.

    Keyword arguments: `weights, state, rng, update_state`.
    """
    del inputs, kwargs
    raise NotImplementedError(f'{self.name} must override forward_unbatched.')

  def _incremental_forward_unbatched(self, *inputs: Any, **kwargs: Any) -> Any:
    """A predict-mode step: `forward_unbatched` for queries `q_start` on.

    Keyword arguments: `q_start, q_len, weights, state, rng, update_state`.
    """
    del inputs, kwargs
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
      raise InputValueError(f'{self.name} expects inputs of shape [batch, length, '
                            f'd_model]; got shape {jnp.shape(x)}.')
    return inputs

  # --- initialization -----------------------------------------------------------

  def init_weights_and_state(self, input_signature):
    sigs = (tuple(input_signature) if isinstance(input_signature, (tuple, list))
            else (input_signature,))
    sigs = tuple(self._init_signature(sigs))
    if len(sigs[0].shape) != 3:
      raise InputValueError(f'{self.name} expects inputs of shape [batch, length, '
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
        fn = _EAGER_FORWARD[self] = xla_cpu.jit(_forward_of(weakref.ref(self)))
      output, new_state = fn(*args)
    self.state = new_state
    return output

  def _forward(self, inputs, weights, state, rng):
    return _forward_of(lambda: self)(inputs, weights, state, rng)

  def _as_tuple(self, inputs, weights):
    if self.n_in == 1:
      if isinstance(inputs, (tuple, list)):
        raise InputTypeError(f'{self.name} takes one input array; got a '
                             f'{type(inputs).__name__} of {len(inputs)}.')
      inputs = (inputs,)
    else:
      if not isinstance(inputs, (tuple, list)) or len(inputs) != self.n_in:
        raise InputTypeError(f'{self.name} takes {self.n_in} inputs; got '
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
    else:
      state = self._units_for_batch(state, batch_size)
    outputs, new_state = [], []
    for example in range(batch_size):
      acc = jnp.zeros((seqlen, d_model), dtype=inputs[0].dtype)
      for head in range(self._n_heads):
        unit = example * self._n_heads + head
        x = tuple(a[example] for a in inputs)
        w = jax.tree_util.tree_map(lambda a, i=head: a[i], weights)
        s = jax.tree_util.tree_map(lambda a, i=unit: a[i], state)
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

  def _units_for_batch(self, state, batch_size):
    """The per-unit state for `batch_size` examples: one example's (`n_heads`
    rows) is repeated for each; any other state is returned as it is."""
    leaves = jax.tree_util.tree_leaves(state)
    if batch_size > 1 and leaves and all(
        jnp.ndim(a) and a.shape[0] == self._n_heads for a in leaves):
      return repeat_rows(state, batch_size)
    return state

  def _predict_state_rows(self, state, batch_size):
    """The predict-mode state rows a call of `batch_size` examples runs on.

    The state is sized by the signature the layer was initialized with;
    `init_from_file` without a signature takes the file's (the training
    batch), and Trax then decodes a batch of 1 with it. A smaller batch runs
    on the first `batch_size` examples' rows, as in Trax (whose memory update
    broadcasts a batch-1 input and whose loop reads example 0 only); a
    one-example state serves a larger batch, copied for each example. Returns
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
    if state_batch == 1:  # One example's state: a copy for each example.
      return ((mem_end, repeat_rows(tuple(mem), batch_size),
               repeat_rows(units, batch_size)), lambda new_state: new_state)
    if batch_size > state_batch:
      raise InputValueError(
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
      carry, y = body(carry, jax.tree_util.tree_map(lambda a, i=i: a[i], xs))
      ys.append(y)
    return carry, _tree_stack(ys)

  # `forward_and_or_backward` takes `subtract_from` (see there).
  supports_subtract_from = True

  def forward_and_or_backward(self, inputs, weights, state, rng,
                              output_grad=None, compute_output=True,
                              update_state=True, subtract_from=None,
                              prelude=None, input_grad_init=None):
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
      subtract_from: None, or an array of the output's shape and dtype: the
        output returned is then `subtract_from - attention(inputs)`, the
        heads subtracted one by one in its buffer (a reversible layer
        rebuilding its input keeps no second output-sized array). Needs
        `compute_output`.
      prelude: None, or a `groups.Prelude` the first input goes through
        before the attention, run group by group (only where
        `folds_prelude(shape)`); `weights_grad` is then the pair
        `(prelude's weights grad, this layer's)`.
      input_grad_init: None, or an array of the first input's shape: the
        first input's gradient is accumulated onto it (the cotangent that
        input already has; one example group at a time, heads one at a
        time, with a prelude, it is summed in place, with no second
        input-sized buffer).

    Returns:
      `(output, new_state, inputs_grad, weights_grad)`, each None when not
      asked for. `inputs_grad` has the structure of `inputs` (float0 zeros for
      integer inputs such as masks).
    """
    raw_inputs = inputs
    inputs = self._as_tuple(inputs, weights)
    shape = inputs[0].shape
    self._check_pass(shape, output_grad, compute_output, update_state)
    if subtract_from is not None and (
        not compute_output or jnp.shape(subtract_from) != shape or
        subtract_from.dtype != inputs[0].dtype):
      raise InputValueError(
          f'{self.name}: subtract_from needs compute_output and the '
          f'output\'s shape {tuple(shape)} and dtype {inputs[0].dtype}; got '
          f'{jnp.shape(subtract_from)} {subtract_from.dtype}.')
    self._check_prelude(inputs, prelude, input_grad_init, output_grad)
    fn, inputs, state, merge_rows, direct = self._unit_function(
        inputs, weights, state, rng, update_state)
    if direct is not None:
      output, new_state = direct
      return output, tuple(merge_rows(new_state)), None, None
    groups = groups_lib.Groups.plan(self, inputs, self._units_at_once(shape))
    groups.check_state(self, state)
    todo = groups_lib.Todo(compute_output, output_grad is not None, update_state,
                 tuple(groups_lib.is_differentiable(x) for x in inputs))
    stages = self._projected_stages(shape)
    if stages is not None:
      out, new_state, dx, weights_grad = groups_lib.run_projected(
          stages, self._n_heads, groups.heads * groups.examples, inputs,
          weights, state, rng, todo, output_grad, subtract_from, self._loop)
      if input_grad_init is not None:
        dx = (dx[0] + input_grad_init,) + tuple(dx[1:])
    else:
      runner: Any = groups_lib.GroupRunner(fn, groups, todo)
      if prelude is not None:
        stages = self._unit_stages(shape)
        runner = groups_lib.PreludeRunner(
            prelude, stages._replace(
                core=functools.partial(stages.core, rng=rng,
                                       update_state=update_state),
                combine=functools.partial(stages.combine, rng=rng)),
            groups, todo, prelude_chunks((groups.examples,) + shape[1:]))
      out, new_state, dx, w_ct, w_pre_ct = self._run_groups(
          runner, inputs, weights, state, output_grad, shape, subtract_from,
          input_grad_init)
      if update_state:
        new_state = jax.tree_util.tree_map(groups.merge_units, new_state)
      weights_grad = None if w_ct is None else jax.tree_util.tree_map(
          lambda a: a.reshape((self._n_heads,) + a.shape[2:]), w_ct)
      if prelude is not None and weights_grad is not None:
        weights_grad = (w_pre_ct, weights_grad)

    output = out.reshape(shape) if compute_output else None
    if update_state:
      new_state = tuple(merge_rows(new_state))
    inputs_grad = (groups_lib.inputs_grad(raw_inputs, dx, todo.differentiable)
                   if todo.grad else None)
    return output, new_state, inputs_grad, weights_grad

  def folds_prelude(self, shape):
    """Whether a pass over inputs of `shape` runs a `prelude` group by group.

    Where the heads run one group at a time (the longest sequences; not in
    predict mode) through `_unit_stages` (whose input projection runs with
    the prelude): a pass projecting all heads at once holds the
    projections of all heads anyway.
    """
    return (not self._incremental and self._projected_stages(shape) is None
            and self._unit_stages(shape) is not None)

  def _check_prelude(self, inputs, prelude, input_grad_init, output_grad):
    """Raises unless `prelude` and `input_grad_init` fit this pass's `inputs`."""
    x = inputs[0]
    if prelude is not None:
      if any(groups_lib.is_differentiable(a) for a in inputs[1:]):
        raise InputValueError(
            f'{self.name}: with a prelude only the first input may be a '
            'float array (the others are masks).')
      if not self.folds_prelude(x.shape):
        raise ArgumentValueError(
            f'{self.name}: a prelude runs only where the heads run one group '
            f'at a time (folds_prelude({tuple(x.shape)}) is False); apply it '
            'before the layer.')
      out = jax.eval_shape(prelude.fn, x, prelude.weights)
      if out.shape != x.shape or out.dtype != x.dtype:
        raise InputValueError(
            f'{self.name}: a prelude must keep its input\'s shape and dtype '
            f'{tuple(x.shape)} {x.dtype}; got {tuple(out.shape)} {out.dtype}.')
    if input_grad_init is not None and (
        output_grad is None or jnp.shape(input_grad_init) != x.shape or
        input_grad_init.dtype != x.dtype):
      raise InputValueError(
          f'{self.name}: input_grad_init needs output_grad and the first '
          f'input\'s shape {tuple(x.shape)} and dtype {x.dtype}; got '
          f'{jnp.shape(input_grad_init)} {jnp.asarray(input_grad_init).dtype}.')

  def _projected_stages(self, shape):
    """The `UnitStages` if a pass over inputs of `shape` projects all heads at once.

    Not in predict mode (a step's few positions gain nothing), nor when the
    projected inputs of all units would take more than
    `projected_max_bytes()`: there the per-unit loop's smaller working set
    matters more than its speed (the longest sequences).
    """
    if self._incremental:
      return None
    stages = self._unit_stages(shape)
    if stages is None:
      return None
    batch, length = shape[:2]
    projected_bytes = 4 * batch * length * self._n_heads * stages.unit_depth
    return stages if projected_bytes <= projected_max_bytes() else None

  def _check_pass(self, shape, output_grad, compute_output, update_state):
    """Raises unless the pass asked for is possible and its arguments agree."""
    if not (compute_output or output_grad is not None):
      raise ArgumentValueError('forward_and_or_backward: nothing to compute (no '
                               'output asked and no output_grad given).')
    if output_grad is not None and jnp.shape(output_grad) != shape:
      raise InputValueError(f'{self.name}: output_grad shape {jnp.shape(output_grad)}'
                            f' differs from the output shape {tuple(shape)}.')
    if self._incremental and output_grad is not None:
      raise NotImplementedError(
          f'{self.name}: gradients in mode="predict" are not supported; use '
          f'mode="train" or "eval" to differentiate.')
    if self._incremental and not update_state:
      raise ArgumentValueError(f'{self.name}: in mode="predict" every call appends '
                               f'to the memory, so update_state must be True.')

  def _units_at_once(self, shape):
    """Units computed at once for inputs of `shape`: `n_parallel_heads`.

    A predict-mode call of one position gives each unit little work, so all
    units run at once (vmapped): looping over them one group at a time would
    make a batch-8 decoding step cost 8 batch-1 steps.
    """
    if self._incremental and shape[1] == 1:
      return None
    if self._n_parallel_heads is not None:
      return self._n_parallel_heads
    unit_bytes = self.unit_bytes(
        shape[1], projected=self._projected_stages(shape) is not None)
    return units_that_fit(shape[0], self._n_heads, unit_bytes,
                          group_memory_bytes())

  def _unit_function(self, inputs, weights, state, rng, update_state):
    """The per-unit function of this pass and what it runs on.

    Returns `(fn, inputs, per_unit_state, merge_rows, direct)`: `fn(*x,
    weights, state)` for one example and head; in predict mode the inputs
    and state come out of the memory update and `merge_rows` puts the memory
    and the units' new state back together (identity otherwise). `direct` is
    `_all_units_step`'s `(output, units' new state)`, or None.
    """
    if not self._incremental:
      fn = functools.partial(self.forward_unbatched, rng=rng,
                             update_state=update_state)
      state = self._units_for_batch(state, inputs[0].shape[0])
      return fn, inputs, state, lambda new_state: new_state, None
    batch_size, seqlen = inputs[0].shape[:2]
    state, merge_rows = self._predict_state_rows(state, batch_size)
    inputs, state, q_start, new_mem, new_mem_end = self._use_predict_mem(
        inputs, state)
    direct = self._all_units_step(inputs, weights, state, q_start, seqlen)
    fn = functools.partial(self._incremental_forward_unbatched,
                           q_start=lax.stop_gradient(q_start), q_len=seqlen,
                           rng=rng, update_state=update_state)
    return fn, inputs, state, lambda units: merge_rows(
        (new_mem_end, tuple(new_mem), units)), direct

  def _run_groups(self, runner, inputs, weights, state, output_grad, shape,
                  subtract_from=None, input_grad_init=None):
    """Loops over example groups and, inside, head groups (`lax.scan`).

    `shape` is the output's (in predict mode `inputs` hold the memory). With
    `subtract_from`, each example group's output starts from its rows of it
    and the heads are subtracted; with `input_grad_init`, the first input's
    cotangent starts from its rows.

    `runner`: a `GroupRunner`, or a `PreludeRunner` (whose prelude's
    weights gradient is summed over all groups). Returns `(out [n_eg, E, L,
    d], new_state (split by units), inputs cotangents, weights cotangent
    [n_hg, G, ...], the prelude's weights cotangent)`, None where not asked
    (or without a prelude).
    """
    groups, todo = runner.groups, runner.todo
    prelude = (runner.prelude if isinstance(runner, groups_lib.PreludeRunner)
               else None)
    w_pre = None if prelude is None else prelude.weights
    xs_r = tuple(groups.split_examples(x) for x in inputs)
    w_r = jax.tree_util.tree_map(groups.split_heads, weights)
    s_r = jax.tree_util.tree_map(groups.split_units, state)
    ct_r = groups.split_examples(output_grad) if todo.grad else None
    base_r = (None if subtract_from is None else
              groups.split_examples(subtract_from))
    init_r = (None if input_grad_init is None else
              groups.split_examples(input_grad_init))
    d_inputs = [x for x, d in zip(inputs, todo.differentiable) if d]
    out0 = (jnp.zeros((groups.examples,) + tuple(shape[1:]), inputs[0].dtype)
            if todo.output and subtract_from is None else None)

    def example_body(acc, ex):
      w_ct_acc, w_pre_ct_acc = acc
      xs_e, s_e, ct_e, base_e, init_e = ex
      dx0 = None
      if todo.grad:
        dx0 = tuple(jnp.zeros((groups.examples,) + x.shape[1:], x.dtype)
                    for x in d_inputs)
        if init_e is not None:
          dx0 = (init_e,) + dx0[1:]

      def head_body(carry, hd):
        out_acc, dx_acc, w_pre_ct_acc = carry
        w_h, s_h = hd
        if prelude is None:
          out, new_s, dx_ct, w_ct = runner.run(xs_e, w_h, s_h, ct_e)
          if todo.grad:
            dx_acc = tuple(a + b for a, b in zip(dx_acc, dx_ct))
        else:
          out, new_s, dx0_acc, w_ct, w_pre_ct = runner.run(
              xs_e, w_h, s_h, ct_e, w_pre, None if dx_acc is None else dx_acc[0])
          if todo.grad:
            dx_acc = (dx0_acc,)
            w_pre_ct_acc = jax.tree_util.tree_map(jnp.add, w_pre_ct_acc,
                                                  w_pre_ct)
        if not todo.output:
          out_acc = None
        elif base_e is None:
          out_acc = out_acc + out
        else:
          out_acc = out_acc - out
        return (out_acc, dx_acc, w_pre_ct_acc), (
            new_s if todo.state else None, w_ct)

      (out_e, dx_e, w_pre_ct_acc), (new_s_e, w_ct_e) = self._loop(
          head_body, (out0 if base_e is None else base_e, dx0, w_pre_ct_acc),
          (w_r, s_e), groups.n_head_groups)
      if todo.grad:
        w_ct_acc = jax.tree_util.tree_map(jnp.add, w_ct_acc, w_ct_e)
      return (w_ct_acc, w_pre_ct_acc), (out_e, new_s_e, dx_e)

    zeros = lambda t: jax.tree_util.tree_map(jnp.zeros_like, t)
    acc0 = (zeros(w_r), zeros(w_pre)) if todo.grad else (None, None)
    (w_ct, w_pre_ct), (out, new_state, dx) = self._loop(
        example_body, acc0, (xs_r, s_r, ct_r, base_r, init_r),
        groups.n_example_groups)
    return out, new_state, dx, w_ct, w_pre_ct
