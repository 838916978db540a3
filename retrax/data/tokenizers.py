"""Tokenizers and the `Tokenize` / `Detokenize` stream functions.

Vocabulary types (the ``vocab_type`` argument, as in Trax):

* ``'char'`` - Trax's character level, which is UTF-8 *bytes*: ids 0..255
  (`ByteTextEncoder`); ``'bytes'`` is an alias.
* ``'subword'`` - a Trax/T2T ``.subword`` file (`SubwordTextEncoder`).
* ``'sentencepiece'`` - a SentencePiece ``.model`` file
  (`SentencePieceVocabulary`; needs the ``sentencepiece`` package). Train one
  from local text with `train_sentencepiece`.

Any other encoder object with ``encode``/``decode``/``vocab_size`` (such as
`CharTextEncoder`, for an alphabet of Unicode characters) can be passed as
``vocab=`` instead.

Vocab files are local: ``os.path.join(vocab_dir, vocab_file)``, or
`vocab_file` alone when `vocab_dir` is None. Trax's default ``vocab_dir``,
``gs://trax-ml/vocabs/``, is not read (no TensorFlow, no network): download
the file once and point `vocab_dir` at its folder.
"""

import functools
import itertools
import os
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from retrax import local_paths
from retrax.configurable import configurable
from retrax.errors import InputValueError
from retrax.errors import UserInputError
from retrax.errors import one_line
from retrax.data.subword import SubwordTextEncoder
from retrax.validation import ArgumentValueError

_RESERVED_TOKENS_BYTES = (b'<pad>', b'<EOS>')
VOCAB_TYPES = ('char', 'bytes', 'subword', 'sentencepiece')


class ByteTextEncoder:
  """UTF-8 bytes as ids: ``id = byte + num_reserved_ids`` (Trax's 'char').

  Args:
    num_reserved_ids: ids below this are reserved (0 -> ``<pad>``,
      1 -> ``<EOS>`` when decoding). Trax's class default is 2; `tokenize`
      uses 0.
  """

  def __init__(self, num_reserved_ids: int = 2):
    if not 0 <= num_reserved_ids <= len(_RESERVED_TOKENS_BYTES):
      raise ArgumentValueError(f'num_reserved_ids must be 0, 1 or 2, got '
                               f'{num_reserved_ids}.')
    self.num_reserved_ids = num_reserved_ids

  @property
  def vocab_size(self) -> int:
    return 256 + self.num_reserved_ids

  def encode(self, s) -> List[int]:
    """A str (encoded as UTF-8) or bytes -> list of ids."""
    return self.encode_array(s).tolist()

  def encode_array(self, s) -> np.ndarray:
    """Like `encode` but returns an int64 array (fast path)."""
    data = s.encode('utf-8') if isinstance(s, str) else bytes(s)
    ids = np.frombuffer(data, dtype=np.uint8).astype(np.int64)
    if self.num_reserved_ids:
      ids += self.num_reserved_ids
    return ids

  def decode(self, ids, strip_extraneous: bool = False) -> str:
    """Ids -> text; invalid UTF-8 becomes U+FFFD (errors='replace')."""
    return b''.join(self.decode_list(ids, strip_extraneous)).decode(
        'utf-8', 'replace')

  def decode_list(self, ids, strip_extraneous: bool = False) -> List[bytes]:
    """Ids -> one ``bytes`` object per id (reserved ids -> ``b'<pad>'``...)."""
    ids = [int(i) for i in ids]
    n = self.num_reserved_ids
    if strip_extraneous:
      while ids and 0 <= ids[-1] < n:
        ids.pop()
    out = []
    for i in ids:
      if 0 <= i < n:
        out.append(_RESERVED_TOKENS_BYTES[i])
      elif n <= i < n + 256:
        out.append(bytes((i - n,)))
      else:
        raise InputValueError(f'Byte id {i} is outside [0, {n + 256}) for '
                              f'num_reserved_ids={n}.')
    return out


class CharTextEncoder:
  """Characters of a fixed alphabet as ids: ``id = index + num_reserved_ids``.

  Example::

    enc = CharTextEncoder('abc ', num_reserved_ids=1)
    enc.encode('cab a')   # [3, 1, 2, 4, 1]

  Args:
    alphabet: the characters, each once (a str or a sequence of 1-char strs).
    num_reserved_ids: ids reserved below the alphabet (decode skips them).
    oov_id: id for characters outside the alphabet; None raises ValueError.
  """

  def __init__(self, alphabet: Sequence[str], num_reserved_ids: int = 0,
               oov_id: Optional[int] = None):
    chars = list(alphabet)
    if not chars or any(len(c) != 1 for c in chars):
      raise ArgumentValueError('CharTextEncoder needs a non-empty alphabet of single '
                               'characters.')
    if len(set(chars)) != len(chars):
      raise ArgumentValueError('CharTextEncoder alphabet has repeated characters.')
    self.alphabet = ''.join(chars)
    self.num_reserved_ids = num_reserved_ids
    self.oov_id = oov_id
    self._ids = {c: i + num_reserved_ids for i, c in enumerate(chars)}

  @classmethod
  def from_text(cls, texts: Iterable[str], **kwargs) -> 'CharTextEncoder':
    """Builds the alphabet (sorted) from all characters in `texts`."""
    chars: set[str] = set()
    for t in texts:
      chars.update(t)
    return cls(sorted(chars), **kwargs)

  @property
  def vocab_size(self) -> int:
    return self.num_reserved_ids + len(self.alphabet)

  def encode(self, s) -> List[int]:
    if isinstance(s, bytes):
      s = s.decode('utf-8', 'replace')
    if self.oov_id is not None:
      return [self._ids.get(c, self.oov_id) for c in s]
    try:
      return [self._ids[c] for c in s]
    except KeyError as e:
      raise InputValueError(f'Character {e.args[0]!r} is not in the alphabet; pass '
                            f'oov_id= to map unknown characters.') from None

  def decode(self, ids, strip_extraneous: bool = False) -> str:
    del strip_extraneous
    n = self.num_reserved_ids
    return ''.join(self.alphabet[i - n] for i in (int(j) for j in ids)
                   if n <= i < n + len(self.alphabet))


def _import_sentencepiece():
  try:
    import sentencepiece
  except ImportError as e:
    raise ImportError(
        'SentencePiece vocabularies need the sentencepiece package: '
        '`pip install sentencepiece`.') from e
  return sentencepiece


class SentencePieceVocabulary:
  """A SentencePiece model, with T5/seqio's conventions as Trax uses them.

  ``vocab_size = pieces + extra_ids``. Decoding maps ids >= the number of
  pieces to UNK and cuts after the first EOS (as seqio does).

  Args:
    model_file: path of a ``.model`` file.
    extra_ids: extra ids appended after the pieces (T5 sentinels).

  Raises:
    FileNotFoundError: if `model_file` does not exist.
    ImportError: if sentencepiece is not installed.
  """

  def __init__(self, model_file: str, extra_ids: int = 0):
    model_file = local_paths.check_local(os.fspath(model_file),
                                         'SentencePieceVocabulary')
    if not os.path.isfile(model_file):
      raise FileNotFoundError(f'SentencePiece model {model_file!r} not found.')
    spm = _import_sentencepiece()
    self.model_file = model_file
    self.extra_ids = extra_ids
    try:
      self._sp = spm.SentencePieceProcessor(model_file=model_file)
    except (RuntimeError, OSError) as e:  # Not a ModelProto.
      raise UserInputError(
          f'{model_file} is not a SentencePiece model ({one_line(e, 100)}); '
          'pass the .model file that spm_train wrote.') from None
    self.piece_size = self._sp.get_piece_size()

  def _id_or_none(self, i):
    return None if i < 0 else i

  @property
  def unk_id(self) -> Optional[int]:
    return self._id_or_none(self._sp.unk_id())

  @property
  def eos_id(self) -> Optional[int]:
    return self._id_or_none(self._sp.eos_id())

  @property
  def pad_id(self) -> Optional[int]:
    return self._id_or_none(self._sp.pad_id())

  @property
  def vocab_size(self) -> int:
    return self.piece_size + self.extra_ids

  def encode(self, s) -> List[int]:
    if isinstance(s, bytes):
      s = s.decode('utf-8', 'replace')
    return self._sp.encode(s)

  def encode_batch(self, texts: Sequence[Any], num_threads: int = -1):
    """Encodes many strings at once (C++ threads); returns lists of ids."""
    texts = [t.decode('utf-8', 'replace') if isinstance(t, bytes) else t
             for t in texts]
    return self._sp.encode(texts, num_threads=num_threads)

  def decode(self, ids) -> str:
    ids = [int(i) for i in ids]
    if self.unk_id is not None:
      ids = [self.unk_id if i >= self.piece_size else i for i in ids]
    if self.eos_id is not None and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id) + 1]
    return self._sp.decode(ids)


def train_sentencepiece(text: Any,
                        model_prefix: str,
                        vocab_size: int = 8000,
                        model_type: str = 'unigram',
                        character_coverage: float = 1.0,
                        pad_id: int = 0,
                        eos_id: int = 1,
                        unk_id: int = 2,
                        bos_id: int = -1,
                        input_sentence_size: int = 0,
                        **trainer_kwargs: Any) -> str:
  """Trains a SentencePiece model on local text; returns the ``.model`` path.

  The special ids default to T5's layout (pad 0, EOS 1, UNK 2, no BOS), which
  `AddLossWeights(id_to_mask=0)` and Trax's decoding expect.

  Args:
    text: a file path, a list of paths, an iterable of strings, or a source
      (a callable such as `TextLines(...)`, called with None).
    model_prefix: output prefix; writes ``<prefix>.model`` and
      ``<prefix>.vocab``.
    vocab_size: number of pieces.
    model_type: 'unigram', 'bpe', 'char' or 'word'.
    character_coverage: fraction of characters covered by the model.
    pad_id, eos_id, unk_id, bos_id: special ids (-1 disables one).
    input_sentence_size: sample this many sentences (0: use all).
    **trainer_kwargs: other ``SentencePieceTrainer.train`` options.

  Raises:
    ImportError: if sentencepiece is not installed.
    FileNotFoundError: for a missing input path.
  """
  spm = _import_sentencepiece()
  kwargs = dict(model_prefix=os.fspath(model_prefix), vocab_size=vocab_size,
                model_type=model_type, character_coverage=character_coverage,
                pad_id=pad_id, eos_id=eos_id, unk_id=unk_id, bos_id=bos_id,
                input_sentence_size=input_sentence_size,
                minloglevel=trainer_kwargs.pop('minloglevel', 2))
  kwargs.update(trainer_kwargs)
  if isinstance(text, (str, os.PathLike)) or (
      isinstance(text, (list, tuple)) and text and
      all(isinstance(t, (str, os.PathLike)) and os.path.isfile(t)
          for t in text)):
    paths = [text] if isinstance(text, (str, os.PathLike)) else list(text)
    for p in paths:
      if not os.path.isfile(p):
        raise FileNotFoundError(f'train_sentencepiece: no file at {p!r}.')
    kwargs['input'] = ','.join(os.fspath(p) for p in paths)
  else:
    if callable(text):
      text = text(None)
    kwargs['sentence_iterator'] = (
        t.decode('utf-8', 'replace') if isinstance(t, bytes) else t
        for t in text)
  spm.SentencePieceTrainer.train(**kwargs)
  return os.fspath(model_prefix) + '.model'


@functools.lru_cache(maxsize=16)
def _load_vocab(vocab_type, path, extra_ids, mtime_ns):
  del mtime_ns  # Part of the cache key only: a rewritten file is reloaded.
  if vocab_type == 'subword':
    return SubwordTextEncoder(path)
  return SentencePieceVocabulary(path, extra_ids=extra_ids)


def _get_vocab(vocab_type='subword', vocab_file=None, vocab_dir=None,
               extra_ids=0):
  """Returns the encoder for `vocab_type`; file-based ones are cached."""
  if vocab_type not in VOCAB_TYPES:
    raise ArgumentValueError(f'vocab_type must be one of {VOCAB_TYPES}, got '
                             f'{vocab_type!r} (Trax\'s "bert" vocabularies are not '
                             f'supported).')
  if vocab_type in ('char', 'bytes'):
    return ByteTextEncoder(num_reserved_ids=0)
  if vocab_file is None:
    raise ArgumentValueError(f'vocab_type={vocab_type!r} needs vocab_file (and '
                             f'optionally vocab_dir).')
  path = os.path.join(vocab_dir, vocab_file) if vocab_dir else vocab_file
  path = local_paths.check_local(os.fspath(path), f'vocab ({vocab_type})')
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f'Vocab file {path!r} not found (vocab_type={vocab_type!r}). Trax '
        f'looks in gs://trax-ml/vocabs/ by default; retrax needs a local '
        f'copy: pass vocab_dir=<its folder> or a full path as vocab_file.')
  path = os.path.abspath(path)
  return _load_vocab(vocab_type, path, extra_ids, os.stat(path).st_mtime_ns)


def _encoder(vocab, vocab_type, vocab_file, vocab_dir):
  return vocab if vocab is not None else _get_vocab(vocab_type, vocab_file,
                                                   vocab_dir)


def _array_encoder(vocab, n_reserved_ids):
  """Returns ``text -> int64 ids + n_reserved_ids`` for an encoder object."""
  encode_array = getattr(vocab, 'encode_array', None)
  if encode_array is None:
    encode_array = lambda x: np.asarray(vocab.encode(x), dtype=np.int64)
  if not n_reserved_ids:
    return encode_array
  return lambda x: encode_array(x) + n_reserved_ids


def _map_keys(example, keys, fn):
  """Applies `fn` to tuple/dict entries in `keys` (all if None), or to `example`."""
  if isinstance(example, (list, tuple)):
    return tuple(fn(x) if keys is None or i in keys else x
                 for i, x in enumerate(example))
  if isinstance(example, dict):
    return {k: fn(v) if keys is None or k in keys else v
            for k, v in example.items()}
  return fn(example)


class _Slot:
  """Placeholder for the i-th string of a group in `_tokenize_grouped`."""
  __slots__ = ('index',)

  def __init__(self, index):
    self.index = index


def _collect_texts(example, keys, texts):
  """Moves the strings to encode into `texts`, leaving `_Slot`s behind."""
  def slot(x):
    texts.append(x)
    return _Slot(len(texts) - 1)
  if isinstance(example, (str, bytes)):
    return slot(example)
  return _map_keys(example, keys, slot)


def _fill_slots(shell, keys, arrays):
  """Inverse of `_collect_texts`: puts the encoded arrays in place."""
  fill = lambda v: arrays[v.index]
  return fill(shell) if isinstance(shell, _Slot) else _map_keys(shell, keys,
                                                                fill)


def _tokenize_grouped(stream, keys, encoder, n_reserved_ids, group_size):
  """Like the loop in `tokenize`, encoding `group_size` examples per call."""
  iterator = iter(stream)
  while True:
    group = list(itertools.islice(iterator, group_size))
    if not group:
      return
    texts: list = []
    shells = [_collect_texts(ex, keys, texts) for ex in group]
    arrays = [np.asarray(ids, dtype=np.int64) + n_reserved_ids
              for ids in encoder.encode_batch(texts)]
    for shell in shells:
      yield _fill_slots(shell, keys, arrays)


def tokenize(stream: Iterable[Any],
             keys: Optional[Sequence[Any]] = None,
             vocab_type: str = 'subword',
             vocab_file: Optional[str] = None,
             vocab_dir: Optional[str] = None,
             n_reserved_ids: int = 0,
             vocab: Any = None,
             group_size: int = 1) -> Iterator[Any]:
  """Maps strings in a stream to int64 arrays of token ids.

  Examples may be strings (or bytes), tuples or dicts; `keys` selects the
  tuple indices or dict keys to tokenize (default: all). Ids are shifted by
  `n_reserved_ids` so that ids below it stay free (e.g. 0 for padding).

  Args:
    stream: iterable of examples.
    keys: which entries to tokenize.
    vocab_type: 'subword', 'sentencepiece', 'char' or 'bytes'.
    vocab_file: vocab file name (subword/sentencepiece).
    vocab_dir: folder of `vocab_file`.
    n_reserved_ids: offset added to every id.
    vocab: an encoder object to use instead of `vocab_type` (retrax only).
    group_size: with a SentencePiece vocab, encode this many examples per
      call, on all cores (retrax only; 2-3x faster, but reads `group_size`
      examples ahead, which matters for a `CountAndSkip` placed upstream).

  Yields:
    Examples with the selected strings replaced by int64 arrays (an empty
    string gives an empty int64 array; Trax gives float64 there).

  Raises:
    ValueError / FileNotFoundError: for a bad vocab_type or missing file,
      before the first example is read.
  """
  encoder = _encoder(vocab, vocab_type, vocab_file, vocab_dir)
  if group_size < 1:
    raise ArgumentValueError(f'group_size must be >= 1, got {group_size}.')
  if group_size > 1 and hasattr(encoder, 'encode_batch'):
    yield from _tokenize_grouped(stream, keys, encoder, n_reserved_ids,
                                 group_size)
    return
  encode = _array_encoder(encoder, n_reserved_ids)
  for example in stream:
    if isinstance(example, (str, bytes)):
      yield encode(example)
    else:
      yield _map_keys(example, keys, encode)


@configurable('trax.data')
def Tokenize(keys: Optional[Sequence[Any]] = None,
             vocab_type: str = 'subword',
             vocab_file: Optional[str] = None,
             vocab_dir: Optional[str] = None,
             n_reserved_ids: int = 0,
             vocab: Any = None,
             group_size: int = 1) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function tokenizing examples; see `tokenize`.

  The vocabulary is loaded here, so a missing file fails at construction.
  """
  encoder = _encoder(vocab, vocab_type, vocab_file, vocab_dir)
  if group_size < 1:
    raise ArgumentValueError(f'group_size must be >= 1, got {group_size}.')
  return lambda g: tokenize(g, keys=keys, n_reserved_ids=n_reserved_ids,
                            vocab=encoder, group_size=group_size)


def detokenize(x: Any,
               vocab_type: str = 'subword',
               vocab_file: Optional[str] = None,
               vocab_dir: Optional[str] = None,
               n_reserved_ids: int = 0,
               vocab: Any = None) -> str:
  """Maps a list/array of ids back to text; the inverse of `tokenize`."""
  encoder = _encoder(vocab, vocab_type, vocab_file, vocab_dir)
  ids = np.asarray(x, dtype=np.int64).reshape(-1) - n_reserved_ids
  return str(encoder.decode(ids.tolist()))


def Detokenize(keys: Optional[Sequence[Any]] = None,
               vocab_type: str = 'subword',
               vocab_file: Optional[str] = None,
               vocab_dir: Optional[str] = None,
               n_reserved_ids: int = 0,
               vocab: Any = None) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function mapping id arrays at `keys` back to strings."""
  encoder = _encoder(vocab, vocab_type, vocab_file, vocab_dir)

  def _detok(stream):
    for example in stream:
      yield _map_keys(example, keys, lambda ids: detokenize(
          ids, n_reserved_ids=n_reserved_ids, vocab=encoder))
  return _detok


def vocab_size(vocab_type: str = 'subword',
               vocab_file: Optional[str] = None,
               vocab_dir: Optional[str] = None,
               n_reserved_ids: int = 0,
               vocab: Any = None) -> int:
  """Number of ids a model must predict: vocabulary size + `n_reserved_ids`."""
  return _encoder(vocab, vocab_type, vocab_file, vocab_dir).vocab_size + (
      n_reserved_ids)


@configurable('trax.data')
def ConvertToUnicode(keys: Optional[Sequence[Any]] = None
                     ) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Decodes UTF-8 bytes at `keys` to str, ignoring undecodable bytes (Trax)."""
  def _to_str(x):
    return x if isinstance(x, str) else str(bytes(x), 'utf-8', 'ignore')

  def _convert(stream):
    for example in stream:
      yield _map_keys(example, keys, _to_str)
  return _convert


def sentencepiece_tokenize(stream: Iterable[Any], spm_path: str,
                           extra_ids: int = 0) -> Iterator[np.ndarray]:
  """Tokenizes strings (or 1-tuples of them) with a SentencePiece model."""
  if spm_path is None:
    raise ArgumentValueError('sentencepiece_tokenize needs spm_path (Trax defaults to '
                             'T5\'s model on GCS, which retrax does not read).')
  encoder = _get_vocab('sentencepiece', spm_path, None, extra_ids)
  for example in stream:
    if isinstance(example, tuple):
      example = example[0]
    yield np.asarray(encoder.encode(example), dtype=np.int64)


@configurable('trax.data')
def SentencePieceTokenize(spm_path: Optional[str] = None,
                          extra_ids: int = 0
                          ) -> Callable[[Iterable[Any]], Iterator[Any]]:
  """Returns a stream function; see `sentencepiece_tokenize`."""
  if spm_path is None:
    raise ArgumentValueError('SentencePieceTokenize needs spm_path.')
  return lambda g: sentencepiece_tokenize(g, spm_path, extra_ids)
