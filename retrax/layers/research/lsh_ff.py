"""Trax's `LSHFF`: a feed-forward block whose first layer is masked by LSH.

`Dense(d_ff) -> Relu -> Dense(d_model)`, except that a hidden unit `j` is
kept for input `x` only if `x` and row `j` of the first kernel share a bucket
in at least one of `n_hashes` random-rotation hashes (drawn from the layer's
rng, the same rotations for inputs and kernel rows): the units most likely
to survive the Relu.
"""

import jax
import jax.numpy as jnp
from jax import lax

from retrax.errors import InputValueError
from retrax.layers import base
from retrax.layers import initializers as init
from retrax import validation
from retrax.layers.attention.ops import hash_vecs
from retrax.validation import ArgumentValueError


class LSHFF(base.Layer):
  """LSH-masked feed-forward block `[..., d_model] -> [..., d_model]`.

  Weights (Trax's layout): `w1 [d_ff, d_model]` (the first layer, one row per
  hidden unit), `w2 [d_ff, d_model]`, `b2 [d_model]`; the first layer has no
  bias. `n_buckets` is an even int or a list of them (factorised hashing).
  """

  def __init__(self, d_ff, n_buckets, n_hashes=4, mode='train',
               kernel_initializer=init.GlorotUniformInitializer(),
               bias_initializer=init.RandomNormalInitializer(1e-6)):
    super().__init__(name=f'LSHFF_{d_ff}', mode=mode)
    self._d_ff = validation.check_int('LSHFF', 'd_ff', d_ff, 1)
    self._n_hashes = validation.check_int('LSHFF', 'n_hashes', n_hashes, 1)
    factors = n_buckets if isinstance(n_buckets, (list, tuple)) else [n_buckets]
    if not factors or any(not isinstance(f, int) or f <= 0 or f % 2
                          for f in factors):
      raise ArgumentValueError(f'LSHFF: n_buckets must be a positive even int or a '
                               f'list of them; got {n_buckets!r}.')
    self._n_buckets = n_buckets
    self._kernel_initializer = kernel_initializer
    self._bias_initializer = bias_initializer

  def forward(self, x):
    w1, w2, b2 = self.weights
    if x.shape[-1] != w1.shape[1]:
      raise InputValueError(f'{self.name}: inputs have depth {x.shape[-1]} but the '
                            f'weights expect {w1.shape[1]}.')
    shape = x.shape
    x = jnp.reshape(x, (-1, shape[-1]))
    x_buckets, _ = hash_vecs(x, self._n_buckets, self._n_hashes, self.rng)
    w1_buckets, _ = hash_vecs(w1, self._n_buckets, self._n_hashes, self.rng)
    # [n_hashes, rows, d_ff]: True where a row and a unit share a bucket.
    same = jnp.equal(x_buckets[:, :, None], w1_buckets[:, None, :])
    hash_mask = lax.stop_gradient(jnp.any(same, axis=0)).astype(x.dtype)
    mid = jnp.dot(x, w1.T) * hash_mask  # [rows, d_ff]
    relu = jnp.where(mid <= 0, jnp.zeros_like(mid), mid)
    res = jnp.dot(relu, w2) + jnp.expand_dims(b2, 0)
    return jnp.reshape(res, shape)

  def init_weights_and_state(self, input_signature):
    d_model = input_signature.shape[-1]
    rng_w1, rng_w2, rng_b2 = jax.random.split(self.rng, 3)
    w1 = self._kernel_initializer((self._d_ff, d_model), rng_w1)
    w2 = self._kernel_initializer((self._d_ff, d_model), rng_w2)
    b2 = self._bias_initializer((d_model,), rng_b2)
    self.weights = (w1, w2, b2)
