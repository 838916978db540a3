"""A training checkpoint with valid checksums but crafted positions is a
one-line `CheckpointError` on resume, not a Python error (issue 29, item 3)."""

import hashlib
import json
import os

import pytest

import resume_worker
from retrax.app import cli
from retrax.checkpoints import native
from retrax.checkpoints.errors import CheckpointError


def _resign(path, field, value):
  meta = os.path.join(path, native.METADATA_FILE)
  with open(meta) as f:
    doc = json.load(f)
  doc.pop('checksum')
  doc['metadata'][field] = value
  body = json.dumps(doc, separators=(',', ':')).encode()  # As signed.
  doc['checksum'] = hashlib.sha256(body).hexdigest()
  with open(meta, 'w') as f:
    json.dump(doc, f)


@pytest.mark.parametrize('field,value', [
    ('history', 5), ('history', {'train': {'loss': [[1]]}}),
    ('batches', {'train': ['x']}), ('batches', [1]),
    ('accumulator', [1]), ('accumulator', {'task_index': 0}),
    ('step', '3'),
])
def test_crafted_training_metadata_is_one_line(tmp_path, field, value):
  out = str(tmp_path)
  resume_worker.run(out, 3)
  _resign(os.path.join(out, 'ckpt_000000003'), field, value)
  try:  # The resume reads the newest checkpoint, ckpt_3.
    loop = resume_worker.make_loop(out)
  except CheckpointError as e:
    error = e
  else:  # A checkpoint recording no int step is skipped: name it.
    with pytest.raises(CheckpointError) as info:
      loop.load_checkpoint(filename='ckpt_000000003')
    error = info.value
  assert '\n' not in str(error) and 'ckpt_000000003' in str(error)
  # Converting it reads what Trax's files hold: a result or one line.
  assert cli.main(['convert', os.path.join(out, 'ckpt_000000003'),
                   str(tmp_path / 'x')]) in (0, 2)
