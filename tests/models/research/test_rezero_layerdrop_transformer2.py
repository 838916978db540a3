"""ReZero, LayerDrop/Skipping and Transformer2 models against real Trax 1.4.1.

`fixtures/golden/{rezero,layerdrop,transformer2}/` were written by Trax
(`fixtures/golden/rezero/make_rezero_goldens.py`): eval-model checkpoints
(`save_to_file`, perturbed weights), Trax's eval outputs and, for the
predict cases, Trax's predict-mode outputs fed one token per call.
"""

import os

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import shapes
from retrax.models.research import layerdrop_transformer as ld
from retrax.models.research import rezero
from retrax.models.research import transformer2
from tests.backend_tolerance import float32_tolerance

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden')
LM = dict(d_model=16, d_ff=32, n_heads=2, max_len=32, dropout=0.1)

# Same constructors as make_rezero_goldens.py.
CASES = {
    'rezero_lm': ('rezero', lambda mode: rezero.ReZeroTransformerLM(
        16, n_layers=2, mode=mode, **LM)),
    'rezero_encdec': ('rezero', lambda mode: rezero.ReZeroTransformer(
        16, 12, n_encoder_layers=2, n_decoder_layers=2, mode=mode, **LM)),
    'rezero_encoder': ('rezero', lambda mode: rezero.ReZeroTransformerEncoder(
        16, n_classes=3, n_layers=2, mode=mode, **LM)),
    'rezero_decoder': ('rezero', lambda mode: rezero.ReZeroTransformerDecoder(
        None, n_layers=1, mode=mode, **LM)),
    'skipping_lm': ('layerdrop', lambda mode: ld.SkippingTransformerLM(
        16, n_layers=2, mode=mode, **LM)),
    'layerdrop_lm': ('layerdrop', lambda mode: ld.LayerDropTransformerLM(
        16, n_layers=3, mode=mode, **LM)),
    'everyother_lm': ('layerdrop', lambda mode: ld.EveryOtherLayerDropTransformerLM(
        16, n_layers=4, mode=mode, skip_mode='odd', eval_skip_fraction=1.0,
        **LM)),
    'transformer2': ('transformer2', lambda mode: transformer2.Transformer2(
        16, 12, n_encoder_layers=1, n_decoder_layers=2, mode=mode, **LM)),
    'transformer2_nopad': ('transformer2', lambda mode: transformer2.Transformer2(
        16, 12, n_encoder_layers=1, n_decoder_layers=1, mode=mode, **LM)),
}
# Each tl.Cond compiles both branches on every eager call: the LayerDrop
# models with 3-4 conditioned blocks take 20-60 s at this machine's load.
_SLOW = pytest.mark.slow
PREDICT = ['rezero_lm', 'rezero_encdec', 'skipping_lm',
           pytest.param('layerdrop_lm', marks=_SLOW),
           pytest.param('everyother_lm', marks=_SLOW), 'transformer2_nopad']
EVAL = [pytest.param(n, marks=_SLOW) if n == 'everyother_lm' else n
        for n in sorted(CASES)]


def _io(name):
  group = CASES[name][0]
  io = np.load(os.path.join(GOLDEN, group, f'{name}.npz'))
  inputs = tuple(io[f'in{i}'] for i in range(3) if f'in{i}' in io)
  return io, inputs, os.path.join(GOLDEN, group, f'{name}.pkl.gz')


def _close(actual, desired, tol=1e-5):
  """`tol` of the reference's scale; on a TPU at least the float32 floor of it.

  On a v5e (2026-12-06) everyother_lm's logits were off Trax's by 3.5e-5 of
  their scale; on the CPU, weights changed by a relative 1e-6 move them by up
  to 5.8e-6 of it (1e-5: 5.7e-5).
  """
  desired = np.asarray(desired)
  np.testing.assert_allclose(
      np.asarray(actual), desired,
      **float32_tolerance(rtol=0, atol=tol,
                          scale=max(1.0, np.abs(desired).max())))


def _arg(inputs):
  return inputs if len(inputs) > 1 else inputs[0]


@pytest.mark.parametrize('name', EVAL)
def test_trax_checkpoint_gives_trax_eval_outputs(name):
  io, inputs, path = _io(name)
  model = CASES[name][1]('eval')
  sig = shapes.signature(_arg(inputs))
  weights, state = model.init(sig)
  loaded_w, loaded_s = model.init_from_file(path, weights_only=False)
  for ours, theirs in ((weights, loaded_w), (state, loaded_s)):
    assert (jax.tree_util.tree_structure(ours) ==
            jax.tree_util.tree_structure(theirs))
    for a, b in zip(jax.tree_util.tree_leaves(ours),
                    jax.tree_util.tree_leaves(theirs)):
      assert np.shape(a) == np.shape(b)
  outs = model(_arg(inputs))
  outs = outs if isinstance(outs, (tuple, list)) else (outs,)
  for i, out in enumerate(outs):
    _close(out, io[f'out{i}'])


def _predict_outputs(name, path, inputs):
  model = CASES[name][1]('predict')
  *source, target = inputs
  step_sig = tuple(shapes.signature(x) for x in source) + (
      shapes.ShapeDtype((target.shape[0], 1), np.int32),)
  model.init_from_file(path, weights_only=True, input_signature=step_sig)
  shifted = np.concatenate(
      [np.zeros((target.shape[0], 1), np.int32), target[:, :-1]], 1)
  outs = []
  for t in range(target.shape[1]):
    out = model(tuple(source) + (shifted[:, t:t + 1],))
    outs.append(np.asarray(out[0] if isinstance(out, (tuple, list)) else out))
  return np.concatenate(outs, axis=1)


@pytest.mark.parametrize('name', PREDICT)
def test_predict_equals_trax_predict_and_eval_on_every_prefix(name):
  io, inputs, path = _io(name)
  predicted = _predict_outputs(name, path, inputs)
  _close(predicted, io['predict'])
  _close(predicted, io['out0'])  # eval logits, position by position


def test_residual_zero_starts_as_identity_and_scales_its_branch():
  layer = rezero.ResidualZero(tl.Dense(3))
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  layer.init(shapes.signature(x))
  np.testing.assert_array_equal(np.asarray(layer(x)), x)
  # Serial(Branch(identity, Serial(Dense, Weights, Multiply)), Add).
  (((), ((), (dense, alpha, ()))), ()) = layer.weights
  assert np.shape(alpha) == () and float(alpha) == 0.0
  layer.weights = (((), ((), (dense, np.float32(0.5), ()))), ())
  kernel, bias = dense
  _close(layer(x), x + 0.5 * (x @ np.asarray(kernel) + np.asarray(bias)))


def test_layerdrop_train_skips_blocks_at_the_given_rate():
  """skip_fraction 1 drops every block: the model is embedding -> norm -> Dense."""
  x = np.array([[3, 1, 4, 1, 5]], np.int32)
  dropped = ld.LayerDropTransformerLM(16, n_layers=2, mode='train',
                                      skip_fraction=1.0, eval_skip_fraction=1.0,
                                      **{**LM, 'dropout': 0.0})
  dropped.init(shapes.signature(x))
  kept = ld.LayerDropTransformerLM(16, n_layers=0, mode='train',
                                   skip_fraction=[], eval_skip_fraction=[],
                                   **{**LM, 'dropout': 0.0})
  kept.init(shapes.signature(x))
  leaves = jax.tree_util.tree_leaves(dropped.weights)
  # Embedding, positions, then LayerNorm and Dense after the blocks.
  kept.weights = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(kept.weights), leaves[:2] + leaves[-4:])
  _close(dropped(x), kept(x))


def test_skipping_eval_runs_every_block_and_train_varies():
  x = np.array([[3, 1, 4, 1, 5, 9]], np.int32)
  train = ld.SkippingTransformerLM(16, n_layers=3, mode='train',
                                   skip_fraction=0.9, **{**LM, 'dropout': 0.0})
  train.init(shapes.signature(x))
  outs = {np.asarray(train(x, rng=jax.random.PRNGKey(i))).tobytes()
          for i in range(6)}
  assert len(outs) > 1  # different numbers of blocks run


@pytest.mark.parametrize('make, match', [
    (lambda: ld.LayerDropTransformerLM(16, n_layers=2, skip_fraction=[0.1]),
     r'n_layers \(2\) must be equal to len\(skip_fraction\) \(1\)'),
    (lambda: ld.LayerDropTransformerLM(16, n_layers=2,
                                       eval_skip_fraction='often'),
     'eval_skip_fraction'),
    (lambda: ld.EveryOtherLayerDropTransformerLM(16, skip_mode='third'),
     'skip_mode must be one of'),
    (lambda: ld.SkippingTransformerLM(16, skip_fraction=1.5),
     r'skip_fraction must be in \[0, 1\]'),
    (lambda: rezero.ReZeroTransformerLM(16, d_model=30, n_heads=4),
     r'd_model \(30\) must be a positive multiple of n_heads \(4\)'),
    (lambda: rezero.ReZeroTransformer(16, mode='decode'), 'mode must be'),
    (lambda: transformer2.Transformer2(16, d_model=10, n_heads=3),
     r'Transformer2: d_model \(10\)'),
    (lambda: rezero.ResidualZero(tl.Dense(2), 'relu'),
     'ResidualZero: expected layers'),
])
def test_bad_arguments_raise_clear_errors(make, match):
  with pytest.raises(ValueError, match=match):
    make()
