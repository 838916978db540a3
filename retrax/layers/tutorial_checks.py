"""Warns once when a loss that expects log-probabilities is fed something else.

Trax 1.3 stopped ending its models (`TransformerLM`, `ReformerLM`, ...) in
`LogSoftmax`, while `CrossEntropyLoss` and `CrossEntropySum` still take
log-probabilities. Programs written for Trax <= 1.2 therefore train raw logits
against a loss that rewards making them large: the loss goes negative and
sampling produces garbage. Two symptoms are checked:

* the model outputs reaching such a loss are not log-probabilities: the mean
  over (at most 64) positions of `|logsumexp(outputs)|` exceeds 0.25 (it is ~0
  for log-probabilities, ~log(vocab_size) for fresh logits). Eagerly this is
  checked on the spot; under `jit` a `lax.cond` calls back to the host only when
  the check fails, so correct programs pay one small reduction and no transfer;
* a cross-entropy loss value below 0 (checked by `training.Loop` on the loss it
  already reads back each step).

The warning (`LogProbabilitiesWarning`, a `UserWarning`) is issued at most once
per process, attributed to the user's line that led to the check (the first
frame outside retrax, JAX and the standard library; for a jitted check, the
line being traced), not to retrax's own files.
"""

import functools
import os
import sys
import sysconfig
import threading
import types
import warnings
from typing import Optional

import jax
import numpy as np

from retrax.fastmath import numpy as jnp

TOLERANCE = 0.25
_ROWS = 64
# Loss layers that read log-probabilities (the Serial names Trax gives them).
LOG_PROB_LOSSES = ('CrossEntropyLoss', 'CrossEntropySum')

_lock = threading.Lock()
_warned = False
_pending = None


class LogProbabilitiesWarning(UserWarning):
  """A loss expecting log-probabilities got raw logits (or negative loss)."""


def _fix(layer_name):
  return (f'Since Trax 1.3 models no longer end in LogSoftmax: use '
          f'tl.CrossEntropyLossWithLogSoftmax() or '
          f'tl.WeightedCategoryCrossEntropy() (they take logits) instead of '
          f'tl.{layer_name}(), or end the model with tl.LogSoftmax(). '
          '(Shown once per process.)')


def has_warned():
  """True once the warning was issued in this process."""
  return _warned


def reset():
  """Lets the warning be issued again and drops a pending one (for tests)."""
  global _warned, _pending
  with _lock:
    _warned = False
    _pending = None


def _library_dirs():
  """Folders whose frames are not the user's: retrax, JAX, gin, the stdlib."""
  dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
  for name in ('jax', 'jaxlib', 'gin'):
    path = getattr(sys.modules.get(name), '__file__', None)
    if path:
      dirs.append(os.path.dirname(os.path.abspath(path)))
  return tuple(os.path.join(d, '') for d in dirs)


_STDLIB = os.path.join(os.path.abspath(sysconfig.get_paths()['stdlib']), '')


def _is_library(filename):
  if filename.startswith('<frozen'):
    return True
  path = os.path.abspath(filename)
  if path.startswith(_STDLIB) and not any(
      d in path for d in ('site-packages', 'dist-packages')):
    return True
  return path.startswith(_library_dirs())


def _user_frame():
  """`(frame, its depth below the caller)` of the innermost user frame, or
  `(None, None)` when every frame is a library's."""
  frame: Optional[types.FrameType] = sys._getframe(2)
  depth = 1
  while frame is not None and _is_library(frame.f_code.co_filename):
    frame, depth = frame.f_back, depth + 1
  return frame, depth


def _user_site():
  """The innermost user frame's `(filename, lineno, globals)`, or None."""
  frame, _ = _user_frame()
  return None if frame is None else (frame.f_code.co_filename, frame.f_lineno,
                                     frame.f_globals)


def _warn_once(message, site=None):
  """Warns once per process, at `site` (from `_user_site`) if given, else at
  the user's frame that called into retrax."""
  global _warned
  with _lock:
    if _warned:
      return
    _warned = True
  if site is None:
    frame, depth = _user_frame()
    # stacklevel 1 is this function; depth 1 its caller.
    warnings.warn(message, LogProbabilitiesWarning,
                  stacklevel=depth + 1 if frame is not None else 2)
    return
  filename, lineno, module_globals = site
  warnings.warn_explicit(
      message, LogProbabilitiesWarning, filename, lineno,
      module=module_globals.get('__name__'),
      registry=module_globals.setdefault('__warningregistry__', {}),
      module_globals=module_globals)


def _not_log_probs(layer_name, deviation, site=None):
  _warn_once(
      f'{layer_name} expects log-probabilities, but the model outputs fed to '
      f'it are not (mean |logsumexp| over the category axis = '
      f'{float(deviation):.3g}; log-probabilities give 0): the model likely '
      f'ends in raw logits. {_fix(layer_name)}', site)


def _from_device(layer_name, site, deviation):
  """The host side of the jitted check: a warning turned error waits for the host."""
  global _pending
  try:
    _not_log_probs(layer_name, deviation, site)
  except Warning as e:  # Warnings as errors: raised by `raise_pending`.
    _pending = e


def raise_pending():
  """Raises a warning that a jitted check turned into an error (`-W error`)."""
  global _pending
  error, _pending = _pending, None
  if error is not None:
    raise error


def check_log_probs(layer_name, model_output):
  """Warns (once) if `model_output`, given to `layer_name`, is not log-probs."""
  if _warned or model_output.ndim == 0 or model_output.shape[-1] < 2:
    return
  rows = jnp.reshape(model_output, (-1, model_output.shape[-1]))[:_ROWS]
  rows = jax.lax.stop_gradient(rows).astype(jnp.float32)
  deviation = jnp.mean(jnp.abs(jax.nn.logsumexp(rows, axis=-1)))
  if isinstance(deviation, jax.core.Tracer):
    # The user's line being traced: the callback may run on another thread.
    report = functools.partial(_from_device, layer_name, _user_site())
    jax.lax.cond(deviation > TOLERANCE,
                 lambda d: jax.debug.callback(report, d),
                 lambda d: None, deviation)
  elif float(deviation) > TOLERANCE:
    _not_log_probs(layer_name, deviation)


def check_loss_value(layer_name, value):
  """Warns (once) if a log-probability cross-entropy loss `value` is below 0."""
  if _warned or layer_name not in LOG_PROB_LOSSES:
    return
  if np.isfinite(value) and value < -1e-3:
    _warn_once(
        f'{layer_name} returned a negative loss ({float(value):.4g}); a '
        'cross-entropy of log-probabilities is never below 0, so the model '
        f'outputs are not log-probabilities. {_fix(layer_name)}')
