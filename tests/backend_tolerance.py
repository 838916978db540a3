"""Float32 tolerances per backend: a test's own off a TPU, at least a floor on one.

Usage: `np.testing.assert_allclose(got, want, **float32_tolerance(rtol=1e-5,
atol=1e-5))`. Off a TPU (CPU, GPU) the test's own values come back
unchanged; on a TPU each is raised to `TPU_FLOAT32_FLOOR`.

The backend is `jax.default_backend()` of the process that asserts, where the
compared arrays were computed: the root conftest leaves the test process on
the chip and sends only the processes that tests start to the CPU
(`JAX_PLATFORMS=cpu`), which inherit `RETRAX_TEST_BACKEND=tpu` but compute
on the CPU.
"""

import jax

# The floor for float32 results computed through exp/softmax/matmul chains on
# a TPU, not for exact-integer results. A TPU's float32 exp, divide and
# multi-pass matmuls are not a CPU's bit for bit: on a v5e (JAX 0.10.2, matmuls
# at 'highest' precision, chip run of 2026-12-06) attention outputs were off
# float64 NumPy by up to 3.3e-4 abs, relative ~6e-5 away from zero (the Pallas
# kernel off XLA, both on the chip, by up to 7e-6 abs), against tests'
# tolerances of 1e-5. Its elementwise float32 is the cause
# (benchmarks/float32_error.py on the chip, max relative error against
# float64: exp 5.0e-6, log 1.6e-5, tanh 3.1e-5, matmul at 'highest' 4.2e-7).
TPU_FLOAT32_FLOOR = 5e-4


def on_tpu():
  return jax.default_backend() == 'tpu'


def float32_tolerance(rtol, atol, scale=1.0):
  """`dict(rtol=, atol=)` for `assert_allclose`: the given ones, TPU-floored.

  `scale`: the magnitude `atol` is a fraction of (e.g. the reference's
  largest); the returned atol is `atol * scale`, the TPU floor then being a
  fraction of it too. Comparisons with real Trax's goldens use it: their
  float32 outputs and gradients are only as close as the model's
  conditioning allows (tests/layers/research/golden_leaves.py).
  """
  if on_tpu():
    rtol = max(rtol, TPU_FLOAT32_FLOOR)
    atol = max(atol, TPU_FLOAT32_FLOOR)
  return dict(rtol=rtol, atol=atol * scale)
