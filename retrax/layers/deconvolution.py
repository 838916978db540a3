"""Transposed convolution: `ConvTranspose` (`lax.conv_transpose`)."""

import functools
import itertools
import operator

from jax import lax

from retrax import fastmath
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.layers import base
from retrax.layers import convolution
from retrax.layers import initializers as init
from retrax.validation import ArgumentValueError


@configurable('trax.layers')
class ConvTranspose(convolution.ConvLayoutMixin, base.Layer):
  """N-d transposed ("de-") convolution plus bias, as Trax's (`lax.conv_transpose`).

  With 'VALID' padding and strides `s`, a spatial size `n` becomes
  `n * s + max(k - s, 0)` (k the dilated kernel size); with 'SAME' it becomes
  `n * s`. The kernel is not flipped (`transpose_kernel=False`), as in Trax.
  Weights are `(w, b)`: `w` shaped as `dimension_numbers[1]` spells, `b`
  `(filters,)` for channels-last outputs. Inputs of rank above the layout's
  have their leading axes merged into the batch axis (NHWC only, as Trax).

  Args:
    filters: Number of output channels.
    kernel_size: Tuple of kernel sizes, one per spatial axis.
    strides: Tuple of strides (default all 1).
    padding: 'VALID' or 'SAME' (or (low, high) pairs).
    rhs_dilation: Kernel dilation per spatial axis (default none).
    dimension_numbers: (input, kernel, output) layout strings.
    kernel_initialzer: Kernel initializer (Trax's spelling); default
      Glorot-normal at the kernel's 'I' and 'O' axes.
    bias_initializer: Bias initializer.
    kernel_initializer: Same as `kernel_initialzer` (keyword-only alias).
  """

  def __init__(self, filters, kernel_size, strides=None, padding='VALID',
               rhs_dilation=None, dimension_numbers=('NHWC', 'HWIO', 'NHWC'),
               kernel_initialzer=None,
               bias_initializer=init.RandomNormalInitializer(1e-6), *,
               kernel_initializer=None):
    super().__init__()
    if kernel_initialzer is not None and kernel_initializer is not None:
      raise ArgumentValueError('Give kernel_initialzer or kernel_initializer, not '
                               'both.')
    kernel_initializer = kernel_initialzer or kernel_initializer
    self._set_conv_layout(filters, kernel_size, padding, dimension_numbers,
                          kernel_initializer, bias_initializer)
    self._strides = tuple(strides or self._one)
    self._rhs_dilation = None if rhs_dilation is None else tuple(rhs_dilation)
    if self._padding == 'SAME_LOWER':
      raise ArgumentValueError("ConvTranspose takes padding 'VALID', 'SAME' or (low, "
                               "high) pairs; got 'SAME_LOWER'.")

  def _conv_shape(self, shape):
    shape = tuple(shape)
    rank = len(self._lhs_spec)
    if len(shape) == rank:
      return shape
    if len(shape) < rank or len(shape) <= 4 or not (
        self._lhs_spec == self._out_spec == 'NHWC'):
      raise InputValueError(
          f'{self.name} with input layout {self._lhs_spec!r} expects rank-'
          f'{rank} inputs ({", ".join(self._lhs_spec)}); got shape {shape} '
          f'(rank {len(shape)}). Only NHWC takes extra leading (batch) axes.')
    return (functools.reduce(operator.mul, shape[:-3], 1),) + shape[-3:]

  def forward(self, x):
    if not isinstance(self.weights, (tuple, list)) or len(self.weights) != 2:
      raise InputValueError(f'{self.name} weights should be a (w, b) pair; got '
                            f'{base.signature(self.weights)}; was the layer '
                            'initialized?')
    w, b = self.weights
    convolution.check_float_input(self, x)
    shape = self._conv_shape(x.shape)
    c_in = shape[self._lhs_spec.index('C')]
    w_in = w.shape[self._rhs_spec.index('I')]
    if c_in != w_in:
      raise InputValueError(
          f'{self.name} expects inputs with {w_in} channels (its kernel has '
          f'shape {tuple(w.shape)}); got input shape {tuple(x.shape)}.')
    x_shape = tuple(x.shape)
    if len(x_shape) != len(shape):
      x = jnp.reshape(x, shape)
    res = lax.conv_transpose(x, w, self._strides, self._padding,
                             self._rhs_dilation, self._dimension_numbers)
    res = res + fastmath.with_rank(b, res.ndim)
    if len(x_shape) != len(shape):
      res = jnp.reshape(res, x_shape[:-3] + tuple(res.shape[-3:]))
    return res

  def init_weights_and_state(self, input_signature):
    convolution.check_float_input(self, input_signature)
    shape = self._conv_shape(input_signature.shape)
    kernel_shape = self._conv_kernel_shape(shape)
    bias_dims = [self._filters if c == 'C' else 1 for c in self._out_spec]
    bias_shape = tuple(itertools.dropwhile(lambda d: d == 1, bias_dims))
    rng_w, rng_b = fastmath.random.split(self.rng, 2)
    w = self._kernel_initializer(kernel_shape, rng_w)
    b = self._bias_initializer(bias_shape, rng_b)
    self.weights = (w, b)
