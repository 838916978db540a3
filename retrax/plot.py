"""Plots a training run's metrics (`output_dir/metrics.jsonl`) to a PNG.

    from retrax import plot
    plot.plot_metrics('~/train_dir')          # -> '~/train_dir/metrics.png'

Needs matplotlib (`pip install retrax[plots]`).
"""

import collections
import math
import os

from retrax.checkpoints.atomic import atomic_write
from retrax.supervised import metrics_log


def _pyplot():
  try:
    import matplotlib
  except ImportError:
    raise ImportError(
        'retrax.plot needs matplotlib: pip install matplotlib (or '
        'retrax[plots]).') from None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  return plt


def load_metrics(output_dir):
  """`{metric: {mode: ([steps], [values])}}` from a run's metrics.jsonl."""
  path = os.path.join(os.path.expanduser(os.fspath(output_dir)),
                      metrics_log.METRICS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{path} does not exist; is {output_dir} the output_dir of a '
        'training run?')
  series = collections.defaultdict(lambda: collections.defaultdict(
      lambda: ([], [])))
  for record in metrics_log.read_jsonl(path):
    steps, values = series[record['metric']][record['mode']]
    steps.append(record['step'])
    values.append(record['value'])
  return {metric: dict(modes) for metric, modes in series.items()}


def plot_metrics(output_dir, out_png=None, metrics=None):
  """Draws one panel per metric (a line per mode: train, eval) into a PNG.

  Args:
    output_dir: the run's output directory (holding metrics.jsonl).
    out_png: where to write the image; default `<output_dir>/metrics.png`.
    metrics: names of the metrics to draw (e.g. `['metrics/Accuracy']`);
      default all, `metrics/*` first.

  Returns:
    The path of the PNG.

  Raises:
    FileNotFoundError: no metrics.jsonl in `output_dir`.
    ValueError: no metrics recorded, or an unknown name in `metrics`.
  """
  series = load_metrics(output_dir)
  if metrics is None:
    metrics = sorted(series, key=lambda m: (not m.startswith('metrics/'), m))
  unknown = [m for m in metrics if m not in series]
  if unknown or not metrics:
    raise ValueError(
        f'No data for metrics {unknown or "(none recorded)"}; the run has '
        f'{sorted(series)}.')
  plt = _pyplot()
  n_cols = min(3, len(metrics))
  n_rows = math.ceil(len(metrics) / n_cols)
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.5 * n_cols, 3.2 * n_rows),
                           squeeze=False)
  for ax, metric in zip(axes.flat, metrics):
    for mode, (steps, values) in sorted(series[metric].items()):
      ax.plot(steps, values, marker='.', label=mode)
    ax.set_title(metric)
    ax.set_xlabel('step')
    ax.legend()
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(metrics):]:
    ax.axis('off')
  fig.tight_layout()
  if out_png is None:
    out_png = os.path.join(os.path.expanduser(os.fspath(output_dir)),
                           'metrics.png')
  try:  # Atomically: a full or read-only disk leaves no partial PNG.
    with atomic_write(out_png) as f:
      fig.savefig(f, format='png', dpi=100)
  finally:
    plt.close(fig)
  return out_png
