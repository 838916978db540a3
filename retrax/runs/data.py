"""The data a run directory records: where `retrax eval` and `sample` get batches.

Every run holds its model (`model.json`) and checkpoints (`retrax.run_layout`
lists the files); what it trained on is recorded by the program that made it:

  run_config.json   `retrax train`: the duplication task or a text file
                    (`jobs.build_inputs`)
  config.gin        `python -m retrax.trainer`: the configured `train.inputs`
                    (Trax's default `batcher` when unbound)
  (nothing)         a `training.Loop` over the program's own streams, and the
                    runs `retrax convert` writes: `eval --data text:FILE`
                    names the data (`text_eval_stream`)

Batches are Trax's `(inputs..., targets, weights)`: the model takes its
`n_in` first items.
"""

import copy
import importlib.util
import os

from retrax.data import tasks
from retrax.errors import one_line
from retrax.errors import UserInputError
from retrax.run_layout import GIN_CONFIG_FILE
from retrax.run_layout import TOKENIZER_FILE
from retrax.runs import config as config_lib


class RunDataError(UserInputError):
  """A run records no data to evaluate or prompt with, or its record is unusable."""


def parse_gin_file(path):
  """Parses a run's `config.gin` into gin's config (replacing it: no binding
  of another config may reach the run's); returns the gin module.

  A config.gin is a program, as every gin file is (its imports run
  modules): read only runs you trust.
  """
  try:
    import gin
  except ImportError:
    raise RunDataError(f'{path}: reading a gin run needs the gin-config '
                       'package: pip install "retrax[gin]".') from None
  from retrax import compat
  compat.install()  # config.gin imports `trax.*` and names Trax's functions.
  gin.clear_config()
  try:
    gin.parse_config_file(path)
  except (ValueError, SyntaxError, OSError, ImportError) as e:
    raise RunDataError(f'{path}: {one_line(e)}') from None
  return gin


def gin_configured(gin, path, name):
  """The function gin binds to `name` (e.g. 'train.model'), or None."""
  try:
    reference = gin.query_parameter(name)
  except ValueError:
    return None
  if not callable(reference) and not hasattr(reference, 'configurable'):
    raise RunDataError(f'{path}: {name} is {reference!r:.60}, not a '
                       'configurable reference (@name).')
  return copy.deepcopy(reference)  # The configured function itself.


def gin_inputs(directory):
  """The `Inputs` of a gin run: its `config.gin`'s `train.inputs` (Trax's
  default `batcher` where unbound), or None without a config.gin."""
  path = os.path.join(directory, GIN_CONFIG_FILE)
  if not os.path.isfile(path):
    return None
  gin = parse_gin_file(path)
  from retrax.data import inputs as data_inputs
  inputs = gin_configured(gin, path, 'train.inputs') or data_inputs.batcher
  try:
    if callable(inputs) and not hasattr(inputs, 'eval_stream'):
      inputs = inputs()
  except (ValueError, OSError, ImportError) as e:
    raise RunDataError(f'{path}: train.inputs: {one_line(e)}') from None
  if not hasattr(inputs, 'eval_stream'):
    raise RunDataError(f'{path}: train.inputs gives a {type(inputs).__name__}'
                       ', not an Inputs with an eval_stream.')
  return inputs


SENTENCEPIECE_EXTRA = "pip install 'retrax[tokenizers]'"


def sentencepiece_installed():
  """Whether the sentencepiece package (retrax's `tokenizers` extra) is there."""
  return importlib.util.find_spec('sentencepiece') is not None


def tokenizer_file(directory):
  """The `TextTokenizer` of the run's `tokenizer.model` (SentencePiece), or
  None: no such file, or no sentencepiece package to read it with (then the
  run takes token ids, and `tokenizer_unavailable` says what to install)."""
  path = os.path.join(directory, TOKENIZER_FILE)
  if os.path.isfile(path) and sentencepiece_installed():
    return config_lib.open_tokenizer('sentencepiece:' + path)
  return None


def tokenizer_unavailable(directory, what):
  """A RunDataError when the run holds a `tokenizer.model` that cannot be
  read without the sentencepiece package (`what` needs it), else None."""
  path = os.path.join(directory, TOKENIZER_FILE)
  if os.path.isfile(path) and not sentencepiece_installed():
    return RunDataError(
        f'{what}: the run\'s tokenizer ({path}) is a SentencePiece model, and '
        f'the sentencepiece package is not installed: {SENTENCEPIECE_EXTRA}.')
  return None


def text_eval_stream(data, length, batch_size, tokenizer=None):
  """Batches of `length` ids walking all of text file `data` ('text:FILE')."""
  if not data.startswith('text:'):
    raise RunDataError(f'--data {data!r}: expected text:FILE (a UTF-8 text '
                       'file to evaluate on).')
  return tasks.text_eval_batches(data[len('text:'):], length, batch_size,
                                 tokenizer)


def no_data_error(directory):
  """The error for a run that records no data and was given none."""
  return RunDataError(
      f'{directory} records no data (a Loop over a program\'s own streams, '
      'or a converted run): name some with --data text:FILE.')
