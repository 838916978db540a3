"""The console progress: terminal-only bar, compile notice, one rate, ETA, recompile warning."""

import io
import subprocess
import sys
import warnings

import numpy as np
import pytest

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


def test_no_bar_when_stderr_is_not_a_terminal(monkeypatch, capsys):
  monkeypatch.setattr(sys, 'stderr', io.StringIO())
  p = progress.Progress(1000)  # Auto: stderr is a StringIO, not a TTY.
  for _ in range(5):
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
  p._bar.refresh()
  text = term.getvalue()
  p.close()
  last = text.split('\r')[-1]
  assert '10.0 steps/s' in last and '320 tokens/s' in last
  assert 'ETA 00:05' in last and 'loss 2.5000' in last
  assert last.count('/s') == 2  # One step rate (and the token rate), no tqdm rate.


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
