"""A run directory read back: `load_run` (`retrax.load_run`) and its settings.

`load_run` rebuilds a run's model in any mode with its latest weights, like
Hugging Face's ``from_pretrained`` for a local directory::

    run = retrax.load_run('runs/text', mode='predict')
    run.model, run.tokenizer, run.config, run.checkpoint

It reads ``model.json`` (the constructor every run records: `retrax
train`, `python -m retrax.trainer`, a `training.Loop`, `retrax convert`; see
`retrax.models.registry`) or, for old runs of `retrax train`, the run's
`RunConfig` (`config_of_run`, `build_model`).
"""

import dataclasses
import functools
import os
from typing import Any, Optional, Union

import jax
import numpy as np

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.checkpoints import layer_io
from retrax.checkpoints import tree
from retrax.checkpoints.errors import CheckpointFormatError
from retrax.data import tasks
from retrax.errors import read_json
from retrax.models import registry
from retrax.run_layout import CONFIG_FILE
from retrax.run_layout import MODEL_FILE
from retrax.run_layout import TOKENIZER_FILE
from retrax.runs import config as config_lib
from retrax.runs import data as run_data
from retrax.supervised import checkpointing


def build_model(config, mode='train'):
  """The model a RunConfig describes, in `mode`."""
  m = config.model
  if m.name == 'TransformerLM':
    return models.TransformerLM(
        vocab_size=m.vocab_size, d_model=m.d_model, d_ff=m.d_ff,
        n_layers=m.n_layers, n_heads=m.n_heads, max_len=m.length,
        dropout=m.dropout, mode=mode)
  attention: Any  # A layer class, or one with some arguments bound.
  if m.attention == 'lsh':
    attention = functools.partial(
        tl.LSHSelfAttention, chunk_len=m.chunk_len, n_hashes=m.n_hashes,
        n_chunks_before=1, predict_mem_len=m.length,
        predict_drop_len=m.length)
  elif m.attention == 'local':
    attention = functools.partial(
        tl.SelfAttention, chunk_len=m.chunk_len, n_chunks_before=1,
        predict_mem_len=m.length, predict_drop_len=m.length)
  else:
    attention = tl.CausalAttention
  return models.ReformerLM(
      vocab_size=m.vocab_size, d_model=m.d_model, d_ff=m.d_ff,
      d_attention_key=m.d_head, d_attention_value=m.d_head,
      n_layers=m.n_layers, n_heads=m.n_heads, dropout=m.dropout,
      max_len=m.length, attention_type=attention, mode=mode)


def tokenizer_of_run(config):
  """The `TextTokenizer` of a text run (None for the duplication task).

  A SentencePiece model is read from the run's own copy (`TOKENIZER_FILE`,
  written by `train`) when there is one, so a moved run keeps working.
  """
  if not config.data.source.startswith('text:'):
    return None
  spec = config.data.tokenizer
  copy = os.path.join(config.train.output_dir, TOKENIZER_FILE)
  if spec.startswith('sentencepiece:') and os.path.exists(copy):
    spec = 'sentencepiece:' + copy
  return config_lib.open_tokenizer(spec)


def read_config_file(path):
  """The flat keys of a run's `run_config.json` (a dict), or a one-line error."""
  values = read_json(path, config_lib.ConfigError, 'it holds the run\'s '
                     'settings: restore it, or train into a new directory.')
  if not isinstance(values, dict):
    raise config_lib.ConfigError(f'{path} does not hold a dict of settings.')
  return values


def config_of_run(output_dir):
  """The RunConfig saved in a run directory (its `output_dir` set to that directory).

  The saved `output_dir` may be relative to where training ran; the run is
  found where it is now (moved, or named from another working directory).
  """
  path = os.path.join(output_dir, CONFIG_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{output_dir} is not a retrax run directory (no '
                            f'{CONFIG_FILE}); train one with `retrax train '
                            f'--output_dir {output_dir}`.')
  values = read_config_file(path)
  unknown = sorted(set(values) - set(config_lib.KEYS))
  if unknown:
    raise config_lib.ConfigError(f'{path} has unknown keys {unknown}.')
  values['output_dir'] = os.fspath(output_dir)
  return config_lib.RunConfig.from_dict(values)


@dataclasses.dataclass
class Run:
  """What `load_run` returns.

  Attributes:
    model: the model in the requested mode with the run's latest weights.
    tokenizer: a `retrax.data.tasks.TextTokenizer` for text runs and runs
      holding a `tokenizer.model` (`retrax convert` of a Hugging Face
      directory with a `spiece.model`), else None; None too for a run with a
      `tokenizer.model` but no run_config.json where the sentencepiece
      package is not installed.
    config: the CLI's `RunConfig` for runs of `retrax train`, else None.
    checkpoint: the checkpoint the weights came from.
    directory: the run directory.
    input_signature: the input signature the checkpoint records (the
      training batch's).
  """
  model: tl.Layer
  tokenizer: Optional[tasks.TextTokenizer]
  config: Optional[config_lib.RunConfig]
  checkpoint: str
  directory: str
  input_signature: Any = None


def _latest_checkpoint(directory):
  path = checkpointing.find_latest_valid(directory)
  if path is None:
    path = checkpointing.trax_checkpoint_path(directory)
  if path is None:
    raise FileNotFoundError(f'{directory} holds no valid checkpoint; train '
                            'first (`retrax train` or a `Loop` with '
                            'output_dir).')
  return path


def _signature(stored, n_in, mode, batch_size):
  """The stored input signature with batch `batch_size`.

  To predict, the last input (a language model's tokens, an
  encoder-decoder's targets) has length 1: decoding feeds one position at a
  time. An encoder-decoder's source keeps its length (its first call reads
  the whole source).
  """
  one = not isinstance(stored, (list, tuple))
  items = [stored] if one else list(stored)[:n_in]
  out = []
  for i, s in enumerate(items):
    shape = (batch_size,) + tuple(s.shape[1:])
    if (mode == 'predict' and i == len(items) - 1 and len(shape) == 2 and
        np.issubdtype(np.dtype(s.dtype), np.integer)):
      shape = (batch_size, 1)
    out.append(shapes.ShapeDtype(shape, s.dtype))
  return out[0] if one or len(out) == 1 else tuple(out)


def _build(directory, mode):
  """(model, config, tokenizer) of a run directory, not yet with weights."""
  model_file = os.path.join(directory, MODEL_FILE)
  config = tokenizer = None
  if os.path.exists(os.path.join(directory, CONFIG_FILE)):
    config = config_of_run(directory)
    tokenizer = tokenizer_of_run(config)
  else:
    tokenizer = run_data.tokenizer_file(directory)
  if os.path.exists(model_file):
    return registry.build_from_file(model_file, mode), config, tokenizer
  if config is not None:
    return build_model(config, mode), config, tokenizer
  raise FileNotFoundError(
      f'{directory} is not a retrax run directory (no {MODEL_FILE}): runs '
      'come from `retrax train`, `python -m retrax.trainer`, `retrax convert` '
      'and Loops over a retrax.models constructor with JSON arguments; for '
      'another model, rebuild it yourself and call model.init_from_file.')


def load_run(directory: Union[str, os.PathLike], mode: str = 'predict',
             batch_size: int = 1, seed: Optional[int] = None) -> Run:
  """Rebuilds a run's model in `mode` and loads its latest weights.

  In eval mode the model takes any batch: a state made for one example (the
  default `batch_size`; LSH attention's hashing keys) is copied for each
  example of a larger batch, so row `i` of a batch gives what example `i`
  gives alone. To predict, `decoding.autoregressive_sample` (and `retrax
  sample`) decodes any batch from that state too; a model you call yourself
  one position at a time takes `batch_size` examples (LSH attention
  models: any number, from one).

  Args:
    directory: a run directory (`retrax train --output_dir`, `python -m
      retrax.trainer --output_dir`, a `training.Loop`'s `output_dir`, or
      the output of `retrax convert`).
    mode: 'train', 'eval' or 'predict' (fresh decoding state).
    batch_size: the batch size the model's state is initialized for.
    seed: if given, the model's fresh state (e.g. LSH attention's hashing
      keys) comes from `PRNGKey(seed)`.

  Raises:
    FileNotFoundError: not a run directory, or no valid checkpoint in it.
  """
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'run directory {directory!r} does not exist.')
  model, config, tokenizer = _build(directory, mode)
  if seed is not None:
    model.rng = jax.random.PRNGKey(seed)
  path = _latest_checkpoint(directory)
  flat_weights, _, stored = layer_io.read_flat_checkpoint(path)
  if stored is None:
    raise CheckpointFormatError(f'{path} records no input signature.')
  signature = _signature(stored, model.n_in, mode, batch_size)
  model.init(signature)
  weights, _ = tree.unflatten_weights_and_state(
      flat_weights, None, model.weights_and_state_signature(signature),
      weights_only=True)
  model.weights = weights
  return Run(model, tokenizer, config, path, directory, stored)
