"""Checks on the paths users pass: local files only, with hints for near misses.

Trax read and wrote through `tf.io.gfile`, so tutorials pass `gs://...` paths;
retrax has no TensorFlow and reads local files only. These helpers turn such
paths, and a `model.pkl` asked for next to an existing `model.pkl.gz`, into
one-line errors that say what to do.
"""

import os
import re

from retrax.errors import UserInputError

_URL = re.compile(r'^([A-Za-z][A-Za-z0-9+.\-]*)://')
_COPY_HINTS = {
    'gs': 'gsutil cp -r {path} .',
    's3': 'aws s3 cp --recursive {path} .',
    'http': 'curl -O {path}',
    'https': 'curl -O {path}',
}


class RemotePathError(UserInputError):
  """A URL (gs://, s3://, http://, ...) was given where a local path is needed."""


def url_scheme(path):
  """The scheme of a URL-like path (`'gs'` for `gs://b/x`), else None."""
  if not isinstance(path, (str, os.PathLike)):
    return None
  m = _URL.match(os.fspath(path))
  return m.group(1).lower() if m else None


def check_local(path, what):
  """Returns `os.fspath(path)`; raises RemotePathError if it is a URL.

  Args:
    path: the path given by the user.
    what: what the path is for, as the message should name it
      (e.g. ``'init_from_file: file_name'``).
  """
  scheme = url_scheme(path)
  if scheme is None:
    return os.fspath(path) if isinstance(path, os.PathLike) else path
  path = os.fspath(path)
  copy = _COPY_HINTS.get(scheme)
  how = f', e.g. `{copy.format(path=path)}`,' if copy else ''
  raise RemotePathError(
      f'{what}: {path!r} is a remote {scheme}:// URL; retrax reads and writes '
      f'local files only (it has no TensorFlow gfile). Copy it to this machine '
      f'first{how} and pass the local path.')


def missing_hint(path):
  """A hint naming a sibling file the user probably meant ('' if none).

  `model.pkl` -> `model.pkl.gz` (Trax 1.3+ writes gzipped checkpoints), and
  the reverse.
  """
  path = os.fspath(path)
  if os.path.exists(path + '.gz'):
    return (f' {path}.gz exists next to it (Trax 1.3+ and retrax write '
            f'gzipped checkpoints): pass {path + ".gz"!r}.')
  if path.endswith('.gz') and os.path.exists(path[:-3]):
    return f' {path[:-3]} exists next to it: pass {path[:-3]!r}.'
  return ''
