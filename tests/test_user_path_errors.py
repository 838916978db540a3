"""One-line errors for a tutorial's paths: .pkl vs .pkl.gz, gs:// URLs, TFDS."""

import importlib
import itertools

import numpy as np
import pytest

import retrax as trax
from retrax import layers as tl
from retrax import local_paths
from retrax import shapes
from retrax.checkpoints import convert
from retrax.checkpoints.errors import CheckpointNotFoundError
from retrax.data import tensorflow_only
from retrax.errors import UserInputError
from retrax.supervised import training


def _saved_model(tmp_path):
  model = tl.Serial(tl.Dense(3))
  model.init(shapes.signature(np.ones((1, 2), np.float32)))
  model.save_to_file(str(tmp_path / 'model.pkl.gz'),
                     input_signature=shapes.ShapeDtype((1, 2)))
  return model


def _one_line(e):
  text = str(e.value)
  assert '\n' not in text and 'Traceback' not in text
  return text


def test_pkl_next_to_pkl_gz_names_the_gz_path(tmp_path):
  model = _saved_model(tmp_path)
  with pytest.raises(CheckpointNotFoundError) as e:
    model.init_from_file(str(tmp_path / 'model.pkl'))
  assert f"pass '{tmp_path / 'model.pkl.gz'}'" in _one_line(e)
  # The hinted path works.
  model.init_from_file(str(tmp_path / 'model.pkl.gz'))
  # No sibling: no hint, still one line naming the file.
  with pytest.raises(CheckpointNotFoundError) as e:
    model.init_from_file(str(tmp_path / 'other.pkl'))
  assert _one_line(e) == f"init_from_file: no file '{tmp_path / 'other.pkl'}'."


def test_gz_asked_next_to_plain_pickle(tmp_path):
  (tmp_path / 'model.pkl').write_bytes(b'x')
  assert local_paths.missing_hint(str(tmp_path / 'model.pkl.gz')) == (
      f" {tmp_path / 'model.pkl'} exists next to it: pass "
      f"'{tmp_path / 'model.pkl'}'.")


@pytest.mark.parametrize('url,hint', [
    ('gs://trax-ml/reformer/model.pkl.gz', 'gsutil cp -r gs://'),
    ('s3://bucket/model.pkl.gz', 'aws s3 cp'),
    ('https://example.org/model.pkl.gz', 'curl -O'),
    ('hdfs://nn/model.pkl.gz', 'Copy it to this machine first and pass'),
])
def test_urls_refused_everywhere_a_path_is_taken(tmp_path, url, hint):
  model = _saved_model(tmp_path)
  calls = [
      lambda: model.init_from_file(url, weights_only=True),
      lambda: convert.convert(url, str(tmp_path / 'out')),
      lambda: convert.convert(str(tmp_path / 'model.pkl.gz'), url),
      lambda: trax.data.TextLines(url),
      lambda: trax.data.TextChunks(url, 64),
      lambda: trax.data.NumpyArrays(url),
      lambda: trax.data.SentencePieceVocabulary(url),
      lambda: trax.data.SubwordTextEncoder(url),
  ]
  for call in calls:
    with pytest.raises(local_paths.RemotePathError) as e:
      src = call()
      if callable(src):
        next(iter(src()))
    text = _one_line(e)
    assert url in text and 'local files only' in text and hint in text
  assert not (tmp_path / 'out').exists()


def _batches():
  x = np.zeros((2, 2), np.float32)
  return itertools.repeat((x, np.zeros((2, 3), np.float32), np.ones((2, 3))))


def test_loop_output_dir_and_load_checkpoint_refuse_urls(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  task = training.TrainTask(_batches(), tl.L2Loss(), trax.optimizers.SGD(0.1))
  model = tl.Serial(tl.Dense(3))
  with pytest.raises(local_paths.RemotePathError, match='Loop: output_dir'):
    training.Loop(model, task, output_dir='gs://bucket/run')
  assert not (tmp_path / 'gs:').exists()  # No local 'gs:' folder was made.
  loop = training.Loop(model, task)
  with pytest.raises(local_paths.RemotePathError, match='load_checkpoint'):
    loop.load_checkpoint('gs://bucket/run')


def test_local_paths_pass_through(tmp_path):
  assert local_paths.check_local(tmp_path / 'a', 'x') == str(tmp_path / 'a')
  assert local_paths.check_local('C:/data/a.txt', 'x') == 'C:/data/a.txt'
  assert local_paths.check_local('file.txt', 'x') == 'file.txt'
  assert local_paths.url_scheme('GS://b/x') == 'gs'


def test_tf_inputs_attribute_path_says_what_to_use_instead(tmp_path):
  # TFDS reads prepared datasets without TF: an unprepared one (or no
  # tensorflow-datasets) says what to use instead, as the T2T/BERT names do.
  with pytest.raises((tensorflow_only.TensorFlowOnlyError, UserInputError),
                     match='TextLines'):
    trax.data.tf_inputs.TFDS('mnist', data_dir=str(tmp_path))
  with pytest.raises(tensorflow_only.TensorFlowOnlyError, match='TextLines'):
    trax.data.tf_inputs.CreateBertInputs()


@pytest.mark.parametrize('name', ['CreateBertInputs', 'CorpusToRandomChunks',
                                  't5_data'])
def test_tfds_names_say_what_to_use_instead(name):
  with pytest.raises(tensorflow_only.TensorFlowOnlyError) as e:
    getattr(trax.data, name)
  text = _one_line(e)
  assert 'retrax does not use' in text and 'TextLines' in text
  assert 'NumpyArrays' in text and 'trax.data.TFDS' in text
  with pytest.raises(ImportError, match='needs TensorFlow'):
    exec(f'from retrax.data import {name}', {})


def test_tf_inputs_module_names_raise_with_the_fix():
  module = importlib.import_module('retrax.data.tf_inputs')
  with pytest.raises(ImportError, match=r'trax\.data\.CreateBertInputs \(from trax'):
    exec('from retrax.data.tf_inputs import CreateBertInputs', {})
  with pytest.raises(tensorflow_only.TensorFlowOnlyError, match='TextLines'):
    module.data_streams('t2t_translate_ende_wmt32k')
  # Unknown names still raise a plain AttributeError (hasattr stays usable).
  assert not hasattr(trax.data, 'NoSuchThing')
  assert not hasattr(module, 'NoSuchThing')
  # Provided tf_inputs names are not refused.
  assert module.TFDS is trax.data.TFDS and callable(module.lm1b_preprocess)
  assert callable(trax.data.Tokenize) and callable(trax.data.vocab_size)
