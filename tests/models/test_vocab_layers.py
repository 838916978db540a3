"""Models' vocabulary sizes are checked at init, where Trax first uses them.

Trax builds and prints `ReformerLM('train')` (the mode passed where the size
goes, as in `print(ReformerLM('train'))`) and fails only at `init`. retrax
builds the same tree, with Trax's layer names, and raises at init or call an
`ArgumentError` naming the model and the argument.
"""

import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax import validation
from retrax.models import vocab_layers
from retrax.models.reformer import reformer
from retrax.models.research import configurable_transformer as ct
from retrax.models.research import terraformer
from retrax.models.research import transformer2

TINY = dict(d_model=8, d_ff=8, n_heads=2, max_len=16)
ENC_DEC = dict(TINY, n_encoder_layers=1, n_decoder_layers=1)

# Model constructor, its first argument's name, small sizes, and whether it
# takes (source, target).
MODELS = {
    'ReformerLM': (models.ReformerLM, 'vocab_size', dict(TINY, n_layers=1)),
    'TransformerLM': (models.TransformerLM, 'vocab_size',
                      dict(TINY, n_layers=1)),
    'TransformerEncoder': (models.TransformerEncoder, 'vocab_size',
                           dict(TINY, n_layers=1)),
    'TransformerDecoder': (models.TransformerDecoder, 'vocab_size',
                           dict(TINY, n_layers=1)),
    'Transformer': (models.Transformer, 'input_vocab_size', ENC_DEC),
    'Reformer': (models.Reformer, 'input_vocab_size', ENC_DEC),
    'ReformerShortenLM': (reformer.ReformerShortenLM, 'vocab_size',
                          dict(TINY, d_embedding=8, n_layers=1)),
    'ConfigurableTransformerLM': (ct.ConfigurableTransformerLM, 'vocab_size',
                                  dict(TINY, n_layers=1)),
    'ConfigurableTransformerEncoder': (ct.ConfigurableTransformerEncoder,
                                       'vocab_size', dict(TINY, n_layers=1)),
    'ConfigurableTransformer': (ct.ConfigurableTransformer,
                                'input_vocab_size', ENC_DEC),
    'ConfigurableTerraformer': (terraformer.ConfigurableTerraformer,
                                'input_vocab_size', ENC_DEC),
    'Transformer2': (transformer2.Transformer2, 'input_vocab_size', ENC_DEC),
}
_ENC_DEC = ('Transformer', 'Reformer', 'ConfigurableTransformer',
            'ConfigurableTerraformer', 'Transformer2')


def _inputs(name):
  tokens = shapes.ShapeDtype((1, 8), np.int32)
  return (tokens, tokens) if name in _ENC_DEC else tokens


@pytest.mark.parametrize('name', sorted(MODELS))
def test_model_with_a_mode_for_vocab_size_builds_trax_s_tree(name):
  make, _, sizes = MODELS[name]
  # The tree of a valid size, with the size in layer names spelled 'train'
  # (Embedding_train_8, Dense_train), as Trax names its layers.
  want = str(make(37, **sizes)).replace('Embedding_37_', 'Embedding_train_')
  assert str(make('train', **sizes)) == want.replace('Dense_37', 'Dense_train')


def test_reformer_lm_prints_as_in_trax():
  # Trax 1.4.1's print(ReformerLM('train')): 2480 characters, these ends.
  text = str(models.ReformerLM('train'))
  assert len(text) == 2480
  assert text.startswith('Serial[\n  Serial[\n    ShiftRight(1)\n  ]\n'
                         '  Embedding_train_512\n  Dropout\n')
  assert text.endswith('  Concatenate_in2\n  LayerNorm\n  Dropout\n'
                       '  Serial[\n    Dense_train\n  ]\n]')


@pytest.mark.parametrize('name', sorted(MODELS))
@pytest.mark.parametrize('size', ['train', 1.5, -1])
def test_bad_vocab_size_raises_at_init_naming_it(name, size):
  make, arg, sizes = MODELS[name]
  model = make(size, **sizes)
  with pytest.raises(tl.LayerError) as info:
    model.init(_inputs(name))
  message = str(info.value)
  owner = 'EmbeddingAndPositionalEncodings' if name in (
      'Reformer', 'ConfigurableTransformer', 'ConfigurableTerraformer',
      'Transformer2') else name
  assert f'{owner}: {arg} must be an int >= 1; got {size!r}' in message
  assert ("pass it as mode='train'" in message) == (size == 'train')


def test_stand_in_raises_when_called_and_valid_sizes_build_real_layers():
  model = models.TransformerLM('eval', **TINY)
  with pytest.raises(tl.LayerError, match="mode='eval'"):
    model(np.zeros((1, 4), np.int32))
  embedding = vocab_layers.Embedding('M', 'vocab_size', np.int64(5), 4)
  dense = vocab_layers.Dense('M', 'vocab_size', np.int32(5))
  assert type(embedding) is tl.Embedding and embedding.vocab_size == 5
  assert type(dense) is tl.Dense and dense.name == 'Dense_5'
  with pytest.raises(tl.LayerError) as info:
    vocab_layers.Embedding('M', 'vocab_size', -1, 4).init(
        shapes.ShapeDtype((1, 2), np.int32))
  assert isinstance(info.value.__cause__, validation.ArgumentValueError)
  assert 'M: vocab_size must be an int >= 1; got -1.' in str(info.value)


def test_output_size_errors_name_the_argument_it_came_from():
  model = models.Transformer(9, output_vocab_size='predict', **ENC_DEC)
  assert str(model).endswith('Dense_predict\n]')
  with pytest.raises(tl.LayerError, match='Transformer: output_vocab_size'):
    model.init(_inputs('Transformer'))
  with pytest.raises(tl.LayerError, match='Transformer: input_vocab_size'):
    models.Transformer('eval', **ENC_DEC).init(_inputs('Transformer'))
  # Transformer2's target embedding fails first; its output layer names it.
  model = transformer2.Transformer2(9, output_vocab_size=-1, **ENC_DEC)
  assert str(model).endswith('Dense_-1\n]')
  with pytest.raises(tl.LayerError, match='Transformer2: output_vocab_size'):
    model.sublayers[-1].init(shapes.ShapeDtype((1, 8, 8)))
