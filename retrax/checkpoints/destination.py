"""Where a conversion may write: a new path or an empty directory, or `force`.

`retrax convert` (`convert.py`) and the Hugging Face conversion
(`retrax.app.hf_runs`) both check their destination here before writing, so that
no file a user holds is replaced unless they ask for it.
"""

import glob
import os


def _trax_base(dst):
  """The Trax basename for `dst`: `DST/model` when `dst` is a directory."""
  if os.path.isdir(dst) or dst.endswith(os.sep) or dst.endswith('/'):
    return os.path.join(dst, 'model')
  suffix = '.pkl.gz'
  return dst[:-len(suffix)] if dst.endswith(suffix) else dst


def _trax_files(base):
  """The existing files of the Trax checkpoint at `base` (no extension)."""
  names = [base + '.pkl.gz', base + '.weights.npy.gz']
  found = [p for p in names if os.path.lexists(p)]
  return found + sorted(glob.glob(glob.escape(base) + '.opt_slots*.npy.gz'))


def _refuse(dst, what):
  raise FileExistsError(
      f'{dst} {what}; convert writes only into a new path or an empty '
      'directory: choose another destination, or pass --force (force=True) to '
      'replace the files it writes (nothing else is touched).')


def check_destination(dst, to, force=False):
  """Where to write format `to` for `dst`; raises if files would be lost.

  Raises:
    FileExistsError: naming `dst`, unless it is new or an empty directory
      (Trax: none of its files exist), or `force` is set.
  """
  if to == 'native':
    if os.path.lexists(dst) and not os.path.isdir(dst):
      raise FileExistsError(f'{dst} exists and is not a directory; a native '
                            'checkpoint is a directory: choose another path.')
    if os.path.isdir(dst) and os.listdir(dst) and not force:
      _refuse(dst, 'is a directory that is not empty')
    return dst
  base = _trax_base(dst)
  if not force:
    if os.path.isdir(dst) and os.listdir(dst):
      _refuse(dst, 'is a directory that is not empty')
    existing = _trax_files(base)
    if existing:
      _refuse(dst, 'would overwrite ' + ', '.join(
          os.path.basename(p) for p in existing))
  return base
