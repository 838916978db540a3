"""Self-describing runs: a model's constructor saved beside its checkpoints.

A model built by a `retrax.models` constructor (``ReformerLM(...)``,
``TransformerLM(...)``, ...) remembers its name and arguments
(`retrax.models.registry`); a `training.Loop` with an `output_dir` writes
them to ``model.json`` there. `load_run` rebuilds the model from that file
in any mode and loads the run's latest weights, like Hugging Face's
``from_pretrained`` for a local directory::

    run = retrax.load_run('runs/text', mode='predict')
    run.model, run.tokenizer, run.config, run.checkpoint

A model built with arguments that have no JSON form (a lambda, an array)
records no constructor, and `load_run` says so.
"""

import dataclasses
import json
import os
from typing import Any

import numpy as np

from retrax import model_spec
from retrax import shapes
from retrax.checkpoints import layer_io
from retrax.checkpoints import tree
from retrax.checkpoints.atomic import atomic_write
from retrax.errors import read_json
from retrax.models import registry
# The recorded constructor of a model, where run-directory code looks it up.
from retrax.models.registry import constructor_of as constructor_of

MODEL_FILE = 'model.json'
_FORMAT = 'retrax-model'
_VERSION = 1


def write_model_file(output_dir, model):
  """Writes ``model.json`` (the model's constructor) into `output_dir`, if known.

  Returns the path written, or None for a model of unknown constructor.
  """
  spec = constructor_of(model)
  if spec is None or output_dir is None:
    return None
  doc = {'format': _FORMAT, 'version': _VERSION, 'constructor': spec['name'],
         'kwargs': spec['kwargs']}
  path = os.path.join(os.fspath(output_dir), MODEL_FILE)
  with atomic_write(path) as f:
    f.write(json.dumps(doc, indent=1).encode())
  return path


def _read_model_file(path):
  """The checked document of a ``model.json``; `ModelFileError` if unusable."""
  doc = read_json(path, model_spec.ModelFileError, 'it describes the run\'s '
                  'model: restore it, or resume the run\'s training, which '
                  'writes it again.')
  if (not isinstance(doc, dict) or doc.get('format') != _FORMAT or
      doc.get('version') != _VERSION):
    raise model_spec.ModelFileError(
        f'{path} is not a {_FORMAT} v{_VERSION} file.')
  return doc


def build_from_file(path, mode='train'):
  """The model a ``model.json`` describes, built in `mode`.

  Raises:
    ModelFileError: the file is unreadable, names no `retrax.models`
      constructor, or arguments or layers it may not (see `model_spec`).
  """
  doc = _read_model_file(path)
  return registry.build(doc.get('constructor'), doc.get('kwargs'), mode, path)


@dataclasses.dataclass
class Run:
  """What `load_run` returns.

  Attributes:
    model: the model in the requested mode with the run's latest weights.
    tokenizer: a `retrax.data.tasks.TextTokenizer` for text runs, else None.
    config: the CLI's `RunConfig` for runs of `retrax train`, else None.
    checkpoint: the checkpoint the weights came from.
    directory: the run directory.
  """
  model: Any
  tokenizer: Any
  config: Any
  checkpoint: str
  directory: str


def _latest_checkpoint(directory):
  # retrax.supervised's Loop imports this module: a cycle.
  from retrax.supervised import checkpointing
  path = checkpointing.find_latest_valid(directory)
  if path is None:
    path = checkpointing.trax_checkpoint_path(directory)
  if path is None:
    raise FileNotFoundError(f'{directory} holds no valid checkpoint; train '
                            'first (`retrax train` or a `Loop` with '
                            'output_dir).')
  return path


def _signature(stored, n_in, mode, batch_size):
  """The stored input signature with batch `batch_size` (length 1 to predict)."""
  one = not isinstance(stored, (list, tuple))
  items = [stored] if one else list(stored)[:n_in]
  out = []
  for s in items:
    shape = (batch_size,) + tuple(s.shape[1:])
    if mode == 'predict' and len(shape) == 2 and np.issubdtype(
        np.dtype(s.dtype), np.integer):
      shape = (batch_size, 1)  # Token models decode one position at a time.
    out.append(shapes.ShapeDtype(shape, s.dtype))
  return out[0] if one or len(out) == 1 else tuple(out)


def _build(directory, mode):
  """(model, config, tokenizer) of a run directory, not yet with weights."""
  # retrax.jobs imports this module (load_run): a cycle.
  from retrax import jobs
  model_file = os.path.join(directory, MODEL_FILE)
  config = tokenizer = None
  if os.path.exists(os.path.join(directory, jobs.CONFIG_FILE)):
    config = jobs.config_of_run(directory)
    tokenizer = jobs.tokenizer_of_run(config)
  if os.path.exists(model_file):
    return build_from_file(model_file, mode), config, tokenizer
  if config is not None:
    return jobs.build_model(config, mode), config, tokenizer
  raise FileNotFoundError(
      f'{directory} has no {MODEL_FILE}: the run was not made by `retrax '
      'train` or by a Loop over a retrax.models constructor with JSON '
      'arguments; rebuild the model yourself and call model.init_from_file.')


def load_run(directory, mode='predict', batch_size=1) -> Run:
  """Rebuilds a run's model in `mode` and loads its latest weights.

  Args:
    directory: a run directory (`retrax train --output_dir`, or a
      `training.Loop`'s `output_dir`).
    mode: 'train', 'eval' or 'predict' (fresh decoding state).
    batch_size: the batch size the model is initialized for.

  Raises:
    FileNotFoundError: not a run directory, or no valid checkpoint in it.
  """
  directory = os.fspath(directory)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f'run directory {directory!r} does not exist.')
  model, config, tokenizer = _build(directory, mode)
  path = _latest_checkpoint(directory)
  flat_weights, _, stored = layer_io.read_flat_checkpoint(path)
  if stored is None:
    raise ValueError(f'{path} records no input signature.')
  signature = _signature(stored, model.n_in, mode, batch_size)
  model.init(signature)
  weights, _ = tree.unflatten_weights_and_state(
      flat_weights, None, model.weights_and_state_signature(signature),
      weights_only=True)
  model.weights = weights
  return Run(model, tokenizer, config, path, directory)
