"""Tests for atomic file replacement."""

import os

import pytest

from retrax.checkpoints.atomic import atomic_write


def test_success_replaces_and_leaves_no_temp(tmp_path):
  path = tmp_path / 'f.bin'
  path.write_bytes(b'old')
  with atomic_write(path) as f:
    f.write(b'new contents')
  assert path.read_bytes() == b'new contents'
  assert os.listdir(tmp_path) == ['f.bin']
  # Same mode as a file made by plain open() (mkstemp alone gives 0o600).
  plain = tmp_path / 'plain.bin'
  plain.write_bytes(b'')
  assert os.stat(path).st_mode == os.stat(plain).st_mode


def test_failure_keeps_old_file_and_removes_temp(tmp_path):
  path = tmp_path / 'f.bin'
  path.write_bytes(b'old')
  with pytest.raises(RuntimeError):
    with atomic_write(path) as f:
      f.write(b'partial')
      raise RuntimeError('killed mid-write')
  assert path.read_bytes() == b'old'
  assert os.listdir(tmp_path) == ['f.bin']
