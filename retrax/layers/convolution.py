"""Convolution layers: `Conv`, `CausalConv`, `Conv1d`, `CausalDepthwiseConv`.

Layouts follow Trax: `dimension_numbers=(lhs, rhs, out)` are strings such as
`('NHWC', 'HWIO', 'NHWC')`, where `N` is the batch axis, `C` the channels of
the input/output, `I`/`O` the kernel's input/output channels and any other
letters spatial axes. The kernel has the shape spelled by `rhs` (e.g.
`(kh, kw, c_in, filters)` for `'HWIO'`); the bias has shape `(filters,)`
(for channels-last outputs; `(filters, 1, 1)` for `'NCHW'`).
"""

import functools
import itertools
import operator

import jax
from jax import lax
import numpy as np

from retrax import fastmath
from retrax.errors import InputTypeError
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import initializers as init
from retrax.shapes import ShapeDtype
from retrax.validation import ArgumentValueError


def check_float_input(layer, sig):
  """Raises a clear TypeError unless `sig` has a floating-point dtype."""
  if not jax.numpy.issubdtype(np.dtype(sig.dtype), jax.numpy.floating):
    raise InputTypeError(
        f'{layer.name} expects floating-point inputs; got '
        f'{base.signature(sig)}. Cast images with tl.ToFloat() or '
        'x.astype(np.float32).')


def _as_tuple(x, name, n):
  """`x` as a tuple of `n` ints (an int is repeated)."""
  if isinstance(x, int):
    return (x,) * n
  x = tuple(x)
  if len(x) != n:
    raise ArgumentValueError(f'{name} must have {n} entries (one per spatial axis); '
                             f'got {x}.')
  return x


def check_padding(padding, n_spatial):
  """`padding` for `lax`: 'VALID', 'SAME', 'SAME_LOWER' or (low, high) pairs."""
  if isinstance(padding, str):
    if padding.upper() not in ('VALID', 'SAME', 'SAME_LOWER'):
      raise ArgumentValueError(f"padding must be 'VALID', 'SAME' or 'SAME_LOWER' (or "
                               f'(low, high) pairs); got {padding!r}.')
    return padding.upper()
  try:
    pairs = tuple(tuple(int(v) for v in p) for p in padding)
  except TypeError:
    pairs = ()
  if len(pairs) != n_spatial or any(len(p) != 2 for p in pairs):
    raise ArgumentValueError(f'Explicit padding must be {n_spatial} (low, high) pairs;'
                             f' got {padding!r}.')
  return pairs


def check_windows_fit(layer_name, shape, spatial_axes, window, dilation,
                      padding, what):
  """Raises a clear ValueError if a window is larger than the padded input."""
  if isinstance(padding, str) and padding != 'VALID':
    return  # 'SAME' pads as needed.
  for i, axis in enumerate(spatial_axes):
    size = shape[axis]
    effective = (window[i] - 1) * dilation[i] + 1
    padded = size if padding == 'VALID' else (
        size + padding[i][0] + padding[i][1])
    if effective > padded:
      extra = '' if dilation[i] == 1 else f' (dilated by {dilation[i]})'
      raise InputValueError(
          f'{layer_name}: {what} of size {window[i]}{extra} along spatial axis '
          f'{axis} is larger than the input there ({size}, padded to '
          f'{padded}) with padding {padding!r}; input shape {tuple(shape)}. '
          "Use a smaller window, a larger input or padding='SAME'.")


class ConvLayoutMixin:
  """The layout settings `Conv` and `ConvTranspose` share, checked once."""

  def _set_conv_layout(self, filters, kernel_size, padding, dimension_numbers,
                       kernel_initializer, bias_initializer):
    """Checks and stores the shared settings; returns the number of spatial axes.

    Sets `_filters`, `_kernel_size`, `_dimension_numbers`, the three layout
    specs, `_one`, `_padding` and the initializers (default kernel
    initializer: Glorot-normal with fans at the kernel's 'I' and 'O' axes).
    """
    self._filters = filters
    self._kernel_size = tuple(kernel_size)
    self._dimension_numbers = tuple(dimension_numbers)
    check_dimension_numbers(self._dimension_numbers)
    lhs, rhs, _ = self._dimension_numbers
    self._lhs_spec, self._rhs_spec, self._out_spec = self._dimension_numbers
    n_spatial = len(lhs) - 2
    if len(self._kernel_size) != n_spatial:
      raise ArgumentValueError(
          f'kernel_size {self._kernel_size} must have {n_spatial} entries, '
          f'one per spatial axis of input layout {lhs!r}.')
    self._one = (1,) * n_spatial
    self._padding = check_padding(padding, n_spatial)
    self._bias_initializer = bias_initializer
    self._kernel_initializer = kernel_initializer or (
        init.GlorotNormalInitializer(rhs.index('O'), rhs.index('I')))
    return n_spatial

  def _conv_kernel_shape(self, input_shape):
    """The kernel shape for inputs of `input_shape`."""
    sizes = iter(self._kernel_size)
    channels = input_shape[self._lhs_spec.index('C')]
    return [self._filters if c == 'O' else channels if c == 'I' else next(sizes)
            for c in self._rhs_spec]


class Conv(ConvLayoutMixin, base.Layer):
  """General N-d convolution (`lax.conv_general_dilated`) plus bias.

  Inputs with more axes than `dimension_numbers[0]` spells (e.g. rank 5 for
  `'NHWC'`: `(B, T, H, W, C)`) have their leading axes merged into the batch
  axis and split again afterwards, as in Trax.

  Args:
    filters: Number of output channels.
    kernel_size: Tuple of kernel sizes, one per spatial axis.
    strides: Tuple of strides (default all 1).
    padding: 'VALID', 'SAME', 'SAME_LOWER' or one (low, high) pair per
      spatial axis.
    dimension_numbers: (input, kernel, output) layout strings.
    kernel_initializer: Initializer of the kernel; default Glorot-normal with
      fans at the kernel's 'I' and 'O' axes.
    bias_initializer: Initializer of the bias.
    use_bias: Whether to add a bias (weights `(w, b)`; else `w` alone).
    rhs_dilation: Kernel dilation per spatial axis (default 1: none); a
      retrax extension, Trax's `Conv` has no dilation.
  """

  def __init__(self, filters, kernel_size, strides=None, padding='VALID',
               dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
               kernel_initializer=None,
               bias_initializer=init.RandomNormalInitializer(1e-6),
               use_bias=True, rhs_dilation=None):
    super().__init__()
    n_spatial = self._set_conv_layout(filters, kernel_size, padding,
                                      dimension_numbers, kernel_initializer,
                                      bias_initializer)
    self._strides = _as_tuple(strides or self._one, 'strides', n_spatial)
    self._dilation = _as_tuple(rhs_dilation or self._one, 'rhs_dilation',
                               n_spatial)
    self._use_bias = use_bias

  # --- shapes ---------------------------------------------------------------

  def _conv_shape(self, shape):
    """The shape `lax` sees: leading axes merged into the batch axis if needed."""
    shape = tuple(shape)
    rank = len(self._lhs_spec)
    if len(shape) == rank:
      return shape
    if len(shape) < rank or not (self._lhs_spec[0] == self._out_spec[0] ==
                                 'N'):
      raise InputValueError(
          f'{self.name} with input layout {self._lhs_spec!r} expects rank-'
          f'{rank} inputs ({", ".join(self._lhs_spec)})'
          + (' or more (leading axes act as batch)'
             if self._lhs_spec[0] == self._out_spec[0] == 'N' else '') +
          f'; got shape {shape} (rank {len(shape)}).')
    n_lead = len(shape) - rank + 1
    return (functools.reduce(operator.mul, shape[:n_lead], 1),) + shape[n_lead:]

  def _check_input(self, sig):
    check_float_input(self, sig)
    shape = self._conv_shape(sig.shape)
    spatial = [i for i, c in enumerate(self._lhs_spec) if c not in 'NC']
    check_windows_fit(self.name, shape, spatial, self._kernel_size,
                      self._dilation, self._padding, 'kernel')
    return shape

  # --- layer API ------------------------------------------------------------

  def forward(self, x):
    if self._use_bias:
      if not isinstance(self.weights, (tuple, list)) or len(self.weights) != 2:
        raise InputValueError(f'{self.name} weights should be a (w, b) pair; got '
                              f'{base.signature(self.weights)}; was the layer '
                              'initialized?')
      w, b = self.weights
    else:
      w, b = self.weights, None
    shape = self._check_input(x)
    c_in = shape[self._lhs_spec.index('C')]
    w_in = w.shape[self._rhs_spec.index('I')]
    if c_in != w_in:
      raise InputValueError(
          f'{self.name} expects inputs with {w_in} channels (its kernel has '
          f'shape {tuple(w.shape)}, layout {self._rhs_spec!r}); got input '
          f'shape {tuple(x.shape)} with {c_in} channels (layout '
          f'{self._lhs_spec!r}).')
    x_shape = tuple(x.shape)
    if len(x_shape) != len(shape):
      x = jnp.reshape(x, shape)
    res = lax.conv_general_dilated(
        x, w, self._strides, self._padding, lhs_dilation=None,
        rhs_dilation=self._dilation, dimension_numbers=self._dimension_numbers)
    if b is not None:
      res = res + fastmath.with_rank(b, res.ndim)
    if len(x_shape) != len(shape):
      n_lead = len(x_shape) - len(shape) + 1
      res = jnp.reshape(res, x_shape[:n_lead] + tuple(res.shape[1:]))
    return res

  def init_weights_and_state(self, input_signature):
    shape = self._check_input(input_signature)
    kernel_shape = self._conv_kernel_shape(shape)
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer(kernel_shape, rng_w)
    if self._use_bias:
      bias_dims = [self._filters if c == 'C' else 1 for c in self._out_spec]
      bias_shape = tuple(itertools.dropwhile(lambda d: d == 1, bias_dims))
      self.weights = (w, self._bias_initializer(bias_shape, rng_b))
    else:
      self.weights = w


def check_dimension_numbers(dimension_numbers):
  """Raises a clear ValueError unless the three layouts are consistent."""
  if len(dimension_numbers) != 3:
    raise ArgumentValueError('dimension_numbers must be 3 layout strings (input, '
                             f'kernel, output); got {dimension_numbers!r}.')
  lhs, rhs, out = dimension_numbers
  if not len(lhs) == len(rhs) == len(out) or len(lhs) < 3:
    raise ArgumentValueError(f'Layouts {dimension_numbers!r} must have equal lengths '
                             '(2 + number of spatial axes).')
  for spec, letters in ((lhs, 'NC'), (rhs, 'IO'), (out, 'NC')):
    if any(spec.count(c) != 1 for c in letters) or len(set(spec)) != len(spec):
      raise ArgumentValueError(f'Layout {spec!r} in {dimension_numbers!r} must name '
                               f'{letters[0]!r} and {letters[1]!r} once each.')


class CausalConv(Conv):
  """Causal 1-d convolution on `(batch, time, depth)`: position t sees only <= t.

  Pads `kernel_width - 1` zeros on the left of the time axis, then applies a
  'VALID' convolution, so the output has the input's length.
  """

  def __init__(self, filters, kernel_width=3, kernel_initializer=None,
               bias_initializer=init.RandomNormalInitializer(1e-6),
               use_bias=True):
    super().__init__(filters=filters, kernel_size=(kernel_width,),
                     strides=None, padding='VALID',
                     dimension_numbers=('NWC', 'WIO', 'NWC'),
                     kernel_initializer=kernel_initializer,
                     bias_initializer=bias_initializer, use_bias=use_bias)

  def _left_pad(self, x):
    if len(x.shape) != 3:
      raise InputValueError(f'{self.name} expects (batch, time, depth) inputs; got '
                            f'shape {tuple(x.shape)}.')
    pad = self._kernel_size[0] - 1
    return jnp.pad(x, [(0, 0), (pad, 0), (0, 0)], mode='constant')

  def forward(self, x):
    return super().forward(self._left_pad(x))

  def init_weights_and_state(self, input_signature):
    if len(input_signature.shape) != 3:
      raise InputValueError(f'{self.name} expects (batch, time, depth) inputs; got '
                            f'shape {tuple(input_signature.shape)}.')
    b, t, d = input_signature.shape
    padded = ShapeDtype((b, t + self._kernel_size[0] - 1, d),
                             input_signature.dtype)
    super().init_weights_and_state(padded)


def Conv1d(filters, kernel_size, stride=1, padding='VALID',
           kernel_initializer=None,
           bias_initializer=init.RandomNormalInitializer(1e-6),
           use_bias=True):
  """1-d convolution on `(batch, width, channels)`: a `Conv` with layout NWC/WIO."""
  return Conv(filters, (kernel_size,), strides=(stride,), padding=padding,
              dimension_numbers=('NWC', 'WIO', 'NWC'),
              kernel_initializer=kernel_initializer,
              bias_initializer=bias_initializer, use_bias=use_bias)


class CausalDepthwiseConv(base.Layer):
  """Causal depthwise convolution along axis 1 of `(batch, length, depth)`.

  `y[:, t, d] = sum_i w[i, d] * x[:, t - i, d]` (zero for `t - i < 0`);
  weights `w` have shape `(kernel_size, depth)`.
  """

  def __init__(self, kernel_size=3,
               kernel_initializer=init.GlorotUniformInitializer(),
               use_bfloat16=False):
    super().__init__(n_in=1, n_out=1)
    self._kernel_size = kernel_size
    self._kernel_initializer = kernel_initializer
    self._use_bfloat16 = use_bfloat16

  def _check(self, shape):
    if len(shape) != 3:
      raise InputValueError(f'{self.name} expects (batch, length, depth) inputs; got'
                            f' shape {tuple(shape)}.')

  def forward(self, x):
    self._check(x.shape)
    w = self.weights
    if not hasattr(w, 'shape') or tuple(w.shape) != (self._kernel_size,
                                                     x.shape[-1]):
      raise InputValueError(
          f'{self.name} expects weights of shape ({self._kernel_size}, '
          f'{x.shape[-1]}) for input {tuple(x.shape)}; got '
          f'{base.signature(w)}.')
    res = x * w[0, :][None, None, :]
    for i in range(1, self._kernel_size):
      x = jnp.pad(x, [(0, 0), (1, 0), (0, 0)], mode='constant')[:, :-1, :]
      res += x * w[i, :][None, None, :]
    return res

  def init_weights_and_state(self, input_signature):
    self._check(input_signature.shape)
    rng_w, _ = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer(
        (self._kernel_size, input_signature.shape[-1]), rng_w)
    self.weights = w.astype(jnp.bfloat16) if self._use_bfloat16 else w
