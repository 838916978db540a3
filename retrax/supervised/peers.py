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

`agree_on_stop(signum, note)` is how the processes stop together: before
each step every process says whether it received a signal, through the
coordination service (a key when it did, then a barrier: no device work, a
fraction of a millisecond); all learn the same answer at the same step, so
all stop after it and join the same save. A scheduler signals hosts seconds
apart, or only one: each deciding alone would leave the save's collectives
waiting for a peer that has gone on training. A peer that does not arrive
within `STOP_WAIT_SECONDS` (when this process has a stop request; else
`STEP_WAIT_SECONDS`, longer: the chief may write alone between steps) is
lost: `PeerLostError`.
"""

import atexit
import contextlib
import itertools
import os
import signal
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
# The wait for the peers at a step's stop agreement; environment variable
# RETRAX_STOP_WAIT_SECONDS sets the first (a scheduler kills a host some
# seconds after its SIGTERM: a stop waits no longer than that matters).
STOP_WAIT_SECONDS = 120
STEP_WAIT_SECONDS = 3600
# A peer whose heartbeat key has not changed for this long, while this
# process waits for it at a stop agreement, is dead or hung (the recoverable
# service fails no barrier for a dead task: it would wait out the bound).
PEER_SILENT_SECONDS = 15

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
  _start_heartbeat()


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


def newest_checkpoint_note():
  return 'the newest checkpoint in the run directory is the last'


@contextlib.contextmanager
def guard(note=newest_checkpoint_note):
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


_agreements = itertools.count()  # Every process counts the same agreements.


def multi_process():
  return jax.process_count() > 1


def stop_wait_seconds():
  """How long a signalled process waits for its peers to stop with it."""
  value = os.environ.get('RETRAX_STOP_WAIT_SECONDS', '')
  try:
    return max(1.0, float(value)) if value else STOP_WAIT_SECONDS
  except ValueError:
    return STOP_WAIT_SECONDS


def stuck_message(signum, note=newest_checkpoint_note):
  """The one line of a process whose peers did not stop with it in time."""
  return (f'process {jax.process_index()} of the {jax.process_count()} in '
          f'this run received {signal.Signals(signum).name} but the run did '
          f'not reach its next step within {stop_wait_seconds():g} s: a peer '
          f'process is hung or unreachable; this process stops without '
          f'saving. {note()[:1].upper()}{note()[1:]}: restart every process '
          'with the same command to resume from it.')


def _client():
  from jax._src import distributed  # The coordination service's client.
  client = distributed.global_state.client
  assert client is not None  # Joined: more than one process.
  return client


_heartbeat: list = []  # [the event that stops it], once started.


def _start_heartbeat():
  """A thread that rewrites this process's `retrax/alive/<id>` key every
  second (until exit), for peers waiting on it to tell it is alive."""
  if _heartbeat or not multi_process():
    return
  client, stop = _client(), threading.Event()
  _heartbeat.append(stop)
  atexit.register(stop.set)  # Before JAX's shutdown (registered earlier).
  key = f'retrax/alive/{jax.process_index()}'

  def beat():
    n = 0
    while not stop.is_set():
      try:
        client.key_value_set(key, str(n), allow_overwrite=True)
      except Exception:  # pylint: disable=broad-except
        return  # The service is gone: the run is ending.
      n += 1
      stop.wait(1.0)
  threading.Thread(target=beat, daemon=True, name='retrax-heartbeat').start()


def _silent_peers(client, seen, now):
  """Peers whose heartbeat did not change for `PEER_SILENT_SECONDS` (`seen`:
  id -> (value, when it changed), kept between calls)."""
  for key, value in client.key_value_dir_get('retrax/alive/'):
    pid = int(key.rsplit('/', 1)[1])
    if seen.get(pid, (None,))[0] != value:
      seen[pid] = (value, now)
  return sorted(pid for pid, (_, when) in seen.items()
                if pid != jax.process_index() and
                now - when > PEER_SILENT_SECONDS)


def _wait_at_barrier(client, wait):
  """The stop barrier, bounded by `wait` seconds; returns the ids of the
  peers found silent meanwhile (then the barrier is left waiting)."""
  done, failed = threading.Event(), []

  def run():
    try:
      client.wait_at_barrier('retrax/stop', int(wait * 1000))
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)
    done.set()
  threading.Thread(target=run, daemon=True).start()
  seen: dict = {}
  while not done.wait(1.0):
    silent = _silent_peers(client, seen, time.monotonic())
    if silent:
      return silent
  if failed:
    raise failed[0]
  return []


def agree_on_stop(signum, note=newest_checkpoint_note):
  """The stop request of the run: the largest signal number any process
  received (`signum` is this process's, 0 for none; SIGTERM's 15 outranks
  Ctrl-C's 2), the same on every process. A collective: every process calls
  it before the same step.

  Raises:
    PeerLostError: a peer did not arrive in time, or is gone (`note()` says
      which checkpoint is the last).
  """
  if jax.process_count() == 1:
    return signum
  client = _client()
  _start_heartbeat()  # Where JAX's own detection joined the run.
  prefix = f'retrax/stop/{next(_agreements)}'
  wait = stop_wait_seconds() if signum else STEP_WAIT_SECONDS
  try:
    if signum:  # Keys only for requests: nothing accumulates otherwise.
      client.key_value_set(f'{prefix}/{jax.process_index()}', str(signum))
    silent = _wait_at_barrier(client, wait)
    if silent:
      raise PeerLostError(
          f'process {", ".join(map(str, silent))} of the '
          f'{jax.process_count()} in this run was lost (its heartbeat '
          f'stopped for {PEER_SILENT_SECONDS} s: dead or hung); process '
          f'{jax.process_index()} stops too. {note()[:1].upper()}'
          f'{note()[1:]}: restart every process with the same command to '
          'resume from it.')
    values = client.key_value_dir_get(prefix + '/')
  except PeerLostError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    what = (f'the processes did not all reach the stop agreement of the next '
            f'step within {wait:g} s' if 'deadline' in str(e).lower() else
            f'the stop agreement failed ({one_line(e, 160)})')
    raise PeerLostError(lost_message(what, note)) from None
  return max([signum] + [int(v) for _, v in values])


if __name__ == '__main__' and sys.argv[1:2] == ['serve']:
  serve(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
