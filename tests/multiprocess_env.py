"""Shared by the tests that start retrax processes on 127.0.0.1."""

import os
import socket

from retrax.supervised import devices


def free_port():
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def cpu_env(**extra):
  """`os.environ` for a child process on one CPU device with no cluster
  settings inherited (the test chooses coordinator and process ids)."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', **extra)
  env.pop('XLA_FLAGS', None)  # One CPU device per process.
  for k in (devices.ENV_COORDINATOR, devices.ENV_NUM_PROCESSES,
            devices.ENV_PROCESS_ID):
    env.pop(k, None)
  return env
