"""`retrax convert` between Hugging Face Reformer directories and retrax runs.

    retrax convert HF_DIR OUT           # HF_DIR: ReformerModelWithLMHead.save_pretrained's
    retrax convert RUN OUT --to hf      # RUN: a run whose model.json is a ReformerLM

HF -> retrax writes a run directory that `retrax.load_run(OUT)` builds:
`model.json` (the ReformerLM of `hf_reformer.lm_kwargs`), `model_000000000`
(a native checkpoint: the weights in retrax's flat order, an input signature
`(1, L)`, and under `hf_extra` HF's tensors retrax has no weight for, such as
the LM head's unused `lm_head.bias` of transformers 5) and `hf_config.json`
(HF's config as read), and `tokenizer.model`, a copy of HF's SentencePiece
model `spiece.model` where the directory has one (`load_run`, `sample` and
`eval` then encode and decode text with it; `tokenizer_note` is the line
`retrax convert` prints about it). retrax -> HF writes `config.json` and
`model.safetensors` (`checkpoints.hf_files`), which
`ReformerModelWithLMHead.from_pretrained(OUT)` loads, and `spiece.model`, a
copy of the run's `tokenizer.model` where it has one (`ReformerTokenizer`'s
file); a run converted from HF gives back its config, its `spiece.model`
and, bit for bit, its tensors.

A converted run keeps HF's input convention: its ReformerLM is built with
`shift_right=False` (recorded in `model.json`), so `load_run(OUT).model(x)`
gives HF's `model(x).logits`, position t predicting token t+1. Trax's
ReformerLM (`shift_right=True`, every run trained in retrax) shifts its
inputs right instead: position t predicts token t. `scored_outputs` and
`decoding_start` tell the jobs how to score and decode a run of either
convention (`models.registry.shifts_right` tells which), and
`convention_note` is the line `retrax convert` prints about it.

This module builds models and writes runs, so it sits beside the jobs, above
`checkpoints/` (which reads and writes HF's files) and `models/` (where
`reformer.hf_reformer` maps HF's config and tensors to ReformerLM's). The
destination must be new or an empty directory unless `force`, as for every
`convert`.
"""

import os

import numpy as np

from retrax import models
from retrax.checkpoints import destination
from retrax.checkpoints.atomic import atomic_write
from retrax.checkpoints import hf_files
from retrax.checkpoints import layer_io
from retrax.checkpoints import native
from retrax.checkpoints.convert import checked_paths
from retrax.checkpoints.hf_files import HFReformerError
from retrax.checkpoints.tree import tree_leaves
from retrax.errors import read_json
from retrax.models import model_spec
from retrax.models import registry
from retrax.models.reformer import hf_reformer
from retrax.run_layout import HF_CONFIG_COPY
from retrax.run_layout import MODEL_FILE
from retrax.run_layout import TOKENIZER_FILE
from retrax.runs import data as run_data
from retrax.shapes import ShapeDtype
from retrax.supervised import checkpointing

RUN_HF_CONFIG = HF_CONFIG_COPY
EXTRA_TREE = 'hf_extra'
HF_SPIECE = 'spiece.model'  # HF's ReformerTokenizer's SentencePiece model.
HF_TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json')


def _flat_weights(tensors, cfg, src):
  """retrax's flat weights from HF `tensors`, and the tensors left over."""
  n_heads = cfg.get('num_attention_heads', hf_reformer.HF_DEFAULTS[
      'num_attention_heads'])
  left = dict(tensors)
  if 'lm_head.decoder.bias' not in left and 'lm_head.bias' in left:
    left['lm_head.decoder.bias'] = left.pop('lm_head.bias')  # Older ties.
  flat = []
  for name, kind, shape in hf_reformer.weight_layout(cfg):
    if name not in left:
      raise HFReformerError(f'{src}: the weights lack {name}, which the '
                            'config.json needs; is it a '
                            'ReformerModelWithLMHead?')
    a = np.asarray(left.pop(name))
    if a.shape != tuple(shape):
      raise HFReformerError(f'{src}: {name} has shape {a.shape}; the '
                            f'config.json implies {tuple(shape)}.')
    flat.append(hf_reformer.to_retrax(kind, a, n_heads))
  return flat, left


def _signature_length(cfg):
  if cfg.get('axial_pos_embds', hf_reformer.HF_DEFAULTS['axial_pos_embds']):
    shape = cfg.get('axial_pos_shape',
                    hf_reformer.HF_DEFAULTS['axial_pos_shape'])
    return int(np.prod(shape))
  return cfg.get('max_position_embeddings',
                 hf_reformer.HF_DEFAULTS['max_position_embeddings'])


def _spiece(src, cfg, dst):
  """The bytes of `src`'s `spiece.model` (None without one), checked before
  anything is written: a SentencePiece model (where the sentencepiece package
  can read it) with no more pieces than the model has ids, and no other
  tokenizer already in `dst` (which `force` does not replace)."""
  path = os.path.join(src, HF_SPIECE)
  data = _read_tokenizer(path)
  if data is not None:
    if run_data.sentencepiece_installed():
      from retrax.data import tokenizers  # Only where a tokenizer is copied.
      pieces = tokenizers.SentencePieceVocabulary(path).vocab_size
      vocab = cfg.get('vocab_size', hf_reformer.HF_DEFAULTS['vocab_size'])
      if pieces > vocab:
        raise HFReformerError(
            f'{path} has {pieces} pieces but config.json\'s vocab_size is '
            f'{vocab}: it is not this model\'s tokenizer; move it out of '
            f'{src} to convert the model alone (it then takes token ids).')
  _check_no_other_tokenizer(os.path.join(dst, TOKENIZER_FILE), data, path)
  return data


def _read_tokenizer(path):
  """The bytes of tokenizer file `path`, or None where there is none."""
  if not os.path.isfile(path):
    return None
  try:
    with open(path, 'rb') as f:
      return f.read()
  except OSError as e:
    raise HFReformerError(f'{path}: cannot read it ({e.strerror}).') from None


def _check_no_other_tokenizer(copy, data, source):
  """Refuses to convert where `copy` (the tokenizer file to write) exists
  and is not `data`, the bytes of tokenizer file `source` (None: there is no
  such file)."""
  if not os.path.lexists(copy):
    return
  try:
    with open(copy, 'rb') as f:
      same = data is not None and f.read() == data
  except OSError:
    same = False
  if not same:
    what = (f'a tokenizer other than {source}' if data is not None else
            f'a tokenizer, and there is no {source}')
    raise FileExistsError(
        f'{copy} is {what}; convert does not replace a tokenizer (not even '
        'with --force): remove it, or choose another destination.')


def _write_tokenizer(path, data):
  if data is not None:
    with atomic_write(path) as f:
      f.write(data)


def tokenizer_note(src, dst):
  """The line `retrax convert HF_DIR DST` prints about the run's tokenizer."""
  if os.path.isfile(os.path.join(dst, TOKENIZER_FILE)):
    note = (f'tokenizer: {HF_SPIECE} copied as {TOKENIZER_FILE}; sample '
            '--prompt and eval --data text:FILE take text')
    if not run_data.sentencepiece_installed():
      note += (' once the sentencepiece package is installed '
               f'({run_data.SENTENCEPIECE_EXTRA})')
    return note + '.'
  others = [n for n in HF_TOKENIZER_FILES
            if os.path.isfile(os.path.join(src, n))]
  read = (f' ({" and ".join(others)} not read: retrax reads SentencePiece '
          'models)' if others else '')
  return (f'no tokenizer: {src} has no {HF_SPIECE}{read}, so sample --prompt '
          'takes token ids ("3 7 1") and eval --data text:FILE reads bytes '
          '(ids 0-255).')


def hf_to_run(src, dst, force=False):
  """Converts HF directory `src` into run directory `dst`; returns `dst`."""
  hf_files.check_weights_present(src)
  cfg = hf_files.read_config(os.path.join(src, hf_files.HF_CONFIG))
  kwargs = hf_reformer.lm_kwargs(cfg)
  tensors = hf_files.read_tensors(src)
  flat, extra = _flat_weights(tensors, cfg, src)
  model = models.MODELS['ReformerLM'](**kwargs, mode='eval')
  destination.check_destination(dst, 'native', force)
  spiece = _spiece(src, cfg, dst)
  os.makedirs(dst, exist_ok=True)
  signature = ShapeDtype((1, _signature_length(cfg)), np.int32)
  native.save_native(
      checkpointing.permanent_path(dst, 0),
      {'weights': flat, 'input_signature': signature, EXTRA_TREE: extra},
      {'step': 0, 'converted_from': {
          'format': 'hf-reformer', 'tensors': sorted(tensors),
          'directory': os.path.basename(os.path.abspath(src))}})
  hf_files.write_json(os.path.join(dst, RUN_HF_CONFIG), cfg)
  _write_tokenizer(os.path.join(dst, TOKENIZER_FILE), spiece)
  if registry.write_model_file(dst, model) is None:
    raise HFReformerError(f'{src}: the ReformerLM it describes has no '
                          'model.json form; this is a retrax bug.')
  return dst


def _run_model_kwargs(src):
  """The ReformerLM arguments (model.json's form) of run directory `src`."""
  path = os.path.join(src, MODEL_FILE)
  if not os.path.isfile(path):
    raise HFReformerError(
        f'{src} has no model.json; --to hf converts a run directory whose '
        'model.json describes a ReformerLM (retrax train, a Loop with '
        'output_dir, or retrax convert HF_DIR).')
  doc = read_json(path, HFReformerError, 'it describes the run\'s model.')
  if not isinstance(doc, dict) or doc.get('constructor') != 'ReformerLM':
    name = doc.get('constructor') if isinstance(doc, dict) else None
    raise HFReformerError(f'{path}: the model is {str(name)[:40]!r}; only a '
                          'ReformerLM converts to HF\'s Reformer.')
  model_spec.check_kwargs(models.MODELS['ReformerLM'], doc.get('kwargs'), path)
  return doc['kwargs']


def _run_weights(src):
  """`(flat weights, HF extras, checkpoint path, HF tensor names)` of a run's
  latest checkpoint; the names are the HF file's when it was converted from one
  (else None)."""
  path = (checkpointing.find_latest_valid(src) or
          checkpointing.trax_checkpoint_path(src))
  if path is None:
    raise HFReformerError(f'{src} holds no valid checkpoint to convert; '
                          'train first.')
  if not native.is_native_checkpoint(path):
    return layer_io.read_flat_checkpoint(path)[0], {}, path, None
  ckpt = native.load_native(path, shape_dtype_factory=ShapeDtype)
  if 'weights' not in ckpt.trees:
    raise HFReformerError(f'{path} has no "weights" tree.')
  extra = ckpt.trees.get(EXTRA_TREE) or {}
  source = ckpt.metadata.get('converted_from')
  names = source.get('tensors') if isinstance(source, dict) else None
  return tree_leaves(ckpt.trees['weights']), dict(extra), path, names


def hf_tensors(flat, cfg, extra, where, names=None):
  """HF's `{name: array}` from retrax's flat weights (`flat`) for `cfg`.

  `names`: the tensor names of the HF file a run was converted from, which
  the result keeps to (a transformers 4 file has `lm_head.bias` alone).
  """
  layout = hf_reformer.weight_layout(cfg)
  if len(flat) != len(layout):
    raise HFReformerError(f'{where} holds {len(flat)} weight arrays; the '
                          f'model.json\'s ReformerLM has {len(layout)}.')
  tensors = {}
  for (name, kind, shape), a in zip(layout, flat):
    t = hf_reformer.to_hf(kind, np.asarray(a))
    if t.shape != tuple(shape):
      raise HFReformerError(f'{where}: the weight for {name} has shape '
                            f'{t.shape} in HF\'s layout; the model.json '
                            f'implies {tuple(shape)}.')
    tensors[name] = t
  tensors.update(extra)
  # transformers 4 tied lm_head.bias to the decoder's bias; 5 keeps both.
  tensors.setdefault('lm_head.bias', tensors['lm_head.decoder.bias'])
  if isinstance(names, list):
    tensors = {k: v for k, v in tensors.items() if k in set(names)}
  return tensors


def run_to_hf(src, dst, force=False):
  """Converts run directory `src` (a ReformerLM) into HF directory `dst`."""
  kwargs = _run_model_kwargs(src)
  base_path = os.path.join(src, RUN_HF_CONFIG)
  base = hf_files.read_config(base_path) if os.path.isfile(base_path) else None
  cfg = hf_reformer.hf_config(kwargs, base)
  flat, extra, path, names = _run_weights(src)
  tensors = hf_tensors(flat, cfg, extra, path, names)
  destination.check_destination(dst, 'native', force)
  tokenizer = os.path.join(src, TOKENIZER_FILE)
  spiece = _read_tokenizer(tokenizer)
  _check_no_other_tokenizer(os.path.join(dst, HF_SPIECE), spiece, tokenizer)
  os.makedirs(dst, exist_ok=True)
  hf_files.write_directory(dst, cfg, tensors)
  _write_tokenizer(os.path.join(dst, HF_SPIECE), spiece)
  return dst


def scored_outputs(model, logits, targets, weights):
  """`(logits, targets, weights)` to score a language-model batch with.

  A batch holds Trax's `(x, x, weights)`: the targets are the inputs. For a
  model of HF's convention, position t's logits are compared with token t+1
  and the first token is not scored (nothing comes before it), which is
  HF's `model(x, labels=x).loss`; for Trax's, everything as given. Slices
  only, so it can run inside `jax.jit`.
  """
  if registry.shifts_right(model):
    return logits, targets, weights
  return logits[:, :-1], targets[:, 1:], weights[:, 1:]


def decoding_start(model, prompt, start_id=0):
  """`(start_id, prompt)` for `decoding.autoregressive_sample` to continue
  `prompt` (`[batch, n]` ids or None).

  Trax's convention starts from `start_id` (the 0 its ShiftRight puts before
  every sequence), then feeds the prompt; HF's feeds the prompt alone, as
  its `generate` does (its first token in the start symbol's place). With no
  prompt both start from `start_id`.
  """
  if (registry.shifts_right(model) or prompt is None or
      np.shape(prompt)[1] == 0):
    return start_id, prompt
  prompt = np.asarray(prompt)
  return prompt[:, :1], (prompt[:, 1:] if prompt.shape[1] > 1 else None)


def convention_note(src, to=None):
  """The line `retrax convert SRC DST [--to hf]` prints after converting:
  how the logits on the written side relate to the inputs."""
  if to != 'hf':
    return ("Hugging Face's input convention: load_run(DST).model(x) gives "
            "HF's model(x).logits (position t predicts token t+1; model.json "
            'records shift_right=false), and sample and eval follow it.')
  if _run_model_kwargs(src).get('shift_right', True) is False:
    return ("Hugging Face's input convention, as the run's: HF's "
            'model(x).logits are the run\'s logits for x.')
  return ("The run has Trax's input convention (ReformerLM shifts its inputs "
          "right) and HF's model does not: HF's model([0] + x[:-1]).logits "
          "are the run's logits for x (position t predicts token t).")


def convert(src, dst, to=None, force=False):
  """`retrax convert` for HF: an HF directory to a run, or a run `to='hf'`.

  Returns:
    `dst` (the run or HF directory written).
  """
  src, dst = checked_paths(src, dst)
  if to == 'hf':
    if hf_files.is_hf_directory(src):
      raise HFReformerError(f'{src} is already a Hugging Face directory.')
    return run_to_hf(src, dst, force)
  if to not in (None, 'native'):
    raise HFReformerError(f'{src} is a Hugging Face directory; convert makes '
                          'it a retrax run (leave out --to), which retrax '
                          'convert can then write in another format.')
  return hf_to_run(src, dst, force)
