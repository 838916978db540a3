"""Trax/Tensor2Tensor ``.subword`` vocabularies: `SubwordTextEncoder`.

Reads the vocab files Trax ships (``en_8k.subword``, ``en_32k.subword``, ...)
and encodes/decodes exactly as T2T's ``SubwordTextEncoder`` does:

1. split text into alternating alphanumeric / non-alphanumeric tokens
   (Unicode categories L* and N* are alphanumeric), dropping a single space
   between two alphanumeric tokens;
2. escape each token: ``\\`` -> ``\\\\``, ``_`` -> ``\\u``, characters outside
   the vocab's alphabet (and newline) -> ``\\<code point>;``, then append
   ``_``;
3. cut each escaped token greedily into the longest subtokens in the vocab.

Decoding concatenates subtokens, splits on ``_``, unescapes, and re-inserts
the dropped spaces, so ``decode(encode(s)) == s`` for any string.
"""

import functools
import os
import re
import unicodedata
from typing import Iterable, List, Sequence

from retrax import local_paths
from retrax.errors import UserInputError

_UNESCAPE_REGEX = re.compile(r'\\u|\\\\|\\([0-9]+);')
_ESCAPE_CHARS = frozenset('\\_u;0123456789')
_UNDEFINED_CHAR = '\u3013'
_CACHE_LIMIT = 1 << 18


@functools.lru_cache(maxsize=1 << 16)
def _is_alnum(c: str) -> bool:
  return unicodedata.category(c)[0] in 'LN'


def split_tokens(text: str) -> List[str]:
  """T2T's invertible tokenizer: text -> alnum / non-alnum tokens.

  ``"Dude - that's so cool."`` ->
  ``['Dude', ' - ', 'that', "'", 's', 'so', 'cool', '.']``.
  """
  if not text:
    return []
  tokens = []
  start = 0
  prev = _is_alnum(text[0])
  for pos in range(1, len(text)):
    cur = _is_alnum(text[pos])
    if cur != prev:
      token = text[start:pos]
      if token != ' ' or start == 0:
        tokens.append(token)
      start = pos
    prev = cur
  tokens.append(text[start:])
  return tokens


def join_tokens(tokens: Sequence[str]) -> str:
  """Inverse of `split_tokens`: puts a space between adjacent alnum tokens."""
  out = []
  prev_alnum = False
  for i, token in enumerate(tokens):
    alnum = _is_alnum(token[0])
    if i > 0 and prev_alnum and alnum:
      out.append(' ')
    out.append(token)
    prev_alnum = alnum
  return ''.join(out)


def escape_token(token: str, alphabet: Iterable[str]) -> str:
  """Escapes `token` so it ends with the only ``_`` and uses only `alphabet`."""
  token = token.replace('\\', '\\\\').replace('_', '\\u')
  chars = [c if c in alphabet and c != '\n' else f'\\{ord(c)};' for c in token]
  return ''.join(chars) + '_'


def unescape_token(escaped: str) -> str:
  """Inverse of `escape_token` (the trailing ``_`` is optional)."""
  def match(m):
    if m.group(1) is None:
      return '_' if m.group(0) == '\\u' else '\\'
    try:
      return chr(int(m.group(1)))
    except (ValueError, OverflowError):
      return _UNDEFINED_CHAR
  trimmed = escaped[:-1] if escaped.endswith('_') else escaped
  return _UNESCAPE_REGEX.sub(match, trimmed)


class SubwordTextEncoder:
  """A T2T subword vocabulary read from a ``.subword`` file.

  The file holds one subtoken per line, optionally wrapped in single or
  double quotes; the id of a subtoken is its line number (0-based), so the
  usual files start with ``'<pad>'`` (0) and ``'<EOS>'`` (1).

  Example::

    vocab = SubwordTextEncoder('en_8k.subword')
    vocab.encode('I have a cat.')   # [139, 96, 12, 2217, 2, 21]
    vocab.decode([139, 96, 12, 2217, 2, 21])   # 'I have a cat.'

  Args:
    filename: path of the vocab file.

  Raises:
    FileNotFoundError: if the file does not exist.
    ValueError: if it holds no subtokens.
  """

  num_reserved_ids = 2

  def __init__(self, filename: str):
    self.filename = local_paths.check_local(os.fspath(filename),
                                            'SubwordTextEncoder')
    if not os.path.isfile(self.filename):
      raise FileNotFoundError(f'Subword vocab file {self.filename!r} not found.')
    subtokens = []
    with open(self.filename, encoding='utf-8', errors='ignore') as f:
      for line in f:
        s = line.rstrip()
        if s and s[0] == s[-1] and s[0] in '\'"':
          s = s[1:-1]
        subtokens.append(s)
    if not any(subtokens):
      raise UserInputError(f'Subword vocab file {self.filename!r} has no subtokens.')
    self._subtokens = subtokens
    self._max_subtoken_len = max(len(s) for s in subtokens)
    self._subtoken_to_id = {s: i for i, s in enumerate(subtokens) if s}
    self._alphabet = frozenset(c for s in subtokens for c in s) | _ESCAPE_CHARS
    self._cache: dict[str, List[int]] = {}

  @property
  def vocab_size(self) -> int:
    """Number of subtokens (lines of the file)."""
    return len(self._subtokens)

  @property
  def all_subtoken_strings(self):
    return tuple(self._subtokens)

  def encode(self, s) -> List[int]:
    """Encodes a string (or UTF-8 bytes, errors ignored) to subtoken ids."""
    if isinstance(s, bytes):
      s = s.decode('utf-8', errors='ignore')
    ids = []
    for token in split_tokens(s):
      ids.extend(self._token_ids(token))
    return ids

  def encode_without_tokenizing(self, token_text: str) -> List[int]:
    """Encodes `token_text` as one token (no alnum splitting)."""
    return list(self._token_ids(token_text))

  def _token_ids(self, token):
    ids = self._cache.get(token)
    if ids is None:
      ids = self._escaped_to_ids(escape_token(token, self._alphabet))
      if len(self._cache) >= _CACHE_LIMIT:
        self._cache.clear()
      self._cache[token] = ids
    return ids

  def _escaped_to_ids(self, escaped):
    """Greedy longest-prefix segmentation of an escaped token."""
    ids = []
    start, n = 0, len(escaped)
    while start < n:
      for end in range(min(n, start + self._max_subtoken_len), start, -1):
        i = self._subtoken_to_id.get(escaped[start:end])
        if i is not None:
          ids.append(i)
          start = end
          break
      else:
        raise UserInputError(
            f'{self.filename}: cannot segment {escaped[start:]!r}; the vocab '
            f'lacks a single-character subtoken for {escaped[start]!r}.')
    return tuple(ids)

  def decode(self, ids, strip_extraneous: bool = False) -> str:
    """Decodes subtoken ids to text; out-of-range ids decode to nothing.

    Args:
      ids: iterable of ints.
      strip_extraneous: drop trailing PAD (0) and EOS (1) ids first.
    """
    ids = [int(i) for i in ids]
    if strip_extraneous:
      while ids and ids[-1] in (0, 1):
        ids.pop()
    return join_tokens(self._ids_to_tokens(ids))

  def decode_list(self, ids) -> List[str]:
    """The subtoken string of each id."""
    return [self._id_to_string(int(i)) for i in ids]

  def _id_to_string(self, i):
    return self._subtokens[i] if 0 <= i < len(self._subtokens) else ''

  def _ids_to_tokens(self, ids):
    concatenated = ''.join(self._id_to_string(i) for i in ids)
    tokens = []
    for t in concatenated.split('_'):
      if t:
        unescaped = unescape_token(t + '_')
        if unescaped:
          tokens.append(unescaped)
    return tokens
