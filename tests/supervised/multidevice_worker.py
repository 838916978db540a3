"""Multi-device checks, run by test_devices.py with 8 forced host devices.

Exits 0 and prints OK when every check holds; an assertion error otherwise.
"""

import jax
import jax.numpy as jnp
import numpy as np

import supervised_toys as toys
from retrax import optimizers
from retrax.supervised import training
from retrax.supervised.batch_checks import BadBatchError


def _loop(n_devices, optimizer=None, dropout=0.2, adasum=False, seed=0):
  task = training.TrainTask(toys.copy_batches(seed),
                            toys.WeightedCrossEntropy(),
                            optimizer or optimizers.Adam(0.05),
                            n_steps_per_checkpoint=3)
  eval_task = training.EvalTask(toys.copy_batches(seed + 100),
                                [toys.WeightedAccuracy()], n_eval_batches=1)
  return training.Loop(toys.mlp(dropout=dropout), task, eval_tasks=eval_task,
                       eval_model=toys.mlp(mode='eval'), n_devices=n_devices,
                       random_seed=seed, adasum=adasum)


def check_same_losses_as_one_device():
  one, eight = _loop(1), _loop(8)
  leaf = jax.tree_util.tree_leaves(eight._weights)[0]  # pylint: disable=protected-access
  assert len(leaf.sharding.device_set) == 8 and leaf.sharding.is_fully_replicated
  one.run(6)
  eight.run(6)
  for mode, metric in (('train', 'metrics/WeightedCrossEntropy'),
                       ('eval', 'metrics/WeightedAccuracy')):
    a, b = one.history.get(mode, metric), eight.history.get(mode, metric)
    assert [s for s, _ in a] == [s for s, _ in b] == [1, 3, 6], (a, b)
    np.testing.assert_allclose([v for _, v in a], [v for _, v in b],
                               rtol=1e-5)
  for a, b in zip(toys.leaves(one.model.weights),
                  toys.leaves(eight.model.weights)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def check_adasum_matches_numpy():
  loop = _loop(8, optimizer=optimizers.SGD(1.0), dropout=0.0, adasum=True)
  weights = jax.tree_util.tree_map(np.asarray, loop._weights)  # pylint: disable=protected-access
  batches = toys.copy_batches(0)
  next(batches)  # The task's sample batch.
  batch = next(batches)  # The batch the first step takes.
  shares = [tuple(x[i:i + 1] for x in batch) for i in range(8)]
  grads = [[np.asarray(g, np.float64) for g in toys.leaves(
      jax.grad(toys.mlp_reference_loss)((weights, ()), share))]
           for share in shares]
  for shift in (1, 2, 4):
    partner = [i + shift if i % (2 * shift) < shift else i - shift
               for i in range(8)]
    merged = []
    for i in range(8):
      leaves = []
      for a, b in zip(grads[i], grads[partner[i]]):
        dot = np.vdot(a, b)
        leaves.append((1 - dot / (2 * np.vdot(a, a) + 1e-30)) * a +
                      (1 - dot / (2 * np.vdot(b, b) + 1e-30)) * b)
      merged.append(leaves)
    grads = merged
  want_grads = [np.mean([g[j] for g in grads], axis=0)
                for j in range(len(grads[0]))]
  before = toys.leaves(weights)
  loop.run(1)
  for w, g, got in zip(before, want_grads, toys.leaves(loop.model.weights)):
    np.testing.assert_allclose(got, w - g, rtol=1e-4, atol=1e-6)


def check_batch_not_divisible_is_a_clear_error():
  loop = _loop(3)
  try:
    loop.run(1)
  except BadBatchError as e:
    assert 'Step 1' in str(e) and 'not divisible' in str(e), str(e)
  else:
    raise AssertionError('a batch of 8 on 3 devices was accepted')


def main():
  assert jax.device_count() == 8, jax.devices()
  check_same_losses_as_one_device()
  check_adasum_matches_numpy()
  check_batch_not_divisible_is_a_clear_error()
  print('OK')


if __name__ == '__main__':
  jnp.zeros(())  # Initialize the backend before any check.
  main()
