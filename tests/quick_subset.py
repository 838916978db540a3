"""`pytest --quick`: the tests that took under a second when the suite was last timed.

`tests/slow_tests.json` lists each test of the default suite that took
`QUICK_SECONDS` or more (setup, call and teardown) in a full run, with its
seconds. `--quick` leaves those out, so a contributor's edit-test loop runs
everything else (tests added since the file was written included) in a
fraction of the suite's time. `pytest --record-durations` times a full run
and writes the file again (with `-n 2` too: the reports reach the
controlling process).

`--shard K/N` keeps the K-th of N parts of what is selected (each test's
part fixed by a hash of its id, so adding tests moves no other): a TPU
chip compiles every test's programs, and the quick suite there takes
several calls of 10 minutes (`TPU_SH_TEST_SHARD` in benchmarks/tpu.sh).
"""

import collections
import json
import os
import zlib

QUICK_SECONDS = 1.0
SLOW_TESTS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                               'slow_tests.json')


def pytest_addoption(parser):
  group = parser.getgroup('retrax')
  group.addoption('--quick', action='store_true',
                  help=f'leave out the tests listed in --slow-tests-file '
                  f'(those that took {QUICK_SECONDS:g} s or more)')
  group.addoption('--record-durations', action='store_true',
                  help='time this run and write --slow-tests-file from it')
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


def read_slow_tests(path):
  """`{test id: seconds}` of the tests `path` lists as slow ({} if none)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)['tests']


def write_slow_tests(path, durations):
  """Writes the tests of `durations` that took `QUICK_SECONDS` or more."""
  slow = {test: round(seconds, 2) for test, seconds in sorted(
      durations.items()) if seconds >= QUICK_SECONDS}
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump({'quick_seconds': QUICK_SECONDS, 'tests': slow}, f, indent=0)
    f.write('\n')
  os.replace(tmp, path)  # Never a half-written file.


class _Recorder:
  """Sums each test's setup, call and teardown seconds; writes them at the end."""

  def __init__(self, path):
    self.path = path
    self.durations = collections.defaultdict(float)

  def pytest_runtest_logreport(self, report):
    self.durations[report.nodeid] += report.duration

  def pytest_sessionfinish(self, exitstatus):
    if exitstatus in (0, 1):  # The run finished (tests failing or not).
      write_slow_tests(self.path, self.durations)


def pytest_configure(config):
  # With xdist only the controlling process records: the workers' reports
  # reach it.
  if config.getoption('record_durations') and not hasattr(config,
                                                          'workerinput'):
    config.pluginmanager.register(
        _Recorder(config.getoption('slow_tests_file')), 'retrax-durations')


def pytest_collection_modifyitems(config, items):
  slow = (read_slow_tests(config.getoption('slow_tests_file'))
          if config.getoption('quick') else {})
  shard = config.getoption('shard')
  k, n = parse_shard(shard) if shard else (1, 1)
  keep = [item for item in items
          if item.nodeid not in slow and shard_of(item.nodeid, n) == k]
  if len(keep) < len(items):
    kept = set(map(id, keep))
    config.hook.pytest_deselected(
        items=[item for item in items if id(item) not in kept])
    items[:] = keep
