"""Trax's dataset preprocessors (`lm1b_preprocess`, ...) over Python iterators.

Trax's versions map `tf.data` datasets; these take an iterator of numpy
examples and return one, with Trax's arguments, so gin configs bind them
unchanged (``data_streams.preprocess_fn = @data.lm1b_preprocess``). Each is
called as ``fn(dataset, training)``: `data_streams` passes
``bare_preprocess_fn`` the dataset's feature dicts and ``preprocess_fn`` the
``(features, targets)`` pairs it makes of them, as Trax does.

Every function is lazy (it reads one example per example it yields), copies a
feature dict before changing it (a ``tf.data`` map never changes its input),
and, for the augmentations, draws from numpy's global random generator
(``np.random.seed`` makes them repeatable).
"""

from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from retrax import local_paths
from retrax.configurable import configurable
from retrax.errors import UserInputError
from retrax.validation import ArgumentTypeError

Examples = Iterable[Any]


def no_preprocess(dataset: Examples, training: bool) -> Examples:
  """Returns `dataset` unchanged (`data_streams`' default ``preprocess_fn``)."""
  del training
  return dataset


def _map_pairs(fn, dataset):
  """Yields ``fn(dict(features), targets)`` for each ``(features, targets)``."""
  for features, targets in dataset:
    yield fn(dict(features), targets)


# Images.


def _scale_image(features, targets):
  features['image'] = np.asarray(features['image'], np.float32) / 255.0
  return features, targets


@configurable('trax.data', denylist=('dataset', 'training'))
def cifar10_no_augmentation_preprocess(dataset: Examples,
                                       training: bool) -> Iterator[Any]:
  """Scales ``features['image']`` to float32 in [0, 1]."""
  del training
  return _map_pairs(_scale_image, dataset)


def _crop_or_pad(image, height, width):
  """`tf.image.resize_with_crop_or_pad`: centred crop or zero padding."""
  for axis, size in ((0, height), (1, width)):
    n = image.shape[axis]
    if n > size:
      image = np.take(image, np.arange((n - size) // 2, (n - size) // 2 + size),
                      axis=axis)
    elif n < size:
      pad = [(0, 0)] * image.ndim
      pad[axis] = ((size - n) // 2, size - n - (size - n) // 2)
      image = np.pad(image, pad)
  return image


def _cifar_augment_image(image):
  """Pads to 40x40, crops a random 32x32 and flips half the images.

  The augmentation of https://arxiv.org/pdf/1608.06993v3.pdf (page 5), as
  Trax applies it to CIFAR-10/100.
  """
  image = _crop_or_pad(np.asarray(image), 40, 40)
  top = np.random.randint(0, image.shape[0] - 32 + 1)
  left = np.random.randint(0, image.shape[1] - 32 + 1)
  image = image[top:top + 32, left:left + 32]
  if np.random.uniform() < 0.5:
    image = image[:, ::-1]
  return image


def _augment(features, targets):
  features['image'] = _cifar_augment_image(features['image'])
  return features, targets


@configurable('trax.data', denylist=('dataset', 'training'))
def cifar10_augmentation_preprocess(dataset: Examples,
                                    training: bool) -> Iterator[Any]:
  """Random crop and flip of ``features['image']`` in training, then scaling."""
  if training:
    dataset = _map_pairs(_augment, dataset)
  return _map_pairs(_scale_image, dataset)


@configurable('trax.data', denylist=('dataset', 'training'))
def cifar10_augmentation_flatten_preprocess(
    dataset: Examples, training: bool,
    predict_image_train_weight: float = 0.01) -> Iterator[Any]:
  """Augments in training, then flattens the image and appends the label.

  Yields ``({'image': seq, 'mask': weights}, seq)`` with ``seq`` the int64
  pixels followed by the label; the loss weight of each pixel is
  `predict_image_train_weight` in training (0 in eval), the label's 1.
  """
  weight = predict_image_train_weight if training else 0.0

  def flatten(features, targets):
    flat = np.reshape(features['image'], (-1,)).astype(np.int64)
    seq = np.concatenate([flat, np.reshape(targets, (1,)).astype(np.int64)])
    mask = np.concatenate([np.full(flat.shape, weight, np.float32),
                           np.ones((1,), np.float32)])
    return {'image': seq, 'mask': mask}, seq

  if training:
    dataset = _map_pairs(_augment, dataset)
  return _map_pairs(flatten, dataset)


@configurable('trax.data', denylist=('dataset', 'training'))
def downsampled_imagenet_flatten_bare_preprocess(
    dataset: Examples, training: bool) -> Iterator[Dict[str, np.ndarray]]:
  """Feature dicts to ``{'image': int64 pixels, flattened}`` (other keys drop).

  For the 32x32 and 64x64 generation of http://arxiv.org/abs/1601.06759.
  """
  del training
  for features in dataset:
    yield {'image': np.reshape(features['image'], (-1,)).astype(np.int64)}


# Sequences.


def _pad_like(x, value=0):
  """A length-1 array shaped like one row of `x`, filled with `value`."""
  x = np.asarray(x)
  return np.full((1,) + x.shape[1:], value, x.dtype)


@configurable('trax.data', denylist=('dataset', 'training'))
def concat_preprocess(dataset: Examples, training: bool,
                      pad_symbol: int = 0) -> Iterator[Any]:
  """LM input ``[pad, inputs, pad, targets]``, as ``features['inputs']`` and targets."""
  del training

  def concat(features, targets):
    inputs = features['inputs']
    pad = _pad_like(inputs, pad_symbol)
    seq = np.concatenate([pad, inputs, pad, targets], axis=0)
    features['inputs'] = seq
    return features, seq

  return _map_pairs(concat, dataset)


@configurable('trax.data', denylist=('dataset', 'training'))
def squeeze_targets_preprocess(dataset: Examples,
                               training: bool) -> Iterator[Any]:
  """Drops a last targets axis of size 1."""
  del training

  def squeeze(features, targets):
    if np.ndim(targets) and np.shape(targets)[-1] == 1:
      targets = np.squeeze(targets, axis=-1)
    return features, targets

  return _map_pairs(squeeze, dataset)


def _filter_pairs(dataset, max_length, length):
  for features, targets in dataset:
    if length(features, targets) <= max_length:
      yield features, targets


@configurable('trax.data', denylist=('dataset', 'training'))
def lm1b_preprocess(dataset: Examples, training: bool,
                    max_target_length: int = -1,
                    max_eval_target_length: int = -1) -> Examples:
  """Keeps pairs whose targets have at most the (train or eval) maximum length.

  A maximum of -1 (or any value <= 0) keeps every example.
  """
  max_length = max_target_length if training else max_eval_target_length
  if max_length <= 0:
    return dataset
  return _filter_pairs(dataset, max_length, lambda _, t: len(t))


@configurable('trax.data', denylist=('dataset', 'training'))
def wmt_preprocess(dataset: Examples, training: bool, max_length: int = -1,
                   max_eval_length: int = -1) -> Examples:
  """Keeps pairs whose ``features['inputs']`` and targets both fit the maximum."""
  limit = max_length if training else max_eval_length
  if limit <= 0:
    return dataset
  return _filter_pairs(dataset, limit,
                       lambda f, t: max(len(f['inputs']), len(t)))


def _concat_with_mask(inputs, targets):
  """``[inputs, 0, targets]`` and its mask ``[0..., 0, 1...]``."""
  pad = _pad_like(inputs)
  seq = np.concatenate([inputs, pad, targets], axis=0)
  mask = np.concatenate([np.zeros_like(inputs), pad, np.ones_like(targets)],
                        axis=0)
  return seq, mask


@configurable('trax.data', denylist=('dataset', 'training'))
def wmt_concat_preprocess(dataset: Examples, training: bool,
                          max_length: int = -1,
                          max_eval_length: int = -1) -> Iterator[Any]:
  """`wmt_preprocess`, then ``inputs, 0, targets`` with a targets-only mask.

  Yields ``(features, seq)`` with ``features['inputs'] = seq`` and
  ``features['mask']`` 1 on the targets.
  """
  def concat(features, targets):
    seq, mask = _concat_with_mask(features['inputs'], targets)
    features['inputs'], features['mask'] = seq, mask
    return features, seq

  return _map_pairs(
      concat, wmt_preprocess(dataset, training, max_length, max_eval_length))


@configurable('trax.data', denylist=('dataset', 'training'))
def lm_token_preprocessing(dataset: Examples,
                           training: bool) -> Iterator[Dict[str, Any]]:
  """Feature dicts: ``inputs`` = ``targets`` = ``[inputs, 0, targets]``, plus ``mask``."""
  del training
  for x in dataset:
    x = dict(x)
    seq, x['mask'] = _concat_with_mask(x['inputs'], x['targets'])
    x['inputs'] = x['targets'] = seq
    yield x


@configurable('trax.data', denylist=('hparams',))
def bair_robot_pushing_hparams(hparams: Any = None,
                               video_num_input_frames: int = 1,
                               video_num_target_frames: int = 15):
  """Sets the frame counts on `hparams`, or returns them without it."""
  if hparams is None:
    return video_num_input_frames, video_num_target_frames
  hparams.video_num_input_frames = video_num_input_frames
  hparams.video_num_target_frames = video_num_target_frames


@configurable('trax.data', denylist=('dataset', 'training'))
def bair_robot_pushing_preprocess(dataset: Examples,
                                  training: bool) -> Iterator[Any]:
  """Input and target frames as one flat int32 sequence with a targets mask."""
  del training

  def concat(features, targets):
    inputs = features['inputs']
    seq = np.concatenate([inputs, targets], axis=0)
    mask = np.concatenate([np.zeros_like(inputs), np.ones_like(targets)],
                          axis=0)
    seq = seq.reshape(-1).astype(np.int32)
    features['inputs'] = features['targets'] = seq
    features['mask'] = mask.reshape(-1).astype(np.float32)
    return features, seq

  return _map_pairs(concat, dataset)


def _code_points(text):
  """`tf.strings.unicode_decode(text, 'UTF-8')` as int64 (bad bytes: U+FFFD)."""
  if isinstance(text, bytes):
    text = text.decode('utf-8', errors='replace')
  return np.frombuffer(text.encode('utf-32-le'), np.uint32).astype(np.int64)


@configurable('trax.data', denylist=('dataset', 'training'))
def c4_preprocess(dataset: Examples, training: bool,
                  max_target_length: int = -1,
                  tokenization: Optional[str] = None,
                  spm_path: Optional[str] = None) -> Iterator[Any]:
  """C4 pairs: ``features['text']`` as targets (and inputs), then a length filter.

  The text becomes Unicode code points, or with ``tokenization='spc'`` the
  ids of the SentencePiece model at `spm_path` (Trax's default is T5's model
  on Google Cloud Storage: copy it and pass its local path). Targets longer
  than `max_target_length` (if > 0) are dropped, in training and eval.
  """
  del training
  encode = _code_points
  if tokenization == 'spc':
    if spm_path is None:
      raise UserInputError(
          "c4_preprocess(tokenization='spc') needs spm_path, a local "
          'SentencePiece model (Trax defaults to T5\'s gs://t5-data/vocabs/'
          'cc_all.32000/sentencepiece.model: copy it and pass its path).')
    from retrax.data import tokenizers
    vocab = tokenizers.SentencePieceVocabulary(
        local_paths.check_local(spm_path, 'c4_preprocess: spm_path'))
    encode = lambda text: np.asarray(vocab.encode(text), np.int64)

  def tokenized(features, targets):
    del targets
    features['targets'] = features['inputs'] = encode(features['text'])
    return features, features['targets']

  pairs = _map_pairs(tokenized, dataset)
  if max_target_length > 0:
    pairs = _filter_pairs(pairs, max_target_length, lambda _, t: len(t))
  return pairs


# Feature dicts (the T5-style token preprocessors).

LenMap = Optional[Dict[str, Any]]


def _check_len_map(len_map, name):
  if not isinstance(len_map, dict):
    raise ArgumentTypeError(f'{name}: len_map should be a dict of feature name to '
                            f'length, got {type(len_map).__name__}.')


@configurable('trax.data', denylist=('dataset', 'training'))
def filter_dataset_on_len(dataset: Examples, training: bool,
                          len_map: LenMap = None,
                          filter_on_eval: bool = False) -> Examples:
  """Keeps dicts whose features' lengths lie in ``len_map[key] = (min, max)``.

  E.g. ``{'inputs': (1, 512), 'targets': (64, 128)}`` keeps examples with
  ``1 <= len(inputs) <= 512`` and ``64 <= len(targets) <= 128``. Only in
  training unless `filter_on_eval`.
  """
  if len_map is None or (not training and not filter_on_eval):
    return dataset
  _check_len_map(len_map, 'filter_dataset_on_len')
  return (x for x in dataset
          if all(lo <= len(x[key]) <= hi for key, (lo, hi) in len_map.items()))


@configurable('trax.data', denylist=('dataset', 'training'))
def truncate_dataset_on_len(dataset: Examples, training: bool,
                            len_map: LenMap = None,
                            truncate_on_eval: bool = False) -> Examples:
  """Cuts each feature of ``len_map`` to at most ``len_map[key]`` items.

  Only in training unless `truncate_on_eval`.
  """
  if len_map is None or (not training and not truncate_on_eval):
    return dataset
  _check_len_map(len_map, 'truncate_dataset_on_len')

  def truncate(x):
    x = dict(x)
    for key, max_len in len_map.items():
      x[key] = x[key][:max_len]
    return x

  return map(truncate, dataset)


@configurable('trax.data', denylist=('dataset', 'training'))
def pad_dataset_to_length(dataset: Examples, training: bool,
                          len_map: LenMap = None) -> Examples:
  """Pads each feature of ``len_map`` with zeros to ``len_map[key]`` items."""
  del training
  if len_map is None:
    return dataset
  _check_len_map(len_map, 'pad_dataset_to_length')

  def pad(x):
    x = dict(x)
    for key, max_len in len_map.items():
      value = np.asarray(x[key])
      if len(value) < max_len:
        widths = [(0, max_len - len(value))] + [(0, 0)] * (value.ndim - 1)
        x[key] = np.pad(value, widths)
    return x

  return map(pad, dataset)


@configurable('trax.data', denylist=('dataset', 'training'))
def add_eos_to_output_features(
    dataset: Examples, training: bool,
    output_features: Union[str, Sequence[str]] = 'targets',
    eos: int = 1) -> Iterator[Dict[str, Any]]:
  """Appends `eos` to each feature named in `output_features`."""
  del training
  keys = (output_features if isinstance(output_features, (list, tuple))
          else [output_features])
  for x in dataset:
    x = dict(x)
    for key in keys:
      value = np.asarray(x[key])
      x[key] = np.concatenate([value, np.asarray([eos], value.dtype)])
    yield x
