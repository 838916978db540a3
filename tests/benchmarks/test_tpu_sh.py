"""benchmarks/tpu.sh at toy sizes on CPU, and step_profile's trace reading."""

import gzip
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from retrax.fastmath import precision
from tests import benchmark_scripts

_BENCH = benchmark_scripts.FOLDER
step_profile = benchmark_scripts.load('step_profile')


def test_top_ops_sums_leaf_device_ops_per_step(tmp_path):
  """Per-step milliseconds of the device's leaf ops; loops, host ops left out."""
  meta = [
      dict(ph='M', name='process_name', pid=3, args=dict(name='/device:TPU:0')),
      dict(ph='M', name='process_name', pid=9, args=dict(name='/host:CPU')),
      dict(ph='M', name='thread_name', pid=3, tid=3, args=dict(name='XLA Ops')),
      dict(ph='M', name='thread_name', pid=3, tid=2,
           args=dict(name='XLA Modules')),
      dict(ph='M', name='thread_name', pid=9, tid=3, args=dict(name='XLA Ops')),
  ]
  ops = []
  for _ in range(2):  # two steps
    ops += [dict(ph='X', pid=3, tid=3, name='gather.1', dur=300.0,
                 args=dict(hlo_category='custom fusion')),
            dict(ph='X', pid=3, tid=3, name='gather.1', dur=100.0),
            dict(ph='X', pid=3, tid=3, name='sort.2', dur=250.0,
                 args=dict(hlo_category='sort')),
            dict(ph='X', pid=3, tid=3, name='while.7', dur=9000.0),
            dict(ph='X', pid=3, tid=2, name='jit_loss', dur=9000.0),
            dict(ph='X', pid=9, tid=3, name='host_op', dur=5000.0)]
  folder = tmp_path / 'plugins' / 'profile' / 'run'
  folder.mkdir(parents=True)
  with gzip.open(folder / 'vm.trace.json.gz', 'wt') as f:
    json.dump(dict(traceEvents=meta + ops), f)
  got = step_profile.top_ops(str(tmp_path), n_steps=2)
  assert got == [(0.4, 2, 'gather.1', 'custom fusion'),
                 (0.25, 1, 'sort.2', 'sort')]
  assert step_profile.top_ops(str(tmp_path / 'plugins' / 'none')) == []
  # By HLO category, per step: an op's category comes from any of its events.
  assert step_profile.op_categories(str(tmp_path), n_steps=2) == {
      'custom fusion': 0.4, 'sort': 0.25}
  assert step_profile.op_categories(str(tmp_path / 'plugins' / 'none')) == {}


@pytest.mark.slow  # ~70 s on a quiet 2-core CPU: a 20-step main job, 4 workers.
def test_tpu_sh_tiny_on_cpu(tmp_path):
  env = dict(os.environ, RETRAX_TPU_SH_TINY='1', OUT=str(tmp_path),
             PYTHON=sys.executable, JAX_PLATFORMS='cpu',
             TPU_SH_STAGES=('float32 main profile variants table search '
                            'decode real_text'),
             TPU_SH_REAL_TEXT_DIR=str(tmp_path / 'real_text_run'))
  proc = subprocess.run(['bash', os.path.join(_BENCH, 'tpu.sh')],
                        capture_output=True, text=True, env=env, timeout=900)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert 'main job: rc 0' in proc.stdout
  assert '4 copies' in (tmp_path / 'tpu_main.log').read_text() or \
      'copies correct' in (tmp_path / 'tpu_main.log').read_text()
  profile = json.loads((tmp_path / 'tpu_profile.json').read_text())
  assert set(profile['parts']) == {'matmul', 'ff', 'lsh', 'step', 'lsh_units1',
                                   'lsh_pallas'}
  assert all(p['step_s'] > 0 for p in profile['parts'].values())
  assert profile['lsh_kernel_over_xla'] == pytest.approx(
      profile['parts']['lsh_pallas']['step_s'] /
      profile['parts']['lsh']['step_s'])
  # The variants stage: the defaults, then blocks forced on, bfloat16
  # matmuls and two heads at a time, compared.
  variants = [json.loads((tmp_path / f'tpu_variant_{i}.json').read_text())
              for i in range(2)]
  assert [v['settings'] for v in variants] == [
      {}, {'retrax.layers.attention.ops.BLOCK_MIN_LOGITS': 0,
           'matmul_dtype': 'bfloat16', 'n_parallel_heads': 2}]
  assert variants[1]['cfg']['n_parallel_heads'] == 2
  assert all(v['parts']['step']['step_s'] > 0 for v in variants)
  assert ("matmul_dtype='bfloat16' "
          "retrax.layers.attention.ops.BLOCK_MIN_LOGITS=0 "
          "n_parallel_heads=2") in proc.stdout
  f32 = json.loads((tmp_path / 'tpu_float32.json').read_text())
  assert f32['backend'] == 'cpu' and f32['cases']['exp']['rel'] < 1e-6
  search = json.loads((tmp_path / 'tpu_max_length.json').read_text())
  assert search['fits'] == 64
  assert 'peak_gflops' not in search['tries']['64']
  table = json.loads((tmp_path / 'tpu_vs_peers.json').read_text())
  assert table['train']['32']['retrax']['step_s'][0] > 0
  assert table['train']['32']['retrax']['peak_gflops']['float32'] > 0
  # The real_text stage's progress file reports as the run itself did.
  assert 'real_text: rc 0' in proc.stdout
  progress = tmp_path / 'real_text_progress.json'
  assert sorted(json.loads(progress.read_text())['runs']) == [
      'lsh-2/seed0', 'lsh-2/seed1', 'residual-full/seed0',
      'residual-full/seed1']
  args = ['--quick', '--arms', 'residual-full,lsh-2', '--seeds', '2']
  again = subprocess.run(
      [sys.executable, os.path.join(_BENCH, 'real_text.py'), *args,
       '--from_progress', str(progress), '--json', str(tmp_path / 'r.json')],
      capture_output=True, text=True, env=env, timeout=300)
  assert again.returncode == 0, again.stderr[-2000:]
  assert (json.loads((tmp_path / 'r.json').read_text())['arms'] ==
          json.loads((tmp_path / 'real_text.json').read_text())['arms'])


def test_set_changes_a_module_constant_and_refuses_unknown_names(monkeypatch):
  from retrax.layers.attention import ops
  monkeypatch.setattr(ops, 'REMAT_SPEED_BLOCKS', ops.REMAT_SPEED_BLOCKS)
  monkeypatch.setattr(ops, 'BLOCK_CHUNKS', ops.BLOCK_CHUNKS)  # restored after
  name = 'retrax.layers.attention.ops.'
  got = step_profile.apply_settings([f'{name}REMAT_SPEED_BLOCKS=False',
                                     f'{name}BLOCK_CHUNKS=32'])
  assert got == {f'{name}REMAT_SPEED_BLOCKS': False,
                 f'{name}BLOCK_CHUNKS': 32}
  assert ops.REMAT_SPEED_BLOCKS is False and ops.BLOCK_CHUNKS == 32
  old = precision.set_matmul_dtype('float32')
  try:
    assert step_profile.apply_settings([], 'bfloat16') == {
        'matmul_dtype': 'bfloat16'}
    assert precision.matmul_dtype() == 'bfloat16'
  finally:
    precision.set_matmul_dtype(old)
  for bad, message in [(f'{name}REMAT_SPEED_BLOCK=False', 'has no'),
                       (f'{name}BLOCK_CHUNKS=thirty', 'not a Python literal'),
                       ('REMAT_SPEED_BLOCKS', 'MODULE.NAME=VALUE'),
                       ('retrax.no_such_module.X=1', 'no module')]:
    with pytest.raises(SystemExit, match=message):
      step_profile.apply_settings([bad])


def test_compare_steps_divides_by_the_first_run_with_a_step(tmp_path):
  runs = [dict(settings={}, parts={'matmul': {'step_s': 1.0}}),  # cut short
          dict(settings={}, parts={'step': {'step_s': 0.5}}),
          dict(settings={'m.X': False}, parts={'step': {'step_s': 0.4}})]
  paths = []
  for i, run in enumerate(runs):
    paths.append(str(tmp_path / f'{i}.json'))
    with open(paths[-1], 'w') as f:
      json.dump(run, f)
  lines = []
  rows = step_profile.compare_steps(paths, log=lines.append)
  assert rows == [({}, None, None), ({}, 500.0, 1.0),
                  ({'m.X': False}, 400.0, pytest.approx(0.8))]
  assert lines[-1].split() == ['400.00', '0.800', 'm.X=False']


def test_compiler_options_reach_the_steps_compile():
  """`--compiler-option`s parse to typed values and are handed to XLA: an
  option XLA lacks fails the step's compile, a real one compiles the same
  step to the same numbers."""
  got = step_profile.compiler_options(
      ['xla_a=98304', '--xla_b=ENABLED', 'xla_c=False', 'xla_d=true'])
  assert got == {'xla_a': 98304, 'xla_b': 'ENABLED', 'xla_c': False,
                 'xla_d': True}
  assert [type(v) for v in got.values()] == [int, str, bool, bool]
  for bad in ['xla_a', 'xla_a=', '=1']:
    with pytest.raises(SystemExit, match='NAME=VALUE'):
      step_profile.compiler_options([bad])
  fn, w, batch = step_profile.step_fn(step_profile.TINY, 16)
  want = fn(w, batch)
  fn, w, batch = step_profile.step_fn(
      step_profile.TINY, 16,
      step_profile.compiler_options(['xla_cpu_enable_fast_math=false']))
  got = fn(w, batch)
  assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-6)
  fn, w, batch = step_profile.step_fn(
      step_profile.TINY, 16, {'xla_no_such_option_here': 1})
  with pytest.raises(Exception, match='xla_no_such_option_here'):
    fn(w, batch)


def test_n_parallel_heads_reaches_the_steps_attention():
  """`--n-parallel-heads` sets the step's LSH layers' unit count (`main`
  records it in the settings: the toy tpu.sh run checks that); two heads at
  a time is the same function as one."""
  from retrax import layers as tl

  def lsh_layers(layer):
    found = [layer] if isinstance(layer, tl.LSHSelfAttention) else []
    for sub in layer.sublayers:
      found += lsh_layers(sub)
    return found
  cfg = dict(step_profile.TINY, n_parallel_heads=2)
  layers = lsh_layers(step_profile.model_of(cfg, 16))
  assert len(layers) == cfg['n_layers']
  assert {layer._n_parallel_heads for layer in layers} == {2}
  assert {layer._n_parallel_heads for layer in lsh_layers(
      step_profile.model_of(step_profile.TINY, 16))} == {None}
  one = step_profile.step_fn(dict(step_profile.TINY, n_parallel_heads=1), 16)
  two = step_profile.step_fn(cfg, 16)
  (loss1, grads1), (loss2, grads2) = one[0](*one[1:]), two[0](*two[1:])
  assert float(loss2) == pytest.approx(float(loss1), rel=1e-5)
  for g1, g2 in zip(jax.tree_util.tree_leaves(grads1),
                    jax.tree_util.tree_leaves(grads2)):
    np.testing.assert_allclose(g2, g1, rtol=1e-4, atol=1e-6)


def test_n_parallel_heads_the_layers_refuse_is_one_line(capsys):
  """A unit count the layers refuse (3 for 2 heads) ends as a usage error
  with the layer's message, not a traceback."""
  with pytest.raises(SystemExit) as exit_info:
    step_profile.main(['--tiny', '--length', '16', '--step-only',
                       '--n-parallel-heads', '3'])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert 'n_parallel_heads must be a multiple or a divisor of n_heads (2)' in err
  assert 'Traceback' not in err
