"""Trax's invertible text tokenizer (`trax.data.tokenizer`) and token counts over files.

`encode` splits text at every boundary between alphanumeric (Unicode L* and
N*) and other characters and drops single spaces between two alphanumeric
tokens; `decode` puts them back, so `decode(encode(s)) == s`.
"""

import collections
import glob
import logging
from typing import Dict, Iterator, List, Optional

from retrax.data import subword


def encode(text: str) -> List[str]:
  """`"Dude - that's so cool."` -> `['Dude', ' - ', 'that', "'", 's', 'so', 'cool', '.']`."""
  return subword.split_tokens(text)


def decode(tokens: List[str]) -> str:
  """Inverse of `encode`."""
  return subword.join_tokens(tokens)


def _read_filepattern(filepattern: str, max_lines: Optional[int] = None,
                      split_on_newlines: bool = True) -> Iterator[str]:
  """Texts of the files matching `filepattern` (sorted): stripped lines, or whole files.

  A `max_lines` > 0 stops after that many lines in all; without line
  splitting, the file being read then ends at that line.
  """
  filenames = sorted(glob.glob(filepattern))
  if not filenames:
    raise FileNotFoundError(f'No files match {filepattern!r}.')
  n_lines = 0
  for filename in filenames:
    with open(filename, encoding='utf-8') as f:
      if split_on_newlines:
        for line in f:
          yield line.strip()
          n_lines += 1
          if max_lines and n_lines >= max_lines:
            return
      elif not max_lines:
        yield f.read()
      else:
        doc = []
        for line in f:
          doc.append(line)
          n_lines += 1
          if n_lines >= max_lines:
            yield ''.join(doc)
            return
        yield ''.join(doc)


def corpus_token_counts(text_filepattern: str, corpus_max_lines: int,
                        split_on_newlines: bool = True) -> Dict[str, int]:
  """Counts of the `encode` tokens of the files matching `text_filepattern`."""
  counts: collections.Counter[str] = collections.Counter()
  for doc in _read_filepattern(text_filepattern, max_lines=corpus_max_lines,
                               split_on_newlines=split_on_newlines):
    counts.update(encode(doc))
  return counts


def vocab_token_counts(text_filepattern: str,
                       max_lines: int) -> Dict[str, int]:
  """`{token: count}` from `token,count` lines (split at the last comma).

  Other lines are skipped with a warning.
  """
  counts = {}
  for i, line in enumerate(_read_filepattern(text_filepattern,
                                             max_lines=max_lines)):
    if ',' not in line:
      logging.warning("Malformed vocab line #%d '%s'", i, line)
      continue
    token, count = line.rsplit(',', 1)
    counts[token] = int(count)
  return counts
