"""retrax.data.tokenizer (Trax's trax.data.tokenizer): encode/decode and token counts."""

import random

import pytest

from retrax.data import tokenizer


def test_encode_splits_alnum_runs_and_drops_single_spaces():
  assert tokenizer.encode("Dude - that's so cool.") == [
      'Dude', ' - ', 'that', "'", 's', 'so', 'cool', '.']
  assert tokenizer.encode(' ab  cd ') == [' ', 'ab', '  ', 'cd', ' ']
  assert tokenizer.encode('Łódź 1981') == ['Łódź', '1981']
  assert tokenizer.encode('') == []


def test_decode_inverts_encode_on_random_text():
  rng = random.Random(0)
  for _ in range(300):
    s = ''.join(chr(rng.randint(0, 0x2FFF)) for _ in range(12))
    assert tokenizer.decode(tokenizer.encode(s)) == s


@pytest.fixture(name='corpus')
def _corpus(tmp_path):
  (tmp_path / 'c-1.txt').write_text('a b. a\nb\n\n', encoding='utf-8')
  (tmp_path / 'c-2.txt').write_text('c a\n', encoding='utf-8')
  return str(tmp_path / 'c-*.txt')


def test_corpus_token_counts_by_line_and_by_file(corpus):
  by_line = tokenizer.corpus_token_counts(corpus, 0, split_on_newlines=True)
  assert dict(by_line) == {'a': 3, 'b': 2, '. ': 1, 'c': 1}  # '' gives no token
  whole = tokenizer.corpus_token_counts(corpus, 0, split_on_newlines=False)
  assert whole['\n'] == 2 and whole['\n\n'] == 1 and whole['. '] == 1
  first2 = tokenizer.corpus_token_counts(corpus, 2, split_on_newlines=False)
  assert dict(first2) == {'a': 2, 'b': 2, '. ': 1, '\n': 2}
  assert 'c' not in tokenizer.corpus_token_counts(corpus, 3)


def test_vocab_token_counts_split_at_last_comma(tmp_path, caplog):
  (tmp_path / 'v-1.txt').write_text('x,y,3\nbad line\nz,10\n', encoding='utf-8')
  (tmp_path / 'v-2.txt').write_text('w,1\n', encoding='utf-8')
  pattern = str(tmp_path / 'v-*.txt')
  assert tokenizer.vocab_token_counts(pattern, 0) == {'x,y': 3, 'z': 10,
                                                      'w': 1}
  assert 'Malformed vocab line #1' in caplog.text
  assert tokenizer.vocab_token_counts(pattern, 2) == {'x,y': 3}


def test_no_matching_file_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match='No files match'):
    tokenizer.corpus_token_counts(str(tmp_path / 'none-*.txt'), 0)
