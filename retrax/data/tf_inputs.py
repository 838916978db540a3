"""Trax's `trax.data.tf_inputs` (TFDS, T2T and T5 inputs) needs TensorFlow.

retrax has no TensorFlow. Every name of Trax's module (`TFDS`,
`data_streams`, `CorpusToRandomChunks`, ...) raises
`retrax.data.tensorflow_only.TensorFlowOnlyError`, which says what to use
instead: `TextLines`/`TextChunks` for text files, `NumpyArrays` for arrays.
The TensorFlow-free names Trax also kept here (`Tokenize`, `tokenize`,
`detokenize`, `vocab_size`, `ConvertToUnicode`, `SentencePieceTokenize`) are in
`retrax.data`.
"""

from retrax.data import tensorflow_only


def __getattr__(name):
  if name.startswith('__'):
    raise AttributeError(name)
  raise tensorflow_only.error(name if name in tensorflow_only.TF_ONLY_NAMES
                              else 'tf_inputs')
