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

Handlers are installed only in the main thread and only over Python's own
defaults (a program's own SIGTERM/SIGINT handlers are left alone), and the
previous handlers are restored when `run` returns: a library does not keep
the process's signals.
"""

import os
import signal
import threading

from retrax.supervised import checkpointing

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
_DEFAULTS = {signal.SIGINT: signal.default_int_handler,
             signal.SIGTERM: signal.SIG_DFL}


class TrainingStopped(BaseException):
  """A signal stopped `Loop.run`: `signum`, the last completed `step` and
  the `checkpoint` holding it (None where this process saves nothing)."""

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
  """Turns SIGTERM/SIGINT into a stop request (`requested`) between `install`
  and `restore`."""

  def __init__(self):
    self.signum = None
    self._previous = {}

  @property
  def requested(self):
    return self.signum is not None

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:  # The second signal: at once, by default.
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.signum = signum
    # os.write, not print: the handler may interrupt a print of the loop.
    os.write(2, f'\n{signal.Signals(signum).name}: stopping after the step '
             'in progress and saving it (signal again to stop at '
             'once).\n'.encode())

  def install(self):
    """Takes SIGTERM/SIGINT over (main thread, default handlers only)."""
    if threading.current_thread() is threading.main_thread():
      for signum, default in _DEFAULTS.items():
        if signal.getsignal(signum) is default:
          self._previous[signum] = signal.signal(signum, self._handle)
    return self

  def restore(self):
    """Gives the signals back to the handlers they had before `install`."""
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
