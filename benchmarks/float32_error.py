"""How far the default backend's float32 arithmetic is from float64 NumPy.

    python benchmarks/float32_error.py [--size 512] [--json out.json]

For each operation the tests' references lean on (a matmul at each
`jax.lax.Precision`, exp, log, tanh, rsqrt, division, softmax, and one
dot-product attention), the largest absolute and relative error of the
backend's float32 result against float64 NumPy on the same float32 inputs,
with float32 NumPy's own rounding error beside it as the floor. On a CPU
every row is at that floor; on a TPU the rows say what precision the
chip's float32 really has, which is what the tests' TPU tolerance
(`tests/backend_tolerance.py`) rests on.
"""
import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np


def _softmax(x, xp):
  e = xp.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _attention(q, k, v, xp, dot):
  return dot(_softmax(dot(q, k.T) / 8.0, xp), v)


def cases(size, rng):
  """`{name: (jax fn, numpy fn, float32 inputs)}`."""
  a = rng.standard_normal((size, size)).astype(np.float32)
  b = rng.standard_normal((size, size)).astype(np.float32)
  x = rng.uniform(-8, 8, size * size).astype(np.float32)
  pos = rng.uniform(1e-3, 1e3, size * size).astype(np.float32)
  out = {}
  for p in ('DEFAULT', 'HIGH', 'HIGHEST'):
    prec = getattr(jax.lax.Precision, p)
    out[f'matmul {p.lower()}'] = (
        lambda a, b, prec=prec: jnp.matmul(a, b, precision=prec), np.matmul,
        (a, b))
  out.update({
      'exp': (jnp.exp, np.exp, (x,)),
      'log': (jnp.log, np.log, (pos,)),
      'tanh': (jnp.tanh, np.tanh, (x,)),
      'rsqrt': (jax.lax.rsqrt, lambda y: 1 / np.sqrt(y), (pos,)),
      'divide': (jnp.divide, np.divide, (x, pos)),
      'softmax': (lambda y: _softmax(y, jnp), lambda y: _softmax(y, np),
                  (a,)),
  })
  hi = lambda s, t: jnp.matmul(s, t, precision=jax.lax.Precision.HIGHEST)
  q, k, v = (rng.standard_normal((size, 64)).astype(np.float32)
             for _ in range(3))
  out['attention (highest)'] = (lambda q, k, v: _attention(q, k, v, jnp, hi),
                                lambda q, k, v: _attention(q, k, v, np,
                                                           np.matmul),
                                (q, k, v))
  return out


def errors(got, want):
  """`(max abs error, max relative error where |want| >= its RMS)`: away
  from zero, where a sum's cancellation does not inflate the ratio."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  diff = np.abs(got - want)
  big = np.abs(want) >= np.sqrt(np.mean(want ** 2))
  return float(diff.max()), float((diff[big] / np.abs(want[big])).max())


def measure(size=512, seed=0, log=print):
  """`{case: {abs, rel, numpy32_abs, numpy32_rel}}` on the default backend."""
  rng = np.random.default_rng(seed)
  out = {}
  log(f'{jax.devices()[0].device_kind} ({jax.default_backend()}), '
      f'size {size}')
  log(f'{"case":22s} {"max abs":>10s} {"max rel":>10s} {"numpy32 rel":>12s}')
  for name, (fn, ref, args) in cases(size, rng).items():
    want = ref(*(np.asarray(a, np.float64) for a in args))
    floor = errors(ref(*args), want)
    got = errors(jax.jit(fn)(*args), want)
    out[name] = dict(abs=got[0], rel=got[1], numpy32_abs=floor[0],
                     numpy32_rel=floor[1])
    log(f'{name:22s} {got[0]:10.2e} {got[1]:10.2e} {floor[1]:12.2e}')
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size', type=int, default=512)
  parser.add_argument('--json', default=None)
  args = parser.parse_args(argv)
  result = dict(device=jax.devices()[0].device_kind,
                backend=jax.default_backend(), jax=jax.__version__,
                size=args.size, cases=measure(args.size))
  if args.json:
    with open(args.json + '.tmp', 'w') as f:
      json.dump(result, f, indent=1)
    os.replace(args.json + '.tmp', args.json)
  return 0


if __name__ == '__main__':
  sys.exit(main())
