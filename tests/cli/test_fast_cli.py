"""The CLI answers --version, --help and usage errors without importing JAX."""

import os
import resource
import subprocess
import sys

import pytest

import retrax

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Runs `cli.main(argv)` for each argv and prints whether JAX was imported.
_PROBE = '''
import sys
from retrax.app import cli
for argv in {argvs!r}:
  try:
    rc = cli.main(argv)
  except SystemExit as e:
    rc = e.code
  print('PROBE', argv, rc, 'jax' in sys.modules)
'''

_FAST = [['--version'], ['--help'], ['train', '--help'], ['sample', '--help'],
         ['convert', '--help'], ['trian'], ['train', '--stepz', '3'],
         ['train', '--set', 'd_modle=64'], ['train', '--steps', 'x'],
         ['sample'], []]


def _run(args):
  env = dict(os.environ, PYTHONPATH=_ROOT)
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, env=env, cwd=_ROOT, timeout=300)


def test_version_help_and_usage_errors_import_no_jax():
  result = _run(['-c', _PROBE.format(argvs=_FAST)])
  assert result.returncode == 0, result.stderr
  lines = [line for line in result.stdout.splitlines()
           if line.startswith('PROBE ')]
  assert len(lines) == len(_FAST), result.stdout
  for argv, line in zip(_FAST, lines):
    assert line.endswith('False'), (argv, line)
  expected = {'--version': '0', '--help': '0', 'trian': '2', 'x': '2'}
  for argv, line in zip(_FAST, lines):
    if argv and argv[-1] in expected:
      assert line.split()[-2] == expected[argv[-1]], line


def test_a_command_that_runs_still_imports_jax():
  # The probe sees JAX where it is needed: the check above can fail.
  result = _run(['-c', _PROBE.format(argvs=[['info']])])
  assert result.returncode == 0, result.stderr
  assert 'PROBE [\'info\'] 0 True' in result.stdout, result.stdout


def test_python_m_retrax_version_is_fast_and_imports_no_jax():
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  result = _run(['-X', 'importtime', '-m', 'retrax', '--version'])
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  assert result.returncode == 0 and result.stdout == (
      f'retrax {retrax.__version__}\n')
  imported = [line.rsplit('|', 1)[-1].strip()
              for line in result.stderr.splitlines() if '|' in line]
  assert 'retrax.app.cli' in imported  # -X importtime did report the imports.
  assert not [m for m in imported if m == 'jax' or m.startswith('jax.')]
  # CPU seconds, not wall time: robust to a busy machine. Importing JAX alone
  # takes over 1 s of CPU here; the CLI's own imports take about 0.1 s.
  cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
  assert cpu < 0.8, f'retrax --version took {cpu:.2f} s of CPU'


@pytest.mark.parametrize('argv', [['--version'], ['train', '--help']])
def test_in_process_answers_are_unchanged(argv, capsys):
  from retrax.app import cli
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 0
  out = capsys.readouterr().out
  assert (out == f'retrax {retrax.__version__}\n' if argv == ['--version']
          else '--steps' in out and '--temperature' in out)
