"""`text_streams`: LM examples from local text for configs that used T2T."""

import numpy as np
import pytest

from retrax import data
from retrax.errors import UserInputError


def _write(path, text):
  path.write_text(text, encoding='utf-8')
  return str(path)


def test_lines_as_byte_ids_train_shuffled_eval_in_order(tmp_path):
  train = _write(tmp_path / 'train.txt', ''.join(f'line {i}\n' for i in range(6)))
  valid = _write(tmp_path / 'valid.txt', 'ab\n\ncd\n')
  train_fn, eval_fn = data.text_streams(train, valid, shuffle_buffer_size=4)
  it = eval_fn()
  out = [next(it) for _ in range(3)]
  for (x, y), text in zip(out, ['ab', 'cd', 'ab']):
    np.testing.assert_array_equal(x, list(text.encode()))
    assert x is y and x.dtype == np.int64
  np.random.seed(0)
  it = train_fn()
  texts = [bytes(next(it)[0].astype(np.uint8)).decode() for _ in range(12)]
  lines = [f'line {i}' for i in range(6)]
  assert set(texts) == set(lines) and texts != lines * 2


def test_chunks_with_reserved_ids_and_preprocess(tmp_path):
  train = _write(tmp_path / 't.txt', 'abcdefgh' * 2 + 'xyz')
  train_fn, eval_fn = data.text_streams(
      train, vocab_type='bytes', chunk_size=8, encoding=None,
      n_reserved_ids=2, preprocess_fn=lambda ds, training: data.lm1b_preprocess(
          ds, training, max_target_length=5, max_eval_target_length=5))
  x, y = next(eval_fn())
  np.testing.assert_array_equal(x, np.frombuffer(b'xyz', np.uint8) + 2)
  assert len(next(train_fn())[0]) == 3


def test_batcher_over_text_streams(tmp_path):
  train = _write(tmp_path / 't.txt', 'x' * 64)
  inputs = data.batcher(data.text_streams(train, chunk_size=16),
                        variable_shapes=False, batch_size=2, eval_batch_size=2,
                        id_to_mask=0)
  x, y, w = next(inputs.train_stream(1))
  assert x.shape == y.shape == w.shape == (2, 16)


def test_errors(tmp_path):
  with pytest.raises(UserInputError, match='train_path'):
    data.text_streams()
  with pytest.raises(FileNotFoundError):
    data.text_streams(str(tmp_path / 'missing.txt'))
  empty = _write(tmp_path / 'empty.txt', '\n\n')
  train_fn, _ = data.text_streams(empty)
  with pytest.raises(UserInputError, match='no text'):
    next(train_fn())
  with pytest.raises(ValueError, match='vocab_file'):
    data.text_streams(empty, vocab_type='subword')
