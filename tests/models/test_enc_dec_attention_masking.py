"""EncDecAttention's masking: Trax 1.4.1's by default, plain softmax on request.

Checked against numpy references.
"""

import jax
import numpy as np

from retrax import layers as tl
from retrax import shapes
from tests.backend_tolerance import float32_tolerance


def _enc_dec_inputs():
  rng = np.random.RandomState(0)
  q = rng.randn(1, 3, 8).astype(np.float32)
  kv = rng.randn(1, 5, 8).astype(np.float32)
  mask = np.array([[True, True, True, False, False]])
  return q, kv, mask


def _heads(layer):
  return [np.asarray(w) for w in layer.weights]


def test_enc_dec_attention_masking_is_trax_s():
  """Trax's masking takes 1e9 off every logit: each real key gets weight 1.

  In float32, `dot - 1e9` rounds to -1e9 for small dots, and so does the
  softmax normaliser `-1e9 + log(3)`: every real key's weight is exp(0).
  """
  q, kv, mask = _enc_dec_inputs()
  layer = tl.EncDecAttention(n_heads=2, d_qk=4, d_v=4, mode='eval')
  layer.init(shapes.signature((q, kv, mask)), rng=jax.random.PRNGKey(0))
  _, _, w_v, w_o = _heads(layer)
  expected = sum(kv[0, :3].sum(axis=0) @ w_v[h] @ w_o[h] for h in range(2))
  got = np.asarray(layer((q, kv, mask)))[0]
  np.testing.assert_allclose(got, np.broadcast_to(expected, got.shape),
                             rtol=1e-5, atol=1e-6)


def test_enc_dec_attention_penalize_padding_only_is_softmax_attention():
  q, kv, mask = _enc_dec_inputs()
  layer = tl.EncDecAttention(n_heads=2, d_qk=4, d_v=4, mode='eval',
                             penalize_padding_only=True)
  layer.init(shapes.signature((q, kv, mask)), rng=jax.random.PRNGKey(0))
  w_q, w_k, w_v, w_o = _heads(layer)
  expected = 0
  for h in range(2):
    dots = (q[0] @ w_q[h]) @ (kv[0, :3] @ w_k[h]).T / np.sqrt(4.0)
    p = np.exp(dots - dots.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    expected = expected + p @ (kv[0, :3] @ w_v[h]) @ w_o[h]
  np.testing.assert_allclose(np.asarray(layer((q, kv, mask)))[0], expected,
                             **float32_tolerance(rtol=1e-5, atol=1e-6))
