"""retrax.models: Trax's models, at Trax's module paths."""

from retrax.models import atari_cnn as atari_cnn
from retrax.models import mlp as mlp
from retrax.models import neural_gpu as neural_gpu
from retrax.models import reformer as reformer
from retrax.models import resnet as resnet
from retrax.models import rnn as rnn
from retrax.models import transformer as transformer
from retrax.models.atari_cnn import AtariCnn as AtariCnn
from retrax.models.atari_cnn import AtariCnnBody as AtariCnnBody
from retrax.models.atari_cnn import FrameStackMLP as FrameStackMLP
from retrax.models.mlp import MLP as MLP
from retrax.models.neural_gpu import NeuralGPU as NeuralGPU
from retrax.models.research import hourglass as hourglass
from retrax.models.research import rse as rse
from retrax.models.research.configurable_transformer import ConfigurableTransformer as ConfigurableTransformer
from retrax.models.research.configurable_transformer import ConfigurableTransformerEncoder as ConfigurableTransformerEncoder
from retrax.models.research.configurable_transformer import ConfigurableTransformerLM as ConfigurableTransformerLM
from retrax.models.research.terraformer import ConfigurableTerraformer as ConfigurableTerraformer
from retrax.models.research import bert as bert
from retrax.models.research import layerdrop_transformer as layerdrop_transformer
from retrax.models.research import rezero as rezero
from retrax.models.research import transformer2 as transformer2
from retrax.models.research.bert import BERT as BERT
from retrax.models.research.bert import BERTClassifierHead as BERTClassifierHead
from retrax.models.research.bert import BERTRegressionHead as BERTRegressionHead
from retrax.models.research.layerdrop_transformer import EveryOtherLayerDropTransformerLM as EveryOtherLayerDropTransformerLM
from retrax.models.research.layerdrop_transformer import LayerDropTransformerLM as LayerDropTransformerLM
from retrax.models.research.layerdrop_transformer import SkippingTransformerLM as SkippingTransformerLM
from retrax.models.research.rezero import ReZeroTransformer as ReZeroTransformer
from retrax.models.research.rezero import ReZeroTransformerDecoder as ReZeroTransformerDecoder
from retrax.models.research.rezero import ReZeroTransformerEncoder as ReZeroTransformerEncoder
from retrax.models.research.rezero import ReZeroTransformerLM as ReZeroTransformerLM
from retrax.models.research.transformer2 import Transformer2 as Transformer2
from retrax.models.research.hourglass import HourglassLM as HourglassLM
from retrax.models.research.rse import ResidualShuffleExchange as ResidualShuffleExchange
from retrax.models.reformer.reformer import Reformer as Reformer
from retrax.models.reformer.reformer import ReformerLM as ReformerLM
from retrax.models.reformer.reformer import ReformerShortenLM as ReformerShortenLM
from retrax.models.resnet import Resnet50 as Resnet50
from retrax.models.resnet import WideResnet as WideResnet
from retrax.models.rnn import GRULM as GRULM
from retrax.models.rnn import LSTMSeq2SeqAttn as LSTMSeq2SeqAttn
from retrax.models.rnn import RNNLM as RNNLM
from retrax.models.transformer import Transformer as Transformer
from retrax.models.transformer import TransformerDecoder as TransformerDecoder
from retrax.models.transformer import TransformerEncoder as TransformerEncoder
from retrax.models.transformer import TransformerLM as TransformerLM

from retrax.run import recorded as _recorded

# Models built through these names remember their constructor and arguments,
# so a run's directory can rebuild them (`retrax.load_run`).
MODELS = {name: _recorded(fn, name) for name, fn in {
    'AtariCnn': AtariCnn,
    'AtariCnnBody': AtariCnnBody,
    'BERT': BERT,
    'BERTClassifierHead': BERTClassifierHead,
    'BERTRegressionHead': BERTRegressionHead,
    'ConfigurableTerraformer': ConfigurableTerraformer,
    'ConfigurableTransformer': ConfigurableTransformer,
    'ConfigurableTransformerEncoder': ConfigurableTransformerEncoder,
    'ConfigurableTransformerLM': ConfigurableTransformerLM,
    'EveryOtherLayerDropTransformerLM': EveryOtherLayerDropTransformerLM,
    'FrameStackMLP': FrameStackMLP,
    'GRULM': GRULM,
    'HourglassLM': HourglassLM,
    'LayerDropTransformerLM': LayerDropTransformerLM,
    'LSTMSeq2SeqAttn': LSTMSeq2SeqAttn,
    'MLP': MLP,
    'NeuralGPU': NeuralGPU,
    'RNNLM': RNNLM,
    'Reformer': Reformer,
    'ReformerLM': ReformerLM,
    'ReformerShortenLM': ReformerShortenLM,
    'ResidualShuffleExchange': ResidualShuffleExchange,
    'ReZeroTransformer': ReZeroTransformer,
    'ReZeroTransformerDecoder': ReZeroTransformerDecoder,
    'ReZeroTransformerEncoder': ReZeroTransformerEncoder,
    'ReZeroTransformerLM': ReZeroTransformerLM,
    'Resnet50': Resnet50,
    'SkippingTransformerLM': SkippingTransformerLM,
    'Transformer': Transformer,
    'Transformer2': Transformer2,
    'TransformerDecoder': TransformerDecoder,
    'TransformerEncoder': TransformerEncoder,
    'TransformerLM': TransformerLM,
    'WideResnet': WideResnet,
}.items()}
globals().update(MODELS)
