"""`pytest --quick`: the tests that took under a second when the suite was last timed.

`tests/slow_tests.json` lists each test of the default suite that took
`QUICK_SECONDS` or more (setup, call and teardown) in a timed run on a CPU,
with its seconds. `--quick` leaves those out, so a contributor's edit-test
loop runs everything else (tests added since the file was written included)
in a fraction of the suite's time. `pytest --record-durations` times a run
and writes the list again (with `-n 2` too: the reports reach the
controlling process); tests that did not run keep their entries, so a part
of the suite can be timed at a time, and a test cut short by an interrupt
(a budget's SIGINT) is listed with the seconds it had run, at least.

An accelerator has its own list beside it (`slow_tests_tpu.json`): a TPU
compiles every program a test makes, eager ops included, and some tests
quick on a CPU take a minute there. Where the tests run on one (the root
conftest sets `RETRAX_TEST_BACKEND`), `--quick` leaves out the tests of
both lists and `--record-durations` writes the accelerator's.

`--shard K/N` keeps the K-th of N parts of what is selected (each test's
part fixed by a hash of its id, so adding tests moves no other): the quick
suite on a TPU chip may take more than one call of 10 minutes
(`TPU_SH_TEST_SHARD` in benchmarks/tpu.sh).
"""

import collections
import json
import os
import time
import zlib

import pytest

QUICK_SECONDS = 1.0
SLOW_TESTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'slow_tests.json')


def pytest_addoption(parser):
  group = parser.getgroup('retrax')
  group.addoption('--quick', action='store_true',
                  help=f'leave out the tests listed in --slow-tests-file '
                  f'(those that took {QUICK_SECONDS:g} s or more), and on an '
                  f'accelerator those of its own list beside it')
  group.addoption('--record-durations', action='store_true',
                  help='time this run and update --slow-tests-file (on an '
                  'accelerator, its own list beside it) from it')
  group.addoption('--slow-tests-file', default=SLOW_TESTS_FILE,
                  help='the slow tests file (default tests/slow_tests.json)')
  group.addoption('--shard', default=None, metavar='K/N',
                  help='run only the K-th of N parts of the selected tests '
                  '(parts fixed by a hash of each test id)')


def parse_shard(text):
  """`'K/N'` as `(K, N)` with 1 <= K <= N; a one-line error otherwise."""
  import pytest
  try:
    k, n = (int(v) for v in text.split('/'))
  except ValueError:
    k = n = 0
  if not 1 <= k <= n:
    raise pytest.UsageError(f'--shard: expected K/N with 1 <= K <= N, e.g. '
                            f'2/4; got {text!r}.')
  return k, n


def shard_of(nodeid, n):
  """The part (1..n) test `nodeid` belongs to."""
  return zlib.crc32(nodeid.encode()) % n + 1


def backend():
  """The backend the tests run on: the root conftest's `RETRAX_TEST_BACKEND`."""
  return os.environ.get('RETRAX_TEST_BACKEND', 'cpu')


def backend_file(path, name):
  """The slow tests file of backend `name` beside the CPU's `path`."""
  if name == 'cpu':
    return path
  stem, ext = os.path.splitext(path)
  return f'{stem}_{name}{ext}'


def read_slow_tests(path):
  """`{test id: seconds}` of the tests `path` lists as slow ({} if none)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)['tests']


def write_slow_tests(path, durations, root, at_least=None):
  """Updates `path` with the tests `durations` timed.

  Those that took `QUICK_SECONDS` or more are listed with their seconds,
  those under it taken out; tests `durations` lacks keep their entries
  unless their file (relative to `root`, the tests' rootdir) is gone: a
  part of the suite can be timed at a time. `at_least`: `{test: seconds}`
  of tests cut short, each listed with the larger of those seconds and its
  entry's, once they reach `QUICK_SECONDS`.
  """
  kept = {test: seconds for test, seconds in read_slow_tests(path).items()
          if test not in durations
          and os.path.exists(os.path.join(root, test.split('::')[0]))}
  kept.update((test, round(seconds, 2)) for test, seconds in durations.items()
              if seconds >= QUICK_SECONDS)
  for test, seconds in (at_least or {}).items():
    if seconds >= QUICK_SECONDS:
      kept[test] = max(kept.get(test, 0), round(seconds, 2))
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump({'quick_seconds': QUICK_SECONDS, 'tests': dict(sorted(
        kept.items()))}, f, indent=0)
    f.write('\n')
  os.replace(tmp, path)  # Never a half-written file.


class _Recorder:
  """Sums each finished test's setup, call and teardown seconds; writes them.

  A module-, class- or session-scoped fixture's setup is left out: pytest
  counts it in the setup of whichever test first asks for it, and charging
  that test would move the fixture's cost on to the next one each time the
  slow one is left out (on the chip, a module's 20 s fixture walked through
  one parametrized test's cases, one per recorded run).
  """

  def __init__(self, path, root):
    self.path = path
    self.root = root
    self.durations = collections.defaultdict(float)
    self.started = {}
    self.finished = set()
    self.shared_setup = collections.defaultdict(float)
    self.current = None

  def pytest_runtest_logstart(self, nodeid):
    self.started[nodeid] = time.monotonic()
    self.current = nodeid

  @pytest.hookimpl(hookwrapper=True)
  def pytest_fixture_setup(self, fixturedef):
    start = time.monotonic()
    yield
    if fixturedef.scope != 'function' and self.current is not None:
      self.shared_setup[self.current] += time.monotonic() - start

  def pytest_runtest_logreport(self, report):
    seconds = report.duration
    if report.when == 'setup':
      seconds = max(0.0, seconds - self.shared_setup.pop(report.nodeid, 0.0))
    self.durations[report.nodeid] += seconds
    if report.when == 'teardown':
      self.finished.add(report.nodeid)

  def pytest_sessionfinish(self, exitstatus):
    # 2: interrupted (a budget's SIGINT on a chip): the tests that finished
    # were timed all the same; one cut short is listed with the seconds it
    # had run, so that the next `--quick` run there does not spend its
    # budget on it again (on a TPU a test renamed since its timing once
    # compiled for 170 s before the budget stopped it).
    if exitstatus in (0, 1, 2):
      now = time.monotonic()
      write_slow_tests(
          backend_file(self.path, backend()),
          {test: self.durations[test] for test in self.finished}, self.root,
          at_least={test: now - start for test, start in self.started.items()
                    if test not in self.finished})


def pytest_configure(config):
  # With xdist only the controlling process records: the workers' reports
  # reach it.
  if config.getoption('record_durations') and not hasattr(config,
                                                          'workerinput'):
    config.pluginmanager.register(
        _Recorder(config.getoption('slow_tests_file'), str(config.rootpath)),
        'retrax-durations')


def pytest_collection_modifyitems(config, items):
  slow = {}
  if config.getoption('quick'):
    path = config.getoption('slow_tests_file')
    slow = read_slow_tests(path)
    if backend() != 'cpu':  # Slow on the CPU or on this backend.
      slow.update(read_slow_tests(backend_file(path, backend())))
  shard = config.getoption('shard')
  k, n = parse_shard(shard) if shard else (1, 1)
  keep = [item for item in items
          if item.nodeid not in slow and shard_of(item.nodeid, n) == k]
  if len(keep) < len(items):
    kept = set(map(id, keep))
    config.hook.pytest_deselected(
        items=[item for item in items if id(item) not in kept])
    items[:] = keep
