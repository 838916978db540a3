"""TensorFlow Datasets without TensorFlow: Trax's `TFDS` and `data_streams`.

Trax reads TFDS datasets with ``tf.data``. retrax reads the same prepared
datasets through the random-access reader of the `tensorflow-datasets`
package (``builder.as_data_source``: array_record files decoded to numpy),
which needs neither TensorFlow nor the network::

  pip install "retrax[tfds]"
  # Once, where TFDS can build the dataset (building most needs TensorFlow):
  tfds build cifar10 --data_dir=~/tensorflow_datasets --file_format=array_record

  train = trax.data.TFDS('cifar10', keys=('image', 'label'))
  train_fn, eval_fn = trax.data.data_streams('cifar10')

Differences from Trax (same arguments, splits and example order otherwise):

* Nothing is downloaded or generated: a dataset not prepared in `data_dir`
  (default ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), or prepared as
  TFRecord files, raises a one-line `UserInputError` saying how to prepare it;
  without `tensorflow-datasets` installed they raise `TensorFlowOnlyError`.
  Tensor2Tensor problems (``'t2t_...'``) raise `TensorFlowOnlyError` naming
  the local alternative.
* Training reads its shards in a random order each epoch (Trax's
  ``shuffle_files``), drawn from numpy's global generator; eval reads in order.
* Examples are numpy, as ``tfds.as_numpy`` gives them: text is ``bytes``,
  sequences are arrays, scalars numpy scalars.
* `TFDS` with ``keys=None`` yields whole example dicts (Trax fails), and with
  ``train=True`` does not need an eval split.
* `data_streams` skips its random 0-100,000 first training examples at the
  source (without reading them) and casts uint8 arrays to int32 (Trax's check
  only catches uint8 scalars); preprocess functions take iterators (see
  `retrax.data.preprocessing`).
"""

import itertools
import os
import random
from typing import Any, Callable, Iterator, Optional, Sequence, Tuple

import numpy as np

from retrax import local_paths
from retrax.configurable import configurable
from retrax.data.preprocessing import no_preprocess
from retrax.data.tensorflow_only import TensorFlowOnlyError
from retrax.data.transforms import shuffle
from retrax.errors import UserInputError
from retrax.validation import ArgumentValueError

# Trax skips up to this many training examples, so that hosts training in
# lock-step do not read the same data.
_MAX_SKIP_EXAMPLES = 100_000
# Examples fetched per read of the random-access source.
_READ_BLOCK = 64
_LOCAL = ('read local files instead with trax.data.TextLines/TextChunks '
          '(text) or trax.data.NumpyArrays (arrays)')


def _import_tfds(dataset_name):
  try:
    import tensorflow_datasets  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    # A missing dependency of an installed tensorflow-datasets is not "not
    # installed": name it.
    why = ('is not installed' if e.name == 'tensorflow_datasets' else
           f'fails to import ({e})')
    raise TensorFlowOnlyError(
        f'TFDS dataset {dataset_name!r}: retrax reads TensorFlow Datasets '
        f'without TensorFlow through the tensorflow-datasets package, which '
        f'{why}: pip install "retrax[tfds]" (no TensorFlow needed); or '
        f'{_LOCAL}.', name='tensorflow_datasets') from None
  return tensorflow_datasets


def _t2t_error(dataset_name):
  return TensorFlowOnlyError(
      f'{dataset_name!r} is Tensor2Tensor problem '
      f'{dataset_name[len("t2t_"):]!r}, which only T2T with TensorFlow '
      'generates and reads; retrax has neither. For a language model, give '
      'batcher trax.data.text_streams(train_path, eval_path, ...) over local '
      'text files (see docs/coming_from_trax.md), or '
      f'{_LOCAL} and Tokenize them.', name='data_streams')


def _data_dir(data_dir):
  data_dir = (data_dir or os.environ.get('TFDS_DATA_DIR') or
              '~/tensorflow_datasets')
  return os.path.expanduser(local_paths.check_local(data_dir, 'TFDS data_dir'))


def _not_prepared(dataset_name, data_dir, why):
  return UserInputError(
      f'TFDS dataset {dataset_name!r} {why} {data_dir} (retrax reads prepared '
      'datasets without TensorFlow and downloads nothing). Prepare it where '
      f'TFDS can build it: tfds build {dataset_name} --data_dir={data_dir} '
      '--file_format=array_record (copy the folder here if built elsewhere; '
      'a TFRecord copy converts with tfds convert_format '
      '--out_file_format=array_record), or pass data_dir=; or '
      f'{_LOCAL}.')


def _builder(dataset_name, data_dir):
  """The TFDS builder of a dataset prepared in `data_dir`; never downloads."""
  if dataset_name.startswith('t2t_'):
    raise _t2t_error(dataset_name)
  tfds = _import_tfds(dataset_name)
  try:
    builder = tfds.builder(dataset_name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    builder = None
  if builder is None or not builder.is_prepared():
    raise _not_prepared(dataset_name, data_dir, 'is not prepared in')
  return builder


def _split_names(info, dataset_name, eval_holdout_size, subsplit,
                 use_alt_eval):
  """Trax's `(train split, eval split or None)` of a dataset."""
  splits = info.splits
  train_split = 'en' if dataset_name == 'c4/multilingual' else 'train'
  if train_split not in splits:
    raise UserInputError(
        f'TFDS dataset {dataset_name!r} has no {train_split!r} split (it has '
        f'{sorted(splits)}); Trax trains on it.')
  n_examples = splits[train_split].num_examples
  n_holdout = int(n_examples * eval_holdout_size)
  eval_split = None
  if n_holdout > 0 or subsplit is not None:
    subsplit = subsplit or (0, 1)
    n_train = n_examples - n_holdout
    start, end = int(n_train * subsplit[0]), int(n_train * subsplit[1])
    if end - start < 1:
      raise ArgumentValueError(f'TFDS {dataset_name!r}: subsplit {subsplit} of '
                               f'the {n_train} training examples selects none.')
    if n_holdout > 0:  # Eval examples from the end of the training split.
      eval_split = f'{train_split}[-{n_holdout}:]'
    train_split = f'{train_split}[{start}:{end}]'
  if dataset_name == 'glue/mnli':
    eval_split = ('validation_mismatched' if use_alt_eval else
                  'validation_matched')
  elif dataset_name == 'c4/multilingual':
    eval_split = 'en-validation'
  elif eval_split is None:
    eval_split = next((s for s in ('validation', 'test') if s in splits), None)
  return train_split, eval_split


def _numpy(value, feature=None):
  """An example's values as numpy (with the feature's dtype where known)."""
  feature = getattr(feature, 'feature', feature)  # A Sequence's items.
  if isinstance(value, dict):
    keys = feature.keys() if hasattr(feature, 'keys') else ()
    return {k: _numpy(v, feature[k] if k in keys else None)
            for k, v in value.items()}
  try:
    dtype = np.dtype(getattr(feature, 'np_dtype', None))
  except TypeError:
    dtype = None
  array = np.asarray(value, dtype=dtype)
  return array[()] if array.ndim == 0 else array


class _Split:
  """One split of a prepared dataset, read by random access."""

  def __init__(self, builder, split, dataset_name, data_dir):
    try:
      self._source = builder.as_data_source(split=split)
    except NotImplementedError:  # Prepared as TFRecord files.
      raise _not_prepared(
          dataset_name, data_dir,
          f'is prepared as {builder.info.file_format} files, not array_record, '
          'in') from None
    self._features = builder.info.features
    self.size = len(self._source)
    if not self.size:
      raise UserInputError(f'TFDS dataset {dataset_name!r}: split {split!r} '
                           'holds no examples.')
    # The index ranges of the split's shards, for shuffling the file order.
    lengths = [fi.take for fi in builder.info.splits[split].file_instructions]
    if sum(lengths) != self.size or min(lengths) < 1:
      lengths = [self.size]
    ends = np.cumsum(lengths)
    self._shards = list(zip(ends - lengths, ends))

  def indices(self, shuffle_files):
    """The indices of one epoch; shards in random order if `shuffle_files`."""
    order = (np.random.permutation(len(self._shards)) if shuffle_files else
             range(len(self._shards)))
    for i in order:
      yield from range(*self._shards[i])

  def read(self, indices):
    """The examples at `indices`, as numpy."""
    indices = iter(indices)
    while True:
      block = [int(i) for i in itertools.islice(indices, _READ_BLOCK)]
      if not block:
        return
      for example in self._source.__getitems__(block):
        yield _numpy(example, self._features)

  def epochs(self, shuffle_files, skip=0):
    """An iterator of epochs (example iterators); the first skips `skip`."""
    for epoch in itertools.count():
      indices = self.indices(shuffle_files)
      if epoch == 0 and skip % self.size:
        indices = itertools.islice(indices, skip % self.size, None)
      yield self.read(indices)


def _hosts(host_id, n_hosts):
  if host_id is None or not n_hosts:
    import jax  # pylint: disable=g-import-not-at-top
    host_id = jax.process_index() if host_id is None else host_id
    n_hosts = n_hosts or jax.process_count()
  return host_id, n_hosts


@configurable('trax.data')
def TFDS(dataset_name: str,  # pylint: disable=invalid-name
         data_dir: Optional[str] = None,
         tfds_preprocess_fn: Optional[Callable[[Any], Any]] = None,
         keys: Optional[Sequence[str]] = None,
         train: bool = True,
         use_alt_eval: bool = False,
         shuffle_train: bool = True,
         host_id: Optional[int] = None,
         n_hosts: Optional[int] = None,
         eval_holdout_size: float = 0) -> Callable[..., Iterator[Any]]:
  """A source of the examples of a prepared TFDS dataset, repeated forever.

  Example::

    pipeline = trax.data.Serial(
        trax.data.TFDS('imdb_reviews', keys=('text', 'label'), train=True),
        trax.data.Tokenize(vocab_file='en_8k.subword', keys=[0]),
        trax.data.Shuffle(), trax.data.Batch(8))

  Args:
    dataset_name: a TFDS name, e.g. ``'glue/mnli'`` or
      ``'scientific_papers/arxiv:1.1.1'``.
    data_dir: where the dataset is prepared (in array_record format).
    tfds_preprocess_fn: applied to each epoch's iterator of example dicts,
      before `keys` are selected.
    keys: the features to yield, as a tuple per example (None: the dicts).
    train: the train split, else the eval split (validation, else test).
    use_alt_eval: ``'glue/mnli'``'s mismatched validation split for eval.
    shuffle_train: read the training shards in a random order each epoch.
    host_id: this host's index, with `n_hosts` (default: JAX's process).
    n_hosts: if > 1, each host reads its own part of the training split.
    eval_holdout_size: fraction of the train split held out (from its end)
      as the eval split.

  Returns:
    A stream function ``f(generator=None)`` yielding the examples.
  """
  data_dir = _data_dir(data_dir)
  builder = _builder(dataset_name, data_dir)
  host_id, n_hosts = _hosts(host_id, n_hosts)
  subsplit = (host_id / n_hosts, (host_id + 1) / n_hosts) if n_hosts > 1 else None
  train_split, eval_split = _split_names(
      builder.info, dataset_name, eval_holdout_size, subsplit, use_alt_eval)
  if not train and eval_split is None:
    raise UserInputError(f'TFDS dataset {dataset_name!r} has neither a '
                         'validation nor a test split; set eval_holdout_size.')
  split = _Split(builder, train_split if train else eval_split, dataset_name,
                 data_dir)

  def gen(generator=None):
    del generator
    for epoch in split.epochs(shuffle_files=train and shuffle_train):
      if tfds_preprocess_fn is not None:
        epoch = tfds_preprocess_fn(epoch)
      for example in epoch:
        yield example if keys is None else tuple(example[k] for k in keys)

  return gen


def dataset_to_stream(dataset: Any, input_name: Any) -> Iterator[Tuple[Any, ...]]:
  """``(features, targets)`` pairs to ``(inputs, targets[, mask])`` tuples.

  The inputs are ``features[input_name]``, the mask ``features['mask']``
  where there is one; uint8 arrays become int32.
  """
  for features, targets in dataset:
    inputs = features[input_name]
    mask = features.get('mask')
    inputs, targets = (x.astype(np.int32) if getattr(x, 'dtype', None) == np.uint8
                       else x for x in (inputs, targets))
    yield (inputs, targets) if mask is None else (inputs, targets, mask)


def _input_and_targets(info, dataset_name, input_name, target_name):
  """Trax's choice: the names given, else the dataset's supervised keys."""
  keys = info.supervised_keys
  if input_name is None and keys:
    input_name = keys[0]
  target_names = [target_name] if target_name is not None else (
      [keys[1]] if keys else None)
  if input_name is None or target_names is None:
    raise UserInputError(
        f'TFDS dataset {dataset_name!r} has no supervised keys: set '
        'data_streams.input_name and data_streams.target_name (its features: '
        f'{sorted(info.features.keys())}).')
  return input_name, target_names


@configurable('trax.data')
def data_streams(dataset_name: Optional[str] = None,
                 data_dir: Optional[str] = None,
                 preprocess_fn: Optional[Callable[..., Any]] = no_preprocess,
                 bare_preprocess_fn: Optional[Callable[..., Any]] = None,
                 shuffle_buffer_size: int = 1024,
                 eval_holdout_size: float = 0,
                 input_name: Optional[str] = None,
                 target_name: Optional[str] = None
                 ) -> Tuple[Callable[[], Iterator[Any]], Callable[[], Iterator[Any]]]:
  """`(train_fn, eval_fn)`: streams of ``(inputs, targets[, mask])`` examples.

  For `batcher` (gin: ``batcher.data_streams = @data.data_streams``). Both
  streams repeat the split forever and shuffle with a queue of
  `shuffle_buffer_size`, as Trax's do; training starts at a random one of
  the first 100,000 examples and reads its shards in a random order.

  Per epoch, ``bare_preprocess_fn(examples, training)`` gets the feature
  dicts; then each dict is paired with its targets (``features[target]``, or
  a dict of them), and ``preprocess_fn(pairs, training)`` gets the endless
  stream of ``(features, targets)`` pairs.

  Args:
    dataset_name: a TFDS name (``'t2t_...'`` Tensor2Tensor problems need
      TensorFlow: they raise `TensorFlowOnlyError`).
    data_dir: where the dataset is prepared (in array_record format).
    preprocess_fn: pairs -> pairs, e.g. `lm1b_preprocess`.
    bare_preprocess_fn: feature dicts -> feature dicts.
    shuffle_buffer_size: the shuffle queue size.
    eval_holdout_size: fraction of the train split held out (from its end)
      as the eval split, instead of the validation (else test) split.
    input_name: the feature given as inputs (default: the dataset's
      supervised input key).
    target_name: the targets' feature (default: the supervised target key).
  """
  if not dataset_name:
    raise UserInputError('data_streams needs a dataset_name (gin: '
                         "data_streams.dataset_name = 'mnist').")
  data_dir = _data_dir(data_dir)
  builder = _builder(dataset_name, data_dir)
  train_split, eval_split = _split_names(
      builder.info, dataset_name, eval_holdout_size, None, False)
  if eval_split is None:
    raise UserInputError(f'TFDS dataset {dataset_name!r} has neither a '
                         'validation nor a test split; set '
                         'data_streams.eval_holdout_size.')
  input_name, target_names = _input_and_targets(
      builder.info, dataset_name, input_name, target_name)
  splits = {True: _Split(builder, train_split, dataset_name, data_dir),
            False: _Split(builder, eval_split, dataset_name, data_dir)}
  return _streams(splits, input_name, target_names,
                  preprocess_fn or no_preprocess, bare_preprocess_fn,
                  shuffle_buffer_size)


def _streams(splits, input_name, target_names, preprocess_fn,
             bare_preprocess_fn, shuffle_buffer_size):
  """`data_streams`' `(train_fn, eval_fn)` over its train and eval `_Split`s."""
  skip = random.randint(0, _MAX_SKIP_EXAMPLES)

  def targets_of(features):
    if len(target_names) == 1:
      return features[target_names[0]]
    return {name: features[name] for name in target_names}

  def pairs(training):
    for epoch in splits[training].epochs(training, skip if training else 0):
      if bare_preprocess_fn is not None:
        epoch = bare_preprocess_fn(epoch, training)
      for features in epoch:
        yield features, targets_of(features)

  def stream(training):
    dataset = preprocess_fn(pairs(training), training)
    return dataset_to_stream(shuffle(dataset, shuffle_buffer_size), input_name)

  return (lambda: stream(True)), (lambda: stream(False))
