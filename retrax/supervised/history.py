"""`History`: the metrics a training run recorded, per mode and metric name.

    >>> h = History()
    >>> h.append('train', 'metrics/accuracy', 1, 0.04)
    >>> h.append('train', 'metrics/accuracy', 1000, 0.31)
    >>> h.get('train', 'metrics/accuracy')
    [(1, 0.04), (1000, 0.31)]

Trax's API (`append`, `get`, `modes`, `metrics_for_mode`, `to_dict`,
`from_dict`); values are stored as Python floats so a history round-trips
through JSON (and so through native checkpoints) exactly.
"""

import collections
import copy
import logging

import numpy as np

from retrax.validation import ArgumentTypeError

_log = logging.getLogger('retrax.supervised')


def _as_number(value):
  """A Python float (or int) for a scalar value; other values unchanged."""
  if isinstance(value, bool):
    return value
  if isinstance(value, (int, float)):
    return value
  if isinstance(value, np.generic) or (hasattr(value, 'dtype') and
                                       np.ndim(value) == 0):
    return np.asarray(value).item()
  return value


class History:
  """History of metrics: `{mode: {metric: [(step, value), ...]}}`."""

  def __init__(self):
    self._values = {}

  @classmethod
  def from_dict(cls, json_object):
    """Builds a History from `to_dict()` output (or Trax's `{'_values': ...}`)."""
    history = cls()
    values = json_object.get('_values', json_object) if isinstance(
        json_object, dict) else None
    if not isinstance(values, dict):
      raise ArgumentTypeError(
          f'History.from_dict expects a dict like {{"_values": {{mode: '
          f'{{metric: [(step, value), ...]}}}}}}; got '
          f'{type(json_object).__name__}.')
    for mode, metrics in values.items():
      for metric, entries in metrics.items():
        for step, value in entries:
          history.append(mode, metric, int(step), value)
    return history

  def to_dict(self):
    """`{'_values': {mode: {metric: [(step, value), ...]}}}` (a deep copy)."""
    return {'_values': {mode: {k: list(v) for k, v in metrics.items()}
                        for mode, metrics in copy.deepcopy(self._values).items()}}

  def append(self, mode, metric, step, value):
    """Appends `(step, value)` for `mode` ('train', 'eval', ...) and `metric`."""
    if mode not in self._values:
      self._values[mode] = collections.defaultdict(list)
    self._values[mode][metric].append((int(step), _as_number(value)))

  def get(self, mode, metric):
    """The `(step, value)` pairs recorded for `mode` and `metric`, oldest first."""
    if mode not in self._values:
      _log.info('Metric %s not found for mode %s', metric, mode)
      return []
    return list(self._values[mode].get(metric, []))

  @property
  def modes(self):
    """The modes recorded so far, sorted."""
    return sorted(self._values)

  def metrics_for_mode(self, mode):
    """The metric names recorded for `mode`, sorted."""
    if mode not in self._values:
      _log.info('Mode %s not found', mode)
      return []
    return sorted(self._values[mode])

  def truncate(self, last_step):
    """Drops every entry recorded after `last_step` (used when resuming)."""
    for metrics in self._values.values():
      for name in list(metrics):
        metrics[name] = [(s, v) for s, v in metrics[name] if s <= last_step]

  def __eq__(self, other):
    return isinstance(other, History) and self.to_dict() == other.to_dict()

  def __str__(self):
    return str({m: dict(v) for m, v in self._values.items()})
