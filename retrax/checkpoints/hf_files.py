"""Hugging Face model directories: their config and weights, read and written.

A directory of `save_pretrained` holds HF's `config.json` and its weights:
`model.safetensors`, safetensors shards listed in
`model.safetensors.index.json`, or `pytorch_model.bin`. safetensors files
are read and written with the `safetensors` package's numpy API (bfloat16
through ml_dtypes); `pytorch_model.bin` (a pickle) needs torch.
`retrax.app.hf_runs` converts such directories (HF's Reformer) into retrax runs
and back; this module knows only the files.
"""

import json
import os

import ml_dtypes
import numpy as np
import safetensors
import safetensors.numpy as st_numpy

from retrax.checkpoints.atomic import atomic_write
from retrax.errors import UserInputError
from retrax.errors import one_line
from retrax.errors import read_json

HF_CONFIG = 'config.json'
SAFETENSORS = 'model.safetensors'
SAFETENSORS_INDEX = 'model.safetensors.index.json'
TORCH_BIN = 'pytorch_model.bin'
TORCH_BIN_INDEX = 'pytorch_model.bin.index.json'
_WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)
_BFLOAT16 = ml_dtypes.bfloat16  # Imported for safetensors' numpy API to know it.
# Plain `pip install torch` fetches a CUDA build of several GB.
PIP_TORCH = 'pip install torch --index-url https://download.pytorch.org/whl/cpu'
_MAX_LISTED = 12  # Entries of a directory an error names.


class HFReformerError(UserInputError):
  """A Hugging Face Reformer or a retrax run that the other side cannot express."""


def is_hf_directory(path):
  """True for a directory with HF's `config.json` and a weights file."""
  path = os.fspath(path)
  return (os.path.isfile(os.path.join(path, HF_CONFIG)) and
          any(os.path.isfile(os.path.join(path, n)) for n in _WEIGHT_FILES))


def read_config(path):
  """The dict of an HF `config.json` (one-line `HFReformerError` if unusable)."""
  doc = read_json(path, HFReformerError, 'it is the Hugging Face model\'s '
                  'configuration: save the model again with save_pretrained.')
  if not isinstance(doc, dict):
    raise HFReformerError(f'{path} is not a JSON object; it should be the '
                          'config.json of save_pretrained.')
  return doc


def _read_safetensors(path):
  try:
    return st_numpy.load_file(path)
  except (safetensors.SafetensorError, OSError, TypeError, ValueError) as e:
    raise HFReformerError(f'{path} is not a readable safetensors file '
                          f'({one_line(e, 200)}).') from None


def _read_torch_bin(path):
  try:
    import torch  # Only for HF's pickled weights.
  except ImportError:
    raise HFReformerError(
        f'{path} is a PyTorch pickle, which only torch can read: {PIP_TORCH} '
        '(CPU build), or save the model with safetensors (save_pretrained '
        'writes model.safetensors by default) and convert that.') from None
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pylint: disable=broad-except
    # Not torch's advice to retry with weights_only=False: that runs the
    # pickle's code.
    reason = ('it holds Python objects besides tensors, which could run code '
              'and were refused unexecuted' if 'weights only' in str(e).lower()
              else f'{type(e).__name__}: {one_line(e, 100)}')
    raise HFReformerError(
        f'{path} is not a PyTorch state dict that torch loads safely '
        f'({reason}); it may be damaged or not a model\'s weights. Save the '
        'model from a source you trust with save_pretrained (safetensors) '
        'and convert that.') from None
  if not isinstance(state, dict) or not all(
      isinstance(k, str) and isinstance(t, torch.Tensor)
      for k, t in state.items()):
    raise HFReformerError(
        f'{path} holds a {type(state).__name__}, not a dict of named tensors '
        '(a state dict); save the model with save_pretrained and convert '
        'that.')

  def numpy_of(t):
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
      return t.view(torch.int16).numpy().view(_BFLOAT16)
    return t.numpy()
  return {k: numpy_of(t) for k, t in state.items()}


def check_weights_present(directory):
  """Raises a one-line `HFReformerError` unless `directory` holds one of the
  weights files of `save_pretrained`: which were looked for, what is there."""
  directory = os.fspath(directory)
  if any(os.path.isfile(os.path.join(directory, n)) for n in _WEIGHT_FILES):
    return
  try:
    names = sorted(os.listdir(directory))
  except OSError as e:
    raise HFReformerError(f'{directory} cannot be listed ({one_line(e, 100)})'
                          '.') from None
  found = ', '.join(names[:_MAX_LISTED]) + (
      f' and {len(names) - _MAX_LISTED} more' if len(names) > _MAX_LISTED
      else '') if names else 'nothing'
  raise HFReformerError(
      f'{directory} holds no Hugging Face weights file: looked for '
      f'{", ".join(_WEIGHT_FILES)}; found {found}. Save the model there with '
      'save_pretrained (it writes model.safetensors) and convert again.')


def read_tensors(directory):
  """`{name: numpy array}` of an HF directory's weights (safetensors, sharded
  safetensors, or pytorch_model.bin)."""
  check_weights_present(directory)
  single = os.path.join(directory, SAFETENSORS)
  if os.path.isfile(single):
    return _read_safetensors(single)
  index = os.path.join(directory, SAFETENSORS_INDEX)
  if os.path.isfile(index):
    doc = read_json(index, HFReformerError, 'it lists the safetensors shards.')
    weight_map = doc.get('weight_map') if isinstance(doc, dict) else None
    shards = (sorted(set(weight_map.values())) if isinstance(weight_map, dict)
              and all(isinstance(v, str) for v in weight_map.values()) else [])
    if not shards or any(os.path.basename(s) != s or s in ('', '.', '..')
                         for s in shards):
      raise HFReformerError(f'{index}: weight_map must name shard files in '
                            f'{directory}; got {shards!r:.80}.')
    tensors = {}
    for shard in shards:
      tensors.update(_read_safetensors(os.path.join(directory, shard)))
    return tensors
  if not os.path.isfile(os.path.join(directory, TORCH_BIN)):
    raise HFReformerError(
        f'{directory} holds sharded PyTorch weights ({TORCH_BIN_INDEX}); load '
        'the model with from_pretrained, save it with save_pretrained '
        '(safetensors) and convert that.')
  return _read_torch_bin(os.path.join(directory, TORCH_BIN))


def write_json(path, doc):
  """Writes `doc` as indented, key-sorted JSON, atomically."""
  with atomic_write(path) as f:
    f.write((json.dumps(doc, indent=2, sort_keys=True) + '\n').encode())


def write_directory(directory, cfg, tensors):
  """Writes `model.safetensors` (metadata `format: pt`, which
  `from_pretrained` expects) and `config.json` in existing `directory`."""
  data = st_numpy.save({k: np.ascontiguousarray(v) for k, v in
                        tensors.items()}, metadata={'format': 'pt'})
  with atomic_write(os.path.join(directory, SAFETENSORS)) as f:
    f.write(data)
  write_json(os.path.join(directory, HF_CONFIG), cfg)
