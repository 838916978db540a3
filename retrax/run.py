"""Self-describing runs: the constructor of a model, saved beside its checkpoints.

A model built by a `retrax.models` constructor (``ReformerLM(...)``,
``TransformerLM(...)``, ...) remembers its name and arguments; a
`training.Loop` with an `output_dir` writes them to ``model.json`` there.
`load_run` rebuilds the model from that file in any mode and loads the run's
latest weights, like Hugging Face's ``from_pretrained`` for a local directory::

    run = retrax.load_run('runs/text', mode='predict')
    run.model, run.tokenizer, run.config, run.checkpoint

Arguments are stored as JSON: numbers, strings, booleans, None, lists and
tuples, dicts, and for the arguments that take a layer, a layer constructor
of `retrax.layers` of that argument's kind (also as ``functools.partial``
with JSON arguments; see `model_spec`, which also checks every file read). A
model built with anything else (a lambda, an array) records no constructor,
and `load_run` says so.
"""

import dataclasses
import functools
import inspect
import json
import os
import weakref
from typing import Any, Optional

import numpy as np

from retrax import layers as tl
from retrax import model_spec
from retrax import shapes
from retrax import trax_gin
from retrax.checkpoints import layer_io
from retrax.checkpoints import tree
from retrax.checkpoints.atomic import atomic_write
from retrax.errors import read_json

MODEL_FILE = 'model.json'
_FORMAT = 'retrax-model'
_VERSION = 1
_SPECS = weakref.WeakKeyDictionary()  # layer -> {'name': ..., 'kwargs': ...}


class _NotJSON(Exception):
  pass


def _layer_name(fn):
  name = getattr(fn, '__name__', None)
  if name and getattr(tl, name, None) is fn:
    return name
  raise _NotJSON(fn)


def _encode(x):
  if x is None or isinstance(x, (bool, int, float, str)):
    return x
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, list):
    return [_encode(y) for y in x]
  if isinstance(x, tuple):
    return {'tuple': [_encode(y) for y in x]}
  if isinstance(x, dict) and all(isinstance(k, str) for k in x):
    return {'dict': {k: _encode(v) for k, v in x.items()}}
  if isinstance(x, functools.partial) and not x.args:
    return {'layer': _layer_name(x.func),
            'kwargs': {k: _encode(v) for k, v in x.keywords.items()}}
  if callable(x):
    # Arguments a gin config binds travel with the layer, as a partial's do.
    bound = trax_gin.bound_arguments(x)
    if bound:
      return {'layer': _layer_name(x),
              'kwargs': {k: _encode(v) for k, v in bound.items()}}
    return {'layer': _layer_name(x)}
  raise _NotJSON(x)


def _decode(x):
  if isinstance(x, list):
    return [_decode(y) for y in x]
  if not isinstance(x, dict):
    return x
  if 'tuple' in x:
    return tuple(_decode(y) for y in x['tuple'])
  if 'dict' in x:
    return {k: _decode(v) for k, v in x['dict'].items()}
  fn = getattr(tl, x['layer'], None)
  if fn is None:
    raise ValueError(f'{MODEL_FILE} names layer {x["layer"]!r}, which '
                     'retrax.layers does not have.')
  if 'kwargs' in x:
    return functools.partial(fn, **{k: _decode(v)
                                    for k, v in x['kwargs'].items()})
  return fn


def recorded(fn, name=None):
  """Wraps model constructor `fn` so that the layers it builds remember the call."""
  name = name or fn.__name__
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def build(*args, **kwargs):
    layer = fn(*args, **kwargs)
    try:
      bound = signature.bind(*args, **kwargs)
      given = dict(bound.arguments)
      bound.apply_defaults()  # Defaults too, when they are JSON-able.
      for values in (bound.arguments, given):
        try:
          encoded = {k: _encode(v) for k, v in values.items() if k != 'mode'}
          model_spec.check_kwargs(fn, encoded, name)  # What loading admits.
          _SPECS[layer] = {'name': name, 'kwargs': encoded}
          break
        except (_NotJSON, model_spec.ModelFileError):
          continue
    except TypeError:
      pass  # Not describable as JSON: the run records no constructor.
    return layer
  return build


def constructor_of(model) -> Optional[dict]:
  """`{'name': ..., 'kwargs': ...}` (JSON) of the constructor that built `model`."""
  try:
    return _SPECS.get(model)
  except TypeError:
    return None


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
  # retrax.models imports this module (to record constructors): a cycle.
  from retrax import models
  doc = _read_model_file(path)
  constructor = doc.get('constructor')
  fn = models.MODELS.get(constructor) if isinstance(constructor, str) else None
  if fn is None:
    raise model_spec.ModelFileError(
        f'{path}: unknown model {str(constructor)[:40]!r}; known: '
        f'{", ".join(sorted(models.MODELS))}.')
  model_spec.check_kwargs(fn, doc.get('kwargs'), path)
  kwargs = {k: _decode(v) for k, v in doc['kwargs'].items()}
  return fn(**kwargs, mode=mode)


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
