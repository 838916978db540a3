"""Sparse feed-forward (Trax's `layers.research.sparsity.SparseFF`, "1 in N").

The dense block `Dense(d_ff), Relu, Dense(d_model)` is split into
`d1 = d_ff // N` blocks of `N` units, of which exactly one per block is active.
A low-rank controller picks it: `logits = x·M1·M2 + Mb` (shape `[d1, N]`),
`quant_mask = argmax(logits)` over each block. Then

    mid[x, y] = relu((x·W1)[x, y]) · onehot(quant_mask)[x, y]
    out       = Σ_{x,y} mid[x, y] · W2[y, x, :] + b2

Weights and state have Trax 1.4.1's layout, so checkpoints load leaf for leaf:
controller `(M1 [d_model, d_lowrank], M2 [d_lowrank, d1, N], Mb [d1, N])`,
main `(W1 [d_model, d1, N], W2 [N, d1, d_model], b2 [d_model])`.

In training the controller samples with straight-through Gumbel-softmax at
`temperature`, and a random `1 - quant_prob` of the steps use the soft mask
instead of the one-hot one (https://arxiv.org/abs/1801.09797, Section 2.1).
In 'predict' mode only the selected columns and rows are gathered.

Trax re-reads, in a reversible model's backward pass, the quantization mask it
remembered in the forward pass (a `running_second_time` state flag that
retrax's reversible layers do not set). retrax keeps that state's layout but
recomputes the mask from the reconstructed input, which is the same mask
unless reconstruction error flips an argmax.
"""

from retrax import fastmath
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import initializers as init
from retrax.validation import ArgumentValueError


def _split_blocks(layer, d_ff, n_elements_in_block):
  if n_elements_in_block < 1 or d_ff % n_elements_in_block:
    raise ArgumentValueError(f'{layer}: d_ff ({d_ff}) must be a positive multiple of '
                             f'n_elements_in_block ({n_elements_in_block}).')
  return d_ff // n_elements_in_block, n_elements_in_block


def _check_depth(layer, x, d_model):
  if x.shape[-1] != d_model:
    raise InputValueError(f'{layer.name} was initialized for inputs of depth '
                          f'{d_model}; got input shape {tuple(x.shape)}.')


def _relu(x):
  # Not jnp.maximum: its gradient at 0 is 1/2, and unselected units sit at 0
  # exactly, so the straight-through gradient would leak into them.
  return jnp.where(x <= 0, jnp.zeros_like(x), x)


class _RememberInReverse(base.Layer):
  """Keeps its input in `state` (Trax's layout); returns it only if `output`."""

  def __init__(self, output=True):
    super().__init__(name='_RememberInReverse', n_out=1 if output else 0)
    self._output = output

  def forward(self, x):
    self.state = (x, {'running_second_time': ()})
    return x if self._output else ()

  def init_weights_and_state(self, input_signature):
    if isinstance(input_signature, (list, tuple)):
      input_signature = input_signature[0]
    self.state = (jnp.zeros(input_signature.shape, dtype=jnp.int32),
                  {'running_second_time': ()})


class _RecallQuantMaskInReverse(base.Layer):
  """`x -> (x, -1s [rows, elements])`: "no recalled mask" for the controller."""

  def __init__(self, elements):
    super().__init__(name='_RecallQuantMaskInReverse', n_in=1, n_out=2)
    self._elements = elements

  def forward(self, x):
    return x, -jnp.ones((x.shape[0], self._elements), dtype=jnp.int32)


class _SparseFFController(base.Layer):
  """`(x, recalled_mask) -> quant_mask [, soft_mask]`: one unit per block."""

  def __init__(self, d_ff, n_elements_in_block, d_lowrank, temperature,
               use_bfloat16, mode, kernel_initializer, bias_initializer,
               also_return_nondiscrete_output):
    super().__init__(name=f'_SparseFFController_{d_ff}', n_in=2,
                     n_out=2 if also_return_nondiscrete_output else 1, mode=mode)
    self._d_ff = d_ff
    self._d1, self._d2 = _split_blocks(self.name, d_ff, n_elements_in_block)
    self._d_lowrank = d_lowrank
    self._temperature = temperature if mode == 'train' else 0.0
    self._use_bfloat16 = use_bfloat16
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._soft = also_return_nondiscrete_output

  def forward(self, inputs):
    x, recalled_quant_mask = inputs
    m1, m2, mb = self.weights
    _check_depth(self, x, m1.shape[0])
    x = jnp.reshape(x, (-1, x.shape[-1]))
    logits = jnp.einsum('bd,dl,lxy->bxy', x, m1, m2) + mb[None]
    if self._soft:
      log_mask = logits - fastmath.logsumexp(logits, axis=-1, keepdims=True)
      mask = jnp.exp(log_mask)
      if self._temperature == 0.0:
        quant_mask = jnp.argmax(log_mask, axis=-1)
      else:
        u = fastmath.random.uniform(self.rng, mask.shape, jnp.float32, 1e-6,
                                    1.0 - 1e-6)
        gumbel = -jnp.log(-jnp.log(u))
        quant_mask = jnp.argmax(log_mask + gumbel * self._temperature, axis=-1)
    else:
      quant_mask = jnp.argmax(logits, axis=-1)
    if self._mode == 'train':  # A recalled mask (not -1) wins.
      quant_mask = jnp.where(recalled_quant_mask == -1, quant_mask,
                             recalled_quant_mask)
    return (quant_mask, mask) if self._soft else quant_mask

  def init_weights_and_state(self, input_signature):
    d_model = input_signature[0].shape[-1]
    rng_m1, rng_m2, rng_mb = fastmath.random.split(self.rng, 3)
    m1 = self._kernel_initializer((d_model, self._d_lowrank), rng_m1)
    m2 = self._kernel_initializer((self._d_lowrank, self._d_ff), rng_m2)
    mb = self._bias_initializer((self._d_ff,), rng_mb)
    if self._use_bfloat16:
      m1, m2, mb = (w.astype(jnp.bfloat16) for w in (m1, m2, mb))
    self.weights = (m1, jnp.reshape(m2, (self._d_lowrank, self._d1, self._d2)),
                    jnp.reshape(mb, (self._d1, self._d2)))


class _SparseFFMain(base.Layer):
  """`(quant_mask, [mask,] x) -> (quant_mask, y)`: sparse Dense-Relu-Dense."""

  def __init__(self, d_ff, n_elements_in_block, quant_prob, use_bfloat16,
               big_weights_in_bfloat16, mode, kernel_initializer,
               bias_initializer, multiply_by_controller_output, kernel_scaling):
    with_mask = mode == 'train' or multiply_by_controller_output
    super().__init__(name=f'_SparseFFMain_{d_ff}', n_in=3 if with_mask else 2,
                     n_out=2, mode=mode)
    self._d_ff = d_ff
    self._d1, self._d2 = _split_blocks(self.name, d_ff, n_elements_in_block)
    self._quant_prob = quant_prob
    self._use_bfloat16 = use_bfloat16
    self._big_weights_in_bfloat16 = big_weights_in_bfloat16
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer
    self._multiply = multiply_by_controller_output
    self._kernel_scaling = kernel_scaling
    self._with_mask = with_mask

  def forward(self, inputs):
    if self._with_mask:
      quant_mask, mask, x = inputs
    else:
      (quant_mask, x), mask = inputs, None
    w1, w2, b2 = self.weights
    _check_depth(self, x, w1.shape[0])
    x_shape = x.shape
    x = jnp.reshape(x, (-1, x_shape[-1]))
    if self._mode == 'predict':  # Gather only the selected units.
      idx = quant_mask[:, :, None, None]                   # [b, d1, 1, 1]
      def gather(w):  # [d1, N, dm] -> the chosen [b, d1, dm]
        return jnp.take_along_axis(w[None], idx, axis=2)[:, :, 0]
      w1_sel = gather(jnp.transpose(w1, (1, 2, 0)))
      w2_sel = gather(jnp.transpose(w2, (1, 0, 2)))
      relu = _relu(jnp.einsum('bd,bxd->bx', x, w1_sel))
      if self._multiply:
        relu *= jnp.take_along_axis(mask, quant_mask[..., None], -1)[..., 0]
      res = jnp.einsum('bx,bxd->bd', relu, w2_sel) + b2[None]
    else:
      one_hot = core.one_hot(quant_mask, self._d2)
      if self._mode == 'train':
        # Straight-through: one-hot forward, soft-mask gradient; with
        # probability 1 - quant_prob the soft mask itself is used.
        one_hot = fastmath.stop_gradient(one_hot)
        one_hot += mask - fastmath.stop_gradient(mask)
        select = fastmath.random.uniform(self.rng, (), jnp.float32, 0.0, 1.0)
        one_hot = jnp.where(select < self._quant_prob, one_hot, mask)
      mid = jnp.einsum('bd,dxy->bxy', x, w1) * one_hot
      relu = _relu(mid)
      if self._multiply:
        if self._mode == 'train':  # Soft-mask steps are already multiplied.
          relu = relu * fastmath.stop_gradient(
              jnp.where(select < self._quant_prob, mask, jnp.ones_like(mask)))
        else:
          relu = relu * mask
      res = jnp.einsum('bxy,yxd->bd', relu, w2) + b2[None]
    return quant_mask, jnp.reshape(res, x_shape)

  def init_weights_and_state(self, input_signature):
    d_model = input_signature[-1].shape[-1]
    rng_w1, rng_w2, rng_b2 = fastmath.random.split(self.rng, 3)
    w1 = self._kernel_initializer((d_model, self._d_ff), rng_w1)
    w2 = self._kernel_initializer((self._d_ff, d_model), rng_w2)
    b2 = self._bias_initializer((d_model,), rng_b2)
    if self._use_bfloat16:
      b2 = b2.astype(jnp.bfloat16)
    if self._use_bfloat16 or self._big_weights_in_bfloat16:
      w1, w2 = w1.astype(jnp.bfloat16), w2.astype(jnp.bfloat16)
    w1 = jnp.reshape(w1, (d_model, self._d1, self._d2))
    w2 = jnp.reshape(w2, (self._d2, self._d1, d_model))
    if self._kernel_scaling:  # Output variance independent of N.
      w2 = w2 * (self._d2 ** 0.5)
    self.weights = (w1, w2, b2)


def SparseFF(d_ff, n_elements_in_block=32, d_lowrank=64, temperature=0.1,
             quant_prob=0.3, use_bfloat16=False, big_weights_in_bfloat16=False,
             mode='train', kernel_initializer=init.GlorotUniformInitializer(),
             bias_initializer=init.RandomNormalInitializer(1e-6),
             dropout_rate=0.0, dropout_shared_axes=None, ff_chunk_size=0,
             multiply_by_controller_output=False, kernel_scaling=False):
  """Feed-forward `d_model -> d_ff -> d_model` with one active unit per block.

  Args:
    d_ff: Depth of the (sparse) hidden layer.
    n_elements_in_block: N: units per block, one of which is active.
    d_lowrank: Rank of the controller's `M1·M2` factorization.
    temperature: Gumbel-softmax temperature of the controller in training.
    quant_prob: Fraction of training steps using the one-hot mask (the others
      use the controller's soft mask).
    use_bfloat16: bfloat16 weights.
    big_weights_in_bfloat16: bfloat16 for `W1`, `W2` only.
    mode: 'train', 'eval' or 'predict'.
    kernel_initializer, bias_initializer: Initializers (shapes before the
      block reshape: `[d_model, d_ff]`, `[d_ff, d_model]`, `[d_ff]`, ...).
    dropout_rate, dropout_shared_axes: Dropout on the block's output.
    ff_chunk_size: If > 0, rows (batch * positions) run in chunks of this size.
    multiply_by_controller_output: Scale active units by the controller's
      softmax probability.
    kernel_scaling: Scale `W2` by `sqrt(N)` at init.

  Returns:
    A layer `[..., d_model] -> [..., d_model]` (Trax's layer tree).
  """
  _split_blocks('SparseFF', d_ff, n_elements_in_block)
  soft = mode == 'train' or multiply_by_controller_output
  controller = _SparseFFController(
      d_ff, n_elements_in_block, d_lowrank, temperature, use_bfloat16, mode,
      kernel_initializer, bias_initializer, also_return_nondiscrete_output=soft)
  main = [
      _SparseFFMain(d_ff, n_elements_in_block, quant_prob, use_bfloat16,
                    big_weights_in_bfloat16, mode, kernel_initializer,
                    bias_initializer, multiply_by_controller_output,
                    kernel_scaling),                           # quant_mask, y
      cb.Select([1, 0]),
      core.Dropout(rate=dropout_rate, shared_axes=dropout_shared_axes,
                   mode=mode),
      cb.Select([1, 0]),                                       # quant_mask, y
  ]
  return cb.BatchLeadingAxes(cb.Serial(
      _RecallQuantMaskInReverse(d_ff // n_elements_in_block),  # x, recalled
      cb.Chunk(cb.Serial(cb.Select((0, 1, 0)),                 # x, recalled, x
                         controller,                           # qm, [mask,] x
                         main),
               ff_chunk_size),                                 # quant_mask, y
      _RememberInReverse(output=False),                        # y
  ))
