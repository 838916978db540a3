"""Trax's `trax.data.tf_inputs`: TFDS inputs and preprocessors, without TensorFlow.

`TFDS`, `data_streams` and the preprocess functions read prepared TensorFlow
Datasets without TensorFlow (`retrax.data.tfds`,
`retrax.data.preprocessing`); the tokenizers Trax kept here are
`retrax.data`'s. The rest of Trax's module (T2T, T5, BERT and MathQA
pipelines: `CreateBertInputs`, `CorpusToRandomChunks`, ...) raises
`retrax.data.tensorflow_only.TensorFlowOnlyError`, which says what to use
instead.
"""

from retrax.data import tensorflow_only
from retrax.data.preprocessing import (
    add_eos_to_output_features,
    bair_robot_pushing_hparams,
    bair_robot_pushing_preprocess,
    c4_preprocess,
    cifar10_augmentation_flatten_preprocess,
    cifar10_augmentation_preprocess,
    cifar10_no_augmentation_preprocess,
    concat_preprocess,
    downsampled_imagenet_flatten_bare_preprocess,
    filter_dataset_on_len,
    lm1b_preprocess,
    lm_token_preprocessing,
    no_preprocess,
    pad_dataset_to_length,
    squeeze_targets_preprocess,
    truncate_dataset_on_len,
    wmt_concat_preprocess,
    wmt_preprocess,
)
from retrax.data.tfds import (
    data_streams,
    dataset_to_stream,
    TFDS,
)
from retrax.data.tokenizers import (
    ConvertToUnicode,
    detokenize,
    SentencePieceTokenize,
    sentencepiece_tokenize,
    Tokenize,
    tokenize,
    vocab_size,
)

__all__ = [
    'add_eos_to_output_features', 'bair_robot_pushing_hparams',
    'bair_robot_pushing_preprocess', 'c4_preprocess',
    'cifar10_augmentation_flatten_preprocess',
    'cifar10_augmentation_preprocess', 'cifar10_no_augmentation_preprocess',
    'concat_preprocess', 'ConvertToUnicode', 'data_streams',
    'dataset_to_stream', 'detokenize',
    'downsampled_imagenet_flatten_bare_preprocess', 'filter_dataset_on_len',
    'lm1b_preprocess', 'lm_token_preprocessing', 'no_preprocess',
    'pad_dataset_to_length', 'sentencepiece_tokenize',
    'SentencePieceTokenize', 'squeeze_targets_preprocess', 'TFDS',
    'Tokenize', 'tokenize', 'truncate_dataset_on_len', 'vocab_size',
    'wmt_concat_preprocess', 'wmt_preprocess'
]


def __getattr__(name):
  if name in tensorflow_only.TF_ONLY_NAMES:
    raise tensorflow_only.error(name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
