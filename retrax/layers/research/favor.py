"""FAVOR+ linear attention (Performer, https://arxiv.org/abs/2006.03555), Trax 1.4.1's layers.

With nonnegative features `q' = φ(q)`, `k' = φ(k)` attention becomes
`out_i = q'_i · S / (q'_i · z)` where `S = Σ_j k'_j v_jᵀ` and `z = Σ_j k'_j`
(sums over all unmasked keys, or over `j <= i` for the causal variant), so
time and memory are linear in the length. `φ` is `relu(x) + stabilizer`,
or for `FavorAttention(use_approximate_softmax=True)` positive random
features of the softmax kernel, `exp(W x - |x|²/2 - max) + eps` with `W` a
fixed (seed 0) block-orthogonal matrix.

`CausalFavorAttention` runs the prefix sums as a scan whose gradient is a
reverse scan that subtracts each step again (no per-position `S` is kept).
In 'predict' mode it keeps `(S, z)` in its state and continues the sums
(Trax 1.4.1 had no predict mode for it).
"""

import jax
import numpy as np

from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.fastmath import numpy as jnp
from retrax.fastmath import random
from retrax.layers import attention
from retrax.layers import base
from retrax.layers import core
from retrax.layers import predict_state
from retrax.validation import ArgumentValueError


def _relu(x):
  return jnp.where(x <= 0, jnp.zeros_like(x), x)


def orthogonal_feature_matrix(rng, n_rows, n_columns, scale_by_norm=True):
  """`(n_rows, n_columns)` stacked orthogonal blocks, rows scaled like Gaussian rows.

  Trax's draw order: for each block, `rng, sub = split(rng)` and the Q of
  `normal(sub, (n_columns, n_columns))` transposed; the row norms come from
  `normal(original rng, (n_rows, n_columns))`, or are `sqrt(n_columns)`.
  """
  blocks = []
  key = rng
  for start in range(0, n_rows, n_columns):
    rng, sub = random.split(rng)
    q, _ = jnp.linalg.qr(random.normal(sub, (n_columns, n_columns)))
    blocks.append(jnp.transpose(q)[:n_rows - start])
  matrix = jnp.vstack(blocks)
  if scale_by_norm:
    norms = jnp.linalg.norm(random.normal(key, (n_rows, n_columns)), axis=1)
  else:
    norms = jnp.sqrt(float(n_columns)) * jnp.ones((n_rows,))
  return norms[:, None] * matrix


@configurable('trax.layers', denylist=('mode',))
class FavorAttention(base.Layer):
  """`(Q, K, V, mask) -> (attention, mask)`, non-causal FAVOR+ over heads merged into the batch."""

  def __init__(self, d_feature=4, n_heads=1, n_random_features=256,
               numerical_stabilizer=0.001, use_approximate_softmax=False,
               scale_by_norm=True, normalize_data=False, epsilon=0.0001,
               mode='train'):
    super().__init__(n_in=4, n_out=2, mode=mode)
    if n_heads < 1 or d_feature % n_heads:
      raise ArgumentValueError(f'FavorAttention: d_feature ({d_feature}) must be a '
                               f'positive multiple of n_heads ({n_heads}).')
    self._n_heads = n_heads
    self._numerical_stabilizer = numerical_stabilizer
    self._use_approximate_softmax = use_approximate_softmax
    self._normalize_data = normalize_data
    self._epsilon = epsilon
    self._projection = None
    if use_approximate_softmax:
      self._projection = orthogonal_feature_matrix(
          random.get_prng(0), n_random_features, d_feature // n_heads,
          scale_by_norm=scale_by_norm)

  def _softmax_features(self, x, is_query):
    """Positive random features of exp(q·k); keys share one max per sequence."""
    # Only the approximate softmax calls this, and its __init__ drew these.
    assert self._projection is not None
    scale = 1.0 / jnp.sqrt(jnp.sqrt(x.shape[-1])) if self._normalize_data else 1.0
    proj = jnp.einsum('bld,md->blm', scale * x, self._projection)
    sq_norm = jnp.sum(jnp.square(x), axis=-1, keepdims=True) / 2.0 * scale**2
    axes = (-1,) if is_query else (-2, -1)
    feats = jnp.exp(proj - sq_norm - jnp.max(proj, axis=axes, keepdims=True))
    return (feats + self._epsilon) / jnp.sqrt(self._projection.shape[0])

  def forward(self, inputs):
    q, k, v, mask = inputs
    if self._use_approximate_softmax:
      q_prime = self._softmax_features(q, True)
      k_prime = self._softmax_features(k, False)
    else:
      q_prime = _relu(q) + self._numerical_stabilizer
      k_prime = _relu(k) + self._numerical_stabilizer
    batch_heads, length = k.shape[0], k.shape[1]
    if batch_heads % self._n_heads:
      raise InputValueError(f'{self.name}: leading axis {batch_heads} of Q/K/V is '
                            f'not batch * n_heads ({self._n_heads}).')
    key_mask = jnp.reshape(mask, (batch_heads // self._n_heads, 1, length))
    key_mask = jnp.broadcast_to(
        key_mask, (batch_heads // self._n_heads, self._n_heads, length))
    k_prime = k_prime * jnp.reshape(key_mask, (batch_heads, length, 1)).astype(
        k_prime.dtype)
    kv = jnp.einsum('blm,bld->bmd', k_prime, v)
    numerator = jnp.einsum('blm,bmd->bld', q_prime, kv)
    denominator = jnp.einsum('blm,bm->bl', q_prime, jnp.sum(k_prime, axis=1))
    return numerator / denominator[..., None], mask


@configurable('trax.layers', denylist=('mode',))
def Favor(d_feature, n_heads=1, n_random_features=256, dropout=0.0,
          numerical_stabilizer=0.001, use_approximate_softmax=False,
          scale_by_norm=0, normalize_data=False, epsilon=0.0001, mode='train'):
  """`(x, mask) -> (y, mask)`: multi-head FAVOR+ attention with Dense Q, K, V and output.

  `dropout` is accepted and ignored, as in Trax.
  """
  del dropout
  return attention.ConfigurableAttention(
      core.Dense(d_feature), core.Dense(d_feature), core.Dense(d_feature),
      core.Dense(d_feature),
      FavorAttention(d_feature, n_heads, n_random_features,
                     numerical_stabilizer, use_approximate_softmax,
                     scale_by_norm, normalize_data, epsilon, mode),
      n_heads=n_heads)


def _prefix_attention(s0, z0, q, k, v):
  """Causal linear attention over time-major `q, k [L, B, m]`, `v [L, B, d]`.

  Returns `(numerator [L, B, d], denominator [L, B], S_L, z_L)`.
  """
  def step(carry, qkv):
    s, z = carry
    q_t, k_t, v_t = qkv
    s = s + jnp.einsum('bm,bd->bmd', k_t, v_t)
    z = z + k_t
    return (s, z), (jnp.einsum('bm,bmd->bd', q_t, s),
                    jnp.einsum('bm,bm->b', q_t, z))
  (s, z), (num, den) = jax.lax.scan(step, (s0, z0), (q, k, v))
  return num, den, s, z


@jax.custom_vjp
def _causal_linear_attention(s0, z0, q, k, v):
  return _prefix_attention(s0, z0, q, k, v)


def _causal_fwd(s0, z0, q, k, v):
  out = _prefix_attention(s0, z0, q, k, v)
  return out, (out[2], out[3], q, k, v)


def _causal_bwd(res, cts):
  s_end, z_end, q, k, v = res
  num_ct, den_ct, s_ct_end, z_ct_end = cts

  def step(carry, inputs):
    s, z, s_ct, z_ct = carry       # sums up to t; cotangents of them
    q_t, k_t, v_t, num_ct_t, den_ct_t = inputs
    q_ct = (jnp.einsum('bd,bmd->bm', num_ct_t, s) +
            den_ct_t[:, None] * z)
    s_ct = s_ct + jnp.einsum('bd,bm->bmd', num_ct_t, q_t)
    z_ct = z_ct + den_ct_t[:, None] * q_t
    k_ct = jnp.einsum('bmd,bd->bm', s_ct, v_t) + z_ct
    v_ct = jnp.einsum('bmd,bm->bd', s_ct, k_t)
    s = s - jnp.einsum('bm,bd->bmd', k_t, v_t)
    z = z - k_t
    return (s, z, s_ct, z_ct), (q_ct, k_ct, v_ct)

  (_, _, s0_ct, z0_ct), (q_ct, k_ct, v_ct) = jax.lax.scan(
      step, (s_end, z_end, s_ct_end, z_ct_end), (q, k, v, num_ct, den_ct),
      reverse=True)
  return s0_ct, z0_ct, q_ct, k_ct, v_ct


_causal_linear_attention.defvjp(_causal_fwd, _causal_bwd)


@configurable('trax.layers', denylist=('mode',))
class CausalFavorAttention(base.Layer):
  """`(Q, K, V) -> attention`: causal FAVOR+ with relu features, heads merged into the batch.

  Predict-mode state: `(S [B*H, d_qk, d_v], z [B*H, d_qk])`, the sums so far;
  given `n_heads` (H), the layer declares that layout to decoding.
  """

  def __init__(self, numerical_stabilizer=0.001, mode='train', *,
               n_heads=None):
    super().__init__(n_in=3, n_out=1, mode=mode)
    self._numerical_stabilizer = numerical_stabilizer
    self._n_heads = n_heads

  def predict_state_layout(self, state):
    """`n_heads` rows per example in both sums (undeclared without n_heads)."""
    if self._n_heads is None:
      return None
    return predict_state.PredictStateLayout(
        predict_state.same_rows(state, self._n_heads))

  def forward(self, inputs):
    q, k, v = inputs
    q_prime = _relu(q) + self._numerical_stabilizer
    k_prime = _relu(k) + self._numerical_stabilizer
    if self._mode == 'predict':
      s0, z0 = self.state
    else:
      s0 = jnp.zeros((k.shape[0], k.shape[-1], v.shape[-1]), q_prime.dtype)
      z0 = jnp.zeros((k.shape[0], k.shape[-1]), q_prime.dtype)
    time_major = lambda x: jnp.moveaxis(x, 1, 0)
    num, den, s, z = _causal_linear_attention(
        s0, z0, time_major(q_prime), time_major(k_prime), time_major(v))
    if self._mode == 'predict':
      self.state = (s, z)
    return jnp.moveaxis(num / den[..., None], 0, 1)

  def init_weights_and_state(self, input_signature):
    if self._mode == 'predict':
      _, k_sig, v_sig = input_signature
      self.state = (
          jnp.zeros((k_sig.shape[0], k_sig.shape[-1], v_sig.shape[-1]),
                    np.float32),
          jnp.zeros((k_sig.shape[0], k_sig.shape[-1]), np.float32))


@configurable('trax.layers', denylist=('mode',))
def CausalFavor(d_feature, n_heads=1, dropout=0.0, numerical_stabilizer=0.001,
                mode='train'):
  """`x -> y`: multi-head causal FAVOR+ attention with Dense Q, K, V and output.

  `dropout` is accepted and ignored, as in Trax.
  """
  del dropout
  return attention.ConfigurableAttention(
      core.Dense(d_feature), core.Dense(d_feature), core.Dense(d_feature),
      core.Dense(d_feature),
      CausalFavorAttention(numerical_stabilizer, mode, n_heads=n_heads),
      n_heads=n_heads)
