"""Joining a multi-process run, and stopping cleanly when a peer process dies.

`join(coordinator, num_processes, process_id)` is `jax.distributed.initialize`
with three changes that let the survivors of a dead process stop with one
line instead of a SIGABRT and a page of C++ stack:

* The coordination service is recoverable (what `jax_enable_recoverability`
  asks of JAX's): it does not broadcast a task's death as a fatal error to
  every other task, and its shutdown barrier does not wait for the dead;
  the survivors see the death as the failure of their next collective (a
  Python exception, within a second or two).
* The coordination service runs in a small process of its own beside
  process 0 (`python -m retrax.supervised.peers serve ...`), so that the
  death of process 0 does not take the service down under the others
  (their clients abort when it vanishes). It stays up for
  `SERVICE_GRACE_SECONDS` after process 0 ends, then exits.
* Heartbeats every few seconds (`HEARTBEAT_SECONDS`): a dead process is
  marked dead within that time.

`guard(note)` turns a collective's failure in a multi-process run into
`PeerLostError`: one line naming the lost process(es) (asked of the
service, at most `LIVE_QUERY_SECONDS`) and, through `note()`, the last
checkpoint. Checkpoints are written atomically, so nothing is half-written.
"""

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict

import jax

from retrax.errors import one_line
from retrax.supervised.batch_checks import TrainingError

HEARTBEAT_SECONDS = 5
LIVE_QUERY_SECONDS = 30
SERVICE_GRACE_SECONDS = 60
SHUTDOWN_SECONDS = 30

# Words in the error of a collective whose peer is gone (Gloo on CPU, NCCL
# and the coordination service elsewhere).
_PEER_FAILURE_WORDS = ('gloo', 'connection closed by peer', 'connection reset',
                       'nccl', 'unavailable:', 'socket closed', 'broken pipe',
                       'coordination service', 'heartbeat')


class PeerLostError(TrainingError):
  """Another process of a multi-process run died or became unreachable."""


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _start_service(port, num_processes):
  """Starts the coordination service's process on `port`; waits until it
  serves (raises if it could not start)."""
  proc = subprocess.Popen(
      [sys.executable, '-m', 'retrax.supervised.peers', 'serve', str(port),
       str(num_processes), str(os.getpid())],
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
      start_new_session=True)
  assert proc.stdout is not None  # stdout=PIPE.
  line = proc.stdout.readline()
  if not line.startswith('serving'):
    raise RuntimeError(f'the coordination service did not start on port '
                       f'{port} (exit code {proc.wait()}); is the port free?')
  return proc


def join(coordinator, num_processes, process_id):
  """`jax.distributed.initialize` with the (recoverable) service apart."""
  options: Dict[str, Any] = dict(heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
                 shutdown_timeout_seconds=SHUTDOWN_SECONDS)
  if process_id == 0:
    _start_service(int(coordinator.rsplit(':', 1)[1]), num_processes)
    # jax starts a service in process 0 in any case: give it a spare port.
    options['coordinator_bind_address'] = f'127.0.0.1:{_free_port()}'
  jax.distributed.initialize(coordinator_address=coordinator,
                             num_processes=num_processes,
                             process_id=process_id, **options)


def serve(port, num_processes, parent_pid):
  """The service process: serves until `parent_pid` has been gone for
  `SERVICE_GRACE_SECONDS` (the survivors shut down through it)."""
  from jax._src.lib import _jax  # The service JAX runs inside process 0.
  service = _jax.get_distributed_runtime_service(
      f'[::]:{port}', num_processes, heartbeat_timeout=HEARTBEAT_SECONDS,
      shutdown_timeout=SHUTDOWN_SECONDS, recoverable=True)
  print('serving', flush=True)
  sys.stdout.close()
  while os.getppid() == parent_pid:
    time.sleep(0.5)
  time.sleep(SERVICE_GRACE_SECONDS)
  service.shutdown()


def is_peer_failure(error):
  """Whether `error` (or its cause) is a collective failing for a lost peer,
  in a multi-process run."""
  if jax.process_count() == 1:
    return False
  while error is not None:
    text = str(error).lower()
    if isinstance(error, PeerLostError) or any(
        w in text for w in _PEER_FAILURE_WORDS):
      return True
    error = error.__cause__
  return False


def lost_processes(timeout=LIVE_QUERY_SECONDS):
  """The ids of the processes the service counts as dead (None if it does
  not answer within `timeout` seconds)."""
  from jax.experimental import multihost_utils
  found = []

  def ask():
    with multihost_utils.live_devices(jax.devices()) as live:
      alive = {d.process_index for d in live}
      found.append(sorted(set(range(jax.process_count())) - alive))
  thread = threading.Thread(target=ask, daemon=True)
  thread.start()
  thread.join(timeout)
  return found[0] if found else None


def lost_message(error, note):
  """The one line of a lost peer: who, what failed, the last checkpoint."""
  lost = lost_processes()
  who = ('a peer process' if not lost else 'process ' + ', '.join(
      map(str, lost)))
  return (f'{who} of the {jax.process_count()} in this run was lost '
          f'({one_line(error, 160)}); process {jax.process_index()} stops '
          f'too. {note()[:1].upper()}{note()[1:]}: restart every process '
          'with the same command to resume from it.')


def _newest_checkpoint_note():
  return 'the newest checkpoint in the run directory is the last'


@contextlib.contextmanager
def guard(note=_newest_checkpoint_note):
  """Raises `PeerLostError` (one line; `note()` says which checkpoint is the
  last) in place of a collective's failure for a lost peer."""
  try:
    yield
  except PeerLostError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if not is_peer_failure(e):
      raise
    raise PeerLostError(lost_message(e, note)) from e


if __name__ == '__main__' and sys.argv[1:2] == ['serve']:
  serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
