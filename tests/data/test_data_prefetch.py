"""Prefetch: order, read-ahead bound, error propagation, no hang on close."""

import os
import subprocess
import sys
import threading
import time

import pytest

from retrax import data

_TIMEOUT_S = 10.0


def _run_with_timeout(fn):
  """Runs fn() in a thread; fails the test (instead of hanging) on timeout."""
  result = {}

  def target():
    try:
      result['value'] = fn()
    except BaseException as e:
      result['error'] = e

  t = threading.Thread(target=target, daemon=True)
  t.start()
  t.join(_TIMEOUT_S)
  assert not t.is_alive(), f'timed out after {_TIMEOUT_S} s (hang)'
  if 'error' in result:
    raise result['error']
  return result['value']


def _prefetch_threads():
  return [t for t in threading.enumerate()
          if t.name == 'retrax-data-prefetch' and t.is_alive()]


def _wait_for_no_prefetch_threads():
  deadline = time.monotonic() + _TIMEOUT_S
  while _prefetch_threads() and time.monotonic() < deadline:
    time.sleep(0.01)
  return not _prefetch_threads()


def test_prefetch_keeps_order_and_ends():
  out = _run_with_timeout(lambda: list(data.Prefetch(3)(iter(range(100)))))
  assert out == list(range(100))
  assert _wait_for_no_prefetch_threads()


def test_prefetch_in_serial_with_batch():
  pipeline = data.Serial(lambda _: ((i, i) for i in range(10)), data.Batch(4),
                         data.Prefetch())
  out = _run_with_timeout(lambda: list(pipeline()))
  assert [b[0].tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_prefetch_reads_at_most_n_ahead():
  produced = []

  def source():
    for i in range(100):
      produced.append(i)
      yield i

  gen = data.Prefetch(n_prefetch=2)(source())
  assert _run_with_timeout(lambda: next(gen)) == 0
  time.sleep(0.3)
  # 1 consumed + 2 queued + at most 1 held by the blocked producer.
  assert len(produced) <= 4
  gen.close()
  assert _wait_for_no_prefetch_threads()


def test_prefetch_reraises_producer_errors():
  def source():
    yield 1
    yield 2
    raise KeyError('bad example')

  gen = data.Prefetch(1)(source())

  def consume():
    seen = []
    with pytest.raises(KeyError, match='bad example') as info:
      for x in gen:
        seen.append(x)
    return seen, info.value

  seen, error = _run_with_timeout(consume)
  assert seen == [1, 2]
  assert any('Prefetch' in note for note in getattr(error, '__notes__', []))


def test_prefetch_error_before_first_example():
  def source():
    raise ValueError('cannot open')
    yield

  with pytest.raises(ValueError, match='cannot open'):
    _run_with_timeout(lambda: next(data.Prefetch()(source())))


def test_closing_early_stops_the_producer_and_closes_the_source():
  closed = threading.Event()

  def endless():
    try:
      i = 0
      while True:
        yield i
        i += 1
    finally:
      closed.set()

  gen = data.Prefetch(2)(endless())
  assert _run_with_timeout(lambda: [next(gen) for _ in range(5)]) == list(
      range(5))
  gen.close()
  assert closed.wait(_TIMEOUT_S)
  assert _wait_for_no_prefetch_threads()


def test_dropping_the_consumer_stops_the_producer():
  def endless():
    while True:
      yield 0

  def consume_and_drop():
    gen = data.Prefetch(4)(endless())
    next(gen)
    del gen

  _run_with_timeout(consume_and_drop)
  assert _wait_for_no_prefetch_threads()


_EXIT_SCRIPT = """
import threading
from retrax import data

def blocked_source():
  yield 1
  threading.Event().wait()  # Blocks forever, like a stuck reader.
  yield 2

gen = data.Prefetch(2)(blocked_source())
assert next(gen) == 1
endless = data.Prefetch(2)(iter(int, 1))  # An infinite stream of zeros.
assert next(endless) == 0
print('done', flush=True)
# Exit without closing either generator.
"""


def test_interpreter_exits_with_prefetch_threads_still_running():
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep +
             os.environ.get('PYTHONPATH', ''))
  result = subprocess.run([sys.executable, '-c', _EXIT_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == 'done'


def test_prefetch_bad_size():
  with pytest.raises(ValueError, match='n_prefetch'):
    data.Prefetch(0)
