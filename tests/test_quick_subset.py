"""`pytest --quick` leaves out the tests a timed run found slow, and keeps
the rest, including tests written since (tests/quick_subset.py)."""

import json
import os
import subprocess
import sys

import pytest

from tests import quick_subset

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A child pytest with only the plugin under test (no xdist: `-p no:xdist`, not
# `-n 0`, which a machine without xdist, the chip's, rejects).
_PYTEST = [sys.executable, '-m', 'pytest', '-p', 'tests.quick_subset', '-p',
           'no:randomly', '-p', 'no:xdist']
_TESTS = '''
import time

def test_fast():
  pass

def test_slow():
  time.sleep({sleep})
'''


def _pytest(tmp_path, *args, backend=None, returncode=0):
  (tmp_path / 'pytest.ini').write_text('[pytest]\n')  # Not the repo's.
  env = dict(os.environ, PYTHONPATH=_REPO)
  # On a chip the tests' children inherit RETRAX_TEST_BACKEND=tpu.
  env.pop('RETRAX_TEST_BACKEND', None)
  if backend:
    env['RETRAX_TEST_BACKEND'] = backend
  proc = subprocess.run(
      [*_PYTEST, '-p', 'no:cacheprovider', '-v',
       '--slow-tests-file', str(tmp_path / 'slow.json'), *args],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == returncode, proc.stdout + proc.stderr
  return proc.stdout


def _slow(path):
  return json.loads(path.read_text())['tests']


def test_recorded_slow_tests_are_left_out_and_new_ones_kept(tmp_path):
  (tmp_path / 'test_a.py').write_text(_TESTS.format(
      sleep=quick_subset.QUICK_SECONDS + 0.2))
  _pytest(tmp_path, '--record-durations')
  slow = json.loads((tmp_path / 'slow.json').read_text())['tests']
  assert list(slow) == ['test_a.py::test_slow']
  assert slow['test_a.py::test_slow'] >= quick_subset.QUICK_SECONDS
  (tmp_path / 'test_b.py').write_text('def test_new():\n  pass\n')
  out = _pytest(tmp_path, '--quick')
  assert 'test_a.py::test_fast PASSED' in out
  assert 'test_b.py::test_new PASSED' in out
  assert 'test_slow' not in out and '1 deselected' in out
  assert 'test_slow PASSED' in _pytest(tmp_path)  # Without --quick: all.


def test_a_shared_fixture_s_setup_is_charged_to_no_test(tmp_path):
  # A module's slow fixture is not the first test's own time: otherwise,
  # left out, its cost would pass to the next test at each recording.
  slow = quick_subset.QUICK_SECONDS + 0.2
  (tmp_path / 'test_m.py').write_text(
      'import time\nimport pytest\n\n'
      '@pytest.fixture(scope="module")\ndef shared():\n'
      f'  time.sleep({slow})\n\n'
      '@pytest.fixture\ndef own():\n'
      f'  time.sleep({slow})\n\n'
      '@pytest.mark.parametrize("i", [0, 1])\n'
      'def test_uses_it(shared, i):\n  pass\n\n'
      'def test_own_fixture(shared, own):\n  pass\n')
  _pytest(tmp_path, '--record-durations')
  # The function-scoped fixture stays its test's own time.
  assert list(_slow(tmp_path / 'slow.json')) == ['test_m.py::test_own_fixture']


def test_recording_updates_the_tests_it_timed_and_keeps_the_others(tmp_path):
  slow = quick_subset.QUICK_SECONDS + 0.2
  (tmp_path / 'test_a.py').write_text(_TESTS.format(sleep=slow))
  (tmp_path / 'slow.json').write_text(json.dumps({'tests': {
      'test_a.py::test_fast': 5.0,     # timed again: now under a second
      'test_b.py::test_other': 3.0,    # not run this time: kept
      'test_gone.py::test_x': 2.0}}))  # its file is gone: dropped
  (tmp_path / 'test_b.py').write_text('def test_other():\n  pass\n')
  _pytest(tmp_path, 'test_a.py', '--record-durations')
  got = _slow(tmp_path / 'slow.json')
  assert sorted(got) == ['test_a.py::test_slow', 'test_b.py::test_other']
  assert got['test_b.py::test_other'] == 3.0 and got['test_a.py::test_slow'] >= slow


def test_an_accelerator_keeps_its_own_list_beside_the_cpus(tmp_path):
  (tmp_path / 'test_a.py').write_text(_TESTS.format(
      sleep=quick_subset.QUICK_SECONDS + 0.2) + 'def test_cpu_slow():\n  pass\n')
  (tmp_path / 'slow.json').write_text(json.dumps({'tests': {
      'test_a.py::test_cpu_slow': 4.0}}))
  _pytest(tmp_path, '--record-durations', backend='tpu')
  assert list(_slow(tmp_path / 'slow_tpu.json')) == ['test_a.py::test_slow']
  assert list(_slow(tmp_path / 'slow.json')) == ['test_a.py::test_cpu_slow']
  out = _pytest(tmp_path, '--quick', backend='tpu')  # Leaves out both lists.
  assert 'test_fast PASSED' in out and '2 deselected' in out
  out = _pytest(tmp_path, '--quick')  # On a CPU: the CPU's list alone.
  assert 'test_slow PASSED' in out and '1 deselected' in out


@pytest.mark.parametrize('listed', [None, 9.0])
def test_an_interrupted_run_records_the_tests_that_finished(tmp_path, listed):
  # The test cut short is listed with the seconds it had run, or with its
  # entry's where that is more.
  (tmp_path / 'test_a.py').write_text(_TESTS.format(
      sleep=quick_subset.QUICK_SECONDS + 0.2) + (
          'def test_z_cut_short():\n  time.sleep(1.5)\n'
          '  raise KeyboardInterrupt\n'))
  (tmp_path / 'slow.json').write_text(json.dumps({'tests': {
      'test_a.py::test_z_cut_short': listed} if listed else {}}))
  _pytest(tmp_path, '--record-durations', returncode=2)
  got = _slow(tmp_path / 'slow.json')
  assert sorted(got) == ['test_a.py::test_slow', 'test_a.py::test_z_cut_short']
  # Seconds a test ran, at least its sleep; a busy machine (the chip's
  # host, starting the child) adds to them, never takes away.
  assert 0 <= got['test_a.py::test_slow'] - (quick_subset.QUICK_SECONDS + 0.2) < 5
  if listed:
    assert got['test_a.py::test_z_cut_short'] == listed
  else:
    assert 0 <= got['test_a.py::test_z_cut_short'] - 1.5 < 5


@pytest.mark.parametrize('backend, least', [('cpu', 100), ('tpu', 20)])
def test_the_repository_files_list_only_existing_slow_tests(backend, least):
  slow = quick_subset.read_slow_tests(
      quick_subset.backend_file(quick_subset.SLOW_TESTS_FILE, backend))
  assert len(slow) > least
  assert all(s >= quick_subset.QUICK_SECONDS for s in slow.values())
  for test in slow:
    assert os.path.exists(os.path.join(_REPO, test.split('::')[0])), test


def test_shards_split_the_selection_into_disjoint_parts(tmp_path):
  (tmp_path / 'test_many.py').write_text(''.join(
      f'def test_{i}():\n  pass\n' for i in range(12)))
  ids = [f'test_many.py::test_{i}' for i in range(12)]
  parts = []
  for k in (1, 2, 3):
    out = _pytest(tmp_path, '--shard', f'{k}/3')
    ran = [t for t in ids if f'{t} PASSED' in out]
    assert ran == [t for t in ids if quick_subset.shard_of(t, 3) == k]
    parts.append(set(ran))
  assert set().union(*parts) == set(ids)
  assert sum(map(len, parts)) == len(ids) and all(parts)


def test_a_bad_shard_is_one_line(tmp_path):
  (tmp_path / 'pytest.ini').write_text('[pytest]\n')
  (tmp_path / 'test_x.py').write_text('def test_x():\n  pass\n')
  proc = subprocess.run(
      [*_PYTEST, '--shard', '4/3'], cwd=tmp_path,
      env=dict(os.environ, PYTHONPATH=_REPO), capture_output=True, text=True,
      timeout=300)
  assert proc.returncode == 4
  assert "--shard: expected K/N with 1 <= K <= N, e.g. 2/4; got '4/3'." in (
      proc.stderr)
