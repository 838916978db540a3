"""Plots training runs' metrics (`output_dir/metrics.jsonl`) to a PNG.

    from retrax.app import plot
    plot.plot_metrics('~/train_dir')          # -> '~/train_dir/metrics.png'
    plot.plot_metrics(['runs/a', 'runs/b'])   # -> './a_vs_b.png', compared

One panel per metric, a line per run and mode (train, eval); losses on a
log scale (`log_loss=False`: linear); the run names in the title. The same
as `retrax plot RUN [RUN ...]`. Needs matplotlib (`pip install
"retrax[plots]"`).
"""

import collections
import math
import os

from retrax import run_layout
from retrax.checkpoints.atomic import atomic_write
from retrax.errors import missing_package
from retrax.supervised import metrics_log
from retrax.validation import ArgumentValueError

_LOSS_WORDS = ('loss', 'crossentropy', 'perplexity')
_MODE_STYLES = {'train': '-', 'eval': '--'}


def _pyplot():
  try:
    import matplotlib
  except ImportError:
    raise missing_package('matplotlib', 'retrax plot', 'plots') from None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  return plt


def load_metrics(output_dir):
  """`{metric: {mode: ([steps], [values])}}` from a run's metrics.jsonl."""
  path = os.path.join(os.path.expanduser(os.fspath(output_dir)),
                      run_layout.METRICS_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f'{path} does not exist: {output_dir} records no training (a run '
        'starts one when it trains; retrax convert writes none). Is it the '
        'output_dir of a training run?')
  # metric -> mode -> (steps, values)
  series: collections.defaultdict[
      str, collections.defaultdict[str, tuple[list, list]]] = collections.defaultdict(
          lambda: collections.defaultdict(lambda: ([], [])))
  for record in metrics_log.read_jsonl(path):
    steps, values = series[record['metric']][record['mode']]
    steps.append(record['step'])
    values.append(record['value'])
  return {metric: dict(modes) for metric, modes in series.items()}


def is_loss(metric):
  """Whether `metric` (e.g. 'metrics/CrossEntropyLoss') is a loss."""
  name = metric.rsplit('/', 1)[-1].lower()
  return any(word in name for word in _LOSS_WORDS)


def run_names(output_dirs):
  """Each run's name: its directory's name, or the path as given where two
  runs share one."""
  paths = [os.fspath(d) for d in output_dirs]
  names = [os.path.basename(os.path.normpath(os.path.expanduser(p)))
           for p in paths]
  return [n if names.count(n) == 1 else os.path.normpath(p)
          for n, p in zip(names, paths)]


def _choose_metrics(runs, metrics):
  """The metrics to draw: `metrics`, or all recorded (`metrics/*` first)."""
  recorded = sorted({m for series in runs.values() for m in series})
  if metrics is None:
    metrics = sorted(recorded, key=lambda m: (not m.startswith('metrics/'), m))
  unknown = [m for m in metrics if m not in recorded]
  if unknown or not metrics:
    raise ArgumentValueError(
        f'No data for metrics {unknown or "(none recorded)"}; the runs have '
        f'{recorded}.')
  return metrics


def _draw_panel(ax, metric, runs, log_loss):
  """One metric: a line per (run, mode); colour per run when comparing."""
  values = []
  for i, (name, series) in enumerate(runs.items()):
    for j, (mode, (steps, ys)) in enumerate(sorted(series.get(metric,
                                                              {}).items())):
      if len(runs) == 1:
        style = dict(color=f'C{j}', label=mode)
      else:
        style = dict(color=f'C{i}', label=f'{name} {mode}',
                     linestyle=_MODE_STYLES.get(mode, ':'))
      ax.plot(steps, ys, marker='.', markersize=3, **style)
      values.extend(ys)
  if log_loss and is_loss(metric) and values and min(values) > 0:
    ax.set_yscale('log')
  ax.set_title(metric)
  ax.set_xlabel('step')
  ax.legend(fontsize='small')
  ax.grid(alpha=0.3, which='both')


def _default_png(names, output_dirs):
  if len(names) == 1:
    return os.path.join(os.path.expanduser(os.fspath(output_dirs[0])),
                        'metrics.png')
  safe = ['_'.join(n.replace(os.sep, '_').split()) for n in names]
  return os.path.abspath('_vs_'.join(safe) + '.png')


def make_figure(output_dir, metrics=None, log_loss=True):
  """The matplotlib figure `plot_metrics` saves (same arguments); close it
  with `matplotlib.pyplot.close(fig)`."""
  output_dirs = (list(output_dir) if isinstance(output_dir, (list, tuple))
                 else [output_dir])
  names = run_names(output_dirs)
  runs = dict(zip(names, (load_metrics(d) for d in output_dirs)))
  metrics = _choose_metrics(runs, metrics)
  plt = _pyplot()
  n_cols = min(3, len(metrics))
  n_rows = math.ceil(len(metrics) / n_cols)
  fig, axes = plt.subplots(n_rows, n_cols, figsize=(4.5 * n_cols,
                                                    3.2 * n_rows + 0.4),
                           squeeze=False)
  for ax, metric in zip(axes.flat, metrics):
    _draw_panel(ax, metric, runs, log_loss)
  for ax in list(axes.flat)[len(metrics):]:
    ax.axis('off')
  fig.suptitle(' vs '.join(names))
  fig.tight_layout()
  return fig


def plot_metrics(output_dir, out_png=None, metrics=None, log_loss=True):
  """Draws one panel per metric (a line per run and mode) into a PNG.

  Args:
    output_dir: a run's output directory (holding metrics.jsonl), or a list
      of them to compare in one figure.
    out_png: where to write the image; default `<output_dir>/metrics.png`
      for one run, `./<run>_vs_<run>.png` for several.
    metrics: names of the metrics to draw (e.g. `['metrics/Accuracy']`);
      default all, `metrics/*` first.
    log_loss: draw losses (names holding Loss, CrossEntropy or Perplexity)
      on a log scale when all their values are positive.

  Returns:
    The path of the PNG.

  Raises:
    FileNotFoundError: no metrics.jsonl in a directory.
    ValueError: no metrics recorded, or an unknown name in `metrics`.
    MissingPackageError: matplotlib is not installed.
  """
  fig = make_figure(output_dir, metrics, log_loss)
  output_dirs = (list(output_dir) if isinstance(output_dir, (list, tuple))
                 else [output_dir])
  out_png = out_png or _default_png(run_names(output_dirs), output_dirs)
  plt = _pyplot()
  try:  # Atomically: a full or read-only disk leaves no partial PNG.
    with atomic_write(out_png) as f:
      fig.savefig(f, format='png', dpi=100)
  finally:
    plt.close(fig)
  return out_png
