"""Settings for the training tests: a compilation cache shared by all of them.

XLA compiles a training step in about 3 s on a 2-core CPU; many tests build
loops over the same small model, and subprocess tests rebuild them again. A
per-session persistent compilation cache (also passed to subprocesses through
`JAX_COMPILATION_CACHE_DIR`) compiles each distinct step once.
"""

import atexit
import os
import shutil
import sys
import tempfile

import jax

_CACHE_DIR = tempfile.mkdtemp(prefix='retrax-test-jax-cache-')
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
os.environ['JAX_COMPILATION_CACHE_DIR'] = _CACHE_DIR
os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
os.environ['JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES'] = '0'
jax.config.update('jax_compilation_cache_dir', _CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
