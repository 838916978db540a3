"""Recurrent layers: LSTM, GRU, convolutional GRU and SRU cells, run with `Scan`.

Cells map `(x_t, state_{t-1}) -> (y_t, state_t)`; the sequence layers
(`LSTM`, `GRU`, `SRU`) run a cell over axis 1 of `(batch, length, depth)`
with `combinators.Scan` (one `lax.scan`, no Python loop over time) starting
from a zero state made by `MakeZeroState`. In 'predict' mode the `Scan`
keeps the last state, so a sequence can be fed a few positions at a time.
"""

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import activation_fns
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import convolution
from retrax.layers import core
from retrax.layers import initializers
from retrax.validation import ArgumentValueError


def _check_cell_inputs(layer, x, state, d_state, d_in):
  """Clear errors for a cell's `(x, state)` against its weights."""
  if tuple(state.shape[:-1]) != tuple(x.shape[:-1]):
    raise InputValueError(
        f'{layer.name}: input {tuple(x.shape)} and state {tuple(state.shape)} '
        'must agree on all but the last axis.')
  if state.shape[-1] != d_state:
    raise InputValueError(f'{layer.name} expects a state of depth {d_state}; got '
                          f'state shape {tuple(state.shape)}.')
  if x.shape[-1] != d_in:
    raise InputValueError(f'{layer.name} was initialized for inputs of depth '
                          f'{d_in}; got input shape {tuple(x.shape)}.')


@configurable('trax.layers')
class LSTMCell(base.Layer):
  """LSTM cell: `(x, [c, h]) -> (h', [c', h'])`.

  With `[i, j, f, o] = [x, h]·W + b` (split in four along the last axis),
  `c' = c·σ(f) + σ(i)·tanh(j)` and `h' = tanh(c')·σ(o)`. The state is the
  concatenation `[c, h]` (depth `2 * n_units`). Weights `(W, b)` have shapes
  `(d_in + n_units, 4 * n_units)` and `(4 * n_units,)`; `forget_bias` is
  added to all of `b` at initialization, as Trax does.
  """

  def __init__(self, n_units, forget_bias=1.0,
               kernel_initializer=initializers.GlorotUniformInitializer(),
               bias_initializer=initializers.RandomNormalInitializer(1e-6)):
    super().__init__(n_in=2, n_out=2)
    self._n_units = n_units
    self._forget_bias = forget_bias
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, inputs):
    x, lstm_state = inputs
    w, b = self.weights
    _check_cell_inputs(self, x, lstm_state, 2 * self._n_units,
                       w.shape[0] - self._n_units)
    c, h = jnp.split(lstm_state, 2, axis=-1)
    y = jnp.dot(jnp.concatenate([x, h], axis=-1), w)
    y = y + fastmath.with_rank(b, y.ndim)
    i, j, f, o = jnp.split(y, 4, axis=-1)
    new_c = c * fastmath.sigmoid(f) + fastmath.sigmoid(i) * jnp.tanh(j)
    new_h = jnp.tanh(new_c) * fastmath.sigmoid(o)
    return new_h, jnp.concatenate([new_c, new_h], axis=-1)

  def init_weights_and_state(self, input_signature):
    x_sig, state_sig = input_signature
    if state_sig.shape[-1] != 2 * self._n_units:
      raise InputValueError(
          f'Last dimension of state (shape: {tuple(state_sig.shape)}) must be '
          f'equal to 2*n_units ({2 * self._n_units}).')
    d_in = x_sig.shape[-1] + self._n_units
    rng1, rng2 = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer((d_in, 4 * self._n_units), rng1)
    b = self._bias_initializer((4 * self._n_units,), rng2) + self._forget_bias
    self.weights = (w, b)


def MakeZeroState(depth_multiplier=1):
  """Layer mapping `(batch, length, depth)` to float32 zeros `(batch, depth_multiplier * depth)`."""
  def f(x):
    if len(x.shape) != 3:
      raise InputValueError('Layer input should be a rank 3 tensor representing '
                            '(batch_size, sequence_length, feature_depth); instead '
                            f'got shape {tuple(x.shape)}.')
    return jnp.zeros((x.shape[0], depth_multiplier * x.shape[-1]),
                     dtype=jnp.float32)
  return base.Fn('MakeZeroState', f)


def LSTM(n_units, mode='train', return_state=False, initial_state=False):
  """LSTM over axis 1 of `(batch, length, d)`: `LSTMCell(n_units)` under `Scan`.

  Args:
    n_units: Depth of the LSTM outputs (the state has `2 * n_units`).
    mode: If 'predict', the last state is kept between calls.
    return_state: If True, also output the final state `[c, h]`.
    initial_state: If True, take the initial state from the stack (below
      the sequence) instead of starting from zeros.

  Returns:
    A layer named `LSTM_{n_units}` (sublayers not printed).
  """
  layers = []
  if not initial_state:
    layers.append(cb.Branch([], MakeZeroState(depth_multiplier=2)))
  layers.append(cb.Scan(LSTMCell(n_units=n_units), axis=1, mode=mode))
  if not return_state:
    layers.append(cb.Select([0], n_in=2))  # Drops the RNN state.
  return cb.Serial(*layers, name=f'LSTM_{n_units}', sublayers_to_print=[])


@configurable('trax.layers')
class GRUCell(base.Layer):
  """GRU cell: `(x, s) -> (s', s')`.

  `[u, r] = σ([x, s]·W1 + b1)`, `c = [x, r·s]·W2 + b2`,
  `s' = u·s + (1 - u)·tanh(c)`. Weights `(W1, b1, W2, b2)` with shapes
  `(d_in + n, 2n)`, `(2n,)`, `(d_in + n, n)`, `(n,)`; `forget_bias` is added
  to `b1` at initialization.
  """

  def __init__(self, n_units, forget_bias=0.0,
               kernel_initializer=initializers.RandomUniformInitializer(0.01),
               bias_initializer=initializers.RandomNormalInitializer(1e-6)):
    super().__init__(n_in=2, n_out=2)
    self._n_units = n_units
    self._forget_bias = forget_bias
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, inputs):
    x, gru_state = inputs
    w1, b1, w2, b2 = self.weights
    _check_cell_inputs(self, x, gru_state, self._n_units,
                       w1.shape[0] - self._n_units)
    y = jnp.dot(jnp.concatenate([x, gru_state], axis=-1), w1)
    y = y + fastmath.with_rank(b1, y.ndim)
    u, r = jnp.split(fastmath.sigmoid(y), 2, axis=-1)
    c = jnp.dot(jnp.concatenate([x, r * gru_state], axis=-1), w2)
    c = c + fastmath.with_rank(b2, c.ndim)
    new_gru_state = u * gru_state + (1 - u) * jnp.tanh(c)
    return new_gru_state, new_gru_state

  def init_weights_and_state(self, input_signature):
    x_sig, state_sig = input_signature
    if state_sig.shape[-1] != self._n_units:
      raise InputValueError(
          'Second argument in input signature should have a final dimension '
          f'of {self._n_units}; instead got {state_sig.shape[-1]}.')
    d_in = x_sig.shape[-1] + self._n_units
    rng1, rng2, rng3, rng4 = fastmath.random.split(self.rng, 4)
    w1 = self._kernel_initializer((d_in, 2 * self._n_units), rng1)
    b1 = self._bias_initializer((2 * self._n_units,), rng2) + self._forget_bias
    w2 = self._kernel_initializer((d_in, self._n_units), rng3)
    b2 = self._bias_initializer((self._n_units,), rng4)
    self.weights = (w1, b1, w2, b2)


def GRU(n_units, mode='train'):
  """GRU over axis 1 of `(batch, length, n_units)` from a zero state; named `GRU_{n_units}`."""
  return cb.Serial(
      cb.Branch([], MakeZeroState(depth_multiplier=1)),
      cb.Scan(GRUCell(n_units=n_units), axis=1, mode=mode),
      cb.Select([0], n_in=2),  # Drops the RNN state.
      name=f'GRU_{n_units}', sublayers_to_print=[])


def ConvGRUCell(n_units, kernel_size=(3, 3)):
  """Convolutional GRU cell (https://arxiv.org/abs/1511.06432) on NHWC states.

  A `GeneralGRUCell` whose transforms are `Conv(n_units, kernel_size,
  padding='SAME')`: the state `s` (batch, h, w, n_units) maps to a new state
  of the same shape. Its candidate branch has `Dropout(0.1)` in train mode,
  as in Trax.
  """
  def build_conv():
    return convolution.Conv(filters=n_units, kernel_size=kernel_size,
                            padding='SAME')
  return GeneralGRUCell(candidate_transform=build_conv,
                        memory_transform_fn=None,
                        gate_nonlinearity=activation_fns.Sigmoid,
                        candidate_nonlinearity=activation_fns.Tanh)


def GeneralGRUCell(candidate_transform, memory_transform_fn=None,
                   gate_nonlinearity=activation_fns.Sigmoid,
                   candidate_nonlinearity=activation_fns.Tanh,
                   dropout_rate_c=0.1, sigmoid_bias=0.5):
  r"""GRU cell with given transforms, mapping a state `s` to the next one.

  .. math::
    u &= g(T_u(s) + \beta) \\
    r &= g(T_r(s) + \beta) \\
    c &= \mathrm{dropout}(h(T_c(r \odot s))) \\
    s' &= u \odot m(s) + (1 - u) \odot c

  with `g = gate_nonlinearity`, `h = candidate_nonlinearity`,
  `β = sigmoid_bias`, three independent `candidate_transform()` layers `T`
  and `m = memory_transform_fn()` (identity if None).

  Args:
    candidate_transform: Function returning a new transform layer.
    memory_transform_fn: Optional function returning a layer applied to the
      memory before gating.
    gate_nonlinearity: Gate activation layer constructor.
    candidate_nonlinearity: Candidate activation layer constructor.
    dropout_rate_c: Dropout rate on the candidate (train mode).
    sigmoid_bias: Constant added before the gate nonlinearities.

  Returns:
    The cell as a layer.
  """
  gate_block = [candidate_transform(), _AddSigmoidBias(sigmoid_bias),
                gate_nonlinearity()]
  reset_block = [candidate_transform(), _AddSigmoidBias(sigmoid_bias),
                 gate_nonlinearity()]
  candidate_block = [
      cb.Dup(),
      reset_block,
      cb.Multiply(),  # r * s
      candidate_transform(),
      candidate_nonlinearity(),
      core.Dropout(rate=dropout_rate_c),
  ]
  memory_transform = memory_transform_fn() if memory_transform_fn else []
  return cb.Serial(
      cb.Branch(memory_transform, gate_block, candidate_block),
      cb.Gate(),
  )


def InnerSRUCell():
  """The SRU recurrence `(x·(1-f), f, c) -> (c', c')` with `c' = f·c + x·(1-f)`."""
  def f(cur_x_times_one_minus_f, cur_f, cur_state):
    res = cur_f * cur_state + cur_x_times_one_minus_f
    return res, res
  return base.Fn('InnerSRUCell', f, n_out=2)


def ScanSRUCell(mode, monkey_patched_mask=None):
  """`InnerSRUCell` scanned over axis 1.

  With `monkey_patched_mask` (Terraformer, predict mode only), an object
  whose `get_layer()` pushes a mask: positions where the mask is 0 keep the
  previous state.
  """
  if monkey_patched_mask is None:
    return cb.Scan(InnerSRUCell(), axis=1, mode=mode)
  if mode != 'predict':
    raise ArgumentValueError('ScanSRUCell takes a monkey_patched_mask in predict mode '
                             f'only; got mode={mode!r}.')

  def update_mask(mask, x_times_one_minus_f):
    initial = jnp.ones(x_times_one_minus_f.shape[:2], dtype=jnp.float32)
    if initial.shape[1] > 1:
      updated_mask = fastmath.dynamic_update_slice_in_dim(
          initial != 0, mask != 0, 1, axis=1)
    else:
      updated_mask = initial
    return updated_mask, x_times_one_minus_f

  def masked_inner_sru_cell(cur_mask, cur_x_times_one_minus_f, cur_f,
                            cur_state):
    keep = fastmath.with_rank(cur_mask, cur_state.ndim).astype(cur_state.dtype)
    res = ((cur_f * cur_state + cur_x_times_one_minus_f) * keep
           + (1 - keep) * cur_state)
    return res, res

  return cb.Serial(
      monkey_patched_mask.get_layer(),
      base.Fn('update_mask', update_mask, n_out=2),
      cb.Scan(base.Fn('MaskedInnerSRUCell', masked_inner_sru_cell, n_out=2),
              axis=1, mode=mode),
  )


def SRU(n_units, activation=None, mode='train', scan_cell=ScanSRUCell):
  r"""Simple Recurrent Unit (https://arxiv.org/abs/1709.02755) over axis 1.

  .. math::
    [r, f, y] &= x·W + b, \quad r, f \leftarrow \sigma(r), \sigma(f) \\
    c_t &= f_t c_{t-1} + (1 - f_t) y_t \quad (c_0 = 0) \\
    h_t &= r_t \, \mathrm{act}(c_t) + (1 - r_t) \, x_t \sqrt{3}

  Inputs `(batch, length, n_units)` (the highway term needs depth
  `n_units`); weights of the one `Dense(3 * n_units)`.

  Args:
    n_units: Depth of inputs and outputs.
    activation: Optional activation layer applied to `c`.
    mode: If 'predict', the last `c` is kept between calls.
    scan_cell: The recurrence over axis 1, called as `scan_cell(mode=mode)`:
      `ScanSRUCell`, or one taking a mask (Terraformer's predict mode passes
      `functools.partial(ScanSRUCell, monkey_patched_mask=...)`).

  Returns:
    A layer named `SRU_{n_units}` (sublayers not printed).
  """
  sigmoid_activation = activation_fns.Sigmoid()
  return cb.Serial(                                         # x
      cb.Branch(core.Dense(3 * n_units), []),               # r_f_y, x
      cb.Split(n_items=3),                                  # r, f, y, x
      cb.Parallel(sigmoid_activation, sigmoid_activation),  # r, f, y, x
      base.Fn('', lambda r, f, y: (y * (1.0 - f), f, r),    # y(1-f), f, r, x
              n_out=3),
      cb.Parallel([], [], cb.Branch(MakeZeroState(), [])),
      scan_cell(mode=mode),
      cb.Select([0], n_in=2),                               # c, r, x
      activation if activation is not None else [],
      base.Fn('FinalSRUGate', lambda c, r, x: c * r + x * (1 - r) * (3**0.5)),
      name=f'SRU_{n_units}', sublayers_to_print=[])


def _AddSigmoidBias(sigmoid_bias):
  # The name is Trax's literal string (its f-prefix is missing there too).
  return base.Fn('AddSigmoidBias({sigmoid_bias})',
                 lambda x: x + sigmoid_bias)
