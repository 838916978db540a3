"""A 2-process FSDP run (`retrax train --mesh fsdp=2`) writes each process's
shards of its checkpoints (no host gathers a whole array) and resumes on 1
process and on 8 devices, continuing as an uninterrupted 1-process run does;
a save killed before its commit is ignored."""

import collections
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.multiprocess_env import cpu_env
from tests.multiprocess_env import free_port

_TINY = ['--set', 'd_model=16', '--set', 'd_ff=32', '--set', 'n_layers=1',
         '--set', 'd_head=8', '--set', 'batch_size=8', '--set', 'eval_every=4',
         '--set', 'checkpoint_every=3', '--set', 'warmup_steps=1',
         '--set', 'trax_files=false', '--quiet', '--no-sample']


def _train(run_dir, *args, n_devices=None):
  return subprocess.Popen(
      [sys.executable, '-m', 'retrax', 'train', '--output_dir', run_dir,
       *_TINY, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, env=cpu_env(n_devices))


def _wait(procs):
  outs = [p.communicate(timeout=900)[0] for p in procs]
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def _losses(run_dir):
  with open(os.path.join(run_dir, 'metrics.jsonl')) as f:
    records = [json.loads(line) for line in f]
  return {(r['step'], r['mode'], r['metric']): r['value'] for r in records
          if r['metric'].startswith('metrics/')}


def _split_nodes(node):
  """The tree nodes of the arrays split over processes in `node`."""
  if isinstance(node, dict):
    if node.get('split'):
      yield node
    for child in node.get('items', ()):
      yield from _split_nodes(child)


def _check_shards(ckpt):
  """Each process wrote one shards file of about half the split bytes, and
  no file holds a whole split array."""
  with open(os.path.join(ckpt, 'metadata.json')) as f:
    doc = json.load(f)
  tables = doc['shard_files']
  assert [t['process'] for t in tables] == [0, 1]
  assert sorted(n for n in os.listdir(ckpt) if n.startswith('shards_')) == (
      sorted(t['file'] for t in tables)), os.listdir(ckpt)
  sizes = [os.path.getsize(os.path.join(ckpt, t['file'])) for t in tables]
  assert max(sizes) < 0.52 * sum(sizes), sizes
  shapes = {n['key']: n['shape'] for tree in doc['trees'].values()
            for n in _split_nodes(tree)}
  assert shapes
  for t in tables:
    held = collections.Counter()
    for piece in t['pieces']:
      held[piece['key']] += math.prod(b - a for a, b in piece['index'])
    assert set(held) == set(shapes)
    assert all(2 * held[k] == math.prod(shapes[k]) for k in shapes), held
  from safetensors.numpy import load_file
  whole = load_file(os.path.join(ckpt, doc['arrays_file']))
  assert not set(whole) & set(shapes)


def _interrupted_save(run_dir, ckpt, step):
  """What a kill of process 0 between the barrier and its commit leaves in
  `ckpt_<step>`: every process's shards file and table, no metadata.json."""
  with open(os.path.join(ckpt, 'metadata.json')) as f:
    tables = json.load(f)['shard_files']
  dst = os.path.join(run_dir, f'ckpt_{step:09d}')
  os.mkdir(dst)
  for t in tables:
    name = t['file'].rsplit('.', 2)[0] + '.' + 'f' * 16 + '.safetensors'
    shutil.copy(os.path.join(ckpt, t['file']), os.path.join(dst, name))
    with open(os.path.join(dst, name[:-len('safetensors')] + 'json'),
              'w') as f:
      json.dump(dict(t, file=name), f)
  return dst


@pytest.mark.slow
def test_two_process_fsdp_checkpoint_resumes_on_one_process_and_8_devices(
    tmp_path):
  addr = f'127.0.0.1:{free_port()}'
  two, one = str(tmp_path / 'two'), str(tmp_path / 'one')
  pair = [_train(two, '--coordinator', addr, '--num_processes', '2',
                 '--process_id', str(i), '--mesh', 'fsdp=2', '--steps', '3')
          for i in range(2)]
  outs = _wait(pair + [_train(one, '--steps', '4')])
  assert 'per device of' in outs[0] and 'mesh data=1,fsdp=2' in outs[0], (
      outs[0][-2000:])
  ckpt = os.path.join(two, 'ckpt_000000003')
  _check_shards(ckpt)
  on_one, on_eight = str(tmp_path / 'on_one'), str(tmp_path / 'on_eight')
  shutil.copytree(two, on_one)
  shutil.copytree(two, on_eight)
  killed = _interrupted_save(on_one, ckpt, 6)
  outs = _wait([_train(on_one, '--steps', '4'),
                _train(on_eight, '--steps', '4', '--mesh', 'data=2,fsdp=4',
                       n_devices=8)])
  for out in outs:
    assert 'Resumed from checkpoint' in out and 'ckpt_000000003' in out, (
        out[-2000:])
  assert not os.path.exists(killed)  # Rotation removed the uncommitted save.
  want = _losses(one)
  for run in (two, on_one, on_eight):
    got = _losses(run)
    common = sorted(set(got) & set(want))
    assert len(common) >= (3 if run == two else 6), (run, sorted(got))
    np.testing.assert_allclose([got[k] for k in common],
                               [want[k] for k in common], rtol=2e-5,
                               err_msg=run)
