"""`TFDS` and `data_streams` read a TFDS dataset prepared on disk, without TF.

The datasets are written here by TFDS's own builder (array_record files, no
TensorFlow, no network); tests that need tensorflow-datasets skip without it.
"""

import os
import sys

import numpy as np
import pytest

from retrax import data
from retrax.data import tensorflow_only
from retrax.data import tfds as tfds_inputs
from retrax.errors import UserInputError

N_TRAIN, N_VALID = 20, 6


def _example(i):
  return {'image': np.full((8, 8, 3), i, np.uint8), 'label': i % 10,
          'text': f'example {i}', 'tokens': np.arange(i % 5 + 1)}


def _build(tfds, data_dir, name, splits, supervised_keys=None, shards=1):
  """Prepares dataset `name` in `data_dir`: `splits` maps names to ranges."""

  def info(self):
    return tfds.core.DatasetInfo(
        builder=self, supervised_keys=supervised_keys, disable_shuffling=True,
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Tensor(shape=(8, 8, 3), dtype=np.uint8),
            'label': tfds.features.ClassLabel(num_classes=10),
            'text': tfds.features.Text(),
            'tokens': tfds.features.Sequence(np.int64)}))

  def generate(self, examples=()):
    for i in examples:
      yield i, _example(i)

  def split_generators(self, dl_manager):
    del dl_manager
    return {s: self._generate_examples(r) for s, r in splits.items()}

  builder_class = type(name, (tfds.core.GeneratorBasedBuilder,), {
      'VERSION': tfds.core.Version('1.0.0'), '_info': info,
      '_split_generators': split_generators, '_generate_examples': generate,
      '__module__': __name__}, skip_registration=True)
  builder_class(data_dir=str(data_dir), file_format='array_record').download_and_prepare(
      download_config=tfds.download.DownloadConfig(num_shards=shards))


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  tfds = pytest.importorskip('tensorflow_datasets')
  path = tmp_path_factory.mktemp('tfds')
  _build(tfds, path, 'RetraxTiny',
         {'train': range(N_TRAIN), 'validation': range(100, 100 + N_VALID)},
         supervised_keys=('image', 'label'), shards=4)
  _build(tfds, path, 'RetraxTestOnly',
         {'train': range(4), 'test': range(50, 53)})
  return str(path)


def _take(stream, n):
  it = iter(stream)
  return [next(it) for _ in range(n)]


def test_tfds_eval_split_in_order_repeated(data_dir):
  source = data.TFDS('retrax_tiny', data_dir=data_dir,
                     keys=('image', 'label'), train=False)
  out = _take(source(), N_VALID + 2)
  assert [int(label) for _, label in out] == [
      (100 + i) % 10 for i in range(N_VALID)] + [0, 1]
  image, label = out[1]
  assert image.dtype == np.uint8 and image.shape == (8, 8, 3)
  assert image[0, 0, 0] == 101 and isinstance(label, np.int64)


def test_tfds_examples_are_numpy_dicts_without_keys(data_dir):
  before = set(sys.modules)
  [x] = _take(data.TFDS('retrax_tiny', data_dir=data_dir, train=False)(), 1)
  imported = set(sys.modules) - before
  assert not {m for m in imported if m.split('.')[0] == 'tensorflow'}
  assert x['text'] == b'example 100'
  assert x['tokens'].dtype == np.int64
  np.testing.assert_array_equal(x['tokens'], np.arange(1))


def test_tfds_train_reads_shards_in_random_order(data_dir):
  ordered = data.TFDS('retrax_tiny', data_dir=data_dir, keys=('image',),
                      shuffle_train=False)
  firsts = [int(x[0][0, 0, 0]) for x in _take(ordered(), N_TRAIN)]
  assert firsts == list(range(N_TRAIN))
  np.random.seed(1)
  shuffled = data.TFDS('retrax_tiny', data_dir=data_dir, keys=('image',))
  firsts = [int(x[0][0, 0, 0]) for x in _take(shuffled(), 2 * N_TRAIN)]
  assert sorted(firsts[:N_TRAIN]) == list(range(N_TRAIN))
  assert firsts[:N_TRAIN] != list(range(N_TRAIN))
  # Shards stay whole: each index follows its predecessor within a shard.
  starts = [i for i, x in enumerate(firsts) if i == 0 or x != firsts[i - 1] + 1]
  assert len(starts) <= 8


def test_tfds_holdout_and_hosts_split_the_train_split(data_dir):
  def labels(**kwargs):
    source = data.TFDS('retrax_tiny', data_dir=data_dir, keys=('image',),
                       shuffle_train=False, **kwargs)
    return [int(x[0][0, 0, 0]) for x in _take(source(), 5)]
  assert labels(train=False, eval_holdout_size=0.25) == [15, 16, 17, 18, 19]
  assert labels(eval_holdout_size=0.25) == [0, 1, 2, 3, 4]
  assert labels(host_id=1, n_hosts=2) == [10, 11, 12, 13, 14]
  assert labels(host_id=1, n_hosts=2, eval_holdout_size=0.5)[:3] == [5, 6, 7]


def test_tfds_preprocess_fn_gets_each_epoch(data_dir):
  calls = []

  def keep_even(examples):
    calls.append(1)
    return (x for x in examples if x['label'] % 2 == 0)
  source = data.TFDS('retrax_test_only', data_dir=data_dir, keys=('label',),
                     tfds_preprocess_fn=keep_even, train=False)
  assert [int(x[0]) for x in _take(source(), 3)] == [0, 2, 0]
  assert len(calls) == 2


def test_data_streams_supervised_keys_and_batcher(data_dir, monkeypatch):
  monkeypatch.setattr(tfds_inputs.random, 'randint', lambda a, b: 3)
  train_fn, eval_fn = data.data_streams('retrax_tiny', data_dir=data_dir,
                                        shuffle_buffer_size=1)
  image, label = next(eval_fn())
  assert image.dtype == np.int32 and image[0, 0, 0] == 100 and label == 0
  np.random.seed(0)
  order = [i for s in np.random.RandomState(0).permutation(4)
           for i in range(5 * s, 5 * s + 5)]
  got = [int(x[0][0, 0, 0]) for x in _take(train_fn(), N_TRAIN - 3)]
  assert got == order[3:]
  inputs = data.batcher(data.data_streams('retrax_tiny', data_dir=data_dir),
                        variable_shapes=False, batch_size=4, eval_batch_size=2)
  x, y, w = next(inputs.train_stream(1))
  assert x.shape == (4, 8, 8, 3) and y.shape == (4,) and w.shape == (4,)
  assert next(inputs.eval_stream(1))[0].shape == (2, 8, 8, 3)


def test_data_streams_preprocess_functions_and_names(data_dir):
  seen = []

  def bare(examples, training):
    seen.append(('bare', training))
    return data.downsampled_imagenet_flatten_bare_preprocess(examples, training)

  def pre(pairs, training):
    seen.append(('pre', training))
    return pairs
  train_fn, eval_fn = data.data_streams(
      'retrax_test_only', data_dir=data_dir, input_name='image',
      target_name='image', bare_preprocess_fn=bare, preprocess_fn=pre,
      shuffle_buffer_size=1)
  inputs, targets = next(eval_fn())
  assert inputs.shape == (192,) and inputs.dtype == np.int64
  assert inputs[0] == 50 and inputs is targets
  next(train_fn())
  assert seen[:4] == [('pre', False), ('bare', False), ('pre', True),
                      ('bare', True)]
  assert set(seen[4:]) <= {('bare', True)}  # A new epoch after the skip.


def test_data_streams_filters_and_masks(data_dir):
  train_fn, _ = data.data_streams(
      'retrax_tiny', data_dir=data_dir, input_name='tokens',
      target_name='tokens', shuffle_buffer_size=4,
      preprocess_fn=lambda ds, training: data.lm1b_preprocess(
          data.wmt_concat_preprocess(
              ((dict(f, inputs=f['tokens']), t) for f, t in ds), training),
          training, max_target_length=5))
  for inputs, targets, mask in _take(train_fn(), 10):
    assert len(targets) <= 5 and mask[-1] == 1
    np.testing.assert_array_equal(inputs, np.arange(len(inputs)))


def test_data_streams_needs_names_without_supervised_keys(data_dir):
  with pytest.raises(UserInputError, match='input_name'):
    data.data_streams('retrax_test_only', data_dir=data_dir)
  with pytest.raises(UserInputError, match='dataset_name'):
    data.data_streams()


def _one_line(excinfo):
  text = str(excinfo.value)
  assert '\n' not in text
  return text


def test_unprepared_dataset_says_how_to_prepare_and_downloads_nothing(tmp_path):
  pytest.importorskip('tensorflow_datasets')
  for name in ['mnist', 'no_such_dataset_here']:
    with pytest.raises(UserInputError) as e:
      data.TFDS(name, data_dir=str(tmp_path))
    text = _one_line(e)
    assert repr(name) in text and str(tmp_path) in text
    assert '--file_format=array_record' in text and 'TextLines' in text
  with pytest.raises(UserInputError, match="'cifar10' is not prepared"):
    data.data_streams('cifar10', data_dir=str(tmp_path))
  assert not os.listdir(tmp_path)


def test_tfrecord_dataset_says_to_convert(data_dir, monkeypatch):
  tfds = pytest.importorskip('tensorflow_datasets')

  def tfrecord(self, split=None):
    raise NotImplementedError('Random access data source for file format '
                              'tfrecord is not supported.')
  monkeypatch.setattr(tfds.core.DatasetBuilder, 'as_data_source', tfrecord)
  with pytest.raises(UserInputError) as e:
    data.TFDS('retrax_tiny', data_dir=data_dir)
  assert 'not array_record' in _one_line(e) and 'convert_format' in str(e.value)


def test_default_data_dir(monkeypatch, tmp_path):
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path))
  assert tfds_inputs._data_dir(None) == str(tmp_path)
  monkeypatch.delenv('TFDS_DATA_DIR')
  assert tfds_inputs._data_dir(None) == os.path.expanduser('~/tensorflow_datasets')


@pytest.mark.parametrize('name', ['t2t_enwik8_l65k', 't2t_translate_ende_wmt32k',
                                  't2t_languagemodel_lm1b32k'])
def test_t2t_problems_name_the_local_alternative(name):
  with pytest.raises(tensorflow_only.TensorFlowOnlyError) as e:
    data.data_streams(name)
  text = _one_line(e)
  assert repr(name[4:]) in text and 'text_streams' in text
  assert 'TextLines' in text


def test_without_tensorflow_datasets_installed(monkeypatch):
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)
  with pytest.raises(tensorflow_only.TensorFlowOnlyError) as e:
    data.TFDS('cifar10', keys=('image', 'label'))
  text = _one_line(e)
  assert "'cifar10'" in text and 'retrax[tfds]' in text and 'NumpyArrays' in text
  with pytest.raises(ImportError):
    data.data_streams('mnist', data_dir='/nonexistent')


def test_uint8_inputs_become_int32_in_streams():
  pairs = [({'x': np.zeros(3, np.uint8), 'mask': np.ones(3)},
            np.zeros(3, np.uint8))]
  x, y, mask = next(data.dataset_to_stream(iter(pairs), 'x'))
  assert x.dtype == np.int32 and y.dtype == np.int32 and mask.shape == (3,)


def test_png_image_features_decode_without_tensorflow(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  pil_image = pytest.importorskip('PIL.Image')
  images = [np.random.RandomState(i).randint(0, 256, (4, 4, 3)).astype(np.uint8)
            for i in range(3)]

  class RetraxPng(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """CIFAR-like: PNG-encoded images (written from PIL images, as TF would)."""
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self, supervised_keys=('image', 'label'),
          disable_shuffling=True, features=tfds.features.FeaturesDict({
              'image': tfds.features.Image(shape=(4, 4, 3)),
              'label': tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
      return {'train': self._generate_examples(), 'test': self._generate_examples()}

    def _generate_examples(self):
      for i, image in enumerate(images):
        yield i, {'image': pil_image.fromarray(image), 'label': i}

  RetraxPng(data_dir=str(tmp_path), file_format='array_record').download_and_prepare()
  _, eval_fn = data.data_streams(
      'retrax_png', data_dir=str(tmp_path), shuffle_buffer_size=1,
      preprocess_fn=data.cifar10_no_augmentation_preprocess)
  for image, (x, label) in zip(images, _take(eval_fn(), 3)):
    np.testing.assert_allclose(x, image / 255.0, rtol=1e-6)
    assert x.dtype == np.float32 and label in (0, 1, 2)
