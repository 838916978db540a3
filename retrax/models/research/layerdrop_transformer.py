"""Transformer LMs that skip decoder blocks at random (LayerDrop, Fan et al. 2019).

arXiv:1909.11556. Each block sits in a `tl.Cond` on a uniform random draw, so
skipped blocks cost nothing. Layer trees equal Trax 1.4.1's
`trax.models.research.layerdrop_transformer` (Trax checkpoints load leaf for
leaf); outside training the draws are compared with fractions 0 or 1 by
default, so eval and predict run a fixed set of blocks.
"""

import numbers

from retrax import layers as tl
from retrax.layers import assert_shape
from retrax.models import transformer
from retrax.models import registry
from retrax.validation import ArgumentValueError


def LargerThan(val):
  """`x > val`, as a layer."""
  return tl.Fn('LargerThan', lambda x: x > val)


def _embedder(vocab_size, d_model, dropout, max_len, mode):
  return [tl.Embedding(vocab_size, d_model),
          tl.Dropout(rate=dropout, mode=mode),
          tl.PositionalEncoding(max_len=max_len, mode=mode)]


def _block(d_model, d_ff, n_heads, dropout, mode, ff_activation):
  return tl.Serial(transformer.DecoderBlock(
      d_model, d_ff, n_heads, dropout, [], mode, ff_activation))


def _check(model, n_layers, mode, **fractions):
  if mode not in ('train', 'eval', 'predict'):
    raise ArgumentValueError(f"{model}: mode must be 'train', 'eval' or 'predict'; "
                             f'got {mode!r}')
  if not isinstance(n_layers, numbers.Integral) or n_layers < 0:
    raise ArgumentValueError(f'{model}: n_layers must be an int >= 0; got {n_layers!r}')
  for name, value in fractions.items():
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
      if not isinstance(v, numbers.Real) or not 0.0 <= float(v) <= 1.0:
        raise ArgumentValueError(f'{model}: {name} must be in [0, 1] (or a list of '
                                 f'such); got {value!r}')


@registry.register
@assert_shape('...s->...sv')
def SkippingTransformerLM(vocab_size, d_model=512, d_ff=2048, n_layers=6,
                          n_heads=8, dropout=0.1, max_len=2048, mode='train',
                          ff_activation=tl.Relu, skip_fraction=0.4):
  """Runs the first `k` blocks, `k ~ U(0, n_layers / skip_fraction)` in training.

  Outside training all `n_layers` blocks run.
  """
  _check('SkippingTransformerLM', n_layers, mode, skip_fraction=skip_fraction)

  @assert_shape('...sd,->...sd,')
  def ConditionedBlock(current_layer_num):
    return tl.Serial(
        tl.Select([1, 0, 1]),           # n_keep emb n_keep
        tl.Cond(LargerThan(float(current_layer_num)),
                _block(d_model, d_ff, n_heads, dropout, mode, ff_activation),
                tl.Serial()))           # emb n_keep

  if mode == 'train' and skip_fraction != 0.0:
    minimum_layers, maximum_layers = 0.0, float(n_layers) / skip_fraction
  else:
    minimum_layers = maximum_layers = float(n_layers)
  return tl.Serial(
      tl.ShiftRight(mode=mode),
      _embedder(vocab_size, d_model, dropout, max_len, mode),
      tl.RandomUniform(minimum_layers, maximum_layers, sync=True),
      tl.Swap(),                        # emb n_keep
      [ConditionedBlock(i) for i in range(n_layers)],
      tl.AssertShape('...sd,'),
      tl.Select([0], n_in=2),
      tl.AssertShape('...sd'),
      tl.LayerNorm(),
      tl.Dense(vocab_size),
  )


_SKIP_MODES = ('even', 'odd', '1half', '2half')


def _skipped_by_mode(skip_mode, n_layers, i):
  return {'even': i % 2 == 0, 'odd': i % 2 == 1, '1half': i < n_layers / 2,
          '2half': i >= n_layers / 2}[skip_mode]


@registry.register
@assert_shape('...s->...sv')
def EveryOtherLayerDropTransformerLM(vocab_size, d_model=512, d_ff=2048,
                                     n_layers=6, n_heads=8, dropout=0.1,
                                     max_len=2048, mode='train',
                                     ff_activation=tl.Relu, skip_mode='even',
                                     skip_fraction=0.5, eval_skip_fraction=0.0):
  """With one draw per step, skips the `skip_mode` blocks (or none).

  `skip_mode`: 'even', 'odd', '1half' or '2half' (the blocks skipped
  together); they are skipped with probability `skip_fraction` in training,
  `eval_skip_fraction` otherwise.
  """
  _check('EveryOtherLayerDropTransformerLM', n_layers, mode,
         skip_fraction=skip_fraction, eval_skip_fraction=eval_skip_fraction)
  if skip_mode not in _SKIP_MODES:
    raise ArgumentValueError(f'EveryOtherLayerDropTransformerLM: skip_mode must be one '
                             f'of {_SKIP_MODES}; got {skip_mode!r}')
  if mode != 'train':
    skip_fraction = eval_skip_fraction

  @assert_shape('...sd,->...sd,')
  def ConditionedBlock(current_layer_num):
    threshold = (skip_fraction
                 if _skipped_by_mode(skip_mode, n_layers, current_layer_num)
                 else 0.0)
    return tl.Serial(
        tl.Select([1, 0, 1]),           # draw emb draw
        tl.Cond(LargerThan(threshold),
                _block(d_model, d_ff, n_heads, dropout, mode, ff_activation)))

  return tl.Serial(
      tl.ShiftRight(mode=mode),
      _embedder(vocab_size, d_model, dropout, max_len, mode),
      tl.RandomUniform(0., 1., sync=True),
      tl.Swap(),                        # emb draw
      [ConditionedBlock(i) for i in range(n_layers)],
      tl.Select([0], n_in=2),
      tl.LayerNorm(),
      tl.Dense(vocab_size),
  )


def _per_layer(name, value, n_layers):
  values = list(value) if isinstance(value, (list, tuple)) else [value] * n_layers
  if len(values) != n_layers:
    raise ArgumentValueError(f'LayerDropTransformerLM: n_layers ({n_layers}) must be '
                             f'equal to len({name}) ({len(values)})')
  return values


def _eval_fractions(eval_skip_fraction, skip_fraction, n_layers):
  """Per-layer eval skip fractions; 'every_other' keeps every 1/p-th layer out."""
  if eval_skip_fraction == 'every_other':
    return [(1.0 if i % int(1. / p) == 0 else 0.0) if p != 0 else 0.0
            for i, p in enumerate(skip_fraction)]
  if eval_skip_fraction == 'same':
    return list(skip_fraction)
  if isinstance(eval_skip_fraction, str):
    raise ArgumentValueError("LayerDropTransformerLM: eval_skip_fraction must be a "
                             "fraction, a list of them, 'every_other' or 'same'; got "
                             f'{eval_skip_fraction!r}')
  return _per_layer('eval_skip_fraction', eval_skip_fraction, n_layers)


@registry.register
@assert_shape('...s->...sv')
def LayerDropTransformerLM(vocab_size, d_model=512, d_ff=2048, n_layers=6,
                           n_heads=8, dropout=0.1, max_len=2048, mode='train',
                           ff_activation=tl.Relu, skip_fraction=0.4,
                           eval_skip_fraction='every_other'):
  """Skips each block independently with probability `skip_fraction[i]`.

  Outside training block `i` is skipped with probability
  `eval_skip_fraction[i]`; 'every_other' (Fan et al.'s pruning) skips block
  `i` when `i` is a multiple of `int(1 / skip_fraction[i])`, 'same' uses the
  training fractions.
  """
  skip_fraction = _per_layer('skip_fraction', skip_fraction, n_layers)
  _check('LayerDropTransformerLM', n_layers, mode, skip_fraction=skip_fraction)
  eval_skip_fraction = _eval_fractions(eval_skip_fraction, skip_fraction,
                                       n_layers)
  _check('LayerDropTransformerLM', n_layers, mode,
         eval_skip_fraction=eval_skip_fraction)
  fractions = skip_fraction if mode == 'train' else eval_skip_fraction

  @assert_shape('...sd->...sd')
  def ConditionedBlock(current_layer_num):
    return tl.Serial(
        tl.RandomUniform(0., 1, sync=True),   # draw emb
        tl.Cond(LargerThan(fractions[current_layer_num]),
                _block(d_model, d_ff, n_heads, dropout, mode, ff_activation),
                tl.Serial()))

  return tl.Serial(
      tl.ShiftRight(mode=mode),
      _embedder(vocab_size, d_model, dropout, max_len, mode),
      [ConditionedBlock(i) for i in range(n_layers)],
      tl.LayerNorm(),
      tl.Dense(vocab_size),
  )
