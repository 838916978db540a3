"""Input pipelines in plain Python and numpy: Trax's ``trax.data`` without TF.

A pipeline is a chain of stream functions composed with `Serial`::

  from retrax import data

  inputs = data.Serial(
      data.TextLines('corpus.txt', skip_empty=True),
      data.Tokenize(vocab_type='sentencepiece', vocab_file='spm.model'),
      data.Shuffle(),
      lambda g: map(lambda x: (x, x), g),        # LM: inputs = targets
      data.FilterByLength(max_length=512),
      data.BucketByLength(boundaries=[64, 128, 256, 512],
                          batch_sizes=[32, 16, 8, 4, 2]),
      data.AddLossWeights(id_to_mask=0),
      data.Prefetch(),
  )
  batch = next(inputs())   # (inputs[B, L], targets[B, L], weights[B, L])

Everything streams: files are read lazily and nothing holds more than a
shuffle queue and the current batches.

Differences from Trax (same names, arguments and outputs otherwise):

* No TensorFlow: `TFDS`, `data_streams` and the preprocess functions of
  Trax's ``tf_inputs`` read prepared TensorFlow Datasets through the
  array_record reader of `tensorflow-datasets` (``pip install
  "retrax[tfds]"``) and never download (see `retrax.data.tfds`);
  `TextLines`/`TextChunks`/`NumpyArrays` read local files. T2T, T5, BERT
  and MathQA inputs raise `TensorFlowOnlyError`. Vocab files are read from
  local paths only (no ``gs://``), and the ``'bert'`` vocab types are not
  provided.
* Randomness: `Shuffle` and the synthetic tasks take an optional ``seed``;
  without it they use numpy's global generator exactly as Trax does.
* `Prefetch` runs a thread, re-raises producer errors in the consumer and
  stops when the consumer is closed (Trax can hang).
* `Parallel` ends when a sub-stream ends (Trax raises ``RuntimeError``).
* `PadToLength(multiple=True)` pads to the next multiple (Trax adds the
  remainder), pads axis 0 only, and accepts a scalar ``pad_value``.
* `Batch` of bare arrays gives array batches and `Dup` of a bare array gives
  ``(x, x)`` (Trax mis-handles both); tokenizing ``''`` gives an empty int64
  array (Trax: float64).
* `Inputs.train_eval_stream` returns the stream it was given (Trax returns
  the train stream); `random_inputs` checks the batch size against
  ``n_devices`` instead of Trax's ``input_range[0] % n_devices``.
* `save_data_counters` writes JSON, not pickle.
* Wrong input raises ``ValueError``/``TypeError`` saying what was expected,
  where Trax uses ``assert``.
"""

from retrax.data.batching import Batch as Batch
from retrax.data.batching import batch as batch
from retrax.data.batching import bucket_by_length as bucket_by_length
from retrax.data.batching import BucketByLength as BucketByLength
from retrax.data.batching import pad_to_max_dims as pad_to_max_dims
from retrax.data.batching import UnBatch as UnBatch
from retrax.data.combinators import Parallel as Parallel
from retrax.data.combinators import Serial as Serial
from retrax.data.counters import count_and_skip as count_and_skip
from retrax.data.counters import CountAndSkip as CountAndSkip
from retrax.data.counters import load_data_counters as load_data_counters
from retrax.data.counters import save_data_counters as save_data_counters
from retrax.data.counters import UniformlySeek as UniformlySeek
from retrax.data.inputs import batcher as batcher
from retrax.data.inputs import Inputs as Inputs
from retrax.data.inputs import make_inputs as make_inputs
from retrax.data.inputs import make_additional_stream as make_additional_stream
from retrax.data.inputs import make_parallel_stream as make_parallel_stream
from retrax.data.lm import ConcatenateToLMInput as ConcatenateToLMInput
from retrax.data.lm import consume_noise_mask as consume_noise_mask
from retrax.data.lm import generate_random_noise_mask as generate_random_noise_mask
from retrax.data.lm import generate_sequential_chunks as generate_sequential_chunks
from retrax.data.lm import MLM as MLM
from retrax.data.lm import PrefixLM as PrefixLM
from retrax.data.lm import random_spans_noise_mask as random_spans_noise_mask
from retrax.data.lm_streams import text_streams as text_streams
from retrax.data.prefetch import Prefetch as Prefetch
from retrax.data.prefetch import prefetch as prefetch
from retrax.data.preprocessing import add_eos_to_output_features as add_eos_to_output_features
from retrax.data.preprocessing import bair_robot_pushing_hparams as bair_robot_pushing_hparams
from retrax.data.preprocessing import bair_robot_pushing_preprocess as bair_robot_pushing_preprocess
from retrax.data.preprocessing import c4_preprocess as c4_preprocess
from retrax.data.preprocessing import cifar10_augmentation_flatten_preprocess as cifar10_augmentation_flatten_preprocess
from retrax.data.preprocessing import cifar10_augmentation_preprocess as cifar10_augmentation_preprocess
from retrax.data.preprocessing import cifar10_no_augmentation_preprocess as cifar10_no_augmentation_preprocess
from retrax.data.preprocessing import concat_preprocess as concat_preprocess
from retrax.data.preprocessing import downsampled_imagenet_flatten_bare_preprocess as downsampled_imagenet_flatten_bare_preprocess
from retrax.data.preprocessing import filter_dataset_on_len as filter_dataset_on_len
from retrax.data.preprocessing import lm1b_preprocess as lm1b_preprocess
from retrax.data.preprocessing import lm_token_preprocessing as lm_token_preprocessing
from retrax.data.preprocessing import no_preprocess as no_preprocess
from retrax.data.preprocessing import pad_dataset_to_length as pad_dataset_to_length
from retrax.data.preprocessing import squeeze_targets_preprocess as squeeze_targets_preprocess
from retrax.data.preprocessing import truncate_dataset_on_len as truncate_dataset_on_len
from retrax.data.preprocessing import wmt_concat_preprocess as wmt_concat_preprocess
from retrax.data.preprocessing import wmt_preprocess as wmt_preprocess
from retrax.data.sources import list_files as list_files
from retrax.data.sources import NumpyArrays as NumpyArrays
from retrax.data.sources import TextChunks as TextChunks
from retrax.data.sources import TextLines as TextLines
from retrax.data.subword import SubwordTextEncoder as SubwordTextEncoder
from retrax.data.tasks import addition_input_stream as addition_input_stream
from retrax.data.tasks import addition_inputs as addition_inputs
from retrax.data.tasks import duplication_inputs as duplication_inputs
from retrax.data.tasks import random_inputs as random_inputs
from retrax.data.tasks import sequence_copy_inputs as sequence_copy_inputs
from retrax.data.tasks import simple_sequence_copy_inputs as simple_sequence_copy_inputs
from retrax.data.tasks import sine_inputs as sine_inputs
from retrax.data.tfds import data_streams as data_streams
from retrax.data.tfds import dataset_to_stream as dataset_to_stream
from retrax.data.tfds import TFDS as TFDS
from retrax.data.tokenizers import ByteTextEncoder as ByteTextEncoder
from retrax.data.tokenizers import CharTextEncoder as CharTextEncoder
from retrax.data.tokenizers import ConvertToUnicode as ConvertToUnicode
from retrax.data.tokenizers import Detokenize as Detokenize
from retrax.data.tokenizers import detokenize as detokenize
from retrax.data.tokenizers import SentencePieceTokenize as SentencePieceTokenize
from retrax.data.tokenizers import sentencepiece_tokenize as sentencepiece_tokenize
from retrax.data.tokenizers import SentencePieceVocabulary as SentencePieceVocabulary
from retrax.data.tokenizers import Tokenize as Tokenize
from retrax.data.tokenizers import tokenize as tokenize
from retrax.data.tokenizers import train_sentencepiece as train_sentencepiece
from retrax.data.tokenizers import vocab_size as vocab_size
from retrax.data.transforms import add_loss_weights as add_loss_weights
from retrax.data.transforms import AddLossWeights as AddLossWeights
from retrax.data.transforms import AppendValue as AppendValue
from retrax.data.transforms import CastTo as CastTo
from retrax.data.transforms import Dup as Dup
from retrax.data.transforms import FilterByLength as FilterByLength
from retrax.data.transforms import FilterEmptyExamples as FilterEmptyExamples
from retrax.data.transforms import Log as Log
from retrax.data.transforms import PadToLength as PadToLength
from retrax.data.transforms import shuffle as shuffle
from retrax.data.transforms import Shuffle as Shuffle
from retrax.data.transforms import TruncateToLength as TruncateToLength
from retrax.data import tensorflow_only as _tensorflow_only
from retrax.data import tf_inputs as tf_inputs


def __getattr__(name):
  # Trax's T2T/T5/BERT inputs (tf_inputs): say what to use instead.
  if name in _tensorflow_only.TF_ONLY_NAMES:
    raise _tensorflow_only.error(name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
