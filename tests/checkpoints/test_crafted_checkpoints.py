"""Crafted checkpoints raise one-line `CheckpointError`s, never Python's own
errors (issue 29, item 3).

Native `metadata.json` files here carry a valid checksum (an attacker can
recompute it), so only the content checks stand between them and the
decoder; the pickles pass the restricted unpickler's global allow-list.
"""

import gzip
import hashlib
import json
import os
import pickle
import time

import numpy as np
import pytest

from retrax.app import cli
from retrax.checkpoints import convert
from retrax.checkpoints import native
from retrax.checkpoints import read_trax_checkpoint
from retrax.checkpoints.errors import CheckpointError


def _native_checkpoint(path):
  return native.save_native(
      path, {'weights': [np.ones(2, np.float32)], 'blob': b'xy',
             'table': {'a': 1}}, {'step': 3, 'kind': 'Loop'})


def _rewrite(path, edit):
  """Edits `path`'s metadata document (a dict, or its text) and re-signs it."""
  meta = os.path.join(path, native.METADATA_FILE)
  with open(meta) as f:
    doc = json.load(f)
  doc.pop('checksum')
  if callable(edit):
    edit(doc)
  body = json.dumps(doc, separators=(',', ':')).encode()  # As signed.
  doc['checksum'] = hashlib.sha256(body).hexdigest()
  text = json.dumps(doc)
  if not callable(edit):  # (old, new) text, e.g. a number JSON cannot hold.
    text = text.replace(*edit)
  with open(meta, 'w') as f:
    f.write(text)


def _bad_base64(doc):
  doc['trees']['blob']['v'] = '!!not base64'


def _list_as_key(doc):
  doc['trees']['table']['keys'] = [[1]]


def _string_step(doc):
  doc['metadata']['step'] = 'abc'


def _bad_namedtuple(doc):
  doc['trees']['table'] = {'t': 'namedtuple', 'name': 'T', 'fields': [[1]],
                           'items': []}


@pytest.mark.parametrize('edit', [
    pytest.param(('"step": 3', '"step": ' + '9' * 5000), id='5000-digit-step'),
    pytest.param(_bad_base64, id='invalid-base64'),
    pytest.param(_list_as_key, id='list-as-dict-key'),
    pytest.param(_string_step, id='string-step'),
    pytest.param(_bad_namedtuple, id='namedtuple-of-lists'),
])
def test_crafted_native_metadata_is_a_checkpoint_error(tmp_path, capsys, edit):
  path = _native_checkpoint(str(tmp_path / 'ckpt'))
  _rewrite(path, edit)
  try:  # Loading may succeed only where the content is well-formed.
    native.load_native(path)
  except CheckpointError as e:
    assert '\n' not in str(e) and path in str(e)
  dst = str(tmp_path / 'out')
  assert cli.main(['convert', path, dst]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('retrax convert: error:') and '\n' not in err, err
  assert not os.path.exists(dst + '.pkl.gz')


def _pickle_gz(path, obj):
  with open(path, 'wb') as f:
    f.write(gzip.compress(pickle.dumps(obj)))
  return str(path)


def test_a_self_referencing_pickle_is_one_line(tmp_path, capsys):
  loop = []
  loop.append(loop)
  path = _pickle_gz(tmp_path / 'model.pkl.gz', {'flat_weights': loop,
                                               'step': 1})
  with pytest.raises(CheckpointError, match='contains itself'):
    read_trax_checkpoint(path)
  assert cli.main(['convert', path, str(tmp_path / 'out')]) == 2
  err = capsys.readouterr().err.strip()
  assert 'contains itself' in err and '\n' not in err
  assert not os.path.exists(tmp_path / 'out')


def test_shared_references_are_walked_once(tmp_path):
  """A pickle of 60 levels of `[a, a]` (2**60 paths, 60 lists) is read at
  once: the cycle check visits each container once."""
  node = [np.ones(1, np.float32)]
  for _ in range(60):
    node = [node, node]
  path = _pickle_gz(tmp_path / 'm.pkl.gz', {'flat_weights': [], 'step': 1,
                                           'input_signature': node})
  start = time.time()
  read_trax_checkpoint(path)
  assert time.time() - start < 5


@pytest.mark.parametrize('content', [
    {'flat_weights': [np.ones(2)], 'step': 'abc'},
    {'flat_weights': [np.ones(2)], 'step': 1, 'history': {'train': {'x': 5}}},
    {'flat_weights': [np.ones(2)], 'step': 1, 'slots_per_task': [[1, [2]]],
     'history': {'eval': {'m': [(1,)]}}},
    {'weights': 5, 'model_state': 3},
])
def test_malformed_pickled_content_is_a_checkpoint_error(tmp_path, content):
  path = _pickle_gz(tmp_path / 'model.pkl.gz', content)
  with pytest.raises(CheckpointError) as e:
    read_trax_checkpoint(path)
  assert '\n' not in str(e.value) and path in str(e.value)
  with pytest.raises(CheckpointError):
    convert.convert(path, str(tmp_path / 'out'))
