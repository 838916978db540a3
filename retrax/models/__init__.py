"""retrax.models: Trax's models, at Trax's module paths."""

from retrax.models import atari_cnn as atari_cnn
from retrax.models import mlp as mlp
from retrax.models import reformer as reformer
from retrax.models import resnet as resnet
from retrax.models import rnn as rnn
from retrax.models import transformer as transformer
from retrax.models.atari_cnn import AtariCnn as AtariCnn
from retrax.models.atari_cnn import AtariCnnBody as AtariCnnBody
from retrax.models.atari_cnn import FrameStackMLP as FrameStackMLP
from retrax.models.mlp import MLP as MLP
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

MODELS = {
    'MLP': MLP,
    'Reformer': Reformer,
    'ReformerLM': ReformerLM,
    'ReformerShortenLM': ReformerShortenLM,
    'Transformer': Transformer,
    'TransformerDecoder': TransformerDecoder,
    'TransformerEncoder': TransformerEncoder,
    'TransformerLM': TransformerLM,
}
