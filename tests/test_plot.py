"""`retrax plot`: log-scale losses, run names in the title, runs compared, no matplotlib."""

import os
import subprocess
import sys

import pytest

from retrax.app import cli
from retrax.app import plot
from retrax.supervised import metrics_log


def _run(path, scale=1.0, steps=(1, 10, 20)):
  """A run directory with train/eval loss and accuracy in metrics.jsonl."""
  path.mkdir(parents=True)
  writer = metrics_log.JsonlWriter(str(path / 'metrics.jsonl'))
  for step in steps:
    writer.write(step, 'train', 'metrics/CrossEntropyLoss', scale / step)
    writer.write(step, 'eval', 'metrics/CrossEntropyLoss', 1.2 * scale / step)
    writer.write(step, 'eval', 'metrics/Accuracy', 1 - 1 / (step + 1))
    writer.write(step, 'train', 'training/learning_rate', 0.0)
  writer.close()
  return path


@pytest.fixture
def pyplot():
  pytest.importorskip('matplotlib')
  import matplotlib.pyplot as plt
  return plt


def _panels(fig):
  return {ax.get_title(): ax for ax in fig.axes if ax.get_title()}


def test_one_run_losses_log_scale_and_its_name_in_the_title(tmp_path, pyplot):
  run = _run(tmp_path / 'reformer-lsh')
  fig = plot.make_figure(run)
  try:
    panels = _panels(fig)
    assert fig.get_suptitle() == 'reformer-lsh'
    assert list(panels) == ['metrics/Accuracy', 'metrics/CrossEntropyLoss',
                            'training/learning_rate']
    assert panels['metrics/CrossEntropyLoss'].get_yscale() == 'log'
    assert panels['metrics/Accuracy'].get_yscale() == 'linear'
    # A zero value cannot go on a log axis: linear even for a loss-like name.
    assert panels['training/learning_rate'].get_yscale() == 'linear'
    lines = {l.get_label(): l for l in panels['metrics/CrossEntropyLoss'].lines}
    assert sorted(lines) == ['eval', 'train']
    assert list(lines['train'].get_xdata()) == [1, 10, 20]
    assert list(lines['eval'].get_ydata()) == pytest.approx([1.2, 0.12, 0.06])
  finally:
    pyplot.close(fig)
  linear = plot.make_figure(run, log_loss=False)
  assert _panels(linear)['metrics/CrossEntropyLoss'].get_yscale() == 'linear'
  pyplot.close(linear)


def test_runs_compared_in_one_figure(tmp_path, pyplot):
  a = _run(tmp_path / 'a', scale=1.0)
  b = _run(tmp_path / 'b', scale=3.0, steps=(1, 5))
  fig = plot.make_figure([a, b], metrics=['metrics/CrossEntropyLoss'])
  try:
    assert fig.get_suptitle() == 'a vs b'
    (ax,) = _panels(fig).values()
    lines = {l.get_label(): l for l in ax.lines}
    assert sorted(lines) == ['a eval', 'a train', 'b eval', 'b train']
    assert list(lines['b train'].get_ydata()) == pytest.approx([3.0, 0.6])
    # A colour per run, a line style per mode.
    assert lines['a train'].get_color() == lines['a eval'].get_color()
    assert lines['a train'].get_color() != lines['b train'].get_color()
    assert lines['b train'].get_linestyle() == '-'
    assert lines['b eval'].get_linestyle() == '--'
  finally:
    pyplot.close(fig)
  # Same directory names: each run is named by its path instead.
  c = _run(tmp_path / 'other' / 'a')
  assert plot.run_names([a, c]) == [os.path.normpath(a), os.path.normpath(c)]


def test_cli_plots_several_runs(tmp_path, pyplot, capsys, monkeypatch):
  a, b = _run(tmp_path / 'a'), _run(tmp_path / 'b', scale=2.0)
  monkeypatch.chdir(tmp_path)
  assert cli.main(['plot', str(a), str(b)]) == 0
  png = capsys.readouterr().out.strip()
  assert png == str(tmp_path / 'a_vs_b.png')
  with open(png, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert cli.main(['plot', str(a), '--linear', '--out',
                   str(tmp_path / 'x.png')]) == 0
  assert os.path.exists(tmp_path / 'x.png')


def test_without_matplotlib_one_line_naming_the_fix(tmp_path):
  run = _run(tmp_path / 'r')
  code = ('import sys; sys.modules["matplotlib"] = None\n'  # Not installed.
          'from retrax.app import cli\n'
          f'sys.exit(cli.main(["plot", {str(run)!r}]))\n')
  proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.count('\n') == 1, proc.stderr
  assert proc.stderr.startswith('retrax plot: error: retrax plot needs the '
                                'matplotlib package')
  assert 'pip install "retrax[plots]"' in proc.stderr
  assert not os.path.exists(run / 'metrics.png')
