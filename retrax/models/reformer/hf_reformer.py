"""Hugging Face's `ReformerModelWithLMHead` as a retrax `ReformerLM`: the mapping.

HF's Reformer is Trax's (its Hub weights were trained in Trax), so each HF
tensor is one retrax weight, reshaped:

  HF (config.json, model.safetensors)           retrax ReformerLM
  word_embeddings.weight [V, M]                 Embedding [V, M]
  position_embeddings.weights.i [.., a_i, .., d_i]  AxialPositionalEncoding
                                                [1, .., a_i, .., d_i]
  position_embeddings.embedding.weight [P, M]   PositionalEncoding [P, M]
  query / key / value / query_key [H*D, M]      w_q / w_k / w_v [H, M, D]
  attention.output.dense [M, H*D]               w_o [H, D, M]
  feed-forward and head Linear [out, in]        Dense [in, out]
  attn_layers 'local' / 'lsh'                   SelfAttention / LSHSelfAttention

`lm_kwargs` turns an HF config into `ReformerLM`'s arguments (refusing, in
one line, what ReformerLM does not compute), `hf_config` goes back from a
run's `model.json`, and `weight_layout` lists the tensors in retrax's flat
weight order with the reshape of each (`to_retrax`, `to_hf`: exact inverses,
so a round trip is bit for bit). `retrax.app.hf_runs` converts directories with
it (`retrax convert`).

HF's model does not shift its inputs right as Trax's ReformerLM does, so
`lm_kwargs` asks for `shift_right=False`: position t's logits predict token
t+1, as in HF. A run trained in retrax keeps Trax's shift, and written to HF
its logits for `x` are HF's for `[0] + x[:-1]` (`hf_runs` says so).

Where the two differ (documented, not refused): retrax's LayerNorm uses
Trax's epsilon 1e-6 (the Hub configs say 1e-12; the weights were trained
with 1e-6), so layer_norm_eps must be within 1e-5 of it; retrax has one
dropout rate (HF's hidden_dropout_prob; the attention-probability rates only
go back to HF); LSH hashing draws random rotations in both, from different
generators, and `num_buckets=None` picks the bucket count from the length by
different rules.
"""

import functools
import inspect
from typing import Any, Dict, List, Tuple

import numpy as np

from retrax import layers as tl
from retrax.checkpoints.hf_files import HFReformerError as HFReformerError
from retrax.models.reformer.reformer import ReformerLM


# ReformerConfig's defaults (transformers 5), for keys a config.json leaves out.
HF_DEFAULTS = {
    'attention_head_size': 64,
    'attn_layers': ['local', 'lsh', 'local', 'lsh', 'local', 'lsh'],
    'axial_pos_embds': True, 'axial_pos_shape': [64, 64],
    'axial_pos_embds_dim': [64, 192], 'chunk_size_feed_forward': 0,
    'feed_forward_size': 512, 'hidden_act': 'relu',
    'hidden_dropout_prob': 0.05, 'hidden_size': 256, 'is_decoder': False,
    'layer_norm_eps': 1e-12, 'local_attn_chunk_length': 64,
    'local_num_chunks_before': 1, 'local_num_chunks_after': 0,
    'local_attention_probs_dropout_prob': 0.05, 'lsh_attn_chunk_length': 64,
    'lsh_num_chunks_before': 1, 'lsh_num_chunks_after': 0,
    'lsh_attention_probs_dropout_prob': 0.0, 'max_position_embeddings': 4096,
    'num_attention_heads': 12, 'num_buckets': None, 'num_hashes': 1,
    'vocab_size': 320,
}
# HF's hidden_act -> retrax activation; FastGelu is HF's gelu_fast formula.
ACTIVATIONS = {'relu': 'Relu', 'gelu': 'Gelu', 'gelu_fast': 'FastGelu',
               'gelu_new': 'FastGelu', 'gelu_pytorch_tanh': 'FastGelu',
               'silu': 'Swish', 'swish': 'Swish', 'tanh': 'Tanh',
               'sigmoid': 'Sigmoid'}
_HF_ACTIVATION = {'Relu': 'relu', 'Gelu': 'gelu', 'FastGelu': 'gelu_fast',
                  'Swish': 'silu', 'Tanh': 'tanh', 'Sigmoid': 'sigmoid'}
TRAX_LAYER_NORM_EPS = 1e-6
_EPS_TOLERANCE = 1e-5


def _get(cfg, key):
  return cfg.get(key, HF_DEFAULTS.get(key))


def _int(cfg, key, low=0):
  value = _get(cfg, key)
  if isinstance(value, bool) or not isinstance(value, int) or value < low:
    raise HFReformerError(f'config.json: {key} must be an int >= {low}; got '
                          f'{value!r:.40}.')
  return value


def _check_hf_lm(cfg):
  """Refuses HF configs that are not a causal ReformerModelWithLMHead."""
  if cfg.get('model_type', 'reformer') != 'reformer':
    raise HFReformerError(f'config.json: model_type {cfg["model_type"]!r:.40} '
                          "is not 'reformer'; retrax converts HF Reformers only.")
  if not _get(cfg, 'is_decoder'):
    raise HFReformerError(
        'config.json: is_decoder is false, a bidirectional Reformer '
        '(ReformerForMaskedLM and the like); retrax converts the causal '
        'ReformerModelWithLMHead (is_decoder: true) into ReformerLM.')
  eps = _get(cfg, 'layer_norm_eps')
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not abs(
      eps - TRAX_LAYER_NORM_EPS) <= _EPS_TOLERANCE:  # NaN compares False.
    raise HFReformerError(
        f'config.json: layer_norm_eps={eps!r:.40}, but retrax\'s LayerNorm '
        f'uses Trax\'s {TRAX_LAYER_NORM_EPS} (outputs agree only for values '
        f'within {_EPS_TOLERANCE} of it, such as HF\'s 1e-12).')
  act = _get(cfg, 'hidden_act')
  if not isinstance(act, str) or act not in ACTIVATIONS:
    raise HFReformerError(f'config.json: hidden_act {act!r:.40} has no retrax '
                          f'activation; supported: {", ".join(ACTIVATIONS)}.')
  for kind in ('local', 'lsh'):
    if _get(cfg, f'{kind}_num_chunks_after'):
      raise HFReformerError(f'config.json: {kind}_num_chunks_after must be 0 '
                            'in a causal language model (as HF requires).')


def _attention_layers(cfg):
  """One `functools.partial` of a retrax attention class per HF layer."""
  kinds = _get(cfg, 'attn_layers')
  if (not isinstance(kinds, (list, tuple)) or not kinds or
      any(k not in ('local', 'lsh') for k in kinds)):
    raise HFReformerError(f'config.json: attn_layers must be a non-empty list '
                          f"of 'local' and 'lsh'; got {kinds!r:.60}.")
  local = functools.partial(
      tl.SelfAttention, chunk_len=_int(cfg, 'local_attn_chunk_length', 1),
      n_chunks_before=_int(cfg, 'local_num_chunks_before'), n_chunks_after=0)
  buckets = _get(cfg, 'num_buckets')
  if buckets is not None and not (_int_list([buckets]) or (
      _int_list(buckets) and len(buckets) == 2)):
    raise HFReformerError(
        f'config.json: num_buckets must be null, an int > 0 or a list of two '
        f'(factors of the bucket count); got {buckets!r:.40}.')
  lsh = functools.partial(
      tl.LSHSelfAttention, chunk_len=_int(cfg, 'lsh_attn_chunk_length', 1),
      n_chunks_before=_int(cfg, 'lsh_num_chunks_before'), n_chunks_after=0,
      n_hashes=_int(cfg, 'num_hashes', 1),
      n_buckets=list(buckets) if isinstance(buckets, (list, tuple)) else buckets)
  return [local if k == 'local' else lsh for k in kinds]


def _int_list(x):
  return isinstance(x, (list, tuple)) and bool(x) and all(
      isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in x)


def _positions(cfg):
  """`ReformerLM`'s positional arguments for HF's axial or plain embeddings."""
  if not _get(cfg, 'axial_pos_embds'):
    return {'pos_type': None, 'pos_axial_shape': (), 'pos_d_axial_embs': None}
  shape, dims = _get(cfg, 'axial_pos_shape'), _get(cfg, 'axial_pos_embds_dim')
  if (not _int_list(shape) or not _int_list(dims) or len(shape) != len(dims)
      or sum(dims) != _get(cfg, 'hidden_size')):
    raise HFReformerError(
        f'config.json: axial_pos_embds_dim {dims!r:.40} must have one depth '
        f'per axis of axial_pos_shape {shape!r:.40} and sum to hidden_size.')
  return {'pos_type': 'axial', 'pos_axial_shape': tuple(shape),
          'pos_d_axial_embs': tuple(dims)}


def lm_kwargs(cfg):
  """`ReformerLM`'s arguments (no `mode`) computing what HF's config does.

  Raises:
    HFReformerError: the config is not a causal Reformer LM, or has a
      setting ReformerLM cannot compute (one line, naming the key).
  """
  _check_hf_lm(cfg)
  head = _int(cfg, 'attention_head_size', 1)
  attention = _attention_layers(cfg)
  dropout = _get(cfg, 'hidden_dropout_prob')
  if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
    raise HFReformerError(f'config.json: hidden_dropout_prob must be a number; '
                          f'got {dropout!r:.40}.')
  kwargs = {
      'vocab_size': _int(cfg, 'vocab_size', 1),
      'd_model': _int(cfg, 'hidden_size', 1),
      'd_ff': _int(cfg, 'feed_forward_size', 1),
      'd_attention_key': head, 'd_attention_value': head,
      'n_layers': len(attention),
      'n_heads': _int(cfg, 'num_attention_heads', 1),
      'dropout': float(dropout),
      'max_len': _int(cfg, 'max_position_embeddings', 1),
      'attention_type': attention,
      'ff_activation': getattr(tl, ACTIVATIONS[_get(cfg, 'hidden_act')]),
      'ff_chunk_size': _int(cfg, 'chunk_size_feed_forward'),
      'shift_right': False,  # HF's inputs: position t predicts token t+1.
  }
  kwargs.update(_positions(cfg))
  return kwargs


# --- retrax run (model.json) -> HF config --------------------------------------


def _defaults(fn):
  return {p.name: p.default for p in inspect.signature(fn).parameters.values()
          if p.default is not inspect.Parameter.empty}


def _plain(x):
  """A `model.json` value with `{'tuple': [...]}` turned into lists."""
  if isinstance(x, list):
    return [_plain(y) for y in x]
  if isinstance(x, dict) and set(x) == {'tuple'}:
    return [_plain(y) for y in x['tuple']]
  return x


def _layer(value, what):
  """`(name, kwargs)` of a model.json layer value (a dict or a bare name)."""
  if isinstance(value, dict) and 'layer' in value:
    return value['layer'], {k: _plain(v) for k, v in
                            value.get('kwargs', {}).items()}
  raise HFReformerError(f'model.json: {what} {str(value)[:60]!r} is not a '
                        'retrax layer.')


def _attention_setting(value):
  """`('local' | 'lsh', settings)` of one model.json attention layer."""
  name, kw = _layer(value, 'attention_type')
  if name not in ('SelfAttention', 'LSHSelfAttention'):
    raise HFReformerError(f'model.json: attention {name!r:.40} has no HF '
                          'Reformer counterpart; HF has SelfAttention '
                          "(chunked: 'local') and LSHSelfAttention ('lsh').")
  kw = {**_defaults(getattr(tl, name)), **kw}
  if kw.get('bias') or (name == 'SelfAttention' and kw.get('share_qk')):
    raise HFReformerError(f'model.json: {name} with bias or share_qk has no '
                          'HF Reformer counterpart (HF projects without bias, '
                          'and shares queries and keys only in LSH layers).')
  if kw['n_chunks_after']:
    raise HFReformerError(f'model.json: {name} has n_chunks_after='
                          f'{kw["n_chunks_after"]}; HF\'s causal Reformer '
                          'needs 0.')
  if name == 'SelfAttention':
    return 'local', {'chunk_len': kw['chunk_len'],
                     'n_chunks_before': kw['n_chunks_before']}
  buckets = _plain(kw['n_buckets'])
  return 'lsh', {'chunk_len': kw['chunk_len'], 'n_hashes': kw['n_hashes'],
                 'n_chunks_before': kw['n_chunks_before'],
                 'n_buckets': buckets}


def _attention_fields(kwargs, max_len):
  """HF's attn_layers and attention settings from ReformerLM's arguments."""
  types = kwargs.get('attention_type') or {'layer': 'SelfAttention'}
  types = types if isinstance(types, list) else [types]
  n_layers = kwargs['n_layers']
  settings = [_attention_setting(types[i % len(types)])
              for i in range(n_layers)]
  fields: Dict[str, Any] = {'attn_layers': [kind for kind, _ in settings]}
  for kind in ('local', 'lsh'):
    distinct = {repr(s) for k, s in settings if k == kind}
    if len(distinct) > 1:
      raise HFReformerError(
          f'model.json: the {kind} attention layers differ ({", ".join(sorted(distinct))}); '
          f'HF\'s config holds one setting for all {kind} layers.')
  for kind, s in dict(settings).items():
    chunk, before = s['chunk_len'], s['n_chunks_before']
    if chunk is None:  # Unchunked: one chunk covers every position.
      chunk, before = max_len, 0
    fields.update({f'{kind}_attn_chunk_length': chunk,
                   f'{kind}_num_chunks_before': before,
                   f'{kind}_num_chunks_after': 0})
    if kind == 'lsh':
      fields.update(num_hashes=s['n_hashes'], num_buckets=s['n_buckets'])
  return fields


def _position_fields(kw):
  pos_type, shape = kw.get('pos_type'), _plain(kw.get('pos_axial_shape'))
  if pos_type in ('axial', 'axial-pos') or (not pos_type and shape):
    return {'axial_pos_embds': True, 'axial_pos_shape': list(shape),
            'axial_pos_embds_dim': list(_plain(kw['pos_d_axial_embs']))}
  if pos_type:
    raise HFReformerError(f'model.json: pos_type {pos_type!r:.40} has no HF '
                          'counterpart; HF has axial (pos_type=\'axial\') and '
                          'learned (pos_type=None) position embeddings.')
  return {'axial_pos_embds': False}


def _activation_field(kw):
  act = kw.get('ff_activation') or {'layer': 'FastGelu'}
  name, act_kwargs = _layer(act, 'ff_activation')
  if name not in _HF_ACTIVATION or act_kwargs:
    raise HFReformerError(f'model.json: ff_activation {name!r:.40} has no HF '
                          f'hidden_act; supported: {", ".join(_HF_ACTIVATION)}.')
  return _HF_ACTIVATION[name]


_NOT_IN_HF = ('ff_use_sru', 'ff_sparsity', 'loss_sparsity', 'loss_d_lowrank',
              'loss_sparsity_prob')


def hf_config(kwargs, base=None):
  """HF's `config.json` (a dict) for ReformerLM arguments `kwargs` (model.json's form).

  `base` is the HF config a converted run came from: its other keys (dropout
  rates of attention probabilities, token ids, layer_norm_eps, ...) are kept,
  so HF -> retrax -> HF gives the config back.

  Raises:
    HFReformerError: an argument HF's Reformer cannot express.
  """
  kw = {**_defaults(ReformerLM), **{k: _plain(v) for k, v in kwargs.items()}}
  for key in _NOT_IN_HF:
    if kw.get(key) not in (0, None):
      raise HFReformerError(f'model.json: {key}={kw[key]!r:.40} has no HF '
                            'Reformer counterpart.')
  if kw['d_attention_key'] != kw['d_attention_value']:
    raise HFReformerError(
        f'model.json: d_attention_key={kw["d_attention_key"]} and '
        f'd_attention_value={kw["d_attention_value"]} differ; HF has one '
        'attention_head_size.')
  derived = {
      'architectures': ['ReformerModelWithLMHead'], 'model_type': 'reformer',
      'is_decoder': True, 'vocab_size': kw['vocab_size'],
      'hidden_size': kw['d_model'], 'feed_forward_size': kw['d_ff'],
      'attention_head_size': kw['d_attention_key'],
      'num_attention_heads': kw['n_heads'], 'num_hidden_layers': kw['n_layers'],
      'hidden_act': _activation_field(kw), 'hidden_dropout_prob': kw['dropout'],
      'max_position_embeddings': kw['max_len'],
      'chunk_size_feed_forward': kw['ff_chunk_size']}
  derived.update(_attention_fields(kw, kw['max_len']))
  derived.update(_position_fields(kw))
  if base is None:  # retrax has one dropout rate, and Trax's epsilon.
    return dict(derived, local_attention_probs_dropout_prob=kw['dropout'],
                lsh_attention_probs_dropout_prob=kw['dropout'],
                layer_norm_eps=TRAX_LAYER_NORM_EPS, tie_word_embeddings=False)
  return _onto_base(derived, base)


def _onto_base(derived, base):
  """`base` updated with `derived`, leaving out what changes nothing: keys
  `base` omits that are at HF's default or have none (num_hidden_layers),
  and a hidden_act naming the same function."""
  cfg = dict(base)
  if ACTIVATIONS.get(base.get('hidden_act')) == ACTIVATIONS[
      derived['hidden_act']]:
    del derived['hidden_act']  # gelu_new stays gelu_new.
  for key, value in derived.items():
    if key in base or (key in HF_DEFAULTS and value != HF_DEFAULTS[key]):
      cfg[key] = value
  return cfg


# --- weights -------------------------------------------------------------------


def weight_layout(cfg):
  """`[(hf_name, kind, hf_shape), ...]` in retrax's flat weight order.

  `kind` names the reshape between the two (see `to_retrax`).
  """
  m, f, v = (_get(cfg, k) for k in ('hidden_size', 'feed_forward_size',
                                    'vocab_size'))
  hd = _get(cfg, 'num_attention_heads') * _get(cfg, 'attention_head_size')
  emb = 'reformer.embeddings.'
  names: List[Tuple[str, str, tuple]] = [
      (emb + 'word_embeddings.weight', 'same', (v, m))]
  if _get(cfg, 'axial_pos_embds'):
    shape = list(_get(cfg, 'axial_pos_shape'))
    for i, d in enumerate(_get(cfg, 'axial_pos_embds_dim')):
      ax = [1] * len(shape)
      ax[i] = shape[i]
      names.append((f'{emb}position_embeddings.weights.{i}', 'axial',
                    tuple(ax) + (d,)))
  else:
    names.append((emb + 'position_embeddings.embedding.weight', 'same',
                  (_get(cfg, 'max_position_embeddings'), m)))
  for i, kind in enumerate(_get(cfg, 'attn_layers')):
    att = f'reformer.encoder.layers.{i}.attention.'
    ff = f'reformer.encoder.layers.{i}.feed_forward.'
    proj = ('query', 'key', 'value') if kind == 'local' else ('query_key',
                                                               'value')
    names += [(att + 'layer_norm.weight', 'same', (m,)),
              (att + 'layer_norm.bias', 'same', (m,))]
    names += [(f'{att}self_attention.{p}.weight', 'heads_in', (hd, m))
              for p in proj]
    names += [(att + 'output.dense.weight', 'heads_out', (m, hd)),
              (ff + 'layer_norm.weight', 'same', (m,)),
              (ff + 'layer_norm.bias', 'same', (m,)),
              (ff + 'dense.dense.weight', 'linear', (f, m)),
              (ff + 'dense.dense.bias', 'same', (f,)),
              (ff + 'output.dense.weight', 'linear', (m, f)),
              (ff + 'output.dense.bias', 'same', (m,))]
  return names + [('reformer.encoder.layer_norm.weight', 'same', (2 * m,)),
                  ('reformer.encoder.layer_norm.bias', 'same', (2 * m,)),
                  ('lm_head.decoder.weight', 'linear', (v, 2 * m)),
                  ('lm_head.decoder.bias', 'same', (v,))]


def to_retrax(kind, a, n_heads):
  """HF tensor `a` as the retrax weight (`kind` from `weight_layout`)."""
  if kind == 'axial':
    return a[None]
  if kind == 'heads_in':  # [H*D, M] -> [H, M, D]
    return np.ascontiguousarray(
        a.reshape(n_heads, -1, a.shape[-1]).transpose(0, 2, 1))
  if kind == 'heads_out':  # [M, H*D] -> [H, D, M]
    return np.ascontiguousarray(a.T.reshape(n_heads, -1, a.shape[0]))
  return np.ascontiguousarray(a.T) if kind == 'linear' else a


def to_hf(kind, a):
  """The inverse of `to_retrax`."""
  if kind == 'axial':
    return a[0]
  if kind == 'heads_in':  # [H, M, D] -> [H*D, M]
    return np.ascontiguousarray(a.transpose(0, 2, 1).reshape(-1, a.shape[1]))
  if kind == 'heads_out':  # [H, D, M] -> [M, H*D]
    return np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)
  return np.ascontiguousarray(a.T) if kind == 'linear' else a
