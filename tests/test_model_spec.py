"""A `model.json` names a model constructor and its own arguments, nothing else
(issue 29, item 6).

A crafted file cannot put an arbitrary layer of `retrax.layers` into the
architecture (`PrintShape` as `ff_activation` loaded and printed on every
call), pass arguments the constructor or a layer does not take, or hide a
layer inside plain data; each is a one-line `ModelFileError`. Models whose
arguments loading would refuse record no constructor.
"""

import functools
import json

import pytest

from retrax import layers as tl
from retrax.models import model_spec
from retrax import models
from retrax.models import registry

_SMALL = dict(vocab_size=16, d_model=8, d_ff=16, n_layers=1, n_heads=2,
              max_len=8, dropout=0.0)


def _model_file(tmp_path, **kwargs):
  model = models.TransformerLM(**_SMALL)
  path = registry.write_model_file(str(tmp_path), model)
  with open(path) as f:
    doc = json.load(f)
  doc['kwargs'].update(kwargs)
  with open(path, 'w') as f:
    json.dump(doc, f)
  return path


def test_a_valid_file_loads(tmp_path):
  path = _model_file(tmp_path, ff_activation={'layer': 'Gelu'})
  assert registry.constructor_of(registry.build_from_file(path))['kwargs'][
      'ff_activation'] == {'layer': 'Gelu'}


@pytest.mark.parametrize('kwargs,fragment', [
    (dict(ff_activation={'layer': 'PrintShape'}), "'PrintShape'"),
    (dict(ff_activation={'layer': 'LSHSelfAttention'}), 'ff_activation'),
    (dict(d_model={'layer': 'Relu'}), 'takes no layer'),
    (dict(evil=1), "['evil']"),
    (dict(mode='predict'), "['mode']"),
    (dict(ff_activation={'layer': 'Relu', 'kwargs': {'n': 1}}), "['n']"),
    (dict(ff_activation={'layer': 'Relu', 'extra': 1}), 'ff_activation'),
    (dict(d_ff={'tuple': [{'layer': 'PrintShape'}]}), 'not a value'),
    (dict(d_ff={'dict': {'x': {'layer': 'PrintShape'}}}), 'not a value'),
    (dict(d_ff=[{'layer': 'PrintShape'}]), 'not a value'),
    (dict(ff_activation=[{'layer': 'Relu'}, {'layer': 'PrintShape'}]),
     "'PrintShape'"),
])
def test_crafted_files_are_refused(tmp_path, capsys, kwargs, fragment):
  path = _model_file(tmp_path, **kwargs)
  with pytest.raises(model_spec.ModelFileError) as e:
    registry.build_from_file(path)
  assert fragment in str(e.value) and path in str(e.value)
  assert '\n' not in str(e.value)
  assert capsys.readouterr().out == ''  # No PrintShape ran.


@pytest.mark.parametrize('content', [
    b'{"format": "retrax-model",', b'[1]', b'\xff',
    b'{"format": "retrax-model", "version": 1, "constructor": ["x"]}',
    b'{"format": "retrax-model", "version": 1, "constructor": "MLP", '
    b'"kwargs": [1]}',
])
def test_unreadable_files_are_one_line(tmp_path, content):
  path = tmp_path / 'model.json'
  path.write_bytes(content)
  with pytest.raises(model_spec.ModelFileError) as e:
    registry.build_from_file(str(path))
  assert '\n' not in str(e.value) and str(path) in str(e.value)


def test_models_with_arguments_loading_refuses_record_no_constructor():
  model = models.TransformerLM(ff_activation=tl.PrintShape, **_SMALL)
  assert registry.constructor_of(model) is None
  attention = functools.partial(tl.SelfAttention, chunk_len=4)
  model = models.ReformerLM(vocab_size=16, d_model=8, d_ff=16,
                            d_attention_key=4, d_attention_value=4,
                            n_layers=1, n_heads=2, max_len=8, dropout=0.0,
                            attention_type=attention)
  assert registry.constructor_of(model)['kwargs']['attention_type'] == {
      'layer': 'SelfAttention', 'kwargs': {'chunk_len': 4}}


def test_a_list_of_attention_layers_records_and_loads(tmp_path):
  types = [functools.partial(tl.SelfAttention, chunk_len=4),
           functools.partial(tl.LSHSelfAttention, chunk_len=4, n_hashes=2)]
  model = models.ReformerLM(vocab_size=16, d_model=8, d_ff=16,
                            d_attention_key=4, d_attention_value=4,
                            n_layers=2, n_heads=2, max_len=8, dropout=0.0,
                            attention_type=types)
  path = registry.write_model_file(str(tmp_path), model)
  loaded = registry.build_from_file(path, mode='eval')
  assert registry.constructor_of(loaded)['kwargs']['attention_type'] == [
      {'layer': 'SelfAttention', 'kwargs': {'chunk_len': 4}},
      {'layer': 'LSHSelfAttention', 'kwargs': {'chunk_len': 4, 'n_hashes': 2}}]
