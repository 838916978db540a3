"""Temporary benchmark: predict-mode cache attention strategies (not a test)."""
import functools, sys, time
import jax, jax.numpy as jnp, numpy as np
from retrax.layers import attention as A

def switch_attend(q, ks, vs, start, min_len=256):
  n, M = q.shape[-2], ks.shape[-2]
  sizes, s = [], min_len
  while s < M:
    sizes.append(s); s *= 2
  sizes.append(M)
  q_pos = start + jnp.arange(n)
  def branch(size, q, ks, vs, q_pos):
    mask = jnp.arange(size)[None, None, :] <= q_pos[None, :, None]
    return A.dot_product_attention(q, ks[:, :size], vs[:, :size], mask)[0]
  which = sum((start + n > s).astype(jnp.int32) for s in sizes[:-1])
  return jax.lax.switch(which, [functools.partial(branch, s) for s in sizes], q, ks, vs, q_pos)

STRATS = {
  'full': lambda q, ks, vs, s: A._attend_to_cache(q, ks, vs, s, None),
  'block256': lambda q, ks, vs, s: A._attend_to_cache(q, ks, vs, s, 256),
  'block512': lambda q, ks, vs, s: A._attend_to_cache(q, ks, vs, s, 512),
  'switch256': switch_attend,
}

def decode(strat, Bp, M, d, steps):
  attend = STRATS[strat]
  def step(carry, x):
    ks, vs, i = carry
    ks = jax.lax.dynamic_update_slice_in_dim(ks, x[:, None], i, 1)
    vs = jax.lax.dynamic_update_slice_in_dim(vs, x[:, None], i, 1)
    y = attend(x[:, None], ks, vs, i)
    return (ks, vs, i + 1), y[:, 0, 0]
  @jax.jit
  def run(xs):
    z = jnp.zeros((Bp, M, d), jnp.float32)
    return jax.lax.scan(step, (z, z, jnp.int32(0)), xs)[1]
  xs = jax.random.normal(jax.random.PRNGKey(0), (steps, Bp, d))
  run(xs).block_until_ready()
  t = time.perf_counter(); out = run(xs).block_until_ready(); dt = time.perf_counter() - t
  return steps / dt, out

if __name__ == '__main__':
  Bp, M, d = (int(a) for a in sys.argv[1:4])
  print(jax.devices(), f'B*H={Bp} M={M} d_head={d}')
  ref = None
  for strat in STRATS:
    tps, out = decode(strat, Bp, M, d, M)
    diff = 0.0 if ref is None else float(jnp.max(jnp.abs(out - ref)))
    ref = out if ref is None else ref
    print(f'{strat:10s} {tps:10.1f} steps/s  maxdiff vs full {diff:.1e}', flush=True)
