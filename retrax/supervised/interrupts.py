"""Stopping `Loop.run` on SIGTERM or Ctrl-C with the last step saved.

While `Loop.run` runs, `StopOnSignal` catches SIGTERM and SIGINT: the first
signal only asks the loop to stop; it finishes the step in progress (with the
evals and saves scheduled for it), saves the last completed step if it is
newer than the last save, flushes its logs, and raises `Interrupted`
(Ctrl-C, a `KeyboardInterrupt`) or `Terminated` (SIGTERM, a `SystemExit`
with code 143), whose message says where it stopped. A second signal ends the
process at once by the signal's default action (as `kill -9` would: the
checkpoints stay consistent, the newest finished one is used on resume).

143 for SIGTERM is 128 + 15, the status a shell reports for a process killed
by SIGTERM: a scheduler (SLURM's requeue, Kubernetes, systemd) or a chained
`retrax train && ...` sees that the run did not finish its steps, which an
exit code of 0 would hide. Ctrl-C gives 130 (128 + 2) the same way.

In a multi-process run the processes agree before each step whether any of
them received a signal (`peers.agree_on_stop`): all stop after the same
step, all join its save and all raise the same `Terminated`/`Interrupted`,
also those that received no signal themselves (or received theirs later).

Handlers are installed only in the main thread and only over Python's own
defaults (a program's own SIGTERM/SIGINT handlers are left alone), and the
previous handlers are restored when `run` returns: a library does not keep
the process's signals.
"""

import os
import signal
import socket
import threading

from retrax.supervised import checkpointing
from retrax.supervised import peers

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_DEFAULTS = {signal.SIGINT: signal.default_int_handler,
             signal.SIGTERM: signal.SIG_DFL}


class TrainingStopped(BaseException):
  """A signal stopped `Loop.run`: `signum`, the last completed `step` and
  the `checkpoint` holding it (None where this process saves nothing).

  A `BaseException`, as `KeyboardInterrupt` is, not a `retrax.Error`: a stop
  that was asked for, which `except Exception` must not swallow (see
  `retrax.errors`).
  """

  def __init__(self, signum, step, checkpoint):
    super().__init__(signum, step, checkpoint)
    self.signum, self.step, self.checkpoint = signum, step, checkpoint

  def __str__(self):
    saved = (f'saved checkpoint {self.checkpoint}' if self.checkpoint else
             'this process saves no checkpoint')
    return (f'stopped by {signal.Signals(self.signum).name} after step '
            f'{self.step}; {saved}; the logs are flushed. Run the same '
            'training again to resume from there.')


class Interrupted(TrainingStopped, KeyboardInterrupt):
  """Ctrl-C (SIGINT) stopped `Loop.run` (a `KeyboardInterrupt`)."""


class Terminated(TrainingStopped, SystemExit):
  """SIGTERM stopped `Loop.run` (a `SystemExit` with code 143)."""

  def __init__(self, signum, step, checkpoint):
    super().__init__(signum, step, checkpoint)
    self.code = EXIT_CODES[signal.SIGTERM]


class StopOnSignal:
  """Turns SIGTERM/SIGINT into a stop request between `install` and
  `restore`: `received` is this process's signal, `signum` the run's, once
  `agreed` (in a multi-process run, another process's signal stops this one
  too).

  Args:
    note: `() -> str`, which checkpoint is the run's last (for the one line
      of a lost peer).
  """

  def __init__(self, note=None):
    self.signum = None
    self.received = None
    self._note = note or peers.newest_checkpoint_note
    self._previous = {}
    self._watchdog = None

  @property
  def requested(self):
    return self.signum is not None

  def agreed(self):
    """Whether the run stops now: this process's request in a single-process
    run; in a multi-process one, any process's (a collective: every process
    asks before the same step)."""
    mine = self.received or 0
    run = peers.agree_on_stop(mine, self._note)
    if run and self.signum is None:
      self.signum = run
      self._stop_watchdog()  # Agreed: the save's collectives are guarded.
      if run != mine:
        os.write(2, f'\n{signal.Signals(run).name} in another process of the '
                 'run: stopping after the step in progress and saving it.\n'
                 .encode())
    return self.requested

  def _handle(self, signum, frame):
    del frame
    if self.received is not None:  # The second signal: at once, by default.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.received = signum
    # os.write, not print: the handler may interrupt a print of the loop.
    os.write(2, f'\n{signal.Signals(signum).name}: stopping after the step '
             'in progress and saving it (signal again to stop at '
             'once).\n'.encode())

  def _stop_watchdog(self):
    if self._watchdog is not None:
      self._watchdog.close()
      self._watchdog = None

  def install(self):
    """Takes SIGTERM/SIGINT over (main thread, default handlers only)."""
    if threading.current_thread() is threading.main_thread():
      for signum, default in _DEFAULTS.items():
        if signal.getsignal(signum) is default:
          self._previous[signum] = signal.signal(signum, self._handle)
      if self._previous and peers.multi_process():
        self._watchdog = _Watchdog.start(self._note)
    return self

  def restore(self):
    """Gives the signals back to the handlers they had before `install`."""
    self._stop_watchdog()
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
    self._previous = {}

  def raise_if_requested(self, loop):
    """After `loop` stopped: logs where, and raises `Interrupted` or
    `Terminated` if a signal asked for the stop."""
    if self.signum is None:
      return
    path = None
    if loop.is_chief and loop.output_dir is not None:
      path = checkpointing.rolling_path(loop.output_dir, loop.step)
    cls = Interrupted if self.signum == signal.SIGINT else Terminated
    error = cls(self.signum, loop.step,
                path if path and os.path.isdir(path) else None)
    message = str(error)
    loop.log_step(message[0].upper() + message[1:])
    raise error


class _Watchdog:
  """Ends a process of a multi-process run with one line (exit code 2) when
  the run has not agreed to stop within `peers.stop_wait_seconds()` of its
  signal: a hung peer blocks it inside a step's collective, where Python
  runs no signal handler and no agreement can fail. A thread learns of the
  signal from the byte `signal.set_wakeup_fd` writes at once."""

  def __init__(self, note, previous_fd, read, write):
    self._note, self._previous_fd = note, previous_fd
    self._read, self._write = read, write
    self._done = threading.Event()
    threading.Thread(target=self._watch, daemon=True).start()

  @classmethod
  def start(cls, note):
    """A watchdog, or None where the wakeup fd is another's (asyncio's)."""
    read, write = socket.socketpair()
    write.setblocking(False)
    previous_fd = signal.set_wakeup_fd(write.fileno())
    if previous_fd != -1:
      signal.set_wakeup_fd(previous_fd)
      read.close()
      write.close()
      return None
    return cls(note, previous_fd, read, write)

  def _watch(self):
    with self._read:
      signums: list = []
      while not signums:
        data = self._read.recv(64)
        if not data or self._done.is_set():
          return
        signums = [b for b in data if b in EXIT_CODES]
    if not self._done.wait(peers.stop_wait_seconds()):
      os.write(2, f'\nretrax: error: {peers.stuck_message(signums[0], self._note)}'
               '\n'.encode())
      os._exit(2)  # Its main thread is stuck: no exception can reach it.

  def close(self):
    """Stops watching (the stop is agreed, or the run is over)."""
    self._done.set()
    signal.set_wakeup_fd(self._previous_fd)
    try:
      self._write.send(b'\0')  # Wakes the thread's recv.
    except OSError:
      pass
    self._write.close()
