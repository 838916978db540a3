"""Hostile Hugging Face directories give one line (issue 53, items 4 and 5):
a `pytorch_model.bin` torch refuses (a pickle that would run code, garbage,
empty, not a dict), a malformed `model.safetensors.index.json`, and
`num_buckets` / `layer_norm_eps` values no Reformer has.

torch is faked here (it is not a dependency): its `load` raises what the
real one raises for such files, or returns what it returns.
"""

import json
import pickle
import sys
import types

import pytest

from retrax.app import cli
from retrax.app import hf_runs
from retrax.checkpoints import hf_files
from retrax.models.reformer import hf_reformer

_CFG = dict(attention_head_size=4, hidden_size=16, num_attention_heads=2,
            feed_forward_size=32, vocab_size=20, is_decoder=True,
            max_position_embeddings=32, layer_norm_eps=1e-12,
            attn_layers=['lsh', 'local'], axial_pos_embds=False,
            local_attn_chunk_length=8, lsh_attn_chunk_length=8,
            hidden_act='gelu', model_type='reformer')
# What torch 2.6+ says of a pickle with a global outside its allow-list.
_TORCH_REFUSAL = (
    'Weights only load failed. This file can still be loaded, to do so you '
    'have two options, do those steps only if you trust the source of the '
    'checkpoint.\n\t(1) In PyTorch 2.6, we changed the default value of the '
    '`weights_only` argument in `torch.load` from `False` to `True`. '
    'Re-running `torch.load` with `weights_only` set to `False` will likely '
    'succeed, but it can result in arbitrary code execution.\nWeightsUnpickler '
    'error: Unsupported global: GLOBAL posix.system')


class _Tensor:
  pass


def _fake_torch(monkeypatch, load):
  torch = types.ModuleType('torch')
  torch.Tensor = _Tensor
  torch.load = load
  monkeypatch.setitem(sys.modules, 'torch', torch)


def _raise(error):
  def load(*args, **kwargs):
    raise error
  return load


def _hf_dir(tmp_path, cfg=_CFG):
  path = tmp_path / 'hf'
  path.mkdir()
  (path / 'config.json').write_text(json.dumps(cfg))
  return path


def _one_line(capsys, argv):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and 'Traceback' not in err, err
  return err


@pytest.mark.parametrize('load,words', [
    (_raise(pickle.UnpicklingError(_TORCH_REFUSAL)), 'could run code'),
    (_raise(pickle.UnpicklingError('invalid load key, \'x\'.')),
     'UnpicklingError'),
    (_raise(EOFError('Ran out of input')), 'EOFError'),
    (_raise(RuntimeError('PytorchStreamReader failed reading zip archive')),
     'RuntimeError'),
    (lambda *a, **k: [1, 2], 'holds a list'),
    (lambda *a, **k: {'w': 'not a tensor'}, 'named tensors'),
])
def test_a_pytorch_bin_torch_refuses_is_one_line(tmp_path, capsys,
                                                 monkeypatch, load, words):
  _fake_torch(monkeypatch, load)
  hf_dir = _hf_dir(tmp_path)
  (hf_dir / 'pytorch_model.bin').write_bytes(b'x')
  err = _one_line(capsys, ['convert', str(hf_dir), str(tmp_path / 'run')])
  assert words in err and 'save_pretrained' in err, err
  assert 'weights_only=False' not in err and 'weights_only` set' not in err
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('index', [
    '[1, 2]', '{"weight_map": [1]}', '{"weight_map": {"a": 3}}',
    '{"weight_map": {"a": ".."}}', '{"weight_map": "x"}', '"text"'])
def test_a_malformed_safetensors_index_is_one_line(tmp_path, index):
  hf_dir = _hf_dir(tmp_path)
  (hf_dir / 'model.safetensors.index.json').write_text(index)
  with pytest.raises(hf_files.HFReformerError, match='weight_map'):
    hf_files.read_tensors(str(hf_dir))


@pytest.mark.parametrize('key,value', [
    ('num_buckets', 'abc'), ('num_buckets', -4), ('num_buckets', 2.5),
    ('num_buckets', [2, 'a']), ('num_buckets', True),
    ('layer_norm_eps', float('nan')), ('layer_norm_eps', True)])
def test_hf_config_values_no_reformer_has_are_refused(key, value):
  with pytest.raises(hf_files.HFReformerError, match=key):
    hf_reformer.lm_kwargs(dict(_CFG, **{key: value}))


def test_a_nan_layer_norm_eps_is_one_line_from_convert(tmp_path, capsys):
  hf_dir = tmp_path / 'hf'
  hf_dir.mkdir()
  # json.dumps writes NaN, which Python's json (and HF's) reads back.
  (hf_dir / 'config.json').write_text(json.dumps(dict(
      _CFG, layer_norm_eps=float('nan'))))
  (hf_dir / 'model.safetensors').write_bytes(b'')
  err = _one_line(capsys, ['convert', str(hf_dir), str(tmp_path / 'run')])
  assert 'layer_norm_eps' in err, err
  assert hf_runs  # The module convert dispatches HF directories to.
