"""The names of Trax's TensorFlow-only data functions, and the error they give.

Trax's `trax.data.tf_inputs` reads TensorFlow Datasets and T2T problems with
TensorFlow. retrax has no TensorFlow; `trax.data.TFDS` and the rest of that
module raise `TensorFlowOnlyError` (an `ImportError`, so `from trax.data import
TFDS` shows the message too) saying what to use instead.
"""

# The public functions and classes of Trax 1.4.1's `trax/data/tf_inputs.py`
# that retrax does not provide (its Tokenize/tokenize/detokenize/vocab_size/
# ConvertToUnicode/SentencePieceTokenize are provided, without TensorFlow).
TF_ONLY_NAMES = frozenset('''
    tf_inputs TFDS data_streams dataset_to_stream t5_data no_preprocess
    t2t_problems cifar10_no_augmentation_preprocess
    cifar10_augmentation_preprocess cifar10_augmentation_flatten_preprocess
    downsampled_imagenet_flatten_bare_preprocess concat_preprocess
    squeeze_targets_preprocess lm1b_preprocess wmt_preprocess
    wmt_concat_preprocess lm_token_preprocessing bair_robot_pushing_hparams
    bair_robot_pushing_preprocess c4_preprocess c4_bare_preprocess_fn
    filter_dataset_on_len truncate_dataset_on_len pad_dataset_to_length
    add_eos_to_output_features generic_text_dataset_preprocess_fn
    get_t5_preprocessor_by_name download_and_prepare BertSingleSentenceInputs
    BertDoubleSentenceInputs CreateBertInputs mask_random_tokens
    BertNextSentencePredictionInputs CorpusToRandomChunks BertGlueTrainStream
    BertGlueEvalStream T5GlueTrainStream T5GlueTrainStreamsParallel
    T5GlueEvalStream T5GlueEvalStreamsParallel T5GlueEvalTasks
    CreateMathQAInputs CreateAquaInputs CreateDropInputs
    CreateAnnotatedDropInputs'''.split())


class TensorFlowOnlyError(ImportError):
  """A Trax data function that needs TensorFlow (retrax has none)."""


def error(name):
  """The `TensorFlowOnlyError` for `trax.data.<name>`."""
  what = ('trax.data.tf_inputs' if name == 'tf_inputs' else
          f'trax.data.{name} (from trax.data.tf_inputs)')
  return TensorFlowOnlyError(
      f'{what} needs TensorFlow / TensorFlow Datasets, which retrax does not '
      'use. Read local data instead: trax.data.TextLines(path) or '
      'TextChunks(path) for text files, trax.data.NumpyArrays(x, y) for arrays '
      '(e.g. a dataset saved once with tfds.as_numpy + np.save), then '
      'Tokenize/Shuffle/Batch as usual; see docs/coming_from_trax.md.',
      name=name)
