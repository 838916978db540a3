"""`retrax convert SRC DST` writes only into a new path or an empty directory."""

import os

import numpy as np
import pytest

from retrax.app import cli
from retrax.checkpoints import convert
from retrax.checkpoints import native
from retrax.checkpoints.trax_format import read_trax_checkpoint


def _native(path, value=1.0, step=3):
  return native.save_native(path, {'weights': [np.full(2, value, np.float32)]},
                            {'step': step})


def _snapshot(root):
  """{relative path: bytes} of every file under `root`."""
  files = {}
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      with open(p, 'rb') as f:
        files[os.path.relpath(p, root)] = f.read()
  return files


def _refused(argv, capsys, dst):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and str(dst) in err and '--force' in err
  return err


def test_new_path_and_empty_directory_are_written(tmp_path):
  src = _native(tmp_path / 'n')
  assert convert.convert(src, tmp_path / 'new' / 'model') == str(
      tmp_path / 'new' / 'model.pkl.gz')
  (tmp_path / 'empty').mkdir()
  # An existing directory receives Trax's file names (model.*).
  assert convert.convert(src, tmp_path / 'empty', to='trax') == str(
      tmp_path / 'empty' / 'model.pkl.gz')
  back = tmp_path / 'empty_native'
  back.mkdir()
  assert native.is_native_checkpoint(
      convert.convert(tmp_path / 'new' / 'model.pkl.gz', back))


def test_trax_files_of_another_run_are_not_overwritten(tmp_path, capsys):
  other = convert.convert(_native(tmp_path / 'other', 7.0, 9), tmp_path / 'dst'
                          / 'model')
  before = _snapshot(tmp_path / 'dst')
  src = _native(tmp_path / 'n')
  for dst in (tmp_path / 'dst' / 'model', tmp_path / 'dst' / 'model.pkl.gz',
              tmp_path / 'dst'):
    _refused(['convert', str(src), str(dst)], capsys, dst)
    assert _snapshot(tmp_path / 'dst') == before
  assert read_trax_checkpoint(other)['step'] == 9
  # A sidecar alone (its pickle lost) is refused too.
  os.remove(other)
  before = _snapshot(tmp_path / 'dst')
  _refused(['convert', str(src), str(tmp_path / 'dst' / 'model')], capsys,
           tmp_path / 'dst' / 'model')
  assert _snapshot(tmp_path / 'dst') == before


def test_native_into_a_non_empty_directory_is_refused(tmp_path, capsys):
  trax = convert.convert(_native(tmp_path / 'n'), tmp_path / 'src' / 'model')
  dst = tmp_path / 'dst'
  dst.mkdir()
  (dst / 'metadata.json').write_text('{"mine": true}')
  (dst / 'notes.txt').write_text('keep me')
  before = _snapshot(dst)
  _refused(['convert', trax, str(dst)], capsys, dst)
  assert _snapshot(dst) == before
  with pytest.raises(FileExistsError, match='force'):
    convert.convert(trax, dst)
  assert _snapshot(dst) == before
  # A file where the directory would go: refused even with --force.
  (tmp_path / 'file').write_text('x')
  assert cli.main(['convert', trax, str(tmp_path / 'file'), '--force']) == 2
  assert 'not a directory' in capsys.readouterr().err
  assert (tmp_path / 'file').read_text() == 'x'


def test_force_overwrites_only_the_files_it_writes(tmp_path, capsys):
  dst = tmp_path / 'dst'
  convert.convert(_native(tmp_path / 'old', 7.0, 9), dst / 'model')
  convert.convert(_native(tmp_path / 'keep', 5.0, 4), dst / 'other')
  (dst / 'notes.txt').write_text('keep me')
  kept = {k: v for k, v in _snapshot(dst).items()
          if not k.startswith('model.')}
  src = _native(tmp_path / 'n', 1.0, 3)
  assert cli.main(['convert', str(src), str(dst / 'model'), '--force']) == 0
  capsys.readouterr()
  after = _snapshot(dst)
  assert {k: after[k] for k in kept} == kept
  ckpt = read_trax_checkpoint(str(dst / 'model.pkl.gz'))
  assert ckpt['step'] == 3 and ckpt['flat_weights'][0].tolist() == [1.0, 1.0]
  # Native with --force: the user's other files stay.
  ndst = tmp_path / 'ndst'
  ndst.mkdir()
  (ndst / 'notes.txt').write_text('keep me')
  assert cli.main(['convert', str(dst / 'model.pkl.gz'), str(ndst),
                   '--force']) == 0
  assert (ndst / 'notes.txt').read_text() == 'keep me'
  assert native.load_native(ndst).metadata['step'] == 3
