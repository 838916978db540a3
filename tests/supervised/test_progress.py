"""Progress: the terminal bar, notebooks (a fake kernel), timed lines elsewhere, one rate, ETA."""

import importlib.machinery
import io
import re
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import tqdm

from retrax.supervised import progress


class _Terminal(io.StringIO):

  def isatty(self):
    return True


class _Clock:

  def __init__(self):
    self.now = 1000.0

  def __call__(self):
    return self.now


@pytest.fixture
def clock(monkeypatch):
  c = _Clock()
  monkeypatch.setattr(progress.time, 'time', c)
  return c


def _batch(length=8):
  x = np.zeros((4, length), np.int32)
  return (x, x)


def test_off_a_terminal_a_line_every_interval_and_none_for_short_runs(
    monkeypatch, clock):
  log = io.StringIO()  # A redirected stderr: no TTY, no notebook.
  monkeypatch.setattr(sys, 'stderr', log)
  p = progress.Progress(1000, initial=200, line_interval=30.0)
  assert p.display == 'lines'
  for _ in range(5):  # 0.5 s of steps (the first one compiled): no line yet.
    clock.now += 0.1
    p.update(_batch(), 1.0)
  assert log.getvalue() == ''
  clock.now += 2.0  # Step 206, 2.6 s in.
  for _ in range(25):  # Steps at 10/s until 30 s after the start.
    clock.now += 0.1
    p.update(_batch(), 2.5)
  assert log.getvalue() == ''
  clock.now = 1000.0 + 30.0
  p.update(_batch(), 2.5)
  lines = log.getvalue().splitlines()
  # The rate counts from step 2 (1000.2 s; step 1 compiled): 29 steps since.
  rate = 29 / 29.8
  eta = round((1000 - 31) / rate)
  assert lines == [f'training: step 231/1200 (19%) [00:30, {rate:.1f} steps/s, '
                   f'{rate * 32:.0f} tokens/s, ETA {eta // 60:02d}:'
                   f'{eta % 60:02d}, loss 2.5000]']
  clock.now += 29.0
  p.update(_batch(), 2.5)
  assert len(log.getvalue().splitlines()) == 1  # The next comes 30 s later.
  clock.now += 1.0
  p.update(_batch(), 2.5)
  assert len(log.getvalue().splitlines()) == 2
  p.close()


def test_short_run_on_a_terminal_draws_nothing(monkeypatch):
  monkeypatch.setattr(sys, 'stderr', _Terminal())
  p = progress.Progress(10)
  assert p.display is None
  p.update(_batch(), 1.0)
  p.close()
  assert sys.stderr.getvalue() == ''


def test_bar_says_compiling_then_one_rate_and_an_eta_without_compile_time(
    monkeypatch, clock):
  term = _Terminal()
  monkeypatch.setattr(sys, 'stderr', term)
  p = progress.Progress(101)
  assert 'compiling' in term.getvalue()  # Drawn before any step returned.
  clock.now += 60.0  # The first step compiles for a minute ...
  p.update(_batch(), None)
  assert p.rate() is None and p.eta() is None
  for _ in range(50):  # ... then 10 steps/s.
    clock.now += 0.1
    p.update(_batch(), 2.5)
  assert p.rate() == pytest.approx(10.0)
  assert p.eta() == pytest.approx(5.0)  # 50 steps left at 10/s: no 60 s in it.
  p._display._bar.refresh()  # tqdm redraws on its own (real) clock.
  text = term.getvalue()
  p.close()
  last = text.split('\r')[-1]
  # One separator after tqdm's elapsed time (tqdm puts it before the
  # postfix), one step rate (and the token rate), no tqdm rate.
  assert re.search(r'\| 51/101 \[\d\d:\d\d, 10\.0 steps/s, 320 tokens/s, '
                   r'ETA 00:05, loss 2\.5000\]', last), last
  assert ', ,' not in text


def test_subprocess_with_redirected_stderr_draws_no_bar(tmp_path):
  code = ('from retrax.supervised import progress\n'
          'p = progress.Progress(500)\n'
          'for _ in range(500): p.update(10)\n'
          'p.close()\n')
  log = tmp_path / 'err.log'
  with open(log, 'w') as f:
    subprocess.run([sys.executable, '-c', code], stderr=f, check=True)
  assert log.read_text() == ''


def test_many_batch_shapes_warn_once():
  p = progress.Progress(100, enabled=False)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    for length in range(1, progress.RECOMPILE_WARN_SHAPES + 1):
      p.update(_batch(length))
      p.update(_batch(length))  # A repeated shape compiles nothing new.
    assert not caught
    for length in range(100, 110):
      p.update(_batch(length))
  assert len(caught) == 1 and issubclass(caught[0].category,
                                         progress.RecompileWarning)
  assert f'{progress.RECOMPILE_WARN_SHAPES + 1} distinct batch shapes' in str(
      caught[0].message)


# --- notebooks: a fake Jupyter kernel --------------------------------------------


class _Shell:
  """IPython's shell as `get_ipython()` returns it (`kernel`: a notebook's)."""

  def __init__(self, kernel):
    self.kernel = kernel


class _Handle:
  """IPython's `DisplayHandle`: what one output area shows."""

  def __init__(self, shown):
    self.shown = shown

  def update(self, obj, raw=False):
    assert raw
    self.shown.append(obj)


def _fake_ipython(monkeypatch, kernel):
  """Installs a fake `IPython` (and `IPython.display`); returns what it displays."""
  shown = []

  def display(obj, raw=False, display_id=None):
    shown.append(obj)
    return _Handle(shown) if display_id else None

  ipython = types.ModuleType('IPython')
  ipython.get_ipython = lambda: _Shell(kernel)
  ipython_display = types.ModuleType('IPython.display')
  ipython_display.display = display
  ipython.display = ipython_display
  monkeypatch.setitem(sys.modules, 'IPython', ipython)
  monkeypatch.setitem(sys.modules, 'IPython.display', ipython_display)
  return shown


def _run_ten_steps(clock, p):
  clock.now += 50.0  # Step 1 compiles.
  p.update(_batch(), None)
  for _ in range(9):
    clock.now += 0.5
    p.update(_batch(), 1.5)


def test_notebook_without_ipywidgets_shows_html_updated_in_place(
    monkeypatch, clock, capsys):
  shown = _fake_ipython(monkeypatch, kernel=object())
  monkeypatch.setitem(sys.modules, 'ipywidgets', None)  # Not installed.
  p = progress.Progress(10)  # A short run: a notebook shows it all the same.
  assert p.display == 'html'
  assert shown[0]['text/plain'] == 'compiling: step 0/10 (0%) [00:00]'
  assert '<progress value="0" max="10"' in shown[0]['text/html']
  _run_ten_steps(clock, p)
  p.write('Step 10: eval')
  last = shown[-1]
  assert last['text/plain'] == ('training: step 10/10 (100%) [00:54, '
                                '2.0 steps/s, 64 tokens/s, ETA 00:00, '
                                'loss 1.5000]')
  assert last['text/html'].startswith('<progress value="10" max="10"')
  assert '<code>training: step 10/10' in last['text/html']
  assert len(shown) < 12  # Throttled: not one update per step.
  p.close()
  assert shown[-1] == {'text/plain': ''}  # Cleared, as tqdm's bar.
  assert capsys.readouterr().out == 'Step 10: eval\n'


class _Widget:
  """An ipywidgets widget, as far as tqdm.notebook uses them."""

  def __init__(self, children=(), **kwargs):
    self.children = list(children)
    self.value = 0 if 'max' in kwargs else ''
    self.bar_style = ''
    self.layout = types.SimpleNamespace()
    self.style = types.SimpleNamespace()
    self.__dict__.update(kwargs)
    self.closed = False

  def close(self):
    self.closed = True


@pytest.fixture
def fresh_tqdm_notebook(monkeypatch):
  """tqdm.notebook imported anew (bound to the fakes), then forgotten."""
  monkeypatch.delitem(sys.modules, 'tqdm.notebook', raising=False)
  monkeypatch.delattr(tqdm, 'notebook', raising=False)
  yield
  sys.modules.pop('tqdm.notebook', None)
  if hasattr(tqdm, 'notebook'):
    delattr(tqdm, 'notebook')


def test_notebook_with_ipywidgets_uses_tqdms_widget(
    monkeypatch, clock, fresh_tqdm_notebook):
  shown = _fake_ipython(monkeypatch, kernel=object())
  ipywidgets = types.ModuleType('ipywidgets')
  ipywidgets.__spec__ = importlib.machinery.ModuleSpec('ipywidgets', None)
  for name in ('FloatProgress', 'HBox', 'HTML'):
    setattr(ipywidgets, name, type(name, (_Widget,), {}))
  monkeypatch.setitem(sys.modules, 'ipywidgets', ipywidgets)
  p = progress.Progress(10, initial=5)
  assert p.display == 'notebook'
  container = shown[0]  # tqdm's HBox of (description, bar, numbers).
  ltext, bar, rtext = container.children
  assert bar.max == 15 and bar.value == 5
  _run_ten_steps(clock, p)
  p._display._bar.refresh()  # tqdm redraws on its own (real) clock.
  assert bar.value == 15
  assert ltext.value.startswith('training:')
  numbers = rtext.value.replace('\u2007', ' ').strip()  # tqdm's HTML spaces.
  assert re.fullmatch(r'15/15 \[\d\d:\d\d, 2\.0 steps/s, 64 tokens/s, '
                      r'ETA 00:00, loss 1\.5000\]', numbers), numbers
  p.close()
  assert container.closed  # leave=False: hidden at the end.


def test_terminal_ipython_is_not_a_notebook(monkeypatch):
  _fake_ipython(monkeypatch, kernel=None)
  monkeypatch.setattr(sys, 'stderr', _Terminal())
  p = progress.Progress(100)
  assert p.display == 'terminal'
  p.close()
  monkeypatch.setattr(sys, 'stderr', io.StringIO())
  assert progress.Progress(100).display == 'lines'
  assert progress.Progress(100, enabled=False).display is None
