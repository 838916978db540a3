"""Shared by the tests that start retrax processes on 127.0.0.1."""

import os
import socket

import pytest

from retrax.supervised import devices


def free_port():
  """A TCP port on 127.0.0.1 that nothing listens on now.

  Skips the test where the machine allows no sockets (a sandboxed TPU VM
  refuses even the loopback): processes there cannot join one run.
  """
  try:
    with socket.socket() as s:
      s.bind(('127.0.0.1', 0))
      return s.getsockname()[1]
  except OSError as e:
    pytest.skip(f'no TCP sockets on this machine ({e}); multi-process runs '
                f'need them')


def xla_flags(n_devices=None):
  """A child process's XLA_FLAGS: the code-generation level of this one (the
  root conftest's: float results differ in their last bits between levels,
  and tests compare a child's numbers with their own) and, if given, the
  number of CPU devices it sees."""
  flags = [f for f in os.environ.get('XLA_FLAGS', '').split()
           if f.startswith('--xla_backend_optimization_level')]
  if n_devices:
    flags.append(f'--xla_force_host_platform_device_count={n_devices}')
  return ' '.join(flags)


def cpu_env(n_devices=None, *, pythonpath=(), platform='cpu', **extra):
  """`os.environ` for a child process on CPU devices with no cluster
  settings inherited (the test chooses coordinator and process ids).

  Args:
    n_devices: the CPU devices the child sees (XLA_FLAGS is replaced by the
      device count); None: XLA's default, one.
    pythonpath: folders put before the child's PYTHONPATH (e.g. the tests'
      worker modules).
    platform: the child's JAX_PLATFORMS; None keeps the test process's, for
      a child whose numbers the test compares bit for bit with its own.
    **extra: more variables.
  """
  if platform is None and os.environ.get('RETRAX_TEST_BACKEND'):
    pytest.skip(f'compares a child process bit for bit with this one, which '
                f'holds the {os.environ["RETRAX_TEST_BACKEND"]} (one program '
                f'at a time)')
  env = dict(os.environ, **extra)
  if platform is not None:
    env['JAX_PLATFORMS'] = platform
  env['XLA_FLAGS'] = xla_flags(n_devices)  # Not the test process's count.
  if pythonpath:
    env['PYTHONPATH'] = os.pathsep.join([*pythonpath,
                                         env.get('PYTHONPATH', '')])
  for k in (devices.ENV_COORDINATOR, devices.ENV_NUM_PROCESSES,
            devices.ENV_PROCESS_ID):
    env.pop(k, None)
  return env
