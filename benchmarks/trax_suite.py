"""Run Trax 1.4.1's own unit tests on retrax (and on real Trax) and compare.

The measure of "a Trax program runs unchanged": a checkout of Trax's v1.4.1
tests is run file by file under pytest, once with `import trax` resolving to
retrax (`retrax.compat.install()`), and, when an interpreter with real Trax is
given, once on Trax itself. The per-test outcomes of the Trax run are cached in
a JSON file so later runs need only retrax.

    pip install -e ".[trax-suite]"   # what Trax's test files import
    git --git-dir=<mirror of google/trax> archive v1.4.1 | tar -x -C /tmp/trax141
    python benchmarks/trax_suite.py --trax-src /tmp/trax141 [--group core]
        [--trax-python $TRAX_PY] [--files layers/core_test.py ...] [--jobs 2]

Prints, per test file, the tests that pass on Trax and how many of those pass
on retrax, then the total ratio. Not part of CI: it needs Trax's sources.

Trax's tests use TensorFlow only for test-case helpers (`tf.test.TestCase`,
`tf.io.gfile`); retrax has no TensorFlow, so the harness supplies those helpers
(`trax_suite_shims/`) on the retrax side. Out of scope (TensorFlow datasets,
gym/RL, TF-numpy, Keras): see `EXCLUDED`.
"""

import argparse
import concurrent.futures
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
SHIMS = HERE / 'trax_suite_shims'
DEFAULT_CACHE = HERE / 'results' / 'trax_suite_trax141.json'

# Test files outside the measure, with the reason.
EXCLUDED = {
    'data/tf_inputs_test.py': 'TensorFlow datasets',
    'supervised/mnist_test.py': 'TFDS download',
    'models/rl_test.py': 'RL',
    'supervised/callbacks_test.py': 'gym / RL serialization (trax.rl)',
    'trax2keras_test.py': 'Keras',
}
EXCLUDED_DIRS = {'rl/': 'RL / gym', 'tf_numpy/': 'TF-numpy'}
RESEARCH_DIRS = ('layers/research/', 'models/research/')

CONFTEST = '''\
import sys
sys.path.insert(0, {shims!r})
import retrax.compat
retrax.compat.install()
'''

# Trax's tests expect `absltest.main()` to have parsed absl's flags (their
# `test_utils.ensure_flag('test_tmpdir')` reads one); under pytest nothing does,
# so both sides get the flags marked parsed, with their defaults.
ABSL_FLAGS = '''\
from absl import flags
flags.FLAGS.mark_as_parsed()
'''


def test_files(src, group):
  """The in-scope `*_test.py` paths (relative to Trax's package) of a group."""
  root = pathlib.Path(src) / 'trax'
  out = []
  for path in sorted(root.rglob('*_test.py')):
    rel = path.relative_to(root).as_posix()
    if rel in EXCLUDED or any(rel.startswith(d) for d in EXCLUDED_DIRS):
      continue
    research = rel.startswith(RESEARCH_DIRS)
    if group == 'all' or (group == 'research') == research:
      out.append(rel)
  return out


def copy_tree(src, dst, retrax_side):
  """Trax's tests and their data files, without Trax's package code."""
  root = pathlib.Path(src) / 'trax'
  for path in root.rglob('*'):
    if path.is_dir() or (path.suffix == '.py' and
                         not path.name.endswith('_test.py')):
      continue
    target = pathlib.Path(dst) / path.relative_to(root)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
  conftest = CONFTEST.format(shims=str(SHIMS)) if retrax_side else ''
  (pathlib.Path(dst) / 'conftest.py').write_text(conftest + ABSL_FLAGS)


def run_file(python, tree, rel, timeout):
  """{test id: outcome} of one test file, run in its own interpreter."""
  with tempfile.TemporaryDirectory(prefix='trax_suite_xml_') as folder:
    xml_path = os.path.join(folder, 'report.xml')
    cmd = [python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
           '--import-mode=importlib', '--junitxml', xml_path, '-o',
           'junit_family=xunit1', rel]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', JAX_PLATFORMS='cpu',
               PYTHONWARNINGS='ignore')
    try:
      subprocess.run(cmd, cwd=tree, env=env, timeout=timeout,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     check=False)
    except subprocess.TimeoutExpired:
      return {f'{rel}::<file>': 'timeout'}
    if not os.path.exists(xml_path):
      return {f'{rel}::<file>': 'error'}
    cases = list(ET.parse(xml_path).getroot().iter('testcase'))
  outcomes = {}
  for case in cases:
    name = f"{rel}::{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
    tags = {child.tag for child in case}
    if 'skipped' in tags:
      outcomes[name] = 'skipped'
    elif tags & {'failure', 'error'}:
      outcomes[name] = 'failed'
    else:
      outcomes[name] = 'passed'
  if not outcomes:
    outcomes[f'{rel}::<file>'] = 'error'
  return outcomes


def merge_into_cache(path, rel, outcomes):
  """Adds one file's Trax outcomes to the JSON cache (safe across processes)."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(f'{path}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    cache = json.loads(path.read_text()) if path.exists() else {}
    cache[rel] = outcomes
    tmp = f'{path}.tmp'
    pathlib.Path(tmp).write_text(json.dumps(cache, indent=1, sort_keys=True))
    os.replace(tmp, path)


def run_suite(python, src, files, retrax_side, jobs, timeout, cache=None):
  """{file: {test: outcome}}; Trax outcomes go to `cache` file by file."""
  with tempfile.TemporaryDirectory(prefix='trax_suite_') as tree:
    copy_tree(src, tree, retrax_side)
    results = {}
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
      futures = {pool.submit(run_file, python, tree, rel, timeout): rel
                 for rel in files}
      for future in concurrent.futures.as_completed(futures):
        rel = futures[future]
        results[rel] = future.result()
        if cache:
          merge_into_cache(cache, rel, results[rel])
        n_pass = sum(v == 'passed' for v in results[rel].values())
        print(f'  {"retrax" if retrax_side else "trax":6s} {rel}: '
              f'{n_pass}/{len(results[rel])} passed', file=sys.stderr)
    return results


def report(trax, retrax):
  """Prints per-file counts; returns (passing on both, passing on Trax)."""
  total_trax = total_both = 0
  print(f'{"file":52s} {"trax":>5s} {"retrax":>7s}  ratio')
  for rel in sorted(retrax):
    passing = [t for t, o in trax.get(rel, {}).items() if o == 'passed']
    both = [t for t in passing if retrax[rel].get(t) == 'passed']
    total_trax += len(passing)
    total_both += len(both)
    ratio = f'{len(both) / len(passing):6.1%}' if passing else '    -'
    print(f'{rel:52s} {len(passing):5d} {len(both):7d}  {ratio}')
  if total_trax:
    print(f'{"TOTAL":52s} {total_trax:5d} {total_both:7d}  '
          f'{total_both / total_trax:6.1%}')
  return total_both, total_trax


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--trax-src', required=True,
                 help='a checkout of google/trax at v1.4.1 (holds trax/)')
  p.add_argument('--group', choices=['core', 'research', 'all'],
                 default='core')
  p.add_argument('--files', nargs='*', help='only these test files')
  p.add_argument('--python', default=sys.executable,
                 help='interpreter with retrax installed')
  p.add_argument('--trax-python', help='interpreter with real Trax 1.4.1; '
                 'its outcomes are cached in --cache')
  p.add_argument('--cache', default=str(DEFAULT_CACHE))
  p.add_argument('--jobs', type=int, default=2)
  p.add_argument('--timeout', type=int, default=1200,
                 help='seconds per test file')
  p.add_argument('--trax-only', action='store_true',
                 help='only fill the Trax cache; do not run retrax')
  p.add_argument('--failures', action='store_true',
                 help='list the tests that pass on Trax but not on retrax')
  args = p.parse_args(argv)
  if not (pathlib.Path(args.trax_src) / 'trax').is_dir():
    p.error(f'--trax-src {args.trax_src}: no trax/ directory there')
  files = args.files or test_files(args.trax_src, args.group)

  cache = {}
  if os.path.exists(args.cache):
    cache = json.loads(pathlib.Path(args.cache).read_text())
  if args.trax_python:
    todo = [f for f in files if f not in cache]
    cache.update(run_suite(args.trax_python, args.trax_src, todo, False,
                           args.jobs, args.timeout, cache=args.cache))
  if args.trax_only:
    return
  missing = [f for f in files if f not in cache]
  if missing:
    print(f'no Trax outcomes for {len(missing)} files (give --trax-python): '
          + ', '.join(missing), file=sys.stderr)
  retrax = run_suite(args.python, args.trax_src, files, True, args.jobs,
                     args.timeout)
  report(cache, retrax)
  if args.failures:
    for rel in sorted(retrax):
      for test, outcome in sorted(cache.get(rel, {}).items()):
        if outcome == 'passed' and retrax[rel].get(test) != 'passed':
          print(f'FAIL {test} ({retrax[rel].get(test, "missing")})')


if __name__ == '__main__':
  main()
