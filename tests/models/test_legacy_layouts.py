"""Checkpoint layouts older Trax wrote load as Trax 1.4.1 loads them.

Trax 1.0-1.2 stored `PositionalEncoding` tables as `(1, max_len, d)` (Trax's
own shipped `transformer_copy`/`transformerlm_copy` decoding checkpoints are
so); Trax 1.4.1 reads them unchanged. The reference here is the Trax-written
`transformerlm` golden with its table rewritten in the old layout: the logits
must be Trax's.
"""

import os

import jax
import numpy as np
import pytest

from retrax import models
from retrax import shapes
from retrax.checkpoints import errors
from retrax.checkpoints import trax_format

GOLDEN = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'golden',
                      'transformerlm')
POS_LEAF = 1  # Embedding (32, 32), then the positional table (64, 32).


def _model(mode='eval'):
  return models.TransformerLM(vocab_size=32, d_model=32, d_ff=64, n_layers=2,
                              n_heads=2, max_len=64, mode=mode)


def _rewrite(tmp_path, change_leaf):
  ckpt = trax_format.read_trax_checkpoint(os.path.join(GOLDEN, 'model.pkl.gz'))
  flat = [np.asarray(w) for w in ckpt['flat_weights']]
  assert flat[POS_LEAF].shape == (64, 32)
  flat[POS_LEAF] = change_leaf(flat[POS_LEAF])
  path = str(tmp_path / 'old.pkl.gz')
  trax_format.write_trax_layer_file(path, flat, None,
                                    ckpt['input_signature'])
  return path


def test_positional_table_with_leading_axis_loads_and_matches_trax(tmp_path):
  path = _rewrite(tmp_path, lambda t: t[None])
  io = np.load(os.path.join(GOLDEN, 'io.npz'))
  model = _model()
  model.init_from_file(path, weights_only=True,
                       input_signature=shapes.signature(io['inputs']))
  assert np.shape(model.weights[3]) == (64, 32)  # Stored in our layout.
  logits, _ = jax.jit(model.pure_fn)(io['inputs'], model.weights, model.state,
                                     model.rng)
  np.testing.assert_allclose(np.asarray(logits), io['logits'], rtol=1e-4,
                             atol=2e-5)


def test_old_layout_decodes_in_predict_mode(tmp_path):
  path = _rewrite(tmp_path, lambda t: t[None])
  model = _model('predict')
  model.init_from_file(path, weights_only=True,
                       input_signature=shapes.ShapeDtype((1, 1), np.int32))
  out = model(np.zeros((1, 1), np.int32))
  assert out.shape == (1, 1, 32)


@pytest.mark.parametrize('change', [lambda t: t[None, None], lambda t: t.T,
                                    lambda t: t[:32]],
                         ids=['two_leading_axes', 'transposed', 'shorter'])
def test_other_shape_changes_are_still_refused(tmp_path, change):
  path = _rewrite(tmp_path, change)
  with pytest.raises(errors.TreeStructureError,
                     match=r'weights\[3\] expects shape \(64, 32\)'):
    _model().init_from_file(path, weights_only=True,
                            input_signature=shapes.ShapeDtype((4, 10),
                                                              np.int32))
