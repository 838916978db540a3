"""Test helper: a layer or model in 'predict' mode, run position by position, equals 'eval' mode.

Like Trax's `layers/test_utils.py::test_eval_equals_predict`: an eval-mode
and a predict-mode instance share the same weights; the predict instance is
fed the input a few positions at a time (its state, e.g. key/value caches
and position counters, carried between calls of `pure_fn` under `jax.jit`)
and each chunk of its outputs must equal the eval outputs at those
positions. Works for LM-like models taking int tokens `(batch, length)` and
for layers taking float activations `(batch, length, d)`.
"""

import jax
import numpy as np

from retrax import shapes


def _take(x, start, end, axis):
  return np.take(np.asarray(x), np.arange(start, end), axis=axis)


def _slice_inputs(inputs, start, end, seq_axis, seq_input):
  if seq_input is None:
    return _take(inputs, start, end, seq_axis)
  sliced = list(inputs)
  sliced[seq_input] = _take(inputs[seq_input], start, end, seq_axis)
  return tuple(sliced)


def _as_list(outputs):
  return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def shift_right(x, axis=1):
  """`x` shifted right by one position along `axis`, with 0 entering first."""
  x = np.asarray(x)
  pad = [(0, 0)] * x.ndim
  pad[axis] = (1, 0)
  return np.take(np.pad(x, pad), np.arange(x.shape[axis]), axis=axis)


def transfer_weights(source_weights, target_weights):
  """Returns `source_weights`' leaves arranged in `target_weights`' tree.

  The trees may differ in nesting (e.g. a `Cache` around a layer in predict
  mode) but must hold leaves of equal shapes in the same order.
  """
  src = jax.tree_util.tree_leaves(source_weights)
  tgt, treedef = jax.tree_util.tree_flatten(target_weights)
  if len(src) != len(tgt):
    raise AssertionError(f'eval model has {len(src)} weight arrays, predict '
                         f'model has {len(tgt)}.')
  for i, (s, t) in enumerate(zip(src, tgt)):
    if np.shape(s) != np.shape(t):
      raise AssertionError(f'weight {i}: eval shape {np.shape(s)} != predict '
                           f'shape {np.shape(t)}.')
  return jax.tree_util.tree_unflatten(treedef, src)


def assert_eval_equals_predict(make_layer_or_model, inputs, n_steps=None,
                               atol=1e-4, rtol=0.0, first_chunk=1, seq_axis=1,
                               seq_input=None, eval_on_prefixes=False,
                               rng=None, predict_inputs=None):
  """Checks that predict mode, run incrementally, reproduces eval mode.

  Args:
    make_layer_or_model: Callable taking `mode=` ('eval' or 'predict') and
      returning a fresh layer.
    inputs: An array (int tokens `(batch, length)` or floats
      `(batch, length, d)`), or a tuple of arrays with the sequence in
      `inputs[seq_input]`; other tuple items are passed whole at every step.
    n_steps: Number of positions to decode (default: all of them).
    atol: Absolute tolerance of the comparison.
    rtol: Relative tolerance of the comparison.
    first_chunk: Number of positions fed in the first predict call (later
      calls take one position each).
    seq_axis: Axis of the sequence in the inputs and outputs.
    seq_input: Index of the sequence input when `inputs` is a tuple.
    eval_on_prefixes: If True, run eval mode on each prefix `[0, end)` and
      compare its last positions, instead of one eval run on all `inputs`
      (for models whose eval outputs depend on the total length).
    rng: PRNG key given to both models (default: `PRNGKey(0)`).
    predict_inputs: What predict mode is fed, chunk by chunk (default:
      `inputs`). A model starting with `ShiftRight` (the identity in predict
      mode) must be fed `shift_right(inputs)` to see what eval mode sees.

  Returns:
    The largest absolute difference seen.
  """
  seq = inputs if seq_input is None else inputs[seq_input]
  length = np.shape(seq)[seq_axis]
  n_steps = length if n_steps is None else n_steps
  if not 1 <= first_chunk <= n_steps <= length:
    raise ValueError(f'Need 1 <= first_chunk ({first_chunk}) <= n_steps '
                     f'({n_steps}) <= input length ({length}).')
  rng = jax.random.PRNGKey(0) if rng is None else rng

  model_eval = make_layer_or_model(mode='eval')
  model_predict = make_layer_or_model(mode='predict')
  signature = shapes.signature(inputs)
  eval_weights, eval_state = model_eval.init(signature)
  predict_weights, predict_state = model_predict.init(signature)
  predict_weights = transfer_weights(eval_weights, predict_weights)

  eval_fn = jax.jit(model_eval.pure_fn)
  predict_fn = jax.jit(model_predict.pure_fn)
  if not eval_on_prefixes:
    full_eval = _as_list(eval_fn(inputs, eval_weights, eval_state, rng)[0])

  chunks = [(0, first_chunk)] + [(i, i + 1) for i in range(first_chunk,
                                                           n_steps)]
  worst = 0.0
  state = predict_state
  for start, end in chunks:
    step_inputs = _slice_inputs(
        inputs if predict_inputs is None else predict_inputs, start, end,
        seq_axis, seq_input)
    outputs, state = predict_fn(step_inputs, predict_weights, state, rng)
    outputs = _as_list(outputs)
    if eval_on_prefixes:
      prefix = _slice_inputs(inputs, 0, end, seq_axis, seq_input)
      expected = _as_list(eval_fn(prefix, eval_weights, eval_state, rng)[0])
    else:
      expected = full_eval
    if len(outputs) != len(expected):
      raise AssertionError(f'predict gave {len(outputs)} outputs, eval gave '
                           f'{len(expected)}.')
    for k, (got, want) in enumerate(zip(outputs, expected)):
      got = np.asarray(got, dtype=np.float64)
      want = np.asarray(want, dtype=np.float64)
      # Outputs without the sequence axis (e.g. a mask) are compared whole.
      eval_len = end if eval_on_prefixes else length
      if want.ndim > seq_axis and want.shape[seq_axis] == eval_len:
        want = _take(want, start, end, seq_axis)
      np.testing.assert_allclose(
          got, want, atol=atol, rtol=rtol,
          err_msg=(f'output {k}, positions [{start}, {end}) of {n_steps}: '
                   'predict mode differs from eval mode'))
      if got.size:
        worst = max(worst, float(np.max(np.abs(got - want))))
  return worst
