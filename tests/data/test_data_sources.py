"""Text and numpy sources: lines, chunks, folders, empty and undecodable files."""

import itertools

import numpy as np
import pytest

from retrax import data


def _write(path, content):
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(content, str):
    content = content.encode('utf-8')
  path.write_bytes(content)
  return path


def test_text_lines_strips_newlines_of_every_kind(tmp_path):
  f = _write(tmp_path / 'a.txt', 'one\ntwo\r\n\nthree')
  assert list(data.TextLines(f)()) == ['one', 'two', '', 'three']
  assert list(data.TextLines(f, skip_empty=True)()) == ['one', 'two', 'three']
  assert list(data.TextLines(str(f), keep_newlines=True)()) == [
      'one\n', 'two\n', '\n', 'three']
  assert list(data.TextLines(f, encoding=None)()) == [b'one', b'two', b'',
                                                      b'three']


def test_text_lines_folder_is_sorted_recursive_and_filtered(tmp_path):
  _write(tmp_path / 'b.txt', 'b1\nb2\n')
  _write(tmp_path / 'a.txt', 'a1\n')
  _write(tmp_path / 'sub' / 'c.txt', 'c1\n')
  _write(tmp_path / 'skip.md', 'no\n')
  _write(tmp_path / '.hidden.txt', 'no\n')
  lines = data.TextLines(tmp_path, pattern='*.txt')
  assert list(lines()) == ['a1', 'b1', 'b2', 'c1']
  assert list(lines()) == ['a1', 'b1', 'b2', 'c1']  # Fresh iterator per call.
  assert data.list_files([tmp_path / 'a.txt', tmp_path / 'sub']) == [
      str(tmp_path / 'a.txt'), str(tmp_path / 'sub' / 'c.txt')]


def test_text_lines_streams_lazily(tmp_path):
  f = _write(tmp_path / 'big.txt', ''.join(f'{i}\n' for i in range(10000)))
  gen = data.TextLines(f)()
  assert [next(gen) for _ in range(3)] == ['0', '1', '2']
  gen.close()


def test_empty_files_yield_nothing_and_repeat_does_not_spin(tmp_path):
  f = _write(tmp_path / 'empty.txt', '')
  assert list(data.TextLines(f)()) == []
  assert list(data.TextLines(f, repeat=True)()) == []
  assert list(data.TextChunks(f, 4, repeat=True)()) == []
  g = _write(tmp_path / 'blank.txt', '\n  \n')
  assert list(data.TextLines(g, skip_empty=True, repeat=True)()) == []


def test_repeat_cycles_forever(tmp_path):
  f = _write(tmp_path / 'a.txt', 'x\ny\n')
  assert list(itertools.islice(data.TextLines(f, repeat=True)(), 5)) == [
      'x', 'y', 'x', 'y', 'x']


def test_undecodable_bytes_replace_by_default_strict_raises(tmp_path):
  f = _write(tmp_path / 'bad.txt', b'ok\nbad \xff\xfe here\nfine\n')
  assert list(data.TextLines(f)()) == ['ok', 'bad \ufffd\ufffd here', 'fine']
  assert list(data.TextLines(f, errors='ignore')()) == ['ok', 'bad  here',
                                                        'fine']
  with pytest.raises(ValueError, match=r'bad\.txt.*not valid utf-8'):
    list(data.TextLines(f, errors='strict')())
  assert list(data.TextLines(f, encoding=None)()) == [b'ok', b'bad \xff\xfe here',
                                                      b'fine']
  with pytest.raises(ValueError, match='chunk 0'):
    list(data.TextChunks(f, 100, errors='strict')())


def test_missing_paths_and_empty_folders_fail_at_construction(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    data.TextLines(tmp_path / 'nope.txt')
  (tmp_path / 'empty_dir').mkdir()
  with pytest.raises(ValueError, match='no file matching'):
    data.TextLines(tmp_path / 'empty_dir')
  f = _write(tmp_path / 'a.txt', 'x')
  with pytest.raises(LookupError):
    data.TextLines(f, encoding='no-such-codec')
  with pytest.raises(ValueError, match='chunk_size'):
    data.TextChunks(f, 0)


def test_text_chunks_characters_and_bytes(tmp_path):
  f = _write(tmp_path / 'a.txt', 'abcdé\r\nfgh')  # 10 characters, 11 bytes
  assert list(data.TextChunks(f, 4)()) == ['abcd', 'é\r\nf', 'gh']
  assert list(data.TextChunks(f, 4, drop_remainder=True)()) == ['abcd',
                                                                'é\r\nf']
  assert list(data.TextChunks(f, 4, encoding=None)()) == [
      b'abcd', b'\xc3\xa9\r\n', b'fgh']
  g = _write(tmp_path / 'b.txt', 'xyz')
  assert list(data.TextChunks([f, g], 8)()) == ['abcdé\r\nf', 'gh', 'xyz']


def test_numpy_arrays(tmp_path):
  xs, ys = np.arange(12).reshape(4, 3), np.arange(4) * 10
  rows = list(data.NumpyArrays(xs, ys)())
  assert len(rows) == 4 and rows[2][0].tolist() == [6, 7, 8] and rows[2][1] == 20
  assert [r.tolist() for r in data.NumpyArrays(xs)()][1] == [3, 4, 5]
  path = tmp_path / 'x.npy'
  np.save(path, xs)
  batch = next(data.Serial(data.NumpyArrays(str(path)), data.Batch(4))())
  np.testing.assert_array_equal(batch, xs)
  assert len(list(itertools.islice(data.NumpyArrays(ys, repeat=True)(), 9))) == 9
  assert list(data.NumpyArrays(np.zeros((0, 2)), repeat=True)()) == []
  with pytest.raises(ValueError, match='same length'):
    data.NumpyArrays(xs, np.arange(3))
  with pytest.raises(ValueError, match='scalar'):
    data.NumpyArrays(np.float32(1))
  with pytest.raises(FileNotFoundError):
    data.NumpyArrays(str(tmp_path / 'missing.npy'))
