"""Trax's `trax.tf_numpy` path, on JAX: `numpy` is `jax.numpy`, plus the flags.

retrax has no TensorFlow. Trax programs and tests that import
`trax.tf_numpy.numpy` (for its numpy API or its float64 switch) or
`trax.tf_numpy.extensions` (for `tpu_devices`) get JAX's equivalents.
"""

from retrax.tf_numpy import extensions as extensions
from retrax.tf_numpy import numpy as numpy
