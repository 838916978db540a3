"""Progress of `Loop.run`: a bar in terminals and notebooks, timed lines elsewhere.

Where the progress is shown is chosen once per `run`:

* in a Jupyter kernel (IPython imported and its shell running a kernel):
  tqdm's notebook widget when ipywidgets is installed, else a line of HTML
  (a `<progress>` element and the same text) that IPython's display updates
  in place;
* on a terminal (stderr is a TTY): tqdm's bar, for runs of at least
  `min_steps` steps;
* anywhere else (a log file, a pipe): one line on stderr every
  `line_interval` seconds (30 by default), the first after `line_interval`
  seconds, so short runs print nothing and long ones are never silent.

Each shows "compiling" until the first step (and the evals after it) have
been compiled and run; the rate (steps/s and tokens/s) and ETA count only the
steps after that, so compile time does not inflate the estimate.

Independently of the display, `Progress` counts the distinct batch shapes it
sees: each one compiles the training step again, and past
`RECOMPILE_WARN_SHAPES` of them a `RecompileWarning` says so once.
"""

import html
import importlib
import importlib.util
import sys
import time
import warnings
from typing import Optional, Tuple

import numpy as np
import tqdm

RECOMPILE_WARN_SHAPES = 8
LINE_INTERVAL = 30.0  # Seconds between progress lines off terminals.
_REFRESH = 0.5  # Seconds between updates of the rate and notebook displays.
_BAR_FORMAT = ('{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} '
               '[{elapsed}{postfix}]')


class RecompileWarning(UserWarning):
  """Many distinct batch shapes: the training step is being recompiled."""


def _is_terminal(stream):
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False


def in_notebook():
  """True inside a Jupyter kernel: IPython is imported and its shell has a
  kernel (a terminal IPython has none; nothing is imported to find out)."""
  ipython = sys.modules.get('IPython')
  get_ipython = getattr(ipython, 'get_ipython', None)
  if get_ipython is None:
    return False
  try:
    shell = get_ipython()
  except Exception:  # noqa: BLE001 - a broken shell is not a notebook.
    return False
  return getattr(shell, 'kernel', None) is not None


def _format_seconds(s):
  s = int(round(s))
  h, rest = divmod(s, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m:02d}:{s:02d}'


def _signature(batch):
  return tuple((np.shape(x), str(getattr(x, 'dtype', type(x).__name__)))
               for x in batch)


# --- displays: where the progress goes -------------------------------------------
#
# Each has `show(n, desc, status, now)` (called every step: `status` is the
# text after the elapsed time, e.g. '9.1 steps/s, ETA 03:17, loss 2.3100'),
# `write(message)` and `close()`.


class _TqdmDisplay:
  """A tqdm bar: the terminal's, or tqdm.notebook's widget."""

  def __init__(self, kind, bar_class, total, initial, **kwargs):
    self.kind = kind
    self._bar = bar_class(total=total, initial=initial, unit='step',
                          leave=False, desc='compiling', bar_format=_BAR_FORMAT,
                          **kwargs)
    self._desc = 'compiling'
    self._status = ''

  def show(self, n, desc, status, now):
    del n, now
    if desc != self._desc:
      self._desc = desc
      self._bar.set_description_str(desc, refresh=False)
    if status != self._status:  # tqdm puts ', ' before the postfix itself.
      self._status = status
      self._bar.set_postfix_str(status, refresh=False)
    self._bar.update(1)

  def write(self, message):
    self._bar.write(message)

  def close(self):
    self._bar.close()


class _TextDisplay:
  """The progress as text: `line(n, desc, status, now)` for the displays
  that draw it themselves."""

  def __init__(self, total, initial, start):
    self._total = total
    self._initial = initial
    self._start = start

  def line(self, n, desc, status, now):
    percent = 100.0 * n / self._total if self._total else 100.0
    status = f', {status}' if status else ''
    return (f'{desc}: step {n}/{self._total} ({percent:.0f}%) '
            f'[{_format_seconds(now - self._start)}{status}]')

  def write(self, message):
    print(message)
    sys.stdout.flush()


class _LineDisplay(_TextDisplay):
  """One line on `stream` every `interval` seconds (the first after one)."""

  kind = 'lines'

  def __init__(self, total, initial, start, stream, interval):
    super().__init__(total, initial, start)
    self._stream = stream
    self._interval = interval
    self._next = start + interval

  def show(self, n, desc, status, now):
    if now >= self._next:
      self.print_line(n, desc, status, now)

  def print_line(self, n, desc, status, now):
    self._stream.write(self.line(n, desc, status, now) + '\n')
    self._stream.flush()
    self._next = now + self._interval

  def close(self):
    pass


class _HtmlDisplay(_TextDisplay):
  """A `<progress>` bar and the text line, updated in place by IPython."""

  kind = 'html'

  def __init__(self, total, initial, start):
    super().__init__(total, initial, start)
    self._ipython_display = importlib.import_module('IPython.display')
    self._last = -float('inf')
    self._handle = self._ipython_display.display(
        self._bundle(initial, 'compiling', '', start), raw=True,
        display_id=True)

  def _bundle(self, n, desc, status, now):
    text = self.line(n, desc, status, now)
    return {'text/plain': text,
            'text/html': f'<progress value="{n}" max="{self._total}" '
                         f'style="width: 30ch"></progress> '
                         f'<code>{html.escape(text)}</code>'}

  def show(self, n, desc, status, now):
    if now - self._last >= _REFRESH or n >= self._total:
      self._last = now
      self._handle.update(self._bundle(n, desc, status, now), raw=True)

  def close(self):
    self._handle.update({'text/plain': ''}, raw=True)  # Gone, as tqdm's.


def _notebook_display(total, initial, start):
  """tqdm's notebook widget if ipywidgets is installed, else IPython HTML."""
  if importlib.util.find_spec('ipywidgets') is not None:
    try:
      notebook = importlib.import_module('tqdm.notebook')
      return _TqdmDisplay('notebook', notebook.tqdm, total, initial)
    except ImportError:  # An ipywidgets tqdm cannot use ("IProgress not found").
      pass
  return _HtmlDisplay(total, initial, start)


def _choose_display(enabled, n_steps, min_steps, initial, start, line_interval):
  """The display of a run (None: nothing shown)."""
  total = initial + n_steps
  if enabled is False:
    return None
  if in_notebook():
    return _notebook_display(total, initial, start)
  if enabled or (_is_terminal(sys.stderr) and n_steps >= min_steps):
    return _TqdmDisplay('terminal', tqdm.tqdm, total, initial,
                        dynamic_ncols=True)
  if _is_terminal(sys.stderr):
    return None  # A short run on a terminal: no bar.
  return _LineDisplay(total, initial, start, sys.stderr, line_interval)


class Progress:
  """The progress of `n_steps` training steps.

  Args:
    n_steps: the number of steps of this `run`.
    enabled: True (a bar: the notebook's in a Jupyter kernel, else tqdm's on
      stderr), False (nothing), or None: chosen as the module docstring says.
    min_steps: the shortest run that gets an automatic bar on a terminal.
    initial: the step count the bar starts from (a resumed run).
    line_interval: seconds between progress lines when stderr is neither a
      terminal nor a notebook's.
  """

  def __init__(self, n_steps, enabled=None, min_steps=100, initial=0,
               line_interval=LINE_INTERVAL):
    self._n_steps = n_steps
    self._initial = initial
    self._steps = 0
    self._tokens = 0
    self._start = time.time()
    # (time, steps, tokens) when compiled.
    self._compiled_at: Optional[Tuple[float, int, int]] = None
    self._status = ''
    self._last_status = -float('inf')
    self._shapes = set()
    self._warned = False
    self._display = _choose_display(enabled, n_steps, min_steps, initial,
                                    self._start, line_interval)

  @property
  def display(self):
    """Where the progress is shown: 'terminal', 'notebook', 'html', 'lines'
    or None."""
    return None if self._display is None else self._display.kind

  def rate(self):
    """Steps per second since the first step was compiled (None before)."""
    if self._compiled_at is None or self._steps <= self._compiled_at[1]:
      return None
    t, steps, _ = self._compiled_at
    return (self._steps - steps) / max(time.time() - t, 1e-9)

  def eta(self):
    """Seconds left at the current rate (None before there is a rate)."""
    rate = self.rate()
    return None if not rate else (self._n_steps - self._steps) / rate

  def update(self, batch, loss=None):
    """Advances one step on `batch` (a tuple of arrays, or a token count)."""
    if isinstance(batch, (int, np.integer)):
      n_tokens = int(batch)
    else:
      n_tokens = int(np.prod(np.shape(batch[0])))
      self._watch_shape(batch)
    self._steps += 1
    self._tokens += n_tokens
    now = time.time()
    # The rate starts at step 2: step 1 (and the evals after it) compiled.
    if self._compiled_at is None and self._steps >= min(2, self._n_steps):
      self._compiled_at = (now, self._steps, self._tokens)
    if self._display is None:
      return
    if now - self._last_status > _REFRESH and self.rate():
      self._status = self._status_text(now, loss)
      self._last_status = now
    desc = 'compiling' if self._compiled_at is None else 'training'
    self._display.show(self._initial + self._steps, desc, self._status, now)

  def _status_text(self, now, loss):
    """'9.1 steps/s, 582 tokens/s, ETA 03:17, loss 2.3100'."""
    assert self._compiled_at is not None  # Called only once rate() is set.
    t, _, tokens = self._compiled_at
    parts = [f'{self.rate():.1f} steps/s',
             f'{(self._tokens - tokens) / max(now - t, 1e-9):.0f} tokens/s',
             f'ETA {_format_seconds(self.eta())}']
    if loss is not None:
      parts.append(f'loss {loss:.4f}')
    return ', '.join(parts)

  def _watch_shape(self, batch):
    if self._warned:
      return
    self._shapes.add(_signature(batch))
    if len(self._shapes) > RECOMPILE_WARN_SHAPES:
      self._warned = True
      warnings.warn(
          f'{len(self._shapes)} distinct batch shapes in '
          f'{self._steps + 1} steps ({time.time() - self._start:.0f} s): each '
          'new shape compiles the training step again. Pad batches to a few '
          'fixed lengths (e.g. fewer bucket boundaries in BucketByLength, or '
          'strict padding to a multiple) to train at full speed.',
          RecompileWarning, stacklevel=3)

  def write(self, message):
    """Prints a line without breaking the bar (plain print when no bar)."""
    if self._display is None:
      print(message)
      sys.stdout.flush()
    else:
      self._display.write(message)

  def close(self):
    if self._display is not None:
      self._display.close()
      self._display = None
