"""optimizers.Trainer and ReversibleSerialTrainer against closed forms and jax.grad."""

import gc
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from retrax import fastmath
from retrax import layers as tl
from retrax import optimizers
from retrax import shapes
from retrax.optimizers import trainer as trainer_lib
from tests import multiprocess_env

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))


def _linear_batch():
  x = np.arange(8, dtype=np.float32).reshape((8, 1)) / 4
  t = np.full((8, 1), np.pi, np.float32)
  mask = np.array([1, 1, 1, 1, 1, 1, 0, 1], np.float32).reshape((8, 1))
  return x, t, mask


def _l2_grads(w, b, x, t, mask):
  """Closed form: d/dw, d/db of sum(mask * (x w + b - t)^2) / sum(mask)."""
  r = (x @ w + b - t) * mask
  return 2 * x.T @ r / mask.sum(), 2 * r.sum(axis=0) / mask.sum()


def _linear_trainer(optimizer):
  model = tl.Serial(tl.Dense(1), tl.L2Loss())
  batch = _linear_batch()
  model.init(shapes.signature(batch))
  optimizer.tree_init(model.weights)
  return model, batch, optimizers.Trainer(model, optimizer)


def test_one_step_sgd_is_the_closed_form_gradient_step():
  model, batch, trainer = _linear_trainer(optimizers.SGD(0.1))
  w0, b0 = (np.asarray(a) for a in model.weights[0])
  loss, stats = trainer.one_step(batch, fastmath.random.get_prng(0))
  x, t, mask = batch
  gw, gb = _l2_grads(w0, b0, x, t, mask)
  np.testing.assert_allclose(loss, np.sum(mask * (x @ w0 + b0 - t)**2) /
                             mask.sum(), rtol=1e-6)
  np.testing.assert_allclose(model.weights[0][0], w0 - 0.1 * gw, rtol=1e-5)
  np.testing.assert_allclose(model.weights[0][1], b0 - 0.1 * gb, rtol=1e-5)
  np.testing.assert_allclose(stats['gradients_l2'],
                             np.sqrt(np.sum(gw**2) + np.sum(gb**2)), rtol=1e-5)
  assert stats['loss'] is loss
  accelerated = trainer.accelerated_model_with_loss  # Trax's Loop reads it.
  np.testing.assert_array_equal(accelerated.weights[0][0], model.weights[0][0])
  np.testing.assert_allclose(accelerated(batch), trainer.one_step(
      batch, fastmath.random.get_prng(1))[0], rtol=1e-6)


def test_learning_rate_given_to_one_step_stays_for_later_steps():
  model, batch, trainer = _linear_trainer(optimizers.SGD(0.1))
  x, t, mask = batch
  trainer.one_step(batch, fastmath.random.get_prng(0), learning_rate=0.5)
  for _ in range(2):  # The second step has no learning_rate: still 0.5.
    w, b = (np.asarray(a) for a in model.weights[0])
    gw, gb = _l2_grads(w, b, x, t, mask)
    trainer.one_step(batch, fastmath.random.get_prng(1))
    np.testing.assert_allclose(model.weights[0][0], w - 0.5 * gw, rtol=1e-5)
    np.testing.assert_allclose(model.weights[0][1], b - 0.5 * gb, rtol=1e-5)


def test_slots_are_written_back_to_the_optimizer():
  opt = optimizers.Momentum(0.1, mass=0.9)
  model, batch, trainer = _linear_trainer(opt)
  w0, b0 = (np.asarray(a) for a in model.weights[0])
  trainer.one_step(batch, fastmath.random.get_prng(0))
  gw, gb = _l2_grads(w0, b0, *batch)
  assert trainer.slots is opt.slots
  # Trax's momentum slot after one step from zero is the gradient itself.
  np.testing.assert_allclose(opt.slots[0], gw, rtol=1e-5)
  np.testing.assert_allclose(opt.slots[1], gb, rtol=1e-5)
  trainer.slots = (np.zeros_like(gw), np.zeros_like(gb))
  assert np.all(np.asarray(opt.slots[0]) == 0)


def test_state_of_the_model_is_updated():
  model = tl.Serial(tl.BatchNorm(axis=(0,)), tl.Dense(1), tl.L2Loss())
  batch = _linear_batch()
  model.init(shapes.signature(batch))
  _, want_state = model.pure_fn(batch, model.weights, model.state,
                                fastmath.random.get_prng(0))
  trainer = optimizers.Trainer(model, optimizers.SGD(0.1))
  trainer.one_step(batch, fastmath.random.get_prng(0))
  for got, want in zip(jax.tree_util.tree_leaves(model.state),
                       jax.tree_util.tree_leaves(want_state)):
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_clear_errors():
  with pytest.raises(ValueError, match='initialized'):
    optimizers.Trainer(tl.Serial(tl.Dense(1), tl.L2Loss()), optimizers.SGD())
  model = tl.Dense(3)
  batch = np.ones((4, 2), np.float32)
  model.init(shapes.signature(batch))
  trainer = optimizers.Trainer(model, optimizers.SGD())
  with pytest.raises(ValueError, match=r'one scalar loss.*shape \(4, 3\)'):
    trainer.one_step(batch, fastmath.random.get_prng(0))
  with pytest.raises(ValueError, match='n_devices=99'):
    optimizers.Trainer(model, optimizers.SGD(), n_devices=99)


# --- ReversibleSerialTrainer ----------------------------------------------------


def _dropout_blocks():
  first = tl.Serial(tl.Embedding(9, 4), tl.Dropout(0.5), tl.Dup())
  rev1 = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.2)),
          tl.ReversibleSwap(),
          tl.ReversibleHalfResidual(tl.Dropout(0.5), tl.Dense(4)),
          tl.ReversibleSwap()]
  mid = tl.Serial(tl.Add(), tl.Dense(4), tl.Dup())
  rev2 = [tl.ReversibleHalfResidual(tl.Dense(4), tl.Dropout(0.3)),
          tl.ReversibleSwap()]
  loss = tl.Serial(tl.Concatenate(), tl.Dense(19), tl.Dropout(0.3),
                   tl.LogSoftmax(), tl.CrossEntropyLoss())
  return first, rev1, mid, rev2, loss


def _int_batch():
  x = np.arange(8).reshape((2, 4))
  return x, 2 * x, np.ones_like(x)


def _leaves(layers):
  return [np.asarray(a) for layer in layers
          for a in jax.tree_util.tree_leaves(layer.weights)]


@pytest.mark.slow
def test_reversible_trainer_equals_trainer_with_dropout_and_adam():
  first, rev1, mid, rev2, loss = _dropout_blocks()
  model = tl.Serial([first] + rev1 + [mid] + rev2 + [loss])
  batch, key = _int_batch(), fastmath.random.get_prng(12)
  steps = [(7, None), (8, 0.02), (9, 0.03)]
  model.init(shapes.signature(batch), rng=key)
  trainer = optimizers.Trainer(model, optimizers.Adam())
  want_losses = [float(trainer.one_step(batch, fastmath.random.get_prng(s),
                                        step=i, learning_rate=lr)[0])
                 for i, (s, lr) in enumerate(steps)]
  layers = [first] + rev1 + [mid] + rev2 + [loss]
  want = _leaves(layers)
  model.init(shapes.signature(batch), rng=key)
  rst = optimizers.ReversibleSerialTrainer(
      [(first.sublayers, rev1), (mid.sublayers, rev2)], loss, optimizers.Adam)
  got_losses = [float(rst.one_step(batch, fastmath.random.get_prng(s),
                                   step=i, learning_rate=lr)[0])
                for i, (s, lr) in enumerate(steps)]
  np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
  got = _leaves(layers)
  assert len(got) == len(want) == 11
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  # Between steps every weight lives in host memory.
  assert all(isinstance(a, np.ndarray) for a in got)


def test_reversible_trainer_sgd_step_is_minus_lr_times_jax_grad():
  first, rev1, mid, rev2, loss = _dropout_blocks()
  model = tl.Serial([first] + rev1 + [mid] + rev2 + [loss])
  batch, rng = _int_batch(), fastmath.random.get_prng(3)
  model.init(shapes.signature(batch), rng=fastmath.random.get_prng(1))
  w0, s0 = model.weights, model.state
  grads = jax.grad(lambda w: model.pure_fn(batch, w, s0, rng)[0])(w0)
  want = jax.tree_util.tree_map(lambda w, g: w - 0.25 * g, w0, grads)
  rst = optimizers.ReversibleSerialTrainer(
      [(first.sublayers, rev1), (mid.sublayers, rev2)], loss,
      lambda: optimizers.SGD(0.25))
  rst.one_step(batch, rng)
  for g, w in zip(jax.tree_util.tree_leaves(model.weights),
                  jax.tree_util.tree_leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _probe_blocks(depth, sizes):
  """Reversible blocks whose residual records the bytes of live JAX arrays."""

  def probe(x):
    jax.debug.callback(
        lambda _: sizes.append(sum(a.nbytes for a in jax.live_arrays())), x)
    return x
  rev = []
  for _ in range(depth):
    rev += [tl.ReversibleHalfResidual(tl.Fn('Probe', probe), tl.Dense(16)),
            tl.ReversibleSwap()]
  return [([tl.Dense(16), tl.Dup()], rev)], tl.Serial(
      tl.Concatenate(), tl.Dense(4), tl.L2Loss())


def _peak_live_bytes(depth):
  batch = (np.ones((4096, 16), np.float32), np.ones((4096, 4), np.float32),
           np.ones((4096, 4), np.float32))
  sizes = []
  blocks, loss = _probe_blocks(depth, sizes)
  optimizers.trainer.init_reversible_blocks(
      blocks, loss, shapes.signature(batch), fastmath.random.get_prng(0))
  rst = optimizers.ReversibleSerialTrainer(blocks, loss, optimizers.Adam)
  # Arrays other tests of this worker left alive are not this step's.
  gc.collect()
  before = sum(a.nbytes for a in jax.live_arrays())
  rst.one_step(batch, fastmath.random.get_prng(1))
  jax.effects_barrier()
  assert len(sizes) == 2 * depth  # Forward and reverse of each probe.
  return max(sizes) - before


def test_reversible_trainer_keeps_no_activations_per_layer():
  # Live while a layer runs: the batch, the block's saved inputs, the stack
  # and its gradients -- a few activations, whatever the depth (weights and
  # slots are in host memory). Keeping each layer's activations would add
  # at least one activation per layer: 10 more from depth 2 to 12.
  activation = 4096 * 16 * 4
  shallow, deep = _peak_live_bytes(2), _peak_live_bytes(12)
  assert deep - shallow < activation, (shallow / activation,
                                       deep / activation)
  assert deep < 12 * activation


def test_extract_and_init_reversible_blocks():
  model = tl.Serial(
      tl.Embedding(9, 4), tl.Dup(),
      tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap(),
      tl.Serial(tl.Add(), tl.Dense(4), tl.Dup()),
      tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap(),
      tl.Concatenate(), tl.Dense(9))
  loss = tl.Serial(tl.LogSoftmax(), tl.CrossEntropyLoss())
  blocks, loss_layer = optimizers.trainer.extract_reversible_blocks(
      [model, loss])
  assert [[l.name for l in std] for std, _ in blocks] == [
      ['Embedding_9_4', 'Dup'], ['Add', 'Dense_4', 'Dup']]
  assert [len(rev) for _, rev in blocks] == [2, 2]
  # Every Serial is opened up, the loss's own too (as in Trax).
  assert [l.name for l in loss_layer.sublayers] == [
      'Concatenate', 'Dense_9', 'LogSoftmax', '_CrossEntropy', '_WeightedMean']
  batch = _int_batch()
  key = fastmath.random.get_prng(5)
  optimizers.trainer.init_reversible_blocks(blocks, loss_layer,
                                            shapes.signature(batch), key)
  # The keys: per block, split(rng, n_layers + 1); [0] goes on, [1:] init.
  k0 = fastmath.random.split(key, 5)
  emb = tl.Embedding(9, 4)
  emb.init(shapes.signature(batch[0]), rng=k0[1])
  np.testing.assert_array_equal(blocks[0][0][0].weights, emb.weights)
  assert isinstance(blocks[0][0][0].weights, np.ndarray)
  assert loss_layer.sublayers[1].weights[0].shape == (8, 9)
  with pytest.raises(ValueError, match='final layer must be a standard'):
    optimizers.trainer.extract_reversible_blocks(
        [tl.Dup(), tl.ReversibleSwap()])


def test_reversible_trainer_slots_and_errors():
  first, rev1, _, _, loss = _dropout_blocks()
  model = tl.Serial([first] + rev1 + [loss])
  model.init(shapes.signature(_int_batch()))
  rst = optimizers.ReversibleSerialTrainer([(first.sublayers, rev1)], loss,
                                           optimizers.Adam)
  slots = rst.slots
  assert len(slots) == 2 and len(slots[0][1]) == 4
  m, v = slots[0][1][0][0]  # Adam's (m, v) of the first RHR's first array.
  assert np.all(m == 0) and np.all(v == 0)
  rst.slots = slots
  assert rst.slots == slots
  assert len(rst.all_layers) == 1 + 4 + 1
  with pytest.raises(TypeError, match='optimizer_fn'):
    optimizers.ReversibleSerialTrainer([(first.sublayers, rev1)], loss,
                                       optimizers.Adam())
  with pytest.raises(TypeError, match='not a ReversibleLayer'):
    optimizers.ReversibleSerialTrainer([(first.sublayers, [tl.Dense(4)])],
                                       loss, optimizers.Adam)


def test_trainer_module_is_trax_shaped():
  assert trainer_lib.ReversibleSerialTrainer is optimizers.ReversibleSerialTrainer
  assert optimizers.trainer.Trainer is optimizers.Trainer


@pytest.mark.slow
def test_two_devices_equal_one_device(tmp_path):
  """Trainer and ReversibleSerialTrainer on 2 forced host devices."""
  env = dict(os.environ, XLA_FLAGS=multiprocess_env.xla_flags(2),
             PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get('PYTHONPATH',
                                                               '')]))
  code = '''
import jax, numpy as np
from retrax import fastmath, layers as tl, optimizers, shapes
assert jax.local_device_count() == 2
def run(n, reversible):
  model = tl.Serial(tl.Dense(4), tl.Dup(),
                    tl.ReversibleHalfResidual(tl.Dense(4)), tl.ReversibleSwap(),
                    tl.Concatenate(), tl.Dense(1), tl.L2Loss())
  x = np.linspace(-1, 1, 32, dtype=np.float32).reshape((8, 4))
  batch = (x, x[:, :1] ** 2, np.ones((8, 1), np.float32))
  model.init(shapes.signature(batch), rng=fastmath.random.get_prng(0))
  if reversible:
    blocks, loss = optimizers.trainer.extract_reversible_blocks(model)
    t = optimizers.ReversibleSerialTrainer(blocks, loss, optimizers.Adam,
                                           n_devices=n)
  else:
    t = optimizers.Trainer(model, optimizers.Adam(), n_devices=n)
  losses = [float(t.one_step(batch, fastmath.random.get_prng(i), step=i)[0])
            for i in range(3)]
  return losses, [np.asarray(a) for a in jax.tree_util.tree_leaves(model.weights)]
ref_l, ref_w = run(1, False)
for n, rev in [(2, False), (1, True), (2, True)]:
  l, w = run(n, rev)
  np.testing.assert_allclose(l, ref_l, rtol=1e-5)
  for a, b in zip(w, ref_w):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
print('OK')
'''
  proc = subprocess.run([sys.executable, '-c', code], env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip().endswith('OK'), (
      proc.stdout[-2000:] + proc.stderr[-4000:])
