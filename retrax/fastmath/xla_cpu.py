"""`jit` with the XLA:CPU compile options retrax's steps run fastest under.

XLA:CPU (jaxlib 0.10) hands dots, elementwise ops and reductions to YNNPACK.
At the Reformer's shapes YNNPACK's reductions are 10-30x slower than XLA's
own loops: a bias gradient `[4096, 256] -> [256]` takes ~10 ms instead of
0.3 ms, the sum of two hash rounds `[2, 4096, 64] -> [4096, 64]` 3 ms instead
of 0.1 ms. retrax's jitted steps keep YNNPACK for dots only, each dot on its
own (fusing elementwise ops into YNNPACK dots gave NaNs in jaxlib 0.10): the
16K-token ReformerLM training step is 8% faster, 10-15% with bfloat16 matmuls.

Other backends, an XLA:CPU that lacks the option, and a user's own
`XLA_FLAGS` that set it get no options.
"""

import functools
import os

import jax

OPTION = 'xla_cpu_experimental_ynn_fusion_type'
VALUE = 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'


@functools.cache
def compiler_options():
  """The options for this process's default backend (None: none)."""
  if jax.default_backend() != 'cpu' or OPTION in os.environ.get(
      'XLA_FLAGS', ''):
    return None
  options = {OPTION: VALUE}
  try:
    jax.jit(lambda x: x + 1, compiler_options=options).lower(1.0).compile()
  except Exception:  # pylint: disable=broad-except
    return None  # An XLA without this option.
  return options


def jit(fun, **kwargs):
  """`jax.jit(fun, **kwargs)` compiled with `compiler_options()`."""
  options = compiler_options()
  if options and 'compiler_options' not in kwargs:
    kwargs['compiler_options'] = options
  return jax.jit(fun, **kwargs)
