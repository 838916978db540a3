"""`jit` with the XLA:CPU compile options retrax's steps run fastest under.

XLA:CPU (jaxlib 0.10) hands dots, elementwise ops and reductions to YNNPACK.
At the Reformer's shapes YNNPACK's reductions are 10-30x slower than XLA's
own loops: a bias gradient `[4096, 256] -> [256]` takes ~10 ms instead of
0.3 ms, the sum of two hash rounds `[2, 4096, 64] -> [4096, 64]` 3 ms instead
of 0.1 ms. retrax's jitted steps keep YNNPACK for dots only, each dot on its
own (fusing elementwise ops into YNNPACK dots gave NaNs in jaxlib 0.10): the
16K-token ReformerLM training step is 8% faster, 10-15% with bfloat16 matmuls.

Copy insertion also runs XLA's region analysis, which drops copies of
loop-carried buffers that pass through conditionals (the predict-mode caches
of a decoding loop): batch-8 LSH decoding is ~20% faster, a training step
1-2%.

Other backends get no options; an XLA:CPU that lacks one, or a user's own
`XLA_FLAGS` that set it, go without that one.
"""

import functools
import os

import jax

OPTION = 'xla_cpu_experimental_ynn_fusion_type'
VALUE = 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT'
REGION_ANALYSIS = 'xla_cpu_copy_insertion_use_region_analysis'
OPTIONS = {OPTION: VALUE, REGION_ANALYSIS: True}


def _compiles_with(option, value):
  try:
    jax.jit(lambda x: x + 1,
            compiler_options={option: value}).lower(1.0).compile()
  except Exception:  # pylint: disable=broad-except
    return False  # An XLA without this option.
  return True


@functools.cache
def compiler_options():
  """The options for this process's default backend (None: none)."""
  if jax.default_backend() != 'cpu':
    return None
  user_flags = os.environ.get('XLA_FLAGS', '')
  options = {k: v for k, v in OPTIONS.items()
             if k not in user_flags and _compiles_with(k, v)}
  return options or None


def jit(fun, **kwargs):
  """`jax.jit(fun, **kwargs)` compiled with `compiler_options()`."""
  options = compiler_options()
  if options and 'compiler_options' not in kwargs:
    kwargs['compiler_options'] = options
  return jax.jit(fun, **kwargs)
