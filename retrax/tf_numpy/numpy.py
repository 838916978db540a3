"""`trax.tf_numpy.numpy` on JAX: `jax.numpy`'s API and the float64 switch.

`set_allow_float64(flag)` sets JAX's `jax_enable_x64` (with it off, float64
requests give float32 arrays, as TF-numpy does without float64).
"""

import jax
from jax.numpy import *


def is_allow_float64():
  """True if float64 arrays are allowed (JAX's `jax_enable_x64`)."""
  return bool(jax.config.read('jax_enable_x64'))


def set_allow_float64(allow):
  """Allows or disallows float64 arrays (sets JAX's `jax_enable_x64`)."""
  jax.config.update('jax_enable_x64', bool(allow))
