"""The model constructors, and the call each model was built with.

Each public constructor of `retrax.models` is decorated with `register`
where it is defined, so every import path gives the same function
(`retrax.models.ReformerLM is retrax.models.reformer.ReformerLM is
MODELS['ReformerLM']`), which is also Trax's gin name `trax.models.<name>`. The
layers it builds remember the constructor's name and arguments in JSON
form (`constructor_of`): a `training.Loop` writes them to a run's
``model.json`` (`write_model_file`) and `retrax.load_run` rebuilds the
model from it (`build_from_file`).

Arguments are stored as JSON: numbers, strings, booleans, None, lists and
tuples, dicts, and for the arguments that take a layer, a layer constructor
of `retrax.layers` of that argument's kind (also as ``functools.partial``
with JSON arguments; see `model_spec`, which checks what loading admits). A
model built with anything else (a lambda, an array) records no constructor.
"""

import functools
import inspect
import json
import os
import weakref
from typing import Optional

import numpy as np

from retrax import configurable
from retrax import layers as tl
from retrax.models import model_spec
from retrax.checkpoints.atomic import atomic_write
from retrax.errors import read_json
from retrax.run_layout import MODEL_FILE

_FORMAT = 'retrax-model'  # model.json's format tag and version.
_VERSION = 1
MODELS: dict = {}  # Constructor name -> the registered constructor.
_SPECS: 'weakref.WeakKeyDictionary' = weakref.WeakKeyDictionary()


class _NotJSON(Exception):
  pass


def _layer_name(fn):
  fn = configurable.public_object(fn)  # A gin reference's function: retrax's.
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
    # Arguments a gin config binds travel with the layer, as a partial's do
    # (`ReformerLM.attention_type = @LSHSelfAttention` with `LSHSelfAttention.*`
    # bindings), so `load_run` rebuilds the model that trained without gin.
    bound = configurable.bound_arguments(x)
    if bound:
      return {'layer': _layer_name(x),
              'kwargs': {k: _encode(v) for k, v in bound.items()}}
    return {'layer': _layer_name(x)}
  raise _NotJSON(x)


def _decode(x, where):
  if isinstance(x, list):
    return [_decode(y, where) for y in x]
  if not isinstance(x, dict):
    return x
  if 'tuple' in x:
    return tuple(_decode(y, where) for y in x['tuple'])
  if 'dict' in x:
    return {k: _decode(v, where) for k, v in x['dict'].items()}
  fn = getattr(tl, x['layer'], None)
  if fn is None:
    raise model_spec.ModelFileError(
        f'{where} names layer {x["layer"]!r}, which retrax.layers does not '
        'have.')
  if 'kwargs' in x:
    return functools.partial(fn, **{k: _decode(v, where)
                                    for k, v in x['kwargs'].items()})
  return fn


def register(fn):
  """Registers model constructor `fn`; the layers it builds remember the call.

  Declares it Trax's gin name `trax.models.<name>` too (`retrax.configurable`):
  the returned function is the one `MODELS` holds, with gin or without.
  """
  name = fn.__name__
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def build_and_record(*args, **kwargs):
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

  public = configurable.configurable('trax.models')(build_and_record)
  MODELS[name] = public
  return public


def constructor_of(model) -> Optional[dict]:
  """`{'name': ..., 'kwargs': ...}` (JSON) of the constructor that built `model`."""
  try:
    return _SPECS.get(model)
  except TypeError:
    return None


def shifts_right(model) -> bool:
  """Whether language model `model` shifts its tokens right itself (Trax's
  convention: output position t predicts token t from the tokens before it).
  False only for a model built with `shift_right=False` (a ReformerLM as
  `retrax convert` builds HF's: position t predicts token t+1).
  """
  spec = constructor_of(model)
  return not (spec and spec['kwargs'].get('shift_right') is False)


def build(name, kwargs, mode, where):
  """The model `MODELS[name](**kwargs, mode=mode)` from its JSON form.

  `where` names the source (a file) in errors. Raises `ModelFileError` for
  an unknown constructor, or arguments or layers loading may not admit.
  """
  fn = MODELS.get(name) if isinstance(name, str) else None
  if fn is None:
    raise model_spec.ModelFileError(
        f'{where}: unknown model {str(name)[:40]!r}; known: '
        f'{", ".join(sorted(MODELS))}.')
  model_spec.check_kwargs(fn, kwargs, where)
  return fn(**{k: _decode(v, where) for k, v in kwargs.items()}, mode=mode)


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
  return build(doc.get('constructor'), doc.get('kwargs'), mode, path)
