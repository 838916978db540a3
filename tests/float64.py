"""`float64()`: JAX in float64 for a test's gradient checks, on a CPU device.

`jax.enable_x64(True)`, and where the default device is a TPU, the host's CPU
as the default device inside too. A TPU has no float64 arithmetic: XLA
emulates it in float32 pairs, and compiling the emulation is slow (on a v5e,
JAX 0.10.2, 2026-12-07: one LSH layer's `check_grads` took 211 s there, the
finite differences of a weightless layer 10-16 s). The checks that need
float64 (central differences, 1e-12 agreement) check the math, not the
chip's arithmetic, which the float32 tests compare on the chip itself
(`tests/backend_tolerance.py`). Arrays made inside land on the CPU; arrays
made before, uncommitted, follow the computation there.
"""

import contextlib

import jax

from tests.backend_tolerance import on_tpu


@contextlib.contextmanager
def float64():
  with jax.enable_x64(True):
    if on_tpu():
      with jax.default_device(jax.devices('cpu')[0]):
        yield
    else:
      yield
