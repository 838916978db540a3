"""Convolution layers against direct NumPy loops (float64) and finite differences."""

import functools
import math

import jax
from jax import test_util as jtu
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import convolution as conv
from retrax.layers import deconvolution as deconv
from retrax.layers import initializers as init
from retrax.shapes import ShapeDtype
from retrax.shapes import signature

RNG = jax.random.PRNGKey(0)


def randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def np_init(shape, rng):
  """A NumPy initializer (no per-shape XLA compilation of random draws)."""
  del rng
  return randn(*shape, seed=int(np.prod(shape)) % 1000)


# Layer arguments that keep random draws out of XLA in the numeric tests.
FAST = dict(kernel_initializer=np_init, bias_initializer=np_init)


def same_pads(sizes, kernel, strides, dilation):
  """TF/lax 'SAME': ceil(n / s) outputs, the extra padding on the high side."""
  pads = []
  for n, k, s, d in zip(sizes, kernel, strides, dilation):
    eff = (k - 1) * d + 1
    total = max((math.ceil(n / s) - 1) * s + eff - n, 0)
    pads.append((total // 2, total - total // 2))
  return pads


def ref_conv(x, w, strides, pads, dilation):
  """Channels-last N-d convolution by direct loops: x (N, *S, C), w (*K, C, F)."""
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  n_sp = x.ndim - 2
  xp = np.pad(x, [(0, 0)] + list(pads) + [(0, 0)])
  kernel = w.shape[:n_sp]
  eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
  out_sizes = [(xp.shape[1 + i] - eff[i]) // strides[i] + 1
               for i in range(n_sp)]
  out = np.zeros((x.shape[0],) + tuple(out_sizes) + (w.shape[-1],))
  for o in np.ndindex(*out_sizes):
    for k in np.ndindex(*kernel):
      src = tuple(o[i] * strides[i] + k[i] * dilation[i] for i in range(n_sp))
      out[(slice(None),) + o] += xp[(slice(None),) + src] @ w[k]
  return out


def run(layer, x, weights=None):
  return jax.jit(layer.pure_fn)(x, layer.weights if weights is None else
                                weights, layer.state, RNG)[0]


# --- Conv --------------------------------------------------------------------


@pytest.mark.parametrize('strides,padding,dilation', [
    ((1, 1), 'VALID', (1, 1)),
    ((2, 1), 'VALID', (1, 1)),
    ((1, 1), 'SAME', (1, 1)),
    ((2, 2), 'SAME', (1, 1)),
    ((1, 2), ((1, 0), (2, 1)), (1, 1)),
    ((1, 1), 'VALID', (2, 1)),
    ((2, 1), 'SAME', (1, 2)),
])
def test_conv2d_matches_direct_loops(strides, padding, dilation):
  x = randn(2, 7, 6, 3)
  layer = conv.Conv(4, (3, 2), strides=strides, padding=padding,
                    rhs_dilation=dilation, **FAST)
  (w, b), state = layer.init(signature(x))
  assert (w.shape, b.shape, state) == ((3, 2, 3, 4), (4,), ())
  pads = (same_pads((7, 6), (3, 2), strides, dilation) if padding == 'SAME'
          else [(0, 0)] * 2 if padding == 'VALID' else padding)
  want = ref_conv(x, w, strides, pads, dilation) + np.asarray(b)
  got = run(layer, x)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_defaults_follow_trax():
  layer = conv.Conv(4, (3, 3))
  key = jax.random.PRNGKey(5)
  w, b = layer.init(ShapeDtype((1, 5, 5, 4)), rng=key)[0]
  # Trax's defaults: Glorot-normal kernel with fans at the 'O' (3) and 'I'
  # (2) axes of HWIO, a N(0, 1e-6^2) bias, the layer's key split in two.
  key_w, key_b = jax.random.split(key, 2)
  np.testing.assert_array_equal(
      w, init.GlorotNormalInitializer(3, 2)((3, 3, 4, 4), key_w))
  np.testing.assert_array_equal(
      b, init.RandomNormalInitializer(1e-6)((4,), key_b))
  assert repr(layer) == 'Conv' and layer.n_in == layer.n_out == 1
  # The default strides are 1 and the default padding 'VALID'.
  assert layer.output_signature(ShapeDtype((1, 5, 5, 4))).shape == (1, 3, 3, 4)


def test_conv_without_bias_has_kernel_alone():
  x = randn(1, 4, 4, 2)
  layer = conv.Conv(3, (2, 2), use_bias=False, kernel_initializer=np_init)
  w = layer.init(signature(x))[0]
  assert hasattr(w, 'shape') and w.shape == (2, 2, 2, 3)
  np.testing.assert_allclose(run(layer, x), ref_conv(x, w, (1, 1), [(0, 0)] * 2,
                                                (1, 1)), rtol=1e-5, atol=1e-5)


def test_conv_channels_first_layout():
  x = randn(2, 3, 6, 5)  # NCHW
  layer = conv.Conv(4, (3, 2), strides=(1, 2), padding='SAME',
                    dimension_numbers=('NCHW', 'OIHW', 'NCHW'), **FAST)
  w, b = layer.init(signature(x))[0]
  assert w.shape == (4, 3, 3, 2) and b.shape == (4, 1, 1)
  x_last = np.transpose(x, (0, 2, 3, 1))
  w_last = np.transpose(w, (2, 3, 1, 0))
  want = ref_conv(x_last, w_last, (1, 2),
                  same_pads((6, 5), (3, 2), (1, 2), (1, 1)), (1, 1))
  want = np.transpose(want, (0, 3, 1, 2)) + np.asarray(b)
  np.testing.assert_allclose(run(layer, x), want, rtol=1e-5, atol=1e-5)


def test_conv1d_and_conv3d():
  x1 = randn(2, 9, 3)
  layer = conv.Conv1d(5, 3, stride=2, padding='SAME', **FAST)
  w, b = layer.init(signature(x1))[0]
  assert w.shape == (3, 3, 5) and repr(layer) == 'Conv'
  want = ref_conv(x1, w, (2,), same_pads((9,), (3,), (2,), (1,)), (1,)) + b
  np.testing.assert_allclose(run(layer, x1), want, rtol=1e-5, atol=1e-5)

  x3 = randn(1, 4, 5, 3, 2)
  layer = conv.Conv(3, (2, 3, 2), strides=(1, 2, 1),
                    dimension_numbers=('NDHWC', 'DHWIO', 'NDHWC'), **FAST)
  w, b = layer.init(signature(x3))[0]
  assert w.shape == (2, 3, 2, 2, 3)
  want = ref_conv(x3, w, (1, 2, 1), [(0, 0)] * 3, (1, 1, 1)) + b
  np.testing.assert_allclose(run(layer, x3), want, rtol=1e-5, atol=1e-5)


def test_conv_merges_leading_axes_into_batch():
  x = randn(2, 3, 5, 5, 2)  # (B, T, H, W, C)
  layer = conv.Conv(4, (3, 3), strides=(2, 2), padding='SAME', **FAST)
  w, b = layer.init(ShapeDtype((1, 1, 5, 5, 2)))[0]
  got = run(layer, x)
  assert got.shape == (2, 3, 3, 3, 4)
  for t in range(3):
    want = ref_conv(x[:, t], w, (2, 2), same_pads((5, 5), (3, 3), (2, 2),
                                                   (1, 1)), (1, 1)) + b
    np.testing.assert_allclose(got[:, t], want, rtol=1e-5, atol=1e-5)


def test_conv_gradients_match_finite_differences():
  x = randn(1, 5, 4, 2)
  layer = conv.Conv(2, (3, 2), strides=(2, 1), padding='SAME',
                    rhs_dilation=(1, 2), **FAST)
  weights = layer.init(signature(x))[0]
  f = jax.jit(lambda x, w: layer.pure_fn(x, w, (), RNG)[0])
  jtu.check_grads(f, (x, weights), order=1, modes=['rev'], atol=2e-2,
                  rtol=2e-2)


# --- CausalConv and Conv1d ----------------------------------------------------


def test_causal_conv_matches_left_padded_loops_and_is_causal():
  x = randn(2, 6, 3)
  layer = conv.CausalConv(4, kernel_width=3, **FAST)
  w, b = layer.init(signature(x))[0]
  assert w.shape == (3, 3, 4) and repr(layer) == 'CausalConv'
  want = ref_conv(x, w, (1,), [(2, 0)], (1,)) + b
  got = run(layer, x)
  assert got.shape == (2, 6, 4)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  changed = x.copy()
  changed[:, 4:] += 1.0
  got2 = run(layer, changed)
  np.testing.assert_allclose(got2[:, :4], got[:, :4], rtol=1e-6, atol=1e-6)
  assert np.max(np.abs(got2[:, 4:] - got[:, 4:])) > 1e-3
  # Sequences shorter than the kernel are fine (they are padded).
  assert run(layer, x[:, :1]).shape == (2, 1, 4)


def test_causal_depthwise_conv_matches_formula():
  x = randn(2, 5, 3)
  layer = conv.CausalDepthwiseConv(kernel_size=3, kernel_initializer=np_init)
  w = layer.init(signature(x))[0]
  assert w.shape == (3, 3) and repr(layer) == 'CausalDepthwiseConv'
  want = np.zeros(x.shape)
  for t in range(5):
    for i in range(3):
      if t - i >= 0:
        want[:, t] += np.asarray(w[i], np.float64) * x[:, t - i]
  np.testing.assert_allclose(run(layer, x), want, rtol=1e-5, atol=1e-6)
  f = jax.jit(lambda x, w: layer.pure_fn(x, w, (), RNG)[0])
  jtu.check_grads(f, (x, w), order=1, modes=['rev'], atol=2e-2, rtol=2e-2)
  wb = conv.CausalDepthwiseConv(use_bfloat16=True,
                                kernel_initializer=np_init).init(
                                    signature(x))[0]
  assert wb.dtype == jax.numpy.bfloat16


# --- ConvTranspose ------------------------------------------------------------


def ref_conv_transpose(x, w, strides, padding):
  """Scatter form: each input pixel adds its value times the flipped kernel.

  lax.conv_transpose (transpose_kernel=False, as Trax) correlates the
  stride-dilated input with the kernel, i.e. scatters with the flipped
  kernel. 'VALID' keeps size n*s + max(k - s, 0) from the start; 'SAME'
  keeps n*s starting at offset k - 1 - pad_lo, with lax's
  pad_lo = k - 1 if s > k - 1 else ceil((k + s - 2) / 2).
  """
  x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
  n_sp = x.ndim - 2
  sizes, kernel = x.shape[1:-1], w.shape[:n_sp]
  w = w[tuple(slice(None, None, -1) for _ in range(n_sp))]
  full_sizes = [(n - 1) * s + k for n, s, k in zip(sizes, strides, kernel)]
  full = np.zeros((x.shape[0],) + tuple(max(f, n * s) for f, n, s in zip(
      full_sizes, sizes, strides)) + (w.shape[-1],))
  for i in np.ndindex(*sizes):
    for j in np.ndindex(*kernel):
      dst = tuple(i[a] * strides[a] + j[a] for a in range(n_sp))
      full[(slice(None),) + dst] += x[(slice(None),) + i] @ w[j]
  if padding == 'VALID':
    out = [n * s + max(k - s, 0) for n, s, k in zip(sizes, strides, kernel)]
    start = [0] * n_sp
  else:
    out = [n * s for n, s in zip(sizes, strides)]
    start = [k - 1 - (k - 1 if s > k - 1 else math.ceil((k + s - 2) / 2))
             for k, s in zip(kernel, strides)]
  return full[(slice(None),) + tuple(slice(a, a + o) for a, o in zip(start,
                                                                     out))]


@pytest.mark.parametrize('strides,padding,kernel', [
    ((1, 1), 'VALID', (3, 2)),
    ((2, 2), 'VALID', (3, 3)),
    ((3, 2), 'VALID', (2, 2)),
    ((2, 1), 'SAME', (3, 2)),
    ((2, 3), 'SAME', (4, 2)),
])
def test_conv_transpose_matches_scatter_reference(strides, padding, kernel):
  x = randn(2, 3, 4, 2)
  layer = deconv.ConvTranspose(3, kernel, strides=strides, padding=padding,
                               kernel_initialzer=np_init,
                               bias_initializer=np_init)
  w, b = layer.init(signature(x))[0]
  assert w.shape == kernel + (2, 3) and b.shape == (3,)
  want = ref_conv_transpose(x, w, strides, padding) + np.asarray(b)
  got = run(layer, x)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_merges_leading_axes_and_has_gradients():
  x = randn(2, 2, 3, 3, 2)
  layer = deconv.ConvTranspose(2, (2, 2), strides=(2, 2),
                               kernel_initializer=np_init,
                               bias_initializer=np_init)
  weights = layer.init(ShapeDtype((1, 1, 3, 3, 2)))[0]
  got = run(layer, x)
  assert got.shape == (2, 2, 6, 6, 2) and repr(layer) == 'ConvTranspose'
  want = ref_conv_transpose(x[:, 1], weights[0], (2, 2), 'VALID') + weights[1]
  np.testing.assert_allclose(got[:, 1], want, rtol=1e-5, atol=1e-5)
  f = jax.jit(lambda x, w: layer.pure_fn(x, w, (), RNG)[0])
  jtu.check_grads(f, (x[:1, :1], weights), order=1, modes=['rev'], atol=2e-2,
                  rtol=2e-2)


def test_conv_transpose_accepts_both_initializer_spellings():
  ones = lambda shape, rng: np.ones(shape, np.float32)
  for kwargs in (dict(kernel_initialzer=ones), dict(kernel_initializer=ones)):
    w, _ = deconv.ConvTranspose(2, (2, 2), bias_initializer=np_init,
                                **kwargs).init(
        ShapeDtype((1, 3, 3, 1)))[0]
    assert np.all(np.asarray(w) == 1)


# --- errors -------------------------------------------------------------------


def _message(fn):
  with pytest.raises(base.LayerError) as info:
    fn()
  return str(info.value)


def test_conv_wrong_rank_is_a_clear_error():
  layer = conv.Conv(2, (3, 3))
  msg = _message(lambda: layer.init(ShapeDtype((5, 5, 3))))
  assert "expects rank-4 inputs (N, H, W, C)" in msg and '(5, 5, 3)' in msg
  layer1d = conv.Conv1d(2, 3)
  msg = _message(lambda: layer1d.init(ShapeDtype((5, 3))))
  assert 'expects rank-3 inputs (N, W, C)' in msg and 'got shape (5, 3)' in msg
  # A layout without a leading batch axis takes no extra axes.
  odd = conv.Conv(2, (3,), dimension_numbers=('WNC', 'WIO', 'WNC'))
  msg = _message(lambda: odd.init(ShapeDtype((2, 5, 5, 3))))
  assert 'expects rank-3 inputs (W, N, C); got shape (2, 5, 5, 3)' in msg


def test_kernel_larger_than_input_is_a_clear_error():
  msg = _message(lambda: conv.Conv(2, (3, 6)).init(ShapeDtype((1, 5, 5, 1))))
  assert 'kernel of size 6' in msg and 'larger than the input' in msg
  msg = _message(lambda: conv.Conv(2, (3, 3), rhs_dilation=(3, 1)).init(
      ShapeDtype((1, 6, 6, 1))))
  assert 'dilated by 3' in msg
  # Inside a network the error names the path to the layer.
  net = cb.Serial(conv.Conv(2, (2, 2), **FAST), conv.Conv(2, (5, 5)))
  with pytest.raises(base.LayerError) as info:
    net.init(ShapeDtype((1, 5, 5, 1)))
  assert info.value.path == 'Serial[1] > Conv'


def test_channel_mismatch_and_int_inputs_are_clear_errors():
  layer = conv.Conv(2, (2, 2), **FAST)
  layer.init(ShapeDtype((1, 4, 4, 3)))
  msg = _message(lambda: layer(np.zeros((1, 4, 4, 5), np.float32)))
  assert 'expects inputs with 3 channels' in msg and '5 channels' in msg
  msg = _message(lambda: layer.init(ShapeDtype((1, 4, 4, 3), np.int32)))
  assert 'floating-point' in msg


def test_bad_constructor_arguments_are_clear_errors():
  with pytest.raises(ValueError, match='kernel_size .* must have 2 entries'):
    conv.Conv(2, (3,))
  with pytest.raises(ValueError, match='padding must be'):
    conv.Conv(2, (3, 3), padding='FULL')
  with pytest.raises(ValueError, match='strides must have 2 entries'):
    conv.Conv(2, (3, 3), strides=(1, 1, 1))
  with pytest.raises(ValueError, match='name .* once each'):
    conv.Conv(2, (3, 3), dimension_numbers=('NHWC', 'HWIC', 'NHWC'))


def test_conv_layers_run_under_jit_in_a_network():
  x = randn(2, 6, 6, 2)
  net = cb.Serial(conv.Conv(3, (3, 3), padding='SAME', **FAST),
                  deconv.ConvTranspose(2, (2, 2), strides=(2, 2),
                                       kernel_initializer=np_init,
                                       bias_initializer=np_init))
  weights, state = net.init(signature(x))
  fn = jax.jit(functools.partial(net.pure_fn, rng=RNG))
  y, _ = fn(x, weights, state)
  assert y.shape == (2, 12, 12, 2)
  np.testing.assert_allclose(y, net(x), rtol=1e-5, atol=1e-5)
