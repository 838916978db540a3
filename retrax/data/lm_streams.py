"""`text_streams`: language-model data from local text, where Trax used T2T.

Trax's LM configs read Tensor2Tensor problems (``t2t_enwik8_l65k``,
``t2t_languagemodel_lm1b32k``, ``t2t_languagemodel_ptb10k``), which only T2T
with TensorFlow generates. `text_streams` gives `batcher` the same
``(train_fn, eval_fn)`` pair over local text files: each line, or each chunk
of `chunk_size` characters (bytes with ``encoding=None``), tokenized, is one
``(ids, ids)`` example, as T2T's LM problems feed ``targets`` as inputs.
"""

import itertools
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple, Union

from retrax.configurable import configurable
from retrax.data.preprocessing import no_preprocess
from retrax.data.sources import TextChunks
from retrax.data.sources import TextLines
from retrax.data.tfds import dataset_to_stream
from retrax.data.tokenizers import Tokenize
from retrax.data.transforms import shuffle
from retrax.errors import UserInputError

Paths = Union[str, Sequence[str]]


@configurable('trax.data')
def text_streams(train_path: Optional[Paths] = None,
                 eval_path: Optional[Paths] = None,
                 vocab_type: str = 'char',
                 vocab_file: Optional[str] = None,
                 vocab_dir: Optional[str] = None,
                 n_reserved_ids: int = 0,
                 chunk_size: Optional[int] = None,
                 encoding: Optional[str] = 'utf-8',
                 preprocess_fn: Optional[Callable[..., Any]] = no_preprocess,
                 shuffle_buffer_size: int = 1024
                 ) -> Tuple[Callable[[], Iterator[Any]], Callable[[], Iterator[Any]]]:
  """`(train_fn, eval_fn)`: LM examples ``(ids, ids)`` from local text files.

  For `batcher` in place of `data_streams` with a ``'t2t_...'`` LM problem,
  e.g. enwik8 as ``t2t_enwik8_l65k`` gave it (bytes + 2 reserved ids, in
  65,536-byte sequences)::

    inputs = trax.data.batcher(trax.data.text_streams(
        'enwik8/train.txt', 'enwik8/valid.txt', vocab_type='bytes',
        n_reserved_ids=2, chunk_size=65536, encoding=None),
        variable_shapes=False)

  Both streams repeat their files forever; the training one is shuffled with
  a queue of `shuffle_buffer_size`. Empty lines are skipped.

  Args:
    train_path: a text file, a folder of them, or a list (see `TextLines`).
    eval_path: the same for evaluation (default: `train_path`).
    vocab_type: 'char'/'bytes' (UTF-8 bytes), 'subword' or 'sentencepiece'
      (with `vocab_file`), as in `Tokenize`.
    vocab_file: the subword or SentencePiece vocabulary.
    vocab_dir: the folder of `vocab_file`.
    n_reserved_ids: added to every id (ids below stay free, 0 for padding).
    chunk_size: examples of this many characters instead of lines.
    encoding: the files' encoding; None reads bytes.
    preprocess_fn: ``fn(pairs, training)`` on ``({'targets': ids}, ids)``
      pairs, as `data_streams` gives them (e.g. `lm1b_preprocess` to drop
      long examples).
    shuffle_buffer_size: the training shuffle queue size.
  """
  if train_path is None:
    raise UserInputError('text_streams needs train_path, a local text file '
                         "or folder (gin: text_streams.train_path = '...').")
  def source(path):
    if chunk_size:
      return TextChunks(path, chunk_size, encoding=encoding)
    return TextLines(path, encoding=encoding, skip_empty=True)
  sources = {True: source(train_path),
             False: source(train_path if eval_path is None else eval_path)}
  tokenize = Tokenize(vocab_type=vocab_type, vocab_file=vocab_file,
                      vocab_dir=vocab_dir, n_reserved_ids=n_reserved_ids)
  return _streams(sources, tokenize, preprocess_fn or no_preprocess,
                  shuffle_buffer_size)


def _streams(sources, tokenize, preprocess_fn, shuffle_buffer_size):
  """`text_streams`' `(train_fn, eval_fn)` over its train and eval sources."""

  def pairs(training):
    for _ in itertools.count():
      n = 0
      for ids in tokenize(sources[training]()):
        n += 1
        yield {'targets': ids}, ids
      if not n:
        raise UserInputError(f'text_streams: {"train" if training else "eval"} '
                             'files hold no text.')

  def stream(training):
    dataset = preprocess_fn(pairs(training), training)
    if training:
      dataset = shuffle(dataset, shuffle_buffer_size)
    return dataset_to_stream(dataset, 'targets')

  return (lambda: stream(True)), (lambda: stream(False))
