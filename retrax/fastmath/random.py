"""Explicit PRNG keys (raw uint32[2] keys, as Trax used)."""

import jax

bernoulli = jax.random.bernoulli
fold_in = jax.random.fold_in
normal = jax.random.normal
randint = jax.random.randint
split = jax.random.split
uniform = jax.random.uniform
categorical = jax.random.categorical
gumbel = jax.random.gumbel


def get_prng(seed):
  """Returns a PRNG key (uint32[2]) for an integer seed."""
  return jax.random.PRNGKey(seed)
