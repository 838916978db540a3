"""Declared repeated blocks of a `ReversibleSerial` run as one `lax.scan`.

References: the plain residual network of `test_reversible` (autodiff, no
scan), the inputs for reconstruction, and the loop path of the same layers
(not declared repeated) for the state and the HLO size.
"""

import jax
import pytest

from retrax.layers import reversible as rv
from retrax.layers.stacked import stackable
from retrax.shapes import signature

from test_reversible import assert_grads_equal_plain
from test_reversible import assert_trees_close
from test_reversible import ff
from test_reversible import loss_of
from test_reversible import random_pair
from test_reversible import rev_blocks


def _uses_scan(model, x, weights, state, rng):
  jaxpr = jax.make_jaxpr(lambda w: model.pure_fn(x, w, state, rng)[0])(weights)
  return 'scan' in str(jaxpr)


@pytest.mark.parametrize('dropout', [None, 0.3])
def test_scanned_blocks_have_the_plain_networks_values_and_grads(dropout):
  # Both halves of a block are the same feed-forward: 6 copies of 2 layers.
  model = rv.ReversibleSerial(rev_blocks(3, dropout=dropout), repeats=6)
  x = random_pair(11)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(12))
  rng = jax.random.PRNGKey(13)
  # Trax's per-layer tree and the held stacked one both run as a scan.
  assert _uses_scan(model, x, weights, state, rng)
  assert _uses_scan(model, x, model.stacked_weights, state, rng)
  assert_grads_equal_plain(model, x, weights, state, rng)


def test_scanned_reverse_recovers_inputs_and_state_matches_the_loop():
  model = rv.ReversibleSerial(rev_blocks(4, dropout=0.2), repeats=4)
  x = random_pair(14, shape=(2, 5, 8))
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(15))
  rng = jax.random.PRNGKey(16)
  y, new_state = jax.jit(model.pure_fn)(x, weights, state, rng)
  back = jax.jit(lambda y: model.reverse(y, weights, state, new_state, rng))(y)
  assert_trees_close(back, x, rtol=1e-4, atol=1e-5)
  loop = rv.ReversibleSerial(rev_blocks(4, dropout=0.2))
  y_loop, state_loop = jax.jit(loop.pure_fn)(x, weights, state, rng)
  assert_trees_close(y, y_loop)
  assert (jax.tree_util.tree_structure(new_state) ==
          jax.tree_util.tree_structure(state_loop))


def _matmuls(n_blocks, scan=True):
  """Matmuls in the program of the gradient of `n_blocks` blocks, as JAX lowers it."""
  model = rv.ReversibleSerial(rev_blocks(n_blocks, dropout=0.1),
                              repeats=n_blocks if scan else None)
  x = random_pair(17)
  _, state = model.init(signature(x), rng=jax.random.PRNGKey(18))
  grad = jax.grad(lambda w: loss_of(model.pure_fn(
      x, w, state, jax.random.PRNGKey(19))[0]))
  return jax.jit(grad).lower(model.stacked_weights).as_text().count(
      'dot_general')


def test_program_holds_one_copy_of_the_block():
  assert _matmuls(2) == _matmuls(6) > 0
  assert _matmuls(6, scan=False) > 2.5 * _matmuls(2, scan=False)


def test_a_layer_used_twice_is_not_scanned():
  half = rv.ReversibleHalfResidual(*ff())
  model = rv.ReversibleSerial([half, rv.ReversibleSwap()] * 2, repeats=2)
  x = random_pair(20)
  weights, state = model.init(signature(x), rng=jax.random.PRNGKey(21))
  assert not stackable(weights, 2, floats=True)  # cache markers
  assert not _uses_scan(model, x, weights, state, jax.random.PRNGKey(22))
