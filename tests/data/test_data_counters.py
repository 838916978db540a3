"""CountAndSkip: Trax's counting sequence, and resuming through save/load."""

import json
import os

import pytest

from retrax import data
from retrax.data import counters


@pytest.fixture(autouse=True)
def _clean_counters():
  saved = dict(counters.data_counters)
  counters.data_counters.clear()
  yield
  counters.data_counters.clear()
  counters.data_counters.update(saved)


def test_count_and_skip_sequence_from_trax():
  examples = data.Serial(lambda _: ((i, i + 1) for i in range(10)),
                         data.CountAndSkip('toy_data'))
  gen = examples()
  assert next(gen) == (0, 1) and counters.data_counters['toy_data'] == 1
  assert next(gen) == (1, 2) and counters.data_counters['toy_data'] == 2
  assert next(examples()) == (2, 3)  # A new stream skips what was delivered.
  assert counters.data_counters['toy_data'] == 3
  counters.data_counters['toy_data'] = 0
  assert next(examples()) == (0, 1)
  assert data.inputs.data_counters is counters.data_counters


def test_resume_after_save_and_load(tmp_path):
  pipeline = data.Serial(lambda _: iter(range(20)), data.CountAndSkip('nums'),
                         data.Batch(3))
  gen = pipeline()
  first = [next(gen).tolist() for _ in range(2)]
  assert first == [[0, 1, 2], [3, 4, 5]]
  path = data.save_data_counters(str(tmp_path), host_id=0)
  assert os.path.basename(path) == 'data_counters0.json'
  with open(path) as f:
    assert json.load(f) == {'nums': 6}

  counters.data_counters.clear()  # As in a fresh process.
  assert data.load_data_counters(str(tmp_path), host_id=0)
  assert next(pipeline()).tolist() == [6, 7, 8]


def test_load_missing_or_bad_counters(tmp_path):
  counters.data_counters['x'] = 5
  assert not data.load_data_counters(str(tmp_path), host_id=3)
  assert counters.data_counters == {'x': 5}
  (tmp_path / 'data_counters1.json').write_text('{"x": "five"}')
  with pytest.raises(ValueError, match='name -> int'):
    data.load_data_counters(str(tmp_path), host_id=1)


def test_count_and_skip_needs_a_name():
  with pytest.raises(ValueError, match='name'):
    data.CountAndSkip('')


def test_uniformly_seek_starts_each_host_at_its_share():
  seek = data.UniformlySeek(name='d', host_id=2, n_hosts=4, dataset_size=40)
  assert list(seek(iter(range(40))))[:3] == [20, 21, 22]
  seek = data.UniformlySeek(name='d', host_id=3, n_hosts=4, dataset_size=400)
  assert list(seek(iter(range(40)))) == []
