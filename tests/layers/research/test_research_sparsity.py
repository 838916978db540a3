"""retrax.layers.research.sparsity: numpy references, reversibility, causality, predict mode."""

import functools

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.layers.research import sparsity
from tests.layers import predict_utils

RNG = jax.random.PRNGKey(0)


def _init_call(layer, x, rng=RNG):
  weights, state = layer.init(shapes.signature(x), rng=rng)
  y, _ = layer.pure_fn(x, weights, state, rng)
  return np.asarray(y), jax.tree_util.tree_leaves(weights)


def _randn(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def test_factored_dense_matches_numpy():
  x = _randn(2, 3, 8)
  y, (gates, proj, bias) = _init_call(sparsity.FactoredDense(4, 8, 12), x)
  assert gates.shape == (4, 8) and proj.shape == (8, 3) and bias.shape == (12,)
  want = np.concatenate([(x * np.asarray(g)) @ np.asarray(proj)
                         for g in gates], -1) + np.asarray(bias)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_multiplicative_modular_sparse_dense_matches_numpy():
  x = _randn(2, 3, 8)
  y, (gates, shared, modules, bias) = _init_call(
      sparsity.MultiplicativeModularSparseDense(2, 8), x)
  assert modules.shape == (2, 4, 4)
  parts = [((x * np.asarray(gates[h])) @ np.asarray(shared)) @ np.asarray(
      modules[h]) for h in range(2)]
  np.testing.assert_allclose(y, np.concatenate(parts, -1) + np.asarray(bias),
                             rtol=1e-5, atol=1e-5)


def test_einsum_dense_matches_numpy():
  x = _randn(2, 5)
  y, (kernel, bias) = _init_call(sparsity.EinsumDense(5, 3, use_bias=True), x)
  assert kernel.shape == (3, 5)
  np.testing.assert_allclose(y, x @ np.asarray(kernel).T + np.asarray(bias),
                             rtol=1e-5, atol=1e-6)


def _locally_connected_ref(x, w, b, padding):
  length, k = w.shape[0], w.shape[1]
  h = (k - 1) // 2
  r = np.einsum('...lp,lkpd->...lkd', x, w)
  if padding == 'VALID':
    rows = np.arange(length - k + 1)
    return sum(r[..., rows + k - 1 - i, i, :] for i in range(k)) + b
  out = np.zeros(x.shape[:-1] + (w.shape[-1],), np.float32)
  for l in range(length):
    for i in range(k):
      src = l + i - h
      if padding == 'WRAP':
        src %= length
      elif not 0 <= src < length:
        continue
      out[..., l, :] += r[..., src, i, :]
  return out + b


@pytest.mark.parametrize('padding', ['WRAP', 'SAME', 'VALID'])
def test_locally_connected_1d_matches_loops(padding):
  x = _randn(2, 5, 3)
  layer = tl.LocallyConnected1d(4, 3, padding=padding)
  y, (w, b) = _init_call(layer, x)
  assert w.shape == (5, 3, 3, 4)
  assert b.shape == ((3 if padding == 'VALID' else 5), 4)
  np.testing.assert_allclose(
      y, _locally_connected_ref(x, np.asarray(w), np.asarray(b), padding),
      rtol=1e-5, atol=1e-5)


def test_locally_connected_dense_modules():
  x = _randn(2, 3, 8)
  y, leaves = _init_call(sparsity.LocallyConnectedDense(4, 5, kernel_size=3),
                         x)
  assert y.shape == (2, 3, 20)
  assert [l.shape for l in leaves] == [(4, 3, 2, 5), (4, 5)]
  dense = sparsity.LocallyConnectedDense(1, 5)
  assert [l.shape for l in _init_call(dense, x)[1]] == [(8, 5), (5,)]


@pytest.mark.parametrize('kwargs,shapes_', [
    (dict(), [(8, 6), (6,)]),
    (dict(sparsity_type='mult', sparsity=2), [(2, 8), (8, 3), (6,)]),
    (dict(sparsity_type='lowrank', sparsity=2, d_lowrank=3),
     [(8, 3), (3,), (3, 6), (6,)]),
    (dict(sparsity_type='einsum', sparsity=2), [(6, 8), (6,)]),
    (dict(sparsity_type='local', sparsity=2), [(2, 1, 4, 3), (2, 3)]),
    (dict(sparsity_type='local3', sparsity=2), [(2, 3, 4, 3), (2, 3)]),
    (dict(sparsity_type='mult', sparsity=2, prob_sparse=0.5),
     [(2, 8), (8, 3), (6,), (6,), (8, 6)]),
])
def test_sparse_dense_with_options_weights(kwargs, shapes_):
  layer = sparsity.SparseDenseWithOptions(6, d_input=8, mode='eval', **kwargs)
  y, leaves = _init_call(layer, _randn(2, 8))
  assert y.shape == (2, 6)
  assert sorted(l.shape for l in leaves) == sorted(shapes_)


def test_random_layer_picks_by_probability():
  first = tl.Fn('One', lambda x: x * 0 + 1)
  second = tl.Fn('Two', lambda x: x * 0 + 2)
  x = np.zeros((3,), np.float32)
  outs = []
  for seed in range(40):
    layer = sparsity.RandomLayer(first, second, 0.25)
    outs.append(_init_call(layer, x, rng=jax.random.PRNGKey(seed))[0][0])
  share = np.mean(np.array(outs) == 1)
  assert 0.05 < share < 0.5
  always = sparsity.RandomLayer(first, second, 1.0)
  assert _init_call(always, x)[0][0] == 1


@pytest.mark.parametrize('kwargs,match', [
    (dict(sparsity_type='dense', sparsity=2), 'unknown sparsity_type'),
    (dict(sparsity_type='mult', sparsity=2, d_input=None), 'needs d_input'),
    (dict(sparsity_type='lowrank', sparsity=2), 'needs d_lowrank'),
    (dict(sparsity_type='local', sparsity=4), 'multiple of sparsity'),
    (dict(sparsity_type='lowrank', sparsity=2, d_lowrank=2, use_bias=False),
     'use_bias=False'),
])
def test_sparse_dense_with_options_errors(kwargs, match):
  kwargs.setdefault('d_input', 8)
  with pytest.raises(ValueError, match=match):
    sparsity.SparseDenseWithOptions(6, **kwargs)


@pytest.mark.parametrize('layer', [sparsity.ReversibleReshapePermute(),
                                   sparsity.ReversibleRandomPermute()],
                         ids=['reshape', 'random'])
def test_reversible_permutations_invert(layer):
  x = _randn(2, 3, 16)
  y, _ = _init_call(layer, x)
  assert not np.allclose(y, x)
  np.testing.assert_array_equal(np.sort(y, -1), np.sort(x, -1))
  np.testing.assert_array_equal(layer.reverse(y), x)


def test_reshape_permute_is_a_transpose():
  # d = 16: log2 d = 4; no k in (2, 1) fails to divide 4, so k = 1, m = 2.
  x = np.arange(16, dtype=np.float32)[None]
  y, _ = _init_call(sparsity.ReversibleReshapePermute(), x)
  np.testing.assert_array_equal(y[0], x[0].reshape(8, 2).T.reshape(-1))
  x = np.arange(32, dtype=np.float32)[None]  # log2 = 5 -> k = 2, m = 4.
  y, _ = _init_call(sparsity.ReversibleReshapePermute(), x)
  np.testing.assert_array_equal(y[0], x[0].reshape(8, 4).T.reshape(-1))
  with pytest.raises(tl.LayerError, match='power-of-two'):
    _init_call(sparsity.ReversibleReshapePermute(), np.zeros((1, 12)))


CAUSAL = {
    'modular': functools.partial(sparsity.ModularCausalAttention, 8,
                                 n_heads=2, sparsity=2),
    'modular_k3': functools.partial(sparsity.ModularCausalAttention, 8,
                                    n_heads=2, sparsity=4, kernel_size=3),
    'lowrank': functools.partial(sparsity.LowRankCausalAttention, 8,
                                 n_heads=2, lowrank=3),
    'multiplicative': functools.partial(sparsity.MultiplicativeCausalAttention,
                                        8, n_heads=2),
    'mult_modular': functools.partial(
        sparsity.MultiplicativeModularCausalAttention, 8, n_heads=2),
    'conv': functools.partial(sparsity.ConvCausalAttention, 8, n_heads=2,
                              sparsity=4, kernel_size=3),
    'mult_conv': functools.partial(sparsity.MultiplicativeConvCausalAttention,
                                   8, n_heads=2, sparsity=2,
                                   length_kernel_size=3),
    'mult_conv_shared_fixed': functools.partial(
        sparsity.MultiplicativeConvCausalAttention, 8, n_heads=2, sparsity=4,
        share_qk=True, v_concat_type='fixed', output_layer_type='multconv'),
    'mult_conv_original': functools.partial(
        sparsity.MultiplicativeConvCausalAttention, 8, n_heads=2, sparsity=2,
        v_concat_type='original', output_layer_type='conv'),
}


@pytest.mark.parametrize('name', sorted(CAUSAL))
def test_causal_attentions_are_causal_and_predict_equals_eval(name):
  make = CAUSAL[name]
  x = _randn(2, 6, 8)
  layer = make(mode='eval')
  weights, state = layer.init(shapes.signature(x), rng=RNG)
  fn = jax.jit(layer.pure_fn)
  y = np.asarray(fn(x, weights, state, RNG)[0])
  x2 = x.copy()
  x2[:, 4:] = _randn(2, 2, 8, seed=5)
  y2 = np.asarray(fn(x2, weights, state, RNG)[0])
  np.testing.assert_allclose(y2[:, :4], y[:, :4], atol=1e-5)
  assert not np.allclose(y2[:, 4:], y[:, 4:])
  if name in PREDICT_CHECKED:
    predict_utils.assert_eval_equals_predict(make, x[:1, :4], atol=1e-5,
                                             first_chunk=2)


# Predict mode of the others is their DotProductCausalAttention's (tested
# in tests/layers); these add remembered convolution inputs.
PREDICT_CHECKED = ('conv', 'mult_conv', 'mult_conv_shared_fixed')


def test_mult_conv_attention_errors():
  with pytest.raises(ValueError, match='output_layer_type'):
    sparsity.MultiplicativeConvCausalAttention(8, output_layer_type='dense')
  with pytest.raises(ValueError, match='v_concat_type'):
    sparsity.MultiplicativeConvCausalAttention(8, v_concat_type='both')
  with pytest.raises(ValueError, match='multiple of sparsity'):
    sparsity.MultiplicativeConvCausalAttention(8, sparsity=3)
