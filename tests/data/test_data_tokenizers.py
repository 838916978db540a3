"""Tokenizers: bytes, chars, T2T subword (Trax's en_8k vocab), SentencePiece."""

import os
import random

import numpy as np
import pytest

from retrax import data
from retrax.data import subword

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')
EN_8K = os.path.join(FIXTURES, 'en_8k.subword')


# ----------------------------------------------------------------- bytes/char


def test_char_vocab_is_utf8_bytes_as_in_trax():
  tok = next(data.tokenize(iter(['I have a cat.']), vocab_type='char'))
  assert tok.dtype == np.int64
  assert tok.tolist() == [ord(c) for c in 'I have a cat.']
  assert data.detokenize(tok, vocab_type='char') == 'I have a cat.'
  tok = next(data.tokenize(iter(['é']), vocab_type='bytes'))
  assert tok.tolist() == [0xC3, 0xA9]
  assert data.vocab_size(vocab_type='char', n_reserved_ids=11) == 256 + 11


def test_tokenize_keys_reserved_ids_and_dicts():
  out = next(data.tokenize(iter([('Cat.', 'Dog.')]), vocab_type='char',
                           n_reserved_ids=5))
  assert out[0].tolist() == [ord(c) + 5 for c in 'Cat.']
  assert out[1].tolist() == [ord(c) + 5 for c in 'Dog.']
  out = next(data.Tokenize(keys=[0], vocab_type='char', n_reserved_ids=2)(
      iter([('Cat.', 'Dog.')])))
  assert out[0].tolist() == [ord(c) + 2 for c in 'Cat.'] and out[1] == 'Dog.'
  out = next(data.tokenize(iter([{'a': 'Cat.', 'b': 'Dog.'}]), keys=['a'],
                           vocab_type='char'))
  assert out['a'].tolist() == [ord(c) for c in 'Cat.'] and out['b'] == 'Dog.'
  assert data.detokenize(out['a'] + 3, vocab_type='char',
                         n_reserved_ids=3) == 'Cat.'
  empty = next(data.tokenize(iter(['']), vocab_type='char'))
  assert empty.shape == (0,) and empty.dtype == np.int64


def test_byte_text_encoder_reserved_ids_and_bad_utf8():
  enc = data.ByteTextEncoder()  # Trax's class default: 2 reserved ids.
  assert enc.vocab_size == 258 and enc.encode('A') == [67]
  assert enc.decode([0, 1, 67]) == '<pad><EOS>A'
  assert enc.decode([67, 1, 0], strip_extraneous=True) == 'A'
  assert enc.decode([0xFF + 2, 67]) == '\ufffdA'
  assert enc.encode(b'\xff') == [0xFF + 2]
  with pytest.raises(ValueError, match='outside'):
    enc.decode([300])


def test_char_text_encoder():
  enc = data.CharTextEncoder('abc ', num_reserved_ids=1)
  assert enc.encode('cab a') == [3, 1, 2, 4, 1] and enc.vocab_size == 5
  assert enc.decode([0, 3, 1, 2, 4, 1]) == 'cab a'
  with pytest.raises(ValueError, match="'z' is not in the alphabet"):
    enc.encode('z')
  assert data.CharTextEncoder('ab', oov_id=0).encode('azb') == [0, 0, 1]
  built = data.CharTextEncoder.from_text(['hello', 'world'])
  assert built.alphabet == 'dehlorw'
  ids = next(data.Tokenize(vocab=built, n_reserved_ids=1)(iter(['low'])))
  assert ids.tolist() == [3 + 1, 4 + 1, 6 + 1]  # l, o, w in "dehlorw"
  assert data.vocab_size(vocab=built) == 7
  with pytest.raises(ValueError, match='repeated'):
    data.CharTextEncoder('aa')


# -------------------------------------------------------------------- subword


def test_subword_en_8k_matches_trax_ids():
  # Expected ids and size from Trax's tf_inputs_test on this very file.
  tok = next(data.tokenize(iter(['I have a cat.']), vocab_type='subword',
                           vocab_dir=FIXTURES, vocab_file='en_8k.subword'))
  assert tok.tolist() == [139, 96, 12, 2217, 2, 21]
  assert data.detokenize(tok, vocab_type='subword', vocab_dir=FIXTURES,
                         vocab_file='en_8k.subword') == 'I have a cat.'
  assert data.vocab_size(vocab_type='subword', vocab_file=EN_8K) == 8183


def _write_vocab(path, subtokens):
  lines = []
  for i, s in enumerate(subtokens):
    lines.append(f'"{s}"' if i % 3 == 0 else f"'{s}'")
  path.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  return str(path)


_TOY = ['<pad>', '<EOS>', 'ab_', 'a', 'b', 'c', '_', '\\', 'u', ';'] + [
    str(d) for d in range(10)] + [' ', '.']


@pytest.mark.parametrize('text, expected', [
    # 'ab' -> 'ab_' (longest match); 'cab' -> 'c' + 'ab_'; the single space
    # between two alphanumeric tokens is implied, not encoded.
    ('ab cab', [2, 5, 2]),
    # '_' is escaped to '\u', then the token gets its closing '_'.
    ('a_b', [3, 6, 7, 8, 6, 4, 6]),
    # 'z' is outside the alphabet: escaped as '\122;'.
    ('z', [7, 11, 12, 12, 9, 6]),
    # Non-alphanumeric tokens keep their spaces: ' . ' is one token.
    ('a . b', [3, 6, 20, 21, 20, 6, 4, 6]),
])
def test_subword_toy_vocab_hand_checked(tmp_path, text, expected):
  vocab = subword.SubwordTextEncoder(_write_vocab(tmp_path / 'toy.subword',
                                                  _TOY))
  assert vocab.vocab_size == len(_TOY)
  assert vocab.encode(text) == expected
  assert vocab.decode(expected) == text


def test_subword_tokenizer_split_and_join():
  text = "Dude - that's so cool."
  tokens = subword.split_tokens(text)
  assert tokens == ['Dude', ' - ', 'that', "'", 's', 'so', 'cool', '.']
  assert subword.join_tokens(tokens) == text
  assert subword.split_tokens('') == []
  assert subword.split_tokens(' a') == [' ', 'a']


def test_subword_escape_roundtrip():
  alphabet = set('abc') | set('\\_u;0123456789')  # Always has the escapes.
  for token in ['a\\b_c', 'zz\n', '', '\u3013']:
    escaped = subword.escape_token(token, alphabet)
    assert escaped.endswith('_') and '_' not in escaped[:-1]
    assert subword.unescape_token(escaped) == token
  assert subword.unescape_token('\\99999999999;_') == '\u3013'


def test_subword_roundtrips_random_unicode():
  vocab = subword.SubwordTextEncoder(EN_8K)
  rng = random.Random(0)
  pool = ('abcXYZ019 _\\;\n\t.,!?\u00e9\u4e2d\u0416\U0001F600\u3000' +
          'the and of ')
  for _ in range(200):
    text = ''.join(rng.choice(pool) for _ in range(rng.randint(0, 30)))
    ids = vocab.encode(text)
    assert all(0 <= i < vocab.vocab_size for i in ids)
    assert vocab.decode(ids) == text, repr(text)
  assert vocab.decode([139, 96, 10 ** 6]) == 'I have'  # Unknown ids: nothing.
  assert vocab.decode([139, 96, 1, 0], strip_extraneous=True) == 'I have'


def test_missing_or_bad_vocab_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='vocab_dir'):
    data.Tokenize(vocab_type='subword', vocab_file='en_32k.subword',
                  vocab_dir=str(tmp_path))
  with pytest.raises(FileNotFoundError, match='not found'):
    data.vocab_size(vocab_type='sentencepiece', vocab_file='nope.model')
  with pytest.raises(ValueError, match='remote'):
    data.Tokenize(vocab_file='en_8k.subword', vocab_dir='gs://trax-ml/vocabs/')
  with pytest.raises(ValueError, match='needs vocab_file'):
    data.Tokenize(vocab_type='subword')
  with pytest.raises(ValueError, match='vocab_type must be one of'):
    data.Tokenize(vocab_type='bert', vocab_file=EN_8K)
  empty = tmp_path / 'empty.subword'
  empty.write_text('')
  with pytest.raises(ValueError, match='no subtokens'):
    data.SubwordTextEncoder(str(empty))
  # tokenize() is lazy like Trax's: the error comes with the first example.
  gen = data.tokenize(iter(['x']), vocab_file=str(tmp_path / 'missing'))
  with pytest.raises(FileNotFoundError):
    next(gen)


# -------------------------------------------------------------- sentencepiece


@pytest.fixture(scope='module')
def spm_model(tmp_path_factory):
  pytest.importorskip('sentencepiece')
  rng = random.Random(0)
  words = [''.join(rng.choice('abcdefghijklmnopqrstuvwxyz')
                   for _ in range(rng.randint(2, 7))) for _ in range(200)]
  lines = [' '.join(rng.choice(words) for _ in range(8)) for _ in range(400)]
  folder = tmp_path_factory.mktemp('spm')
  corpus = folder / 'corpus.txt'
  corpus.write_text('\n'.join(lines) + '\n', encoding='utf-8')
  path = data.train_sentencepiece(str(corpus), str(folder / 'm'),
                                  vocab_size=100)
  return path, lines


def test_sentencepiece_trained_model(spm_model):
  path, lines = spm_model
  vocab = data.SentencePieceVocabulary(path)
  assert os.path.isfile(path) and vocab.vocab_size == 100
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  for line in lines[:20]:
    ids = vocab.encode(line)
    assert all(3 <= i < 100 for i in ids)
    assert vocab.decode(ids) == line
  ids = vocab.encode(lines[0])
  # seqio semantics: cut after the first EOS; ids past the pieces are UNK.
  assert vocab.decode(ids[:3] + [1] + ids[3:]) == vocab.decode(ids[:3])
  assert vocab.decode(ids[:3] + [150]) == vocab.decode(ids[:3] + [2])
  assert data.SentencePieceVocabulary(path, extra_ids=10).vocab_size == 110


def test_sentencepiece_through_tokenize_and_detokenize(spm_model):
  path, lines = spm_model
  folder, name = os.path.split(path)
  kwargs = dict(vocab_type='sentencepiece', vocab_dir=folder, vocab_file=name)
  toks = list(data.Tokenize(n_reserved_ids=0, **kwargs)(iter(lines[:5])))
  assert [data.detokenize(t, **kwargs) for t in toks] == lines[:5]
  assert data.vocab_size(**kwargs) == 100
  texts = list(data.Detokenize(keys=[0], **kwargs)(iter([(toks[0], 7)])))
  assert texts == [(lines[0], 7)]
  via_spm = list(data.SentencePieceTokenize(spm_path=path)(iter([(lines[1],)])))
  assert via_spm[0].tolist() == toks[1].tolist()


def test_grouped_sentencepiece_tokenize_equals_per_example(spm_model):
  path, lines = spm_model
  examples = ([(lines[i], i, lines[i + 1]) for i in range(7)] +
              [lines[9], lines[10].encode('utf-8')])
  kwargs = dict(vocab_type='sentencepiece', vocab_file=path, n_reserved_ids=3,
                keys=[0, 2])
  one = list(data.Tokenize(**kwargs)(iter(examples)))
  grouped = list(data.Tokenize(group_size=4, **kwargs)(iter(examples)))
  assert len(one) == len(grouped) == 9
  for a, b in zip(one, grouped):
    if isinstance(a, tuple):
      assert a[1] == b[1]
      a, b = (a[0], a[2]), (b[0], b[2])
    else:
      a, b = (a,), (b,)
    for x, y in zip(a, b):
      assert x.dtype == y.dtype == np.int64 and x.tolist() == y.tolist()
  with pytest.raises(ValueError, match='group_size'):
    data.Tokenize(vocab_type='char', group_size=0)


def test_train_sentencepiece_from_iterator_and_source(tmp_path, spm_model):
  _, lines = spm_model
  from_iter = data.train_sentencepiece(iter(lines), str(tmp_path / 'it'),
                                       vocab_size=100)
  corpus = tmp_path / 'c.txt'
  corpus.write_text('\n'.join(lines), encoding='utf-8')
  from_source = data.train_sentencepiece(data.TextLines(corpus),
                                         str(tmp_path / 'src'), vocab_size=100)
  a = data.SentencePieceVocabulary(from_iter)
  b = data.SentencePieceVocabulary(from_source)
  assert a.encode(lines[3]) == b.encode(lines[3])
  with pytest.raises(FileNotFoundError):
    data.train_sentencepiece(str(tmp_path / 'missing.txt'),
                             str(tmp_path / 'x'))


def test_convert_to_unicode():
  out = next(data.ConvertToUnicode(keys=[0])(iter([(b'ab\xffc', b'x')])))
  assert out == ('abc', b'x')
