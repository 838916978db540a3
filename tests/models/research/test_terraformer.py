"""ConfigurableTerraformer: Trax-written checkpoints and logits, layer tree, reversibility.

`fixtures/golden/terraformer/` was written by real Trax 1.4.1
(`make_terraformer_goldens.py` there): eval-mode checkpoints (`save_to_file`)
and Trax's logits on fixed sources (ending in padding) and targets, and for
`revenc` Trax's predict-mode logits, one target token per call;
`make_terraformer_predict_goldens.py` there wrote Trax's predict-mode
logits of `default` (`tf_default_predict.npz`) and the `mixed` and
`multconv` cases.
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax import shapes
from retrax.supervised import decoding
from retrax.models.research import terraformer
from retrax.models.research import transformer2 as t2

GOLDEN = os.path.join(os.path.dirname(__file__), '..', '..', 'fixtures',
                      'golden', 'terraformer')


def _lsh(**kw):
  return functools.partial(tl.LSHSelfAttention, chunk_len=8, n_hashes=2,
                           n_buckets=4, n_chunks_before=1, **kw)


def _pure_wrapper(**kw):
  return functools.partial(
      tl.PureLSHSelfAttentionWrapper, chunk_len=8, n_hashes=2, n_buckets=4,
      n_chunks_before=1, num_weights=2, bias=False,
      pure_lsh_implementation=tl.PureLSHSelfAttention, **kw)


# Same arguments as make_terraformer_goldens.py.
TF_ARGS = dict(input_vocab_size=16, d_model=8, d_ff=16, n_heads=2,
               max_len=64, dropout=0.0)
TF_CASES = {
    'default': dict(n_encoder_layers=1, n_decoder_layers=2),
    'lsh': dict(n_encoder_layers=1, n_decoder_layers=3, pos_type=None,
                encoder_attention_type=_lsh(),
                encoder_decoder_attention_type=[_pure_wrapper(), _lsh(),
                                                tl.SelfAttention],
                ff_chunk_size=4, n_layers_forget=1),
    'revenc': dict(n_encoder_layers=2, n_decoder_layers=1,
                   reversible_encoder=True, n_decoder_attention_layers=1,
                   encoder_attention_type=tl.Attention,
                   encoder_decoder_attention_type=tl.CausalAttention,
                   ff_use_sru=(1, 8), pos_type=None),
    # As make_terraformer_predict_goldens.py: the decoder layers that read
    # the source mask through the portal in predict mode (standard causal
    # attention inside MixedLSHSelfAttention, sparse projections' memory).
    'mixed': dict(n_encoder_layers=1, n_decoder_layers=1, pos_type=None,
                  encoder_decoder_attention_type=functools.partial(
                      tl.PureLSHSelfAttentionWrapper,
                      pure_lsh_implementation=tl.MixedLSHSelfAttention,
                      std_length=64, chunk_len=8, n_hashes=2, n_buckets=4,
                      num_weights=2, bias=False, weights_format='sparse',
                      sparsity=4)),
    'multconv': dict(n_encoder_layers=1, n_decoder_layers=1, pos_type=None,
                     encoder_decoder_attention_type=functools.partial(
                         tl.MultiplicativeConvCausalAttention, sparsity=4,
                         length_kernel_size=3)),
}
# Trax's SelfAttention needs a predict-mode memory (make_terraformer_predict_goldens.py).
DEFAULT_PREDICT = dict(encoder_decoder_attention_type=functools.partial(
    tl.SelfAttention, predict_mem_len=32, predict_drop_len=32))


def _make(name, mode, **overrides):
  return terraformer.ConfigurableTerraformer(
      mode=mode, **{**TF_ARGS, **TF_CASES[name], **overrides})


def _io(name):
  return np.load(os.path.join(GOLDEN, f'tf_{name}.npz'))


def _loaded(name, mode, **overrides):
  """The model with Trax's weights and, outside predict mode, Trax's state.

  The state holds the LSH layers' hash rngs, so it must come from Trax too.
  """
  io = _io(name)
  model = _make(name, mode, **overrides)
  sig = shapes.signature((io['source'], io['target']))
  model.init(sig)
  model.init_from_file(os.path.join(GOLDEN, f'tf_{name}.pkl.gz'),
                       weights_only=mode == 'predict', input_signature=sig)
  return model, io


def _close(actual, desired, tol=1e-5):
  desired = np.asarray(desired)
  np.testing.assert_allclose(np.asarray(actual), desired, rtol=0,
                             atol=tol * max(1.0, np.abs(desired).max()))


@pytest.fixture(autouse=True)
def trax_random_bits():
  with jax.threefry_partitionable(False):
    yield


# Tolerance relative to the logits' scale. 'default' (fixed-base positions,
# three unchunked SelfAttention layers) differs from Trax by up to 1.6e-4 on
# logits of scale 7.5; its reversible stream reaches 42 (the difference is
# 4e-6 of that, float32 rounding through the residual sums).
# 'revenc' (a reversible encoder with an SRU feed-forward) differs by up to
# 4.6e-5 of its logits' scale (5.3) on an Intel Xeon CPU and by less than
# 1e-5 on the AMD EPYC it was first checked on: XLA's float32 rounding
# depends on the CPU it compiles for.
REVENC_TOL = 1e-4
EVAL_TOL = {'default': 3e-5, 'revenc': REVENC_TOL}


@pytest.mark.parametrize('name', [
    'default', 'revenc', pytest.param('lsh', marks=pytest.mark.slow)])
def test_eval_logits_match_trax(name):
  model, io = _loaded(name, 'eval')
  logits, targets = model((io['source'], io['target']))
  _close(logits, io['logits'], tol=EVAL_TOL.get(name, 1e-5))
  np.testing.assert_array_equal(np.asarray(targets), io['target'])


def test_checkpoint_maps_leaf_for_leaf():
  io = _io('lsh')
  model = _make('lsh', 'eval')
  weights, state = model.init(shapes.signature((io['source'], io['target'])))
  loaded_w, loaded_s = model.init_from_file(
      os.path.join(GOLDEN, 'tf_lsh.pkl.gz'), weights_only=False)
  for ours, theirs in ((weights, loaded_w), (state, loaded_s)):
    assert (jax.tree_util.tree_structure(ours) ==
            jax.tree_util.tree_structure(theirs))
    for a, b in zip(jax.tree_util.tree_leaves(ours),
                    jax.tree_util.tree_leaves(theirs)):
      assert np.shape(a) == np.shape(b)


@pytest.mark.slow
def test_train_mode_without_dropout_equals_eval():
  # (Not 'default': its fixed-base positions start at random in training.)
  model, io = _loaded('revenc', 'train')
  logits, _ = model((io['source'], io['target']))
  _close(logits, io['logits'], tol=REVENC_TOL)


def _predict_logits(name, source, target, n_calls, **overrides):
  """Predict-mode logits of the model with Trax's weights: the source and the
  shifted target's first token, then one target token per call."""
  model = _make(name, 'predict', **overrides)
  model.init_from_file(
      os.path.join(GOLDEN, f'tf_{name}.pkl.gz'), weights_only=True,
      input_signature=(shapes.ShapeDtype(source.shape, np.int32),
                       shapes.ShapeDtype((1, 1), np.int32)))
  shifted = np.concatenate([np.zeros((1, 1), np.int32), target[:, :-1]], 1)
  return np.concatenate([np.asarray(model((source, shifted[:, t:t + 1]))[0])
                         for t in range(n_calls)], axis=1)


@pytest.mark.parametrize('n_calls', [4, pytest.param(16, marks=pytest.mark.slow)])
def test_predict_equals_trax_and_eval_on_every_prefix(n_calls):
  """Source with padding, then one target token per call (Trax's predict).

  Up to 9.4e-5 from Trax on logits of scale 5.3 on an AMD EPYC CPU (call 3;
  Trax's own predict differs from its eval by 1.3e-5 there), 2.4e-4 on an
  Intel Xeon: `REVENC_TOL` of the logits' scale.
  """
  io = _io('revenc')
  logits = _predict_logits('revenc', io['source'], io['target'], n_calls)
  for t in range(n_calls):
    _close(logits[:, t], io['logits_predict'][:, t], tol=REVENC_TOL)
    _close(logits[:, t], io['logits'][:, t], tol=REVENC_TOL)  # Trax's eval.


@pytest.mark.parametrize('name,n_calls', [
    ('multconv', 4),
    pytest.param('mixed', 3, marks=pytest.mark.slow),  # 13 s
    pytest.param('mixed', 16, marks=pytest.mark.slow),
    pytest.param('multconv', 16, marks=pytest.mark.slow)])
def test_decoders_reading_the_portal_predict_as_trax(name, n_calls):
  """The layers Trax's patch reached skip the source's padding in predict
  mode: MixedLSHSelfAttention's standard causal attention and the causal
  convolutions' memory (`_RememberPad`) of the sparse projections
  ('mixed') and of MultiplicativeConvCausalAttention ('multconv'). Predict
  then equals Trax's predict and eval.

  Without the portal, 'mixed' calls 1-7 differed from Trax by up to 12 on
  logits of scale 8; with it by up to 2.7e-4 (as its eval mode differs
  from Trax's eval).
  """
  io = _io(name)
  logits = _predict_logits(name, io['source'], io['target'], n_calls)
  _close(logits, io['logits_predict'][:, :n_calls], tol=REVENC_TOL)
  _close(logits, io['logits'][:, :n_calls], tol=REVENC_TOL)  # Trax's eval.


def test_portal_readers_refuse_a_batch_of_two():
  """Layers that locate cache slots by the source mask decode one example
  at a time, as in Trax: a batch of two is one clear error naming them
  (at init, which traces a call)."""
  io = _io('multconv')
  source = np.concatenate([io['source']] * 2)
  target = np.zeros((2, 1), np.int32)
  model = _make('multconv', 'predict')
  with pytest.raises(
      Exception,  # The LayerError that names the path to the layer.
      match=r'(_RememberPad|PortalMaskedCausalAttention): Terraformer predict '
            r'mode decodes one example at a time .* shape \(2, 16\)'):
    model.init(shapes.signature((source, target)))  # Traces a call.


@pytest.mark.slow
def test_self_attention_predict_sees_source_padding_as_trax_does():
  """Efficient `SelfAttention` in the decoder (Trax's default) has no portal
  mask in Trax 1.4.1: target positions after the first attend to the
  source's padding in predict mode, which eval mode's causal mask hides, so
  Trax's predict logits differ from its eval logits (by up to 1.5 on logits
  of scale 7.5; the argmax at 3 of 16 positions), so greedy decoding need
  not follow eval mode's argmax. retrax follows Trax's predict mode; after
  a source without padding, predict equals eval.
  """
  io, trax_predict = _io('default'), _io('default_predict')
  logits = _predict_logits('default', io['source'], io['target'], 16,
                           **DEFAULT_PREDICT)
  _close(logits, trax_predict['logits_predict'], tol=EVAL_TOL['default'])
  assert np.abs(logits - io['logits']).max() > 1.0  # Trax's eval differs.
  nopad = _predict_logits('default', trax_predict['nopad_source'],
                          io['target'], 16, **DEFAULT_PREDICT)
  _close(nopad, trax_predict['nopad_logits_predict'], tol=EVAL_TOL['default'])
  _close(nopad, trax_predict['nopad_logits'], tol=EVAL_TOL['default'])


@pytest.mark.slow
def test_non_reversible_encoder_with_causal_attention_predicts_as_eval(tmp_path):
  """Trax's default (non-reversible) encoder, a `CausalAttention` decoder
  (portal-masked in predict mode), a padded source: predict mode, one
  target token per call, equals eval mode (weights x3, so that attention
  is far from uniform)."""
  io = _io('revenc')
  source, target = io['source'], io['target']
  kwargs = dict(TF_ARGS, n_encoder_layers=1, n_decoder_layers=2,
                pos_type=None, encoder_decoder_attention_type=tl.CausalAttention)
  eval_model = terraformer.ConfigurableTerraformer(mode='eval', **kwargs)
  sig = shapes.signature((source, target))
  eval_model.init(sig, rng=jax.random.PRNGKey(0))
  eval_model.weights = jax.tree_util.tree_map(lambda w: 3.0 * w,
                                              eval_model.weights)
  path = str(tmp_path / 'model.pkl.gz')
  eval_model.save_to_file(path, weights_only=True, input_signature=sig)
  expected = np.asarray(eval_model((source, target))[0])
  model = terraformer.ConfigurableTerraformer(mode='predict', **kwargs)
  model.init_from_file(path, weights_only=True, input_signature=(
      shapes.ShapeDtype(source.shape, np.int32),
      shapes.ShapeDtype((1, 1), np.int32)))
  shifted = np.concatenate([np.zeros((1, 1), np.int32), target[:, :-1]], 1)
  for t in range(4):
    logits = model((source, shifted[:, t:t + 1]))[0]
    _close(logits[:, 0], expected[:, t], tol=REVENC_TOL)


@pytest.mark.slow
@pytest.mark.parametrize('name', ['revenc', 'mixed', 'multconv'])
def test_greedy_decoding_agrees_with_eval_mode(name):
  """`autoregressive_sample` (which needs every predict state's layout
  declared: the portal layers run one example only) gives eval mode's
  argmax."""
  io = _io(name)
  source = io['source']
  model = _make(name, 'predict')
  model.init_from_file(
      os.path.join(GOLDEN, f'tf_{name}.pkl.gz'), weights_only=True,
      input_signature=(shapes.ShapeDtype(source.shape, np.int32),
                       shapes.ShapeDtype((1, 1), np.int32)))
  tokens = np.asarray(decoding.autoregressive_sample(
      model, inputs=source, eos_id=-1, max_length=4, temperature=0.0))
  eval_model, _ = _loaded(name, 'eval')
  target = np.zeros((1, 16), np.int32)
  target[:, :4] = tokens
  logits, _ = eval_model((source, target))
  np.testing.assert_array_equal(np.argmax(np.asarray(logits[:, :4]), -1),
                                tokens)


@pytest.mark.slow
def test_gradients_through_reversible_stacks_match_finite_differences():
  # Reversible blocks recompute their inputs instead of storing them; the
  # gradient must still be the function's (central differences per leaf).
  model = _make('revenc', 'train')
  io = _io('revenc')
  x = (io['source'][:, :8], io['target'][:, :8])
  weights, state = model.init(shapes.signature(x))
  rng = jax.random.PRNGKey(0)

  def loss(w):
    return jnp.sum(jnp.sin(model.pure_fn(x, w, state, rng)[0][0]))
  f = jax.jit(loss)
  leaves, tree = jax.tree_util.tree_flatten(weights)
  grads = jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(weights))
  rs, eps = np.random.RandomState(0), 1e-3
  for i in range(0, len(leaves), 3):
    d = jnp.asarray(rs.normal(size=leaves[i].shape), jnp.float32)
    moved = [list(leaves), list(leaves)]
    moved[0][i], moved[1][i] = leaves[i] + eps * d, leaves[i] - eps * d
    fd = (f(jax.tree_util.tree_unflatten(tree, moved[0])) -
          f(jax.tree_util.tree_unflatten(tree, moved[1]))) / (2 * eps)
    np.testing.assert_allclose(float(jnp.sum(grads[i] * d)), float(fd),
                               rtol=5e-2, atol=5e-2)


def test_concat_and_strip_with_padding_invert_each_other():
  vec_e = jnp.arange(2 * 4 * 3, dtype=jnp.float32).reshape((2, 4, 3)) + 1
  vec_d = -jnp.arange(2 * 2 * 3, dtype=jnp.float32).reshape((2, 2, 3)) - 1
  tok_e = jnp.array([[5, 6, 0, 0], [7, 8, 9, 1]], jnp.int32)
  tok_d = jnp.ones((2, 2), jnp.int32)
  layer = t2.ConcatWithPadding()
  layer.init(shapes.signature((vec_e, vec_d, tok_e != 0, tok_e, tok_d)))
  vec_ed, _, _ = layer((vec_e, vec_d, tok_e != 0, tok_e, tok_d))
  np.testing.assert_array_equal(vec_ed[0, :2], vec_e[0, :2])
  np.testing.assert_array_equal(vec_ed[0, 2:4], vec_d[0])
  np.testing.assert_array_equal(vec_ed[0, 4:], np.zeros((2, 3)))
  np.testing.assert_array_equal(vec_ed[1, 4:], vec_d[1])
  back = layer.reverse((vec_ed, tok_e, tok_d))
  np.testing.assert_array_equal(back[1], vec_d)
  np.testing.assert_array_equal(back[0][0, :2], vec_e[0, :2])
  np.testing.assert_array_equal(back[0][0, 2:], np.zeros((2, 3)))
  with pytest.raises(ValueError, match='StripFromConcatenateWithPadding'):
    t2.strip_from_concatenate_with_padding(vec_ed[:, :5], tok_e, tok_d)


def test_bad_arguments_name_the_model_and_argument():
  with pytest.raises(ValueError, match='n_heads .3. must divide d_model/2'):
    terraformer.ConfigurableTerraformer(16, d_model=8, n_heads=3)
  with pytest.raises(ValueError, match='n_decoder_layers'):
    terraformer.ConfigurableTerraformer(
        16, d_model=8, n_heads=2, n_decoder_layers=3,
        encoder_decoder_attention_type=[tl.CausalAttention] * 2)
  with pytest.raises(ValueError, match='input_vocab_size or output_vocab_size'):
    terraformer.ConfigurableTerraformer(None, d_model=8, n_heads=2)


def test_exported_at_trax_paths():
  assert models.ConfigurableTerraformer is not None
  assert 'ConfigurableTerraformer' in models.MODELS
