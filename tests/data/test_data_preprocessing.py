"""Trax's tf_inputs preprocessors over iterators, against numpy references."""

import numpy as np
import pytest

from retrax import data
from retrax.data import preprocessing
from retrax.errors import UserInputError


def _pairs(*lengths):
  """(features, targets) pairs: inputs of length i, targets of length l."""
  return [({'inputs': np.arange(1, i + 1), 'id': i}, np.full(l, 7))
          for i, l in lengths]


def test_names_are_trax_data_names():
  for name in ['lm1b_preprocess', 'wmt_preprocess', 'wmt_concat_preprocess',
               'filter_dataset_on_len', 'truncate_dataset_on_len',
               'pad_dataset_to_length', 'squeeze_targets_preprocess',
               'downsampled_imagenet_flatten_bare_preprocess',
               'cifar10_no_augmentation_preprocess', 'concat_preprocess',
               'lm_token_preprocessing', 'add_eos_to_output_features']:
    assert getattr(data, name) is getattr(preprocessing, name)
    assert getattr(data.tf_inputs, name) is getattr(preprocessing, name)


def test_lm1b_preprocess_filters_targets_by_train_or_eval_maximum():
  pairs = _pairs((1, 3), (1, 4), (1, 5), (1, 9))
  lengths = lambda out: [len(t) for _, t in out]
  assert lengths(data.lm1b_preprocess(iter(pairs), True, 4, 8)) == [3, 4]
  assert lengths(data.lm1b_preprocess(iter(pairs), False, 4, 8)) == [3, 4, 5]
  assert lengths(data.lm1b_preprocess(iter(pairs), True)) == [3, 4, 5, 9]
  assert lengths(data.lm1b_preprocess(iter(pairs), False, 4)) == [3, 4, 5, 9]


def test_wmt_preprocess_uses_the_longer_of_inputs_and_targets():
  pairs = _pairs((2, 2), (5, 2), (2, 5), (3, 3))
  ids = lambda out: [f['id'] for f, _ in out]
  assert ids(data.wmt_preprocess(iter(pairs), True, max_length=3)) == [2, 3]
  assert ids(data.wmt_preprocess(iter(pairs), False, max_length=3)) == [
      2, 5, 2, 3]
  assert ids(data.wmt_preprocess(iter(pairs), False, max_eval_length=2)) == [2]


def test_wmt_concat_preprocess_concatenates_with_a_targets_mask():
  pairs = _pairs((2, 3), (9, 1))
  out = list(data.wmt_concat_preprocess(iter(pairs), True, max_length=4))
  assert len(out) == 1
  features, seq = out[0]
  np.testing.assert_array_equal(seq, [1, 2, 0, 7, 7, 7])
  np.testing.assert_array_equal(features['inputs'], seq)
  np.testing.assert_array_equal(features['mask'], [0, 0, 0, 1, 1, 1])
  np.testing.assert_array_equal(pairs[0][0]['inputs'], [1, 2])  # Not changed.


def test_concat_preprocess_pads_before_inputs_and_targets():
  [(features, seq)] = data.concat_preprocess(iter(_pairs((2, 2))), True,
                                             pad_symbol=5)
  np.testing.assert_array_equal(seq, [5, 1, 2, 5, 7, 7])
  np.testing.assert_array_equal(features['inputs'], seq)


def test_lm_token_preprocessing_on_feature_dicts():
  example = {'inputs': np.array([3, 4]), 'targets': np.array([5])}
  [x] = data.lm_token_preprocessing(iter([example]), False)
  np.testing.assert_array_equal(x['inputs'], [3, 4, 0, 5])
  np.testing.assert_array_equal(x['targets'], [3, 4, 0, 5])
  np.testing.assert_array_equal(x['mask'], [0, 0, 0, 1])
  assert list(example) == ['inputs', 'targets']


def test_squeeze_targets_preprocess():
  pairs = [({}, np.zeros((3, 1))), ({}, np.zeros((3, 2))), ({}, np.int64(4))]
  shapes = [np.shape(t) for _, t in
            data.squeeze_targets_preprocess(iter(pairs), True)]
  assert shapes == [(3,), (3, 2), ()]


def test_len_map_functions_filter_truncate_and_pad():
  xs = [{'inputs': np.arange(n) + 1, 'targets': np.arange(2) + 1}
        for n in (1, 3, 6)]
  len_map = {'inputs': (2, 5)}
  lens = lambda out: [len(x['inputs']) for x in out]
  assert lens(data.filter_dataset_on_len(iter(xs), True, len_map)) == [3]
  assert lens(data.filter_dataset_on_len(iter(xs), False, len_map)) == [1, 3, 6]
  assert lens(data.filter_dataset_on_len(iter(xs), False, len_map,
                                         filter_on_eval=True)) == [3]
  assert lens(data.truncate_dataset_on_len(iter(xs), True, {'inputs': 2})) == [
      1, 2, 2]
  assert lens(data.truncate_dataset_on_len(iter(xs), False, {'inputs': 2})) == [
      1, 3, 6]
  padded = list(data.pad_dataset_to_length(iter(xs), False, {'inputs': 4}))
  np.testing.assert_array_equal(padded[0]['inputs'], [1, 0, 0, 0])
  assert lens(padded) == [4, 4, 6] and len(xs[0]['inputs']) == 1
  with pytest.raises(TypeError, match='len_map'):
    list(data.filter_dataset_on_len(iter(xs), True, [('inputs', (1, 2))]))


def test_add_eos_to_output_features():
  xs = [{'inputs': np.array([4]), 'targets': np.array([5, 6], np.int32)}]
  [x] = data.add_eos_to_output_features(iter(xs), True)
  np.testing.assert_array_equal(x['targets'], [5, 6, 1])
  assert x['targets'].dtype == np.int32
  [x] = data.add_eos_to_output_features(iter(xs), True, ('inputs', 'targets'),
                                        eos=9)
  np.testing.assert_array_equal(x['inputs'], [4, 9])


def test_downsampled_imagenet_flatten_keeps_the_image_only():
  image = np.arange(2 * 2 * 3, dtype=np.uint8).reshape(2, 2, 3)
  [x] = data.downsampled_imagenet_flatten_bare_preprocess(
      iter([{'image': image, 'label': 1}]), True)
  assert list(x) == ['image'] and x['image'].dtype == np.int64
  np.testing.assert_array_equal(x['image'], np.arange(12))


def _cifar(n=3, size=32):
  return [({'image': np.full((size, size, 3), 10 * i, np.uint8)}, np.int64(i))
          for i in range(n)]


def test_cifar10_no_augmentation_scales_to_float():
  out = list(data.cifar10_no_augmentation_preprocess(iter(_cifar()), True))
  assert out[1][0]['image'].dtype == np.float32
  np.testing.assert_allclose(out[1][0]['image'], 10 / 255, rtol=1e-6)
  assert [t for _, t in out] == [0, 1, 2]


def _reference_augment(image, rng):
  """Pad 4 on each side, crop 32x32 at random, flip half: numpy reference."""
  padded = np.pad(image, ((4, 4), (4, 4), (0, 0)))
  top, left = rng.randint(0, 9), rng.randint(0, 9)
  crop = padded[top:top + 32, left:left + 32]
  return crop[:, ::-1] if rng.uniform() < 0.5 else crop


def test_cifar10_augmentation_crops_and_flips_in_training_only():
  image = np.random.RandomState(0).randint(0, 256, (32, 32, 3)).astype(np.uint8)
  examples = [({'image': image}, np.int64(0))] * 8
  np.random.seed(3)
  out = [f['image'] for f, _ in
         data.cifar10_augmentation_preprocess(iter(examples), True)]
  rng = np.random.RandomState(3)
  for got in out:
    np.testing.assert_allclose(got, _reference_augment(image, rng) / 255.0,
                               rtol=1e-6)
  assert len({g.tobytes() for g in out}) > 1
  [(features, _)] = data.cifar10_augmentation_preprocess(iter(examples[:1]),
                                                         False)
  np.testing.assert_allclose(features['image'], image / 255.0, rtol=1e-6)


def test_crop_or_pad_centres_like_tf_image():
  image = np.arange(5 * 7).reshape(5, 7, 1)
  out = preprocessing._crop_or_pad(image, 8, 4)
  assert out.shape == (8, 4, 1)
  np.testing.assert_array_equal(out[1:6, :, 0], image[:, 1:5, 0])
  assert not out[0].any() and not out[6:].any()


def test_cifar10_augmentation_flatten_appends_label_and_mask():
  np.random.seed(0)
  [(features, seq)] = data.cifar10_augmentation_flatten_preprocess(
      iter(_cifar(1)), False)
  assert seq.shape == (32 * 32 * 3 + 1,) and seq.dtype == np.int64
  assert seq[-1] == 0 and features['image'] is seq
  assert features['mask'][-1] == 1 and not features['mask'][:-1].any()
  [(features, _)] = data.cifar10_augmentation_flatten_preprocess(
      iter(_cifar(1)), True, predict_image_train_weight=0.5)
  np.testing.assert_allclose(features['mask'][:-1], 0.5)


def test_c4_preprocess_code_points_and_length_filter():
  pairs = [({'text': 'héllo'.encode()}, None), ({'text': b'a' * 9}, None),
           ({'text': b'\xff'}, None)]
  out = list(data.c4_preprocess(iter(pairs), True, max_target_length=5))
  assert len(out) == 2
  features, targets = out[0]
  np.testing.assert_array_equal(targets, [ord(c) for c in 'héllo'])
  assert targets.dtype == np.int64 and features['inputs'] is targets
  np.testing.assert_array_equal(out[1][1], [0xFFFD])
  with pytest.raises(UserInputError, match='spm_path'):
    data.c4_preprocess(iter(pairs), True, tokenization='spc')


def test_c4_preprocess_sentencepiece(tmp_path):
  pytest.importorskip('sentencepiece')
  model = data.train_sentencepiece(['the cat sat on the mat'] * 50,
                                   str(tmp_path / 'spm'), vocab_size=15)
  vocab = data.SentencePieceVocabulary(model)
  [(_, targets)] = data.c4_preprocess(iter([({'text': b'the cat'}, None)]),
                                      True, tokenization='spc', spm_path=model)
  np.testing.assert_array_equal(targets, vocab.encode('the cat'))


def test_bair_robot_pushing_preprocess_and_hparams():
  inputs, targets = np.ones((1, 2, 2)), np.full((2, 2, 2), 3)
  [(features, seq)] = data.bair_robot_pushing_preprocess(
      iter([({'inputs': inputs}, targets)]), True)
  assert seq.dtype == np.int32 and seq.shape == (12,)
  np.testing.assert_array_equal(features['mask'], [0] * 4 + [1] * 8)
  assert data.bair_robot_pushing_hparams() == (1, 15)

  class HParams:
    pass
  hparams = HParams()
  data.bair_robot_pushing_hparams(hparams, 2, 3)
  assert (hparams.video_num_input_frames, hparams.video_num_target_frames) == (
      2, 3)


def test_no_preprocess_returns_the_dataset():
  it = iter([1])
  assert data.no_preprocess(it, True) is it
