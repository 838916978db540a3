"""Trax's gin configurables on retrax: Trax's `.gin` files run unchanged.

Trax runs its experiments from gin files (`train.model = @trax.models.ReformerLM`,
`LSHSelfAttention.n_hashes = 4`, `multifactor.constant = 0.05`, ...), and its
own modules register every layer, model, optimizer, schedule and input
function with gin under Trax's module names. retrax's core has no gin: this
module is the whole bridge, and it only acts once the program uses gin.

`install()` (run by `import retrax`) registers Trax 1.4.1's configurable
names as soon as the program imports gin (at once if it already has), under
Trax's names and modules (`trax.layers`, `trax.models`, `trax.optimizers`,
`trax.supervised.lr_schedules`, `trax.supervised.trainer_lib`, `trax.data`,
`trax.fastmath.ops`). Registering also makes `trax.*` importable as retrax
(`retrax.compat`'s module alias), because Trax's gin files begin with
`import trax.models` and the like. How each kind of name is made configurable:

* Classes (attention layers, `LayerNorm`, optimizers, `TrainTask`, ...) are
  configured in place (gin decorates their `__init__`), so every construction
  sees the bindings: through any import path, from a model's default
  argument, or inside retrax.
* Functions (layer and model constructors, schedules, input functions,
  `trainer_lib.train`) are wrapped by gin, and the wrapper replaces the
  function under its public name (e.g. `retrax.models.ReformerLM`,
  `retrax.lr.multifactor`) and in the module that defines it, as Trax's
  `__init__` files did. A reference taken before gin was imported keeps the
  plain function, which sees no bindings.
* Trax's TensorFlow data functions that retrax does not provide (T5, BERT
  and MathQA inputs) are registered too, so their configs parse; calling one
  raises `TensorFlowOnlyError`, saying what to use instead.

gin's `backend.name` (module `trax.fastmath.ops`) chooses the default
fastmath backend, as in Trax. retrax's own code reads no gin.
"""

import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys

# Trax 1.4.1's configurable names: (gin module, retrax modules that expose
# them, the first one holding the objects; names; parameters gin may not
# bind). Each name is registered as `gin module.name`.
_LAYERS = ('retrax.layers',)
_DATA = ('retrax.data', 'retrax.data.tf_inputs')  # Trax's home of TFDS & co.
_TRAX_CONFIGURABLES = (
    ('trax.layers', _LAYERS, '''
        AtariConvInit AttentionResampling AveragePooling BatchNorm
        CategoryCrossEntropy ConvTranspose CrossEntropyLossWithLogSoftmax Exp
        FastGelu FilterResponseNorm GRUCell Gelu HardSigmoid HardTanh L2Loss
        LSTMCell LayerNorm LinearPooling LinearUpsampling LogSoftmax
        MacroAveragedFScore NaiveUpsampling NoUpsampling
        RelativeAttentionLMLayer RelativeAttentionLayer RelativeAttentionWrapper
        Relu Rotate SequenceAccuracy Sigmoid Softmax Softplus Tanh
        ThresholdedLinearUnit WeightedCategoryAccuracy
        WeightedCategoryCrossEntropy WeightedFScore''', ()),
    # Attention and position layers take `mode` from the model, never gin.
    ('trax.layers', _LAYERS, '''
        Attention CausalAttention CausalFavor CausalFavorAttention
        ConvCausalAttention DotProductCausalAttention EncDecAttention Favor
        FavorAttention InfinitePositionalEncoding LSHSelfAttention
        LowRankCausalAttention MixedLSHSelfAttention ModularCausalAttention
        MultiplicativeCausalAttention MultiplicativeConvCausalAttention
        MultiplicativeModularCausalAttention PositionalEncoding
        PureLSHSelfAttention PureLSHSelfAttentionWrapper SelfAttention
        TimeBinPositionalEncoding''', ('mode',)),
    ('trax.models', ('retrax.models',), '''
        AtariCnn AtariCnnBody BERT BERTClassifierHead BERTRegressionHead
        ConfigurableTerraformer ConfigurableTransformer
        ConfigurableTransformerEncoder ConfigurableTransformerLM
        EveryOtherLayerDropTransformerLM FrameStackMLP GRULM HourglassLM
        LSTMSeq2SeqAttn LayerDropTransformerLM MLP NeuralGPU RNNLM ReZeroTransformer
        ReZeroTransformerDecoder ReZeroTransformerEncoder ReZeroTransformerLM
        Reformer ReformerLM ReformerShortenLM ResidualShuffleExchange Resnet50
        SkippingTransformerLM Transformer Transformer2 TransformerDecoder
        TransformerEncoder TransformerLM WideResnet''', ()),
    ('trax.models.research.bert', ('retrax.models.research.bert',), '''
        BERTClassifierHead BERTMLMHead BERTPretrainingHead BERTPretrainingLoss
        BERTRegressionHead''', ()),
    ('trax.optimizers', ('retrax.optimizers',),
     'Adafactor Adam Momentum RMSProp SGD SM3', ()),
    ('trax.supervised.lr_schedules',
     ('retrax.supervised.lr_schedules', 'retrax.lr'),
     'constant multifactor warmup warmup_and_rsqrt_decay', ()),
    ('trax.supervised.trainer_lib', ('retrax.supervised.trainer_lib',),
     'named_stream num_devices', ()),
    # The output directory comes from the command line, never from gin.
    ('trax.supervised.trainer_lib',
     ('retrax.supervised.trainer_lib', 'retrax.supervised'),
     'train', ('output_dir',)),
    ('trax.supervised.training', ('retrax.supervised.training',),
     'EvalTask TrainTask', ()),
    # With retrax's `text_streams`, the local stand-in for T2T text problems.
    ('trax.data', _DATA, '''
        AddLossWeights AppendValue Batch BucketByLength CastTo
        ConcatenateToLMInput ConvertToUnicode CountAndSkip Dup FilterByLength
        FilterEmptyExamples Log MLM PadToLength Prefetch PrefixLM
        SentencePieceTokenize Shuffle Tokenize TruncateToLength UnBatch
        UniformlySeek addition_input_stream addition_inputs batcher
        consume_noise_mask generate_random_noise_mask generate_sequential_chunks
        make_additional_stream make_inputs make_parallel_stream random_inputs
        sequence_copy_inputs simple_sequence_copy_inputs sine_inputs
        text_streams''', ()),
    # Trax's TensorFlow inputs: retrax reads TFDS without TensorFlow where it
    # can (`retrax.data`); the others raise `TensorFlowOnlyError` when called.
    ('trax.data', _DATA, '''
        BertGlueEvalStream BertGlueTrainStream BertNextSentencePredictionInputs
        CorpusToRandomChunks CreateAnnotatedDropInputs CreateAquaInputs
        CreateBertInputs CreateDropInputs CreateMathQAInputs T5GlueEvalStream
        T5GlueEvalStreamsParallel T5GlueEvalTasks T5GlueTrainStream
        T5GlueTrainStreamsParallel TFDS data_streams get_t5_preprocessor_by_name
        mask_random_tokens''', ()),
    # Preprocessors get the dataset and the training flag from their caller.
    ('trax.data', _DATA, '''
        add_eos_to_output_features bair_robot_pushing_preprocess
        c4_bare_preprocess_fn c4_preprocess cifar10_augmentation_flatten_preprocess
        cifar10_augmentation_preprocess cifar10_no_augmentation_preprocess
        concat_preprocess downsampled_imagenet_flatten_bare_preprocess
        filter_dataset_on_len generic_text_dataset_preprocess_fn lm1b_preprocess
        lm_token_preprocessing pad_dataset_to_length squeeze_targets_preprocess
        truncate_dataset_on_len wmt_concat_preprocess wmt_preprocess''',
     ('dataset', 'training')),
    ('trax.data', _DATA, 'bair_robot_pushing_hparams', ('hparams',)),
)

_registered = False


def trax_configurable_names():
  """`(gin module, name)` of every name `register` makes configurable."""
  return [(module, name) for module, _, names, _ in _TRAX_CONFIGURABLES
          for name in names.split()] + [('trax.fastmath.ops', 'backend')]


def _backend_name(name=None):
  """The name gin binds to `backend.name` (None: none bound)."""
  return name


def _lookup(module_name, name):
  """`module.name`, or None where retrax has only Trax's TensorFlow error."""
  from retrax.data import tensorflow_only
  try:
    return getattr(importlib.import_module(module_name), name)
  except tensorflow_only.TensorFlowOnlyError:
    return None


def _tensorflow_only(name):
  """A stand-in for Trax's TensorFlow function `name`: raises when called."""
  from retrax.data import tensorflow_only

  def stand_in(*args, **kwargs):
    del args, kwargs
    raise tensorflow_only.error(name)
  stand_in.__name__ = stand_in.__qualname__ = name
  stand_in.__doc__ = f'Trax\'s `trax.data.{name}`, which needs TensorFlow.'
  return stand_in


def _module_and_packages(module_name):
  """`module_name` and the packages above it, which may re-export its names.

  `retrax.layers.attention.dense` defines `CausalAttention`, and the package
  `retrax.layers.attention` (Trax's `trax.layers.attention`) exports it too.
  """
  parts = module_name.split('.')
  return tuple('.'.join(parts[:i]) for i in range(len(parts), 1, -1))


def _replace(modules, original, wrapper, name):
  """Puts `wrapper` where `original` is found under `name` in `modules`."""
  for module_name in modules:
    module = sys.modules.get(module_name)
    if module is not None and getattr(module, name, None) is original:
      setattr(module, name, wrapper)


def _show_parameters(fn):
  """Lets gin read `fn`'s parameters through a `(*args, **kwargs)` decorator.

  gin reads them with `getfullargspec`, which does not follow `__wrapped__`
  (retrax's models and attention layers are decorated): without the names,
  a binding of an argument the caller gives positionally (a leftover
  `TransformerLM.vocab_size` with `TransformerLM(10)`) is passed again by
  keyword ("multiple values") instead of giving way as in Trax, and a
  binding of a parameter the function lacks is not refused.
  """
  if hasattr(fn, '__wrapped__') and '__signature__' not in vars(fn):
    fn.__signature__ = inspect.signature(fn)


def _register_one(gin, gin_module, modules, name, denylist):
  original = _lookup(modules[0], name)
  kwargs = dict(module=gin_module, denylist=list(denylist) or None)
  if original is None:
    gin.external_configurable(_tensorflow_only(name), name, **kwargs)
  elif inspect.isclass(original):
    gin.configurable(name, **kwargs)(original)  # In place: `__init__` reads gin.
  else:
    _show_parameters(original)
    wrapper = gin.external_configurable(original, name, **kwargs)
    _replace(modules + _module_and_packages(original.__module__), original,
             wrapper, name)


def register(gin):
  """Registers Trax's configurable names with `gin` (the module). Idempotent."""
  global _registered
  if _registered:
    return
  _registered = True
  sys.meta_path[:] = [f for f in sys.meta_path
                      if not isinstance(f, _GinImportWatcher)]
  from retrax import compat
  from retrax.fastmath.backend import set_default_source  # JAX: only with gin.
  compat.alias_trax_modules()  # Trax's gin files `import trax.models` etc.
  set_default_source(gin.external_configurable(
      _backend_name, name='backend', module='trax.fastmath.ops'))
  for gin_module, modules, names, denylist in _TRAX_CONFIGURABLES:
    for name in names.split():
      _register_one(gin, gin_module, modules, name, denylist)


class _RegisteringLoader(importlib.abc.Loader):
  """Loads gin with its own loader, then registers Trax's names."""

  def __init__(self, loader):
    self._loader = loader

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    register(module)

  def __getattr__(self, name):  # get_data, get_resource_reader, ...
    return getattr(self._loader, name)


class _GinImportWatcher(importlib.abc.MetaPathFinder):
  """Finds `gin` as the import system would, with `_RegisteringLoader`."""

  def find_spec(self, fullname, path=None, target=None):
    if fullname != 'gin':
      return None
    # Not through sys.meta_path: that would come back here. The watcher
    # stays until gin is loaded (a bare `find_spec('gin')` loads nothing).
    spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
    if spec is not None and spec.loader is not None:
      spec.loader = _RegisteringLoader(spec.loader)
    return spec


def install():
  """Registers Trax's names now if gin is imported, else when it is."""
  if 'gin' in sys.modules:
    register(sys.modules['gin'])
  elif not any(isinstance(f, _GinImportWatcher) for f in sys.meta_path):
    sys.meta_path.insert(0, _GinImportWatcher())
