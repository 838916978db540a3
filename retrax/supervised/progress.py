"""Console progress of `Loop.run`: a bar on terminals, one rate, an honest ETA.

The bar reads "compiling" until the first step (and the evals after it) have
been compiled and run; its rate (steps/s and tokens/s) and ETA count only the
steps after that, so compile time does not inflate the estimate. It is drawn
only when stderr is a terminal
(or when asked with ``enabled=True``), never into a redirected log.

Independently of the bar, `Progress` counts the distinct batch shapes it sees:
each one compiles the training step again, and past `RECOMPILE_WARN_SHAPES` of
them a `RecompileWarning` says so once.
"""

import sys
import time
import warnings

import numpy as np
import tqdm

RECOMPILE_WARN_SHAPES = 8


class RecompileWarning(UserWarning):
  """Many distinct batch shapes: the training step is being recompiled."""


def _is_terminal(stream):
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError):
    return False


def _format_seconds(s):
  s = int(round(s))
  h, rest = divmod(s, 3600)
  m, s = divmod(rest, 60)
  return f'{h}:{m:02d}:{s:02d}' if h else f'{m:02d}:{s:02d}'


def _signature(batch):
  return tuple((np.shape(x), str(getattr(x, 'dtype', type(x).__name__)))
               for x in batch)


class Progress:
  """The progress of `n_steps` training steps.

  Args:
    n_steps: the number of steps of this `run`.
    enabled: True/False, or None for a bar only when stderr is a terminal and
      the run has at least `min_steps` steps.
    min_steps: the shortest run that gets an automatic bar.
    initial: the step count the bar starts from (a resumed run).
  """

  def __init__(self, n_steps, enabled=None, min_steps=100, initial=0):
    if enabled is None:
      enabled = _is_terminal(sys.stderr) and n_steps >= min_steps
    self._n_steps = n_steps
    self._steps = 0
    self._tokens = 0
    self._start = time.time()
    self._compiled_at = None  # (time, steps, tokens) when compiled.
    self._last_postfix = 0.0
    self._shapes = set()
    self._warned = False
    self._bar = None
    if enabled:
      self._bar = tqdm.tqdm(
          total=initial + n_steps, initial=initial, unit='step',
          dynamic_ncols=True, leave=False, desc='compiling',
          bar_format='{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} '
          '[{elapsed}{postfix}]')

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
      if self._bar is not None:
        self._bar.set_description_str('training', refresh=False)
    if self._bar is None:
      return
    self._bar.update(1)
    if now - self._last_postfix > 0.5 and self.rate():
      t, _, tokens = self._compiled_at
      parts = [f'{self.rate():.1f} steps/s',
               f'{(self._tokens - tokens) / max(now - t, 1e-9):.0f} tokens/s',
               f'ETA {_format_seconds(self.eta())}']
      if loss is not None:
        parts.append(f'loss {loss:.4f}')
      self._bar.set_postfix_str(', ' + ', '.join(parts), refresh=False)
      self._last_postfix = now

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
    if self._bar is None:
      print(message)
      sys.stdout.flush()
    else:
      self._bar.write(message)

  def close(self):
    if self._bar is not None:
      self._bar.close()
      self._bar = None
