"""Resumable streams: `CountAndSkip` counters, their save/load, `UniformlySeek`.

`CountAndSkip(name)` counts the examples a stream has delivered in the
module-level dict `data_counters`; a stream built again (after a restart,
with the counters loaded back) skips that many examples first. For a
deterministic pipeline this resumes reading exactly where it stopped::

  pipeline = Serial(TextLines('corpus.txt'), CountAndSkip('corpus'), ...)
  ...  # train, then at checkpoint time:
  save_data_counters(output_dir)
  ...  # new process:
  load_data_counters(output_dir)
  stream = pipeline()   # starts after the last example delivered before
"""

import json
import logging
import os
from typing import Any, Callable, Dict, Iterable, Iterator, Optional

import jax
from retrax.configurable import configurable
from retrax.errors import UserInputError
from retrax.validation import ArgumentValueError

_log = logging.getLogger('retrax.data')

data_counters: Dict[str, int] = {}


def count_and_skip(generator: Iterable[Any], name: str) -> Iterator[Any]:
  """Skips the first ``data_counters[name]`` examples, then counts each one.

  Args:
    generator: iterable of examples.
    name: key in `data_counters` (one per stream).

  Yields:
    The examples after the recorded position; ``data_counters[name]`` is
    incremented before each is yielded.
  """
  local = 0
  for example in generator:
    local += 1
    # Looked up per example: the counters may be loaded after construction.
    if name not in data_counters:
      data_counters[name] = 0
    if local > data_counters[name]:
      data_counters[name] += 1
      yield example


@configurable('trax.data')
def CountAndSkip(name: str) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function that counts and skips examples; see above."""
  if not isinstance(name, str) or not name:
    raise ArgumentValueError(f'CountAndSkip needs a non-empty string name, got '
                             f'{name!r}.')
  return lambda g: count_and_skip(g, name)


def _host_id(host_id):
  if host_id is not None:
    return host_id
  return jax.process_index()


def _counters_path(output_dir, host_id):
  return os.path.join(output_dir, f'data_counters{_host_id(host_id)}.json')


def save_data_counters(output_dir: str, host_id: Optional[int] = None) -> str:
  """Writes `data_counters` to ``output_dir/data_counters{host_id}.json``.

  The file is written to a temporary name and renamed, so a crash never
  leaves a half-written file. Trax pickles to ``.pkl``; retrax writes JSON.

  Args:
    output_dir: directory (created if missing).
    host_id: host index (default: ``jax.process_index()``).

  Returns:
    The path written.
  """
  os.makedirs(output_dir, exist_ok=True)
  path = _counters_path(output_dir, host_id)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    json.dump(data_counters, f, sort_keys=True)
  os.replace(tmp, path)
  return path


def load_data_counters(output_dir: str, host_id: Optional[int] = None) -> bool:
  """Replaces `data_counters` with the saved ones, if the file exists.

  Returns:
    True if a file was loaded, False if there was none (counters unchanged).

  Raises:
    ValueError: if the file is not a JSON object of string -> int.
  """
  path = _counters_path(output_dir, host_id)
  if not os.path.exists(path):
    _log.info('Did not load data counters as %s does not exist.', path)
    return False
  with open(path, encoding='utf-8') as f:
    loaded = json.load(f)
  if not isinstance(loaded, dict) or not all(
      isinstance(k, str) and isinstance(v, int) for k, v in loaded.items()):
    raise UserInputError(f'{path} must hold a JSON object of name -> int counts, '
                         f'got {loaded!r}.')
  data_counters.clear()
  data_counters.update(loaded)
  return True


@configurable('trax.data')
def UniformlySeek(name: Optional[str] = None,
                  host_id: Optional[int] = None,
                  n_hosts: Optional[int] = None,
                  dataset_size: Optional[int] = None
                  ) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Starts host ``host_id`` at example ``host_id * (dataset_size // n_hosts)``.

  Args:
    name: stream name, for the log.
    host_id: this host's index (default: ``jax.process_index()``).
    n_hosts: number of hosts (default: ``jax.process_count()``).
    dataset_size: examples in the data set (default 2**18, as in Trax).
  """
  if not name:
    raise ArgumentValueError('UniformlySeek needs a name.')
  if not dataset_size:
    dataset_size = 2 ** 18
    _log.error('No dataset size given to UniformlySeek, assuming: %d',
               dataset_size)
  if n_hosts is None:
    n_hosts = jax.process_count()
  host = _host_id(host_id)
  to_skip = host * int(dataset_size / n_hosts)

  def _f(generator):
    iterator = iter(generator)
    _log.info('Dataset[%s] host_id[%d] is seeking to position[%d]', name,
              host, to_skip)
    for _ in range(to_skip):
      if next(iterator, _f) is _f:
        return
    yield from iterator
  return _f
