"""The names of Trax's TensorFlow-only data functions, and the error they give.

Trax's `trax.data.tf_inputs` reads TensorFlow Datasets and T2T problems with
TensorFlow. retrax has no TensorFlow: it reads prepared TFDS datasets without
it (`retrax.data.tfds`); the T2T, T5, BERT and MathQA functions of that module
raise `TensorFlowOnlyError` (an `ImportError`, so `from trax.data import
CreateBertInputs` shows the message too) saying what to use instead. Those
Trax made gin-configurable are declared here as stand-ins that raise it when
called, so that Trax's gin configs naming them still parse.
"""

from retrax.configurable import configurable
from retrax.errors import Error

# The public functions and classes of Trax 1.4.1's `trax/data/tf_inputs.py`
# that retrax does not provide: T2T, T5, BERT and MathQA pipelines, and the
# download step (retrax reads TFDS without TensorFlow, see `retrax.data.tfds`
# and `retrax.data.preprocessing`; its Tokenize/tokenize/detokenize/
# vocab_size/ConvertToUnicode/SentencePieceTokenize are in `retrax.data`).
TF_ONLY_NAMES = frozenset('''
    t5_data t2t_problems download_and_prepare c4_bare_preprocess_fn
    generic_text_dataset_preprocess_fn get_t5_preprocessor_by_name
    BertSingleSentenceInputs BertDoubleSentenceInputs CreateBertInputs
    mask_random_tokens BertNextSentencePredictionInputs CorpusToRandomChunks
    BertGlueTrainStream BertGlueEvalStream T5GlueTrainStream
    T5GlueTrainStreamsParallel T5GlueEvalStream T5GlueEvalStreamsParallel
    T5GlueEvalTasks CreateMathQAInputs CreateAquaInputs CreateDropInputs
    CreateAnnotatedDropInputs'''.split())


class TensorFlowOnlyError(Error, ImportError):
  """A Trax data function that needs TensorFlow (retrax has none)."""


def error(name):
  """The `TensorFlowOnlyError` for `trax.data.<name>`."""
  return TensorFlowOnlyError(
      f'trax.data.{name} (from trax.data.tf_inputs) needs TensorFlow (T2T, '
      'T5, BERT and MathQA inputs), which retrax does not use. Read local '
      'data instead: trax.data.TextLines(path) or TextChunks(path) for text '
      'files, trax.data.NumpyArrays(x, y) for arrays, then '
      'Tokenize/Shuffle/Batch as usual; prepared TensorFlow '
      'Datasets are read by trax.data.TFDS and data_streams (pip install '
      '"retrax[tfds]"); see docs/coming_from_trax.md.',
      name=name)


# Those of them Trax registers with gin (under `trax.data`).
_GIN_CONFIGURABLE = '''
    BertGlueEvalStream BertGlueTrainStream BertNextSentencePredictionInputs
    CorpusToRandomChunks CreateAnnotatedDropInputs CreateAquaInputs
    CreateBertInputs CreateDropInputs CreateMathQAInputs T5GlueEvalStream
    T5GlueEvalStreamsParallel T5GlueEvalTasks T5GlueTrainStream
    T5GlueTrainStreamsParallel c4_bare_preprocess_fn
    generic_text_dataset_preprocess_fn get_t5_preprocessor_by_name
    mask_random_tokens'''.split()


def _stand_in(name):
  """A stand-in for Trax's TensorFlow function `name`: raises when called."""

  def stand_in(*args, **kwargs):
    del args, kwargs
    raise error(name)
  stand_in.__name__ = stand_in.__qualname__ = name
  stand_in.__doc__ = f'Trax\'s `trax.data.{name}`, which needs TensorFlow.'
  return configurable('trax.data')(stand_in)


_STAND_INS = {name: _stand_in(name) for name in _GIN_CONFIGURABLE}
