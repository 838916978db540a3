"""Reversible layers: reconstruction, exact gradients, randomness replay, memory, errors.

References: the gradients of a `ReversibleSerial` are checked against plain
autodiff of the same network written here with ordinary residual adds (the
same sublayer objects, the same rng splits); reconstruction against the
inputs; stack ops against `jax.vjp` of their forward; memory against the
plain residual stack's compiled temp size.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import normalization
from retrax.layers import reversible as rv
from retrax.layers.activation_fns import Relu
from retrax.shapes import ShapeDtype
from retrax.shapes import signature

D = 8          # d_model in the small gradient tests
SHAPE = (2, 3, D)


def ff(d_model=D, d_ff=16, dropout=None):
  layers = [normalization.LayerNorm(), core.Dense(d_ff), Relu()]
  if dropout is not None:
    layers.append(core.Dropout(dropout, mode='train'))
  return layers + [core.Dense(d_model)]


def rev_blocks(n_blocks, **ff_kwargs):
  layers = []
  for _ in range(n_blocks):
    layers += [rv.ReversibleHalfResidual(*ff(**ff_kwargs)), rv.ReversibleSwap(),
               rv.ReversibleHalfResidual(*ff(**ff_kwargs)), rv.ReversibleSwap()]
  return layers


def random_pair(seed, shape=SHAPE):
  k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
  return jax.random.normal(k1, shape), jax.random.normal(k2, shape)


def plain_stack(layers, x, weights, state, rng):
  """The reversible stack without custom gradients: acc + f(ctx) by hand.

  Splits rngs exactly as the layers do (Serial: one per sublayer; a
  half-residual: one per sublayer of its own), so dropout masks agree.
  """
  stack = tuple(x)
  for layer, w, s, r in zip(layers, weights, state,
                            jax.random.split(rng, len(layers))):
    if isinstance(layer, rv.ReversibleSerial):
      stack = plain_stack(layer.sublayers, stack, w, s, r)
    elif isinstance(layer, rv.ReversibleHalfResidual):
      acc, *ctx = stack
      subs = layer.sublayers
      rngs = jax.random.split(r, len(subs))
      h = ctx[0] if len(ctx) == 1 else tuple(ctx)
      for sub, ws, ss, rs in zip(subs, w, s, rngs):
        h, _ = sub.pure_fn(h, ws, ss, rs)
      stack = (acc + h,) + tuple(ctx)
    else:  # ReversibleSwap
      stack = (stack[1], stack[0]) + stack[2:]
  return stack


def loss_of(outputs):
  y1, y2 = outputs
  return jnp.sum(y1 * y1) + jnp.sum(jnp.sin(y2) * y1)


def assert_grads_equal_plain(model, x, weights, state, rng):
  """`model`'s loss and gradients (jitted) equal `plain_stack`'s; returns them."""
  def rev_loss(w, x):
    return loss_of(model.pure_fn(x, w, state, rng)[0])

  def ref_loss(w, x):
    return loss_of(plain_stack(model.sublayers, x, w, state, rng))

  got = jax.jit(jax.value_and_grad(rev_loss, argnums=(0, 1)))(weights, x)
  want = jax.value_and_grad(ref_loss, argnums=(0, 1))(weights, x)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
  assert_trees_close(got[1], want[1])
  return got


def assert_trees_close(got, want, rtol=1e-4, atol=1e-6):
  """Leafwise allclose; fp32 round-off is judged against each leaf's scale."""
  got_leaves, got_def = jax.tree_util.tree_flatten(got)
  want_leaves, want_def = jax.tree_util.tree_flatten(want)
  assert got_def == want_def
  for g, w in zip(got_leaves, want_leaves):
    w = np.asarray(w)
    if w.dtype == jax.dtypes.float0:  # the "gradient" of an integer input
      assert np.asarray(g).dtype == w.dtype and np.shape(g) == w.shape
      continue
    scale = float(np.max(np.abs(w))) if w.size else 0.0
    np.testing.assert_allclose(np.asarray(g), w, rtol=rtol,
                               atol=max(atol, 0.1 * rtol * scale))


# --- the Coursera RevNet lab ---------------------------------------------------


def test_swap_reverse_with_default_args_swaps_back():
  x1, x2 = np.array([1]), np.array([5])
  swap = rv.ReversibleSwap()
  out = swap.reverse([x1, x2])
  assert isinstance(out, tuple) and len(out) == 2
  assert (out[0].tolist(), out[1].tolist()) == ([5], [1])
  assert [y.tolist() for y in swap([x1, x2])] == [[5], [1]]
  assert repr(swap) == 'ReversibleSwap_in2_out2'


def test_lab_part2_reprs_and_values():
  f = base.Fn('F', lambda x0: (2 * x0), n_out=1)
  g = base.Fn('G', lambda x0: (10 * x0), n_out=1)
  half_f = rv.ReversibleHalfResidual(f)
  assert repr(half_f) == 'ReversibleHalfResidual_in2_out2[\n  Serial[\n    F\n  ]\n]'
  x1, x2 = np.array([1]), np.array([5])
  half_f.init(signature([x1, x1]))
  assert [y.tolist() for y in half_f([x1, x1])] == [[1 + 2 * 1], [1]]

  blk = [half_f, rv.ReversibleSwap(), rv.ReversibleHalfResidual(g),
         rv.ReversibleSwap()]
  model = rv.ReversibleSerial(blk)
  assert repr(model) == (
      'ReversibleSerial_in2_out2[\n'
      '  ReversibleHalfResidual_in2_out2[\n    Serial[\n      F\n    ]\n  ]\n'
      '  ReversibleSwap_in2_out2\n'
      '  ReversibleHalfResidual_in2_out2[\n    Serial[\n      G\n    ]\n  ]\n'
      '  ReversibleSwap_in2_out2\n]')
  model.init(signature([x1, x2]))
  y1, y2 = model([x1, x2])
  # RevNet equations: y1 = x1 + F(x2), y2 = x2 + G(y1).
  want_y1 = x1 + 2 * x2
  want_y2 = x2 + 10 * want_y1
  assert (y1.tolist(), y2.tolist()) == (want_y1.tolist(), want_y2.tolist())
  # A plain Serial of the same layers computes the same thing.
  plain = cb.Serial(blk)([x1, x2])
  assert [y.tolist() for y in plain] == [want_y1.tolist(), want_y2.tolist()]
  back = model.reverse((y1, y2))
  assert [b.tolist() for b in back] == [[1], [5]]


# --- structure -----------------------------------------------------------------


def test_half_residual_weights_tree_is_trax_layout():
  class Attn(base.Layer):  # a stand-in attention layer: x @ w
    def init_weights_and_state(self, input_signature):
      self.weights = (jnp.ones((input_signature.shape[-1], D)),)

    def forward(self, x):
      return x @ self.weights[0]

  sig = (ShapeDtype(SHAPE), ShapeDtype(SHAPE))
  attn_half = rv.ReversibleHalfResidual(normalization.LayerNorm(),
                                        attention_layer=Attn())
  weights, _ = attn_half.init(sig)
  shapes = jax.tree_util.tree_map(lambda a: a.shape, weights)
  assert shapes == ((((D,), (D,)),), ((D, D),))

  ff_half = rv.ReversibleHalfResidual(*ff())
  weights, state = ff_half.init(sig)
  shapes = jax.tree_util.tree_map(lambda a: a.shape, weights)
  # ((ln_s, ln_b), (W1, b1), Relu (Trax's assert_shape wrapping), (W2, b2))
  assert shapes[0][0] == ((D,), (D,))
  assert shapes[0][1] == ((D, 16), (16,))
  assert shapes[0][-1] == ((16, D), (D,))
  assert len(weights) == 1 and len(state) == 1
  assert repr(ff_half).startswith('ReversibleHalfResidual_in2_out2[\n  Serial[')


def test_half_residual_n_in_from_residual_stack_depth():
  add = base.Fn('Add3', lambda a, b, c: a + b + c)
  half = rv.ReversibleHalfResidual(add)
  assert (half.n_in, half.n_out) == (4, 4)
  xs = [np.float32(v) * np.ones(2, np.float32) for v in (1, 2, 3, 4)]
  out = half(xs)
  assert [y.tolist() for y in out] == [[10, 10], [2, 2], [3, 3], [4, 4]]
  assert [y.tolist() for y in half.reverse(out)] == [[1, 1], [2, 2], [3, 3],
                                                     [4, 4]]


# --- reconstruction --------------------------------------------------------------


def test_reverse_of_forward_recovers_inputs_32_layers():
  d = 64
  model = rv.ReversibleSerial(rev_blocks(16, d_model=d, d_ff=2 * d))  # 32 RHRs
  x = random_pair(0, (2, 16, d))
  # Init one block and give every layer its own random weights of that shape
  # (32 full inits would dominate the test's time).
  block = rv.ReversibleSerial(rev_blocks(1, d_model=d, d_ff=2 * d))
  block_w, block_s = block.init(signature(x))
  np_rng = np.random.default_rng(1)

  def fresh(w):
    return jnp.asarray(np_rng.normal(size=w.shape) / np.sqrt(w.shape[0]),
                       jnp.float32)
  weights = tuple(jax.tree_util.tree_map(fresh, block_w[i % 4])
                  for i in range(len(model.sublayers)))
  state = tuple(block_s[i % 4] for i in range(len(model.sublayers)))
  rng = jax.random.PRNGKey(2)

  y, new_state = model.pure_fn(x, weights, state, rng)
  back = model.reverse(y, weights, state, new_state, rng)
  err = max(float(jnp.max(jnp.abs(b - a))) for a, b in zip(x, back))
  scale = max(float(jnp.max(jnp.abs(v))) for v in y)
  # fp32 round-off accumulated over 32 layers whose outputs reach `scale`
  # (measured: err about 1e-6 with scale about 5).
  assert err < 1e-5 * scale, (err, scale)
  assert float(jnp.max(jnp.abs(y[0] - x[0]))) > 1.0  # the layers did change x


def test_reverse_with_default_args_uses_own_weights():
  model = rv.ReversibleSerial(rev_blocks(2))
  x = random_pair(3)
  model.init(signature(x))
  back = model.reverse(model(x))
  assert_trees_close(back, x, rtol=1e-5, atol=1e-5)


# --- gradients equal the plain network's -------------------------------------------


@pytest.mark.parametrize('dropout', [None, 0.3])
def test_grads_equal_plain_residual_network(dropout):
  model = rv.ReversibleSerial(rev_blocks(1, dropout=dropout))
  x = random_pair(4)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(5))
  got = assert_grads_equal_plain(model, x, weights, state,
                                 jax.random.PRNGKey(6))
  if dropout:  # the masks are really there: another rng, another loss
    value2 = loss_of(model.pure_fn(x, weights, state,
                                   jax.random.PRNGKey(7))[0])
    assert abs(float(value2) - float(got[0])) > 1e-3


def test_grads_through_a_model_and_nested_reversible_serials():
  inner1 = rv.ReversibleSerial(rev_blocks(1))
  inner2 = rv.ReversibleSerial(rev_blocks(1))
  model = cb.Serial(cb.Dup(), rv.ReversibleSerial(inner1, inner2),
                    cb.Concatenate())
  x = random_pair(8)[0]
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(9))
  rng = jax.random.PRNGKey(10)

  def rev_loss(w, x):
    y = model.pure_fn(x, w, state, rng)[0]
    return jnp.sum(jnp.tanh(y) * y)

  def ref_loss(w, x):
    r_rev = jax.random.split(rng, 3)[1]  # Serial: Dup, ReversibleSerial, Concatenate
    y = plain_stack(model.sublayers[1].sublayers, (x, x), w[1], state[1], r_rev)
    y = jnp.concatenate(y, axis=-1)
    return jnp.sum(jnp.tanh(y) * y)

  got = jax.jit(jax.grad(rev_loss, argnums=(0, 1)))(weights, x)
  want = jax.jit(jax.grad(ref_loss, argnums=(0, 1)))(weights, x)
  assert_trees_close(got, want)


def test_standalone_half_residual_in_plain_serial_has_exact_grads():
  half = rv.ReversibleHalfResidual(*ff())
  model = cb.Serial(half, rv.ReversibleSwap())
  x = random_pair(11)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(12))
  rng = jax.random.PRNGKey(13)

  def rev_loss(w, x):
    return loss_of(model.pure_fn(x, w, state, rng)[0])

  def ref_loss(w, x):
    return loss_of(plain_stack(model.sublayers, x, w, state, rng))

  got = jax.grad(rev_loss, argnums=(0, 1))(weights, x)
  want = jax.grad(ref_loss, argnums=(0, 1))(weights, x)
  assert_trees_close(got, want)


def test_reverse_and_grad_equals_vjp_of_forward():
  model = rv.ReversibleSerial(rev_blocks(1))
  x = random_pair(14)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(15))
  rng = jax.random.PRNGKey(16)
  y, new_state = model.pure_fn(x, weights, state, rng)
  ct = random_pair(17)

  def fwd(x, w):
    return plain_stack(model.sublayers, x, w, state, rng)

  _, vjp_fn = jax.vjp(fwd, tuple(x), weights)
  want_x_ct, want_w_ct = vjp_fn(ct)
  x_rec, (x_ct, w_ct) = jax.jit(
      lambda y, ct: model.reverse_and_grad(y, ct, weights, state, new_state,
                                           rng))(y, ct)
  assert_trees_close(x_rec, tuple(x), rtol=1e-5, atol=1e-5)
  assert_trees_close(x_ct, want_x_ct)
  assert_trees_close(w_ct, want_w_ct)


# --- state-held randomness (LSH-style) and the fused backward hook -----------------


class RandomSignDense(base.Layer):
  """x @ w times random signs drawn from a key kept in state, like LSH hashing.

  State is `(signs, key)`: each call splits the key, draws fresh signs, uses
  them and stores both (so `update_state=False` can reuse the signs).
  """

  def init_weights_and_state(self, input_signature):
    d = input_signature.shape[-1]
    self.weights = jax.random.normal(jax.random.PRNGKey(0), (d, d)) / d
    self.state = (jnp.ones((d,)), jax.random.PRNGKey(42))

  def _signs(self, key, d):
    return jnp.where(jax.random.bernoulli(key, 0.5, (d,)), 1.0, -1.0)

  def forward(self, x):
    _, key = self.state
    key, sub = jax.random.split(key)
    signs = self._signs(sub, x.shape[-1])
    self.state = (signs, key)
    y = x @ self.weights
    return y * signs.reshape((1,) * (y.ndim - 1) + signs.shape)


class FusedRandomSignDense(RandomSignDense):
  """The same layer with Trax's fused `forward_and_or_backward` hook."""

  calls = []

  def forward_and_or_backward(self, inputs, weights, state, rng,
                              output_grad=None, compute_output=True,
                              update_state=True):
    del rng
    self.calls.append({'output_grad': output_grad is not None,
                       'compute_output': compute_output,
                       'update_state': update_state})
    signs = state[0]  # reuse the forward pass's signs (new_state)

    def fn(x, w):
      y = x @ w
      return y * signs.reshape((1,) * (y.ndim - 1) + signs.shape)

    out, vjp_fn = jax.vjp(fn, inputs, weights)
    x_ct = w_ct = None
    if output_grad is not None:
      x_ct, w_ct = vjp_fn(output_grad)
    return (out if compute_output else None), None, x_ct, w_ct


@pytest.mark.parametrize('layer_cls', [RandomSignDense, FusedRandomSignDense])
def test_state_randomness_replayed_and_fused_hook(layer_cls):
  layer_cls.calls = []
  layers = [rv.ReversibleHalfResidual(normalization.LayerNorm(),
                                      attention_layer=layer_cls()),
            rv.ReversibleSwap(),
            rv.ReversibleHalfResidual(*ff()), rv.ReversibleSwap(),
            rv.ReversibleHalfResidual(normalization.LayerNorm(),
                                      attention_layer=layer_cls()),
            rv.ReversibleSwap()]
  model = rv.ReversibleSerial(layers)
  x = random_pair(18)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(19))
  rng = jax.random.PRNGKey(20)

  def rev_loss(w, x):
    y, new_state = model.pure_fn(x, w, state, rng)
    return loss_of(y), new_state

  def ref_loss(w, x):
    return loss_of(plain_stack(model.sublayers, x, w, state, rng))

  (value, new_state), got = jax.jit(
      jax.value_and_grad(rev_loss, argnums=(0, 1), has_aux=True))(weights, x)
  want_value, want = jax.value_and_grad(ref_loss, argnums=(0, 1))(weights, x)
  np.testing.assert_allclose(value, want_value, rtol=1e-5)
  assert_trees_close(got, want)
  # The state advanced as in a plain forward pass (fresh key per call).
  plain_state = cb.Serial(layers).pure_fn(x, weights, state, rng)[1]
  assert_trees_close(new_state, plain_state)
  assert not np.array_equal(np.asarray(new_state[0][1][1]),
                            np.asarray(state[0][1][1]))
  if layer_cls is FusedRandomSignDense:
    assert layer_cls.calls == [{'output_grad': True, 'compute_output': True,
                                'update_state': False}] * 2
  else:
    assert not layer_cls.calls


# --- stack operations ---------------------------------------------------------------


def check_stack_op(layer, xs):
  """reverse(forward(x)) == x and reverse_and_grad == vjp of forward."""
  layer.init(signature(xs))
  ys = layer(xs)
  back = layer.reverse(ys)
  assert_trees_close(back, xs, rtol=0, atol=0)
  ct = jax.tree_util.tree_map(lambda y: jnp.cos(y) + 2.0, ys)
  _, vjp_fn = jax.vjp(lambda v: layer.pure_fn(v, (), (), None)[0], xs)
  (want,) = vjp_fn(ct)
  x_rec, (x_ct, w_ct) = layer.reverse_and_grad(ys, ct)
  assert_trees_close(x_rec, xs, rtol=0, atol=0)
  assert_trees_close(x_ct, want, rtol=1e-6)
  assert w_ct == ()
  # As a custom-gradient layer inside jax.grad: the same gradient.
  g = jax.grad(lambda v: sum(jnp.sum(c * y.astype(c.dtype)) for c, y in zip(
      jax.tree_util.tree_leaves(ct),
      jax.tree_util.tree_leaves(layer.pure_fn(v, (), (), None)[0]))),
               allow_int=True)(xs)
  assert_trees_close(g, want, rtol=1e-6)


def test_reversible_select():
  xs = tuple(jnp.arange(6.0).reshape(2, 3) + i for i in range(3))
  layer = rv.ReversibleSelect([2, 0, 1])
  assert layer.name == 'ReversibleSelect[2,0,1]'
  assert [y.tolist() for y in layer(xs)] == [xs[2].tolist(), xs[0].tolist(),
                                             xs[1].tolist()]
  check_stack_op(layer, xs)


def test_reversible_concatenate_pair():
  xs = (jnp.arange(6.0).reshape(2, 3), -jnp.arange(6.0).reshape(2, 3))
  layer = rv.ReversibleConcatenatePair()
  y1, y2 = layer(xs)
  want = np.concatenate([np.asarray(xs[0]), np.asarray(xs[1])], axis=-1)
  assert y1.tolist() == want.tolist() and y2.tolist() == want.tolist()
  check_stack_op(layer, xs)


def test_reversible_reshape():
  xs = (jnp.arange(24.0).reshape(2, 3, 4), jnp.ones((2, 3, 5)))
  layer = rv.ReversibleReshape((2, 3), (6,), n_in=2)
  assert layer.name == 'ReversibleReshape_(2, 3)_(6,)'
  assert [y.shape for y in layer(xs)] == [(6, 4), (6, 5)]
  check_stack_op(layer, xs)
  with pytest.raises(base.LayerError, match=r'leading axes \[2, 3\]'):
    layer((jnp.ones((3, 2, 4)), jnp.ones((3, 2, 4))))


def test_reversible_print_shape(capsys):
  xs = (jnp.ones((2, 3)), jnp.ones((4,), jnp.int32))
  layer = rv.ReversiblePrintShape(n_in=2, msg='here')
  check_stack_op(layer, xs)
  assert 'PrintShape: here: [(2, 3)[float32], (4,)[int32]]' in capsys.readouterr().out
  single = rv.ReversiblePrintShape(msg='one')
  single(jnp.ones((5, 2)))
  assert capsys.readouterr().out.strip() == 'PrintShape: one: [(5, 2)[float32]]'


# --- errors ---------------------------------------------------------------------------


def test_non_reversible_layer_in_reversible_serial_is_rejected():
  with pytest.raises(ValueError, match=r'Sublayer 1 of ReversibleSerial is not '
                     r'reversible .*Dense_4'):
    rv.ReversibleSerial(rv.ReversibleSwap(), core.Dense(4))


def test_half_residual_given_too_few_inputs():
  model = rv.ReversibleSerial(rv.ReversibleHalfResidual(core.Dense(D)),
                              rv.ReversibleSwap())
  with pytest.raises(base.LayerError, match='2 inputs'):
    model.init(ShapeDtype(SHAPE))
  half = rv.ReversibleHalfResidual(core.Dense(D))
  with pytest.raises(base.LayerError, match='expects exactly n_in=2 inputs'):
    half.init((ShapeDtype(SHAPE),) * 3)


def test_half_residual_residual_shape_must_match_accumulator():
  half = rv.ReversibleHalfResidual(core.Dense(D + 1))
  with pytest.raises(base.LayerError,
                     match=r'residual has shape \(2, 3, 9\) but the '
                     r'accumulator .* \(2, 3, 8\)'):
    half.init((ShapeDtype(SHAPE), ShapeDtype(SHAPE)))


def test_half_residual_needs_a_residual_and_select_must_keep_inputs():
  with pytest.raises(ValueError, match='leave a residual'):
    rv.ReversibleHalfResidual(cb.Drop())
  with pytest.raises(ValueError, match=r'miss input\(s\) \[1\]'):
    rv.ReversibleSelect([0, 2])
  with pytest.raises(TypeError, match='attention_layer must be a Layer'):
    rv.ReversibleHalfResidual(attention_layer='attn')


# --- memory ------------------------------------------------------------------------------


def _temp_bytes(model, length, d):
  sig = ShapeDtype((1, length, d))
  weights, state = model.init((sig, sig), rng=jax.random.PRNGKey(0))
  x = (jnp.ones(sig.shape), jnp.ones(sig.shape))

  def loss(w, x, rng):
    return loss_of(model.pure_fn(x, w, state, rng)[0])

  compiled = jax.jit(jax.value_and_grad(loss)).lower(
      weights, x, jax.random.PRNGKey(1)).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_backward_memory_does_not_grow_with_depth():
  """Compiled temp memory of value_and_grad: flat for reversible, linear for plain.

  The reversible stack has dropout: XLA:CPU would otherwise make every
  layer's masks up front (O(depth) memory).
  """
  d, length = 16, 1024

  def plain(n_blocks):
    def half():
      return cb.Serial(cb.Select([1, 0, 1]), *ff(d, 2 * d), cb.Add())
    return cb.Serial([[half(), cb.Swap(), half(), cb.Swap()]
                      for _ in range(n_blocks)])

  rev = [_temp_bytes(rv.ReversibleSerial(
      rev_blocks(n, d_model=d, d_ff=2 * d, dropout=0.1)), length, d)
         for n in (1, 2)]
  ref = [_temp_bytes(plain(n), length, d) for n in (1, 2)]
  assert rev[1] <= 1.15 * rev[0], rev
  assert ref[1] >= 1.6 * ref[0], ref
