"""`TrainState`/`TaskState`, save/restore as functions of the state, and the
public knobs of `Loop` that the legacy `Trainer` uses."""

import os

import jax
import numpy as np
import pytest

import supervised_toys as toys
from retrax import checkpoints as ckpt_lib
from retrax import optimizers
from retrax import shapes
from retrax import run_layout
from retrax.optimizers import placement
from retrax.supervised import checkpointing
from retrax.supervised import training
from retrax.supervised.train_step import TaskState
from retrax.supervised.train_step import TrainState


def _loop(output_dir=None, optimizer=None, lr_schedule=None, n_tasks=1,
          **kwargs):
  tasks = [training.TrainTask(toys.copy_batches(i),
                              toys.WeightedCrossEntropy(),
                              optimizer or optimizers.Adam(0.05),
                              lr_schedule=lr_schedule)
           for i in range(n_tasks)]
  return training.Loop(toys.mlp(), tasks, output_dir=output_dir,
                       random_seed=0, **kwargs)


def _host_leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_train_step_is_one_sgd_step_of_the_reference_loss():
  loop = _loop(optimizer=optimizers.SGD(0.1))
  state = loop.train_state
  assert isinstance(state, TrainState) and state.step == 0
  assert isinstance(state.tasks[0], TaskState)
  weights = jax.tree_util.tree_map(
      np.asarray, (state.weights, state.tasks[0].loss_weights))
  batch = next(toys.copy_batches(7))
  grads = jax.grad(toys.mlp_reference_loss)(weights, batch)
  want = [w - 0.1 * np.asarray(g) for w, g in zip(toys.leaves(weights),
                                                  toys.leaves(grads))]
  loop.train_step(batch)
  assert loop.step == loop.train_state.step == 1
  got = toys.leaves(loop.train_state.weights)
  assert len(got) == len(want)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not loop.history.modes  # A bare step logs nothing.


def test_opt_step_offset_is_what_the_schedule_sees():
  for offset, first in ((0, 1), (-1, 0)):
    seen = []
    loop = _loop(lr_schedule=lambda s, seen=seen: seen.append(int(s)) or 0.01,
                 options=training.LoopOptions(opt_step_offset=offset))
    seen.clear()
    loop.train_step(next(toys.copy_batches(0)))
    loop.train_step(next(toys.copy_batches(1)))
    assert seen == [first, first + 1]


def test_save_state_and_restore_state_round_trip(tmp_path):
  loop = _loop()
  loop.run(3)
  host = placement.to_host(loop.train_state)
  assert all(isinstance(x, np.ndarray) for x in _host_leaves(host))
  path = checkpointing.save_state(
      str(tmp_path / 'ckpt_000000003'), host,
      input_signature=shapes.signature(next(toys.copy_batches(0))[:1]),
      history=loop.history, batches={'train': [3], 'eval': []},
      kind='Trainer', loss_sums={'task_index': 0, 'n_steps': 1, 'loss': 2.5,
                                 'stats': {}})
  fresh = _loop()  # Another initialization: the template only gives shapes.
  restored, meta = checkpointing.restore_state(path, fresh.train_state)
  assert restored.step == 3 and meta['kind'] == 'Trainer'
  assert meta['batches'] == {'train': [3], 'eval': []}
  assert meta['accumulator']['loss'] == 2.5
  assert meta['history'] == loop.history.to_dict()['_values']
  assert (jax.tree_util.tree_structure(restored) ==
          jax.tree_util.tree_structure(fresh.train_state))
  for a, b in zip(_host_leaves(restored), _host_leaves(host)):
    np.testing.assert_array_equal(a, b)
    assert a.dtype == b.dtype


def test_restore_state_refuses_another_number_of_tasks(tmp_path):
  loop = _loop()
  path = checkpointing.save_state(
      str(tmp_path / 'ckpt'), placement.to_host(loop.train_state),
      input_signature=None, history=loop.history, batches={})
  with pytest.raises(ckpt_lib.TreeStructureError, match='1 training task'):
    checkpointing.restore_state(path, _loop(n_tasks=2).train_state)


def test_never_schedules_save_only_the_final_step(tmp_path):
  eval_task = training.EvalTask(toys.copy_batches(9),
                                [toys.WeightedAccuracy()], n_eval_batches=1)
  task = training.TrainTask(toys.copy_batches(0), toys.WeightedCrossEntropy(),
                            optimizers.Adam(0.05), n_steps_per_checkpoint=1,
                            n_steps_per_permanent_checkpoint=1)
  loop = training.Loop(
      toys.mlp(), task, eval_tasks=eval_task, output_dir=str(tmp_path),
      random_seed=0, checkpoint_at=training.never,
      permanent_checkpoint_at=training.never, eval_at=training.never,
      options=training.LoopOptions(checkpoint_kind='Trainer'))
  loop.run(4)
  names = sorted(n for n in os.listdir(tmp_path) if n.startswith(
      (run_layout.ROLLING_PREFIX, run_layout.PERMANENT_PREFIX)))
  assert names == ['ckpt_000000004']
  assert loop.history.get('eval', 'metrics/WeightedAccuracy') == []
  meta = ckpt_lib.load_native(os.path.join(tmp_path, names[0])).metadata
  assert meta['kind'] == 'Trainer' and meta['step'] == 4


def test_a_save_fetches_the_state_to_the_host_once(tmp_path, monkeypatch):
  loop = _loop(output_dir=str(tmp_path))
  loop.run(1)
  calls = []
  real = placement.to_host
  monkeypatch.setattr(placement, 'to_host',
                      lambda tree: calls.append(1) or real(tree))
  loop.save_checkpoint()
  assert len(calls) == 1
