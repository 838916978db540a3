"""Bad inputs give a LayerError naming the layer path, creation site, and expected vs. got."""

import inspect

import jax
import numpy as np
import pytest

from retrax.layers import activation_fns as af
from retrax.layers import base
from retrax.layers import combinators as cb
from retrax.layers import core
from retrax.layers import normalization as norm
from retrax.shapes import ShapeDtype

F32 = np.float32


def raises_layer_error(fn):
  with pytest.raises(base.LayerError) as info:
    fn()
  return info.value


def check_short(err):
  """The message is a few readable lines, not an XLA/JAX trace."""
  text = str(err)
  assert len(text.splitlines()) <= 12, text
  for noise in ('Traceback', 'jaxpr', 'XlaRuntimeError', 'File "',
                'JAX has removed'):
    assert noise not in text, text


def test_wrong_number_of_stack_items_at_init():
  model = cb.Serial(core.Dense(4), cb.Add())  # needs 2 items
  err = raises_layer_error(lambda: model.init(ShapeDtype((2, 3))))
  assert err.path == 'Serial'
  assert 'Serial expects a tuple of 2 inputs; got a single' in str(err)
  assert repr(ShapeDtype((2, 3))) in str(err)
  check_short(err)
  model = cb.Parallel(core.Dense(2), core.Dense(2), core.Dense(2))
  err = raises_layer_error(
      lambda: model.init((ShapeDtype((1, 2)), ShapeDtype((1, 2)))))
  assert 'Parallel expects 3 inputs; got 2' in str(err)


def test_wrong_number_of_stack_items_when_called():
  err = raises_layer_error(lambda: cb.Concatenate(n_items=3)(
      (np.ones(2), np.ones(2))))
  assert err.path == 'Concatenate'
  assert 'expects 3 inputs; got 2' in str(err)


def test_incompatible_shapes_found_at_init_with_path():
  model = cb.Serial(core.Dense(4), cb.Branch(core.Dense(3), core.Dense(5)),
                    cb.Add())
  err = raises_layer_error(lambda: model.init(ShapeDtype((2, 6))))
  assert err.path == 'Serial[2] > Add'
  assert ('layer input shapes: (ShapeDtype{shape:(2, 3), dtype:float32}, '
          'ShapeDtype{shape:(2, 5), dtype:float32})') in str(err)
  assert 'incompatible shapes' in str(err)
  check_short(err)


def test_dense_input_width_differs_from_its_weights():
  dense = core.Dense(4)
  dense.init(ShapeDtype((2, 3)))
  model = cb.Serial(af.Relu(), dense)
  err = raises_layer_error(lambda: model(np.ones((2, 5), F32)))
  assert err.path == 'Serial[1] > Dense_4'
  assert ('Dense_4 expects inputs with last dimension 3 (its weight W has '
          'shape (3, 4)); got inputs of shape (2, 5)') in str(err)
  assert 'layer input shapes: ShapeDtype{shape:(2, 5), dtype:float32}' in str(
      err)
  check_short(err)


def test_shared_layer_reused_on_other_width_fails_at_init():
  d = core.Dense(2)
  model = cb.Serial(d, cb.Branch(None, d))  # second use sees width 2, not 3
  err = raises_layer_error(lambda: model.init(ShapeDtype((1, 3))))
  assert err.path == 'Serial[1] > Branch[1] > Dense_2'
  assert 'last dimension 3' in str(err) and '(1, 2)' in str(err)


def test_branch_paths_name_the_branch_not_its_parallel():
  model = cb.Serial(core.Dense(3),
                    cb.Branch(core.Embedding(5, 2), core.Dense(2)))
  err = raises_layer_error(lambda: model.init(ShapeDtype((1, 4))))
  assert err.path == 'Serial[1] > Branch[0] > Embedding_5_2'


def test_float_ids_to_embedding():
  model = cb.Serial(core.Embedding(10, 4), core.Dense(2))
  err = raises_layer_error(lambda: model.init(ShapeDtype((2, 3), F32)))
  assert err.path == 'Serial[0] > Embedding_10_4'
  assert ('Embedding_10_4 expects integer token ids; got '
          f'{ShapeDtype((2, 3), F32)!r}') in str(err)
  check_short(err)
  emb = core.Embedding(10, 4)
  emb.init(ShapeDtype((3,), np.int32))
  err = raises_layer_error(lambda: emb(np.ones(3, F32)))
  assert 'expects integer token ids' in str(err)


def test_int_inputs_to_dense_are_promoted_as_in_trax():
  model = cb.Serial(core.Flatten(), core.Dense(2))
  x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
  model.init(ShapeDtype(x.shape, np.int32))
  y = model(x)
  w, b = model.sublayers[1].weights
  assert y.dtype == np.float32
  xf = x.reshape(2, 12).astype(np.float64)
  # Error relative to the sum of |terms|: an output near zero is a
  # cancellation of terms up to ~200 in size (float32 rounding of each).
  scale = np.abs(xf) @ np.abs(np.asarray(w)) + np.abs(np.asarray(b))
  np.testing.assert_array_less(
      np.abs(y - (xf @ np.asarray(w) + np.asarray(b))), 1e-6 * scale)


def test_error_names_the_creation_site():
  line = inspect.currentframe().f_lineno + 1
  model = cb.Serial(core.Embedding(10, 4))
  err = raises_layer_error(lambda: model.init(ShapeDtype((2,), F32)))
  assert (f'layer created in file [...]/tests/layers/test_errors.py, line '
          f'{line}') in str(err)


def test_bad_fn_definitions():
  with pytest.raises(ValueError, match="Fn 'Bad': function has default"):
    base.Fn('Bad', lambda x, y=1: x)
  with pytest.raises(ValueError, match="Fn 'Star': function has variable"):
    base.Fn('Star', lambda *xs: xs)
  model = cb.Serial(core.Dense(2), base.Fn('Two', lambda x: x, n_out=2))
  err = raises_layer_error(lambda: model.init(ShapeDtype((1, 3))))
  assert err.path == 'Serial[1] > Two'
  assert ('Two promises n_out=2 outputs (a tuple) but its function returned '
          'one array ShapeDtype{shape:(1, 2), dtype:float32}') in str(err)
  model = cb.Serial(base.Fn('Reshape7', lambda x: x.reshape(7)))
  err = raises_layer_error(lambda: model.init(ShapeDtype((2, 3))))
  assert err.path == 'Serial[0] > Reshape7'
  assert 'reshape' in str(err).lower()
  check_short(err)


def test_uninitialized_layer_says_to_call_init():
  err = raises_layer_error(lambda: cb.Serial(norm.LayerNorm())(
      np.ones((2, 3), F32)))
  assert err.path == 'Serial[0] > LayerNorm'
  assert 'layer.init(input_signature)' in str(err)


def test_errors_under_jit_keep_the_path():
  model = cb.Serial(core.Dense(3), core.Dense(4))
  weights, state = model.init(ShapeDtype((2, 5)))
  err = raises_layer_error(lambda: jax.jit(model.pure_fn)(
      np.ones((2, 6), F32), weights, state, jax.random.PRNGKey(0)))
  assert err.path == 'Serial[0] > Dense_3'
  assert 'last dimension 5' in str(err)


def test_errors_inside_scan_and_cond_have_paths():
  scan = cb.Scan(cb.Serial(core.Dense(2), cb.Dup()), axis=1)
  scan.init((ShapeDtype((1, 4, 3)), ShapeDtype((1, 2))))
  err = raises_layer_error(lambda: scan((np.ones((1, 4, 5), F32),
                                         np.ones((1, 2), F32))))
  assert err.path.startswith('Scan[0] > Serial[0] > Dense_2')
  cond = cb.Cond(base.Fn('Pos', lambda x: x > 0), core.Embedding(5, 2))
  err = raises_layer_error(lambda: cond.init(
      (ShapeDtype(()), ShapeDtype((1, 3), F32))))
  assert err.path == 'Cond[1] > Embedding_5_2'


def test_layer_error_properties():
  err = raises_layer_error(lambda: cb.Serial(core.Embedding(3, 2)).init(
      ShapeDtype((4,), F32)))
  assert err.layer_name == 'Embedding_3_2'
  assert err.input_signature == ShapeDtype((4,), F32)
  assert 'Exception passing through layer Serial[0] > Embedding_3_2 (in init)' in (
      str(err))


def test_eager_efficient_attention_error_is_short():
  """Raised while its eager call is traced under jit, the error stays short."""
  from retrax.layers.attention import efficient as ea
  layer = ea.SelfAttention(n_heads=2, d_qk=4, d_v=4, causal=True,
                           mode='predict', predict_mem_len=8,
                           predict_drop_len=4)
  layer.init(ShapeDtype((1, 1, 6)))
  err = raises_layer_error(lambda: layer(np.zeros((1, 1, 5), F32)))
  check_short(err)
  assert str(err).endswith('inputs have d_model 5 but the weights expect 6.')
