"""benchmarks/vs_peers.py: closed-form FLOPs, the table's ratios, a toy run end to end."""

import functools
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from retrax import layers as tl
from retrax import models
from retrax.layers.attention.lsh import default_n_buckets
from retrax.shapes import ShapeDtype
from tests import benchmark_scripts

_PATH = benchmark_scripts.path('vs_peers')
vs_peers = benchmark_scripts.load('vs_peers')


def test_bucket_count_is_retrax_default():
  # The HF worker runs without retrax, so it carries its own copy.
  for length in [16, 64, 1024, 4096, 16384, 65536, 1 << 20]:
    assert vs_peers.report.default_n_buckets(length, 64) == default_n_buckets(
        length, 64)


def test_forward_flops_close_to_xla_cost_analysis():
  # All heads in one group and one layer: no lax.scan (over heads, or over
  # repeated layers), so XLA counts every op once. XLA also counts
  # elementwise work, which the matmul-only closed form omits.
  cfg = dict(vocab=64, d_model=64, d_ff=256, n_heads=2, d_head=32, n_layers=1,
             n_hashes=2, chunk_len=16)
  length = 256
  attention = functools.partial(tl.LSHSelfAttention, n_hashes=2, chunk_len=16,
                                n_parallel_heads=2)  # both heads at once
  model = models.ReformerLM(
      vocab_size=64, d_model=64, d_ff=256, d_attention_key=32,
      d_attention_value=32, n_layers=1, n_heads=2, dropout=0.0,
      max_len=length, attention_type=attention, mode='eval')
  x = np.zeros((1, length), np.int32)
  # The model's own broadcasting is not this test's subject (conftest.py
  # makes rank promotion raise; library fixes are under way elsewhere).
  with jax.numpy_rank_promotion('allow'):
    model.init(ShapeDtype((1, length), np.int32))
    compiled = jax.jit(model.pure_fn).lower(x, model.weights, model.state,
                                            model.rng).compile()
  analysis = compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  blocks, head = vs_peers.report.forward_flops(cfg, length)
  assert 0.85 < (blocks + head) / analysis['flops'] <= 1.0
  assert vs_peers.report.train_flops(cfg, length) == 4 * blocks + 3 * head


def _fake_results():
  def train(step, first, rss):
    return dict(step_s=[step * 0.9, step, step * 1.5], first_s=first,
                rss_bytes=rss)
  retrax = train(1.0, 5.0, 2e9)
  retrax['peak_gflops'] = {'float32': 100.0, 'bfloat16': 400.0}
  retrax_16 = train(3.0, 9.0, 4e9)
  retrax_16['peak_gflops'] = {'float32': 100.0, 'bfloat16': 400.0}
  return dict(
      cfg=vs_peers.FULL, peers=['retrax', 'trax', 'hf'],
      train={'4096': dict(retrax=retrax, trax=train(2.0, 20.0, 3e9),
                          hf=train(1.5, 4.0, 1e9)),
             '16384': dict(retrax=retrax_16, trax=train(8.0, 40.0, 6e9),
                           hf={'error': 'timed out after 600 s'})},
      decode={'256': dict(retrax={'1': dict(tok_s=100.0),
                                  '8': dict(tok_s=500.0)},
                          trax={'1': dict(tok_s=20.0), '8': dict(tok_s=40.0)},
                          hf={'1': dict(tok_s=50.0), '8': dict(tok_s=400.0)})})


def _row(table, label):
  lines = [l for l in table.splitlines() if l.startswith(f'| {label}')]
  assert len(lines) == 1, (label, table)
  return [c.strip() for c in lines[0].strip('|').split('|')][1:]


def test_table_ratios():
  table = vs_peers.report.format_table(_fake_results())
  assert table.splitlines()[0] == ('|  | retrax | Trax 1.4.1 | HF (PyTorch) | '
                                   'Trax 1.4.1 vs retrax | HF (PyTorch) vs '
                                   'retrax |')
  # Medians 1, 2, 1.5: peer time / retrax time.
  assert _row(table, 'train step L=4096,') == ['1', '2', '1.5', '2.00x',
                                               '1.50x']
  assert _row(table, 'peak RSS L=4096') == ['2', '3', '1', '1.50x', '0.50x']
  # A failed worker leaves its cells empty.
  assert _row(table, 'train step L=16384,') == ['3', '8', '—', '2.67x', '—']
  flops = vs_peers.report.train_flops(vs_peers.FULL, 4096)
  cells = _row(table, 'GFLOP/s L=4096')
  assert float(cells[0]) == pytest.approx(flops / 1e9, rel=1e-2)
  fraction = _row(table, 'fraction of fp32 matmul peak (100 GFLOP/s) L=4096')
  assert float(fraction[0]) == pytest.approx(flops / 1e9 / 100, rel=1e-2)
  # Every FLOP at the fp32 peak (100 GFLOP/s): Trax's 2 s over that floor.
  floor = _row(table, 'fp32 matmul-bound floor L=4096')
  assert float(floor[0]) == pytest.approx(flops / 1e11, rel=1e-2)
  assert floor[1:3] == ['2', '1.5']
  assert float(floor[3][:-1]) == pytest.approx(2.0 / (flops / 1e11), rel=1e-2)
  assert 'MFLOP/token' in table and f'{flops / 4096 / 1e6:.4g} MFLOP' in table
  assert _row(table, 'step time growth L=4096->16384') == ['3', '4', '—',
                                                           '—', '—']
  # Decoding: retrax rate / peer rate.
  assert _row(table, 'decode 256 tokens, batch 1,') == ['100', '20', '50',
                                                        '5.00x', '2.00x']
  assert _row(table, 'decode 256 tokens: batch 8 / batch 1') == [
      '5', '2', '8', '—', '—']
  assert vs_peers.report.errors(_fake_results()) == [
      'train 16384 hf: timed out after 600 s']


def test_bf16_column_is_its_speedup_over_float32():
  results = _fake_results()
  results['peers'] = ['retrax', 'retrax-bf16', 'trax']
  results['train']['4096']['retrax-bf16'] = dict(step_s=[0.5, 0.5],
                                                 first_s=4.0, rss_bytes=2e9)
  results['decode']['256']['retrax-bf16'] = {'1': dict(tok_s=150.0)}
  table = vs_peers.report.format_table(results)
  assert table.splitlines()[0] == ('|  | retrax | retrax bf16 | Trax 1.4.1 | '
                                   'bf16 speedup | Trax 1.4.1 vs retrax |')
  assert _row(table, 'train step L=4096,') == ['1', '0.5', '2', '2.00x',
                                               '2.00x']
  assert _row(table, 'decode 256 tokens, batch 1,') == ['100', '150', '20',
                                                        '1.50x', '5.00x']


@pytest.mark.slow  # ~35-70 s on 2 cores: a subprocess compiles a train step.
def test_end_to_end_tiny(tmp_path):
  out = tmp_path / 'results.json'
  proc = subprocess.run(
      [sys.executable, _PATH, '--tiny', '--n-layers', '1', '--lengths', '32',
       '--steps', '2', '--decode-tokens', '8', '--decode-batches', '1,2',
       '--bf16', '--json', str(out)], capture_output=True, text=True,
      timeout=400)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'FAILED' not in proc.stdout, proc.stdout
  results = json.loads(out.read_text())
  train = results['train']['32']['retrax']
  assert len(train['step_s']) == 2
  assert len(results['train']['32']['retrax-bf16']['step_s']) == 2
  cfg = dict(vs_peers.TINY, n_layers=1)
  assert results['cfg'] == cfg
  table = proc.stdout[proc.stdout.index('|  | retrax |'):]
  median = float(_row(table, 'train step L=32,')[0])
  assert median == pytest.approx(float(np.median(train['step_s'])), rel=1e-2)
  assert 0 < median < float(_row(table, 'first step incl. compile L=32')[0])
  assert 0.05 < float(_row(table, 'peak RSS L=32')[0]) < 20
  rate = float(_row(table, 'GFLOP/s L=32')[0])
  assert rate == pytest.approx(vs_peers.report.train_flops(cfg, 32) / median / 1e9,
                               rel=2e-2)
  label = [l for l in table.splitlines() if 'fp32 matmul peak' in l][0]
  peak = float(re.search(r'peak \(([\d.e+]+) GFLOP/s\)', label).group(1))
  assert peak == pytest.approx(train['peak_gflops']['float32'], rel=1e-2)
  fraction = float(label.split('|')[2])
  assert fraction == pytest.approx(rate / peak, rel=3e-2)
  decode = results['decode']['8']['retrax']
  rates = [float(_row(table, f'decode 8 tokens, batch {b},')[0])
           for b in (1, 2)]
  assert rates == pytest.approx([decode['1']['tok_s'], decode['2']['tok_s']],
                                rel=1e-2)
  assert all(r > 0 for r in rates)
  assert float(_row(table, 'decode 8 tokens: batch 2 / batch 1')[0]) == (
      pytest.approx(rates[1] / rates[0], rel=2e-2))


def test_pinned_worker_runs_on_the_given_cpu():
  argv, env = vs_peers.pinned_argv_env({0})
  assert argv == ['--cpus', '0'] and env['OMP_NUM_THREADS'] == '1'
  assert vs_peers.pinned_argv_env(None) == ([], None)
  # A worker process that reports its affinity instead of measuring.
  code = (
      'import importlib.util, json, os, sys\n'
      f'spec = importlib.util.spec_from_file_location("v", {_PATH!r})\n'
      'v = importlib.util.module_from_spec(spec); spec.loader.exec_module(v)\n'
      'v.worker = lambda args: print(v.RESULT_TAG + json.dumps(dict(cpus='
      'sorted(os.sched_getaffinity(0)), omp=os.environ["OMP_NUM_THREADS"])))\n'
      'v.main(sys.argv[1:])\n')
  proc = subprocess.run(
      [sys.executable, '-c', code, '--peer', 'retrax', '--worker', 'train'] +
      argv, capture_output=True, text=True, env=env, check=True)
  result = json.loads(proc.stdout.split(vs_peers.RESULT_TAG)[1])
  assert result == dict(cpus=[0], omp='1')


def test_axial_positions_grow_the_weights_by_sqrt_length_not_length():
  # --axial-pos: two tables of ~sqrt(L) rows (a * b = L) whose depths sum
  # to d_model, so that the weights (and Adam's slots) grow with sqrt(L),
  # not with L as a learned table's; lengths that do not factor are refused.
  assert vs_peers.axial_shape(1 << 21) == (1024, 2048)
  assert vs_peers.axial_shape(1 << 20) == (1024, 1024)
  assert vs_peers.axial_depths(255) == (127, 128)
  with pytest.raises(ValueError, match='powers of two'):
    vs_peers.axial_shape(3 * 1024)
  args = vs_peers.parse_args(['--tiny', '--axial-pos'])
  cfg = vs_peers.config_of(args)
  assert cfg['axial_pos'] == 1

  def n_weights(length, axial):
    model = models.ReformerLM(
        vocab_size=32, d_model=32, d_ff=64, n_layers=1, n_heads=2,
        max_len=length, mode='eval', **(dict(
            pos_type='axial', pos_axial_shape=vs_peers.axial_shape(length),
            pos_d_axial_embs=vs_peers.axial_depths(32)) if axial else {}))
    model.init(ShapeDtype((1, length), np.int32))
    return sum(np.size(w) for w in jax.tree.leaves(model.weights))
  assert n_weights(1024, True) - n_weights(256, True) == (32 - 16) * 16 + (
      32 - 16) * 16  # (16x16 -> 32x32 rows) x 16 deep, per table
  assert n_weights(1024, False) - n_weights(256, False) == (1024 - 256) * 32


def test_decode_worker_runs_lsh_predict_mode():
  # The predict memory goes to the attention layers only (ReformerLM takes no
  # predict_mem_len); the chip's decode rows once failed on exactly that.
  result = vs_peers.run_worker(sys.executable, 'retrax', [
      '--cfg', json.dumps(dict(vs_peers.TINY, n_layers=1)), '--worker',
      'decode', '--tokens', '4', '--decode-batches', '1'], timeout=300)
  assert 'error' not in result, result
  assert result['1']['tok_s'] > 0


@pytest.mark.parametrize('progress, last', [
    (['model and loop set up in 1.0 s', 'step 1 of 4 in 2.0 s'],
     'step 1 of 4 in 2.0 s'),
    ([], 'no progress line (still starting)')])
def test_a_timed_out_worker_says_where_it_was(progress, last):
  # On the chip a paper-size 16K worker timed out twice with no clue where.
  code = ''.join(f'vs_peers.progress({line!r}); ' for line in progress)
  cmd = [sys.executable, '-c', f'import sys; sys.path.insert(0, '
         f'{os.path.dirname(vs_peers.__file__)!r}); import vs_peers; {code}'
         'import time; time.sleep(60)']
  result = vs_peers.run_json_command(cmd, timeout=5)
  assert result['error'] == f'timed out after 5 s; last: {last}'


def test_a_result_written_before_a_slow_exit_is_kept():
  # On the chip a 64K step's process took 20 s or more to exit after it had
  # written its result.
  cmd = [sys.executable, '-c', f'import sys; sys.path.insert(0, '
         f'{os.path.dirname(vs_peers.__file__)!r}); import vs_peers; '
         f'print(vs_peers.RESULT_TAG + \'{{"median_s": 0.5}}\', flush=True); '
         'import time; time.sleep(60)']
  assert vs_peers.run_json_command(cmd, timeout=5) == {
      'median_s': 0.5, 'exit_timed_out_s': 5}
  result = dict(step_s=[2.0], first_s=5.0, rss_bytes=3e9, exit_timed_out_s=5)
  assert vs_peers._brief(result) == (  # pylint: disable=protected-access
      'median 2.000 s, first 5.0 s, RSS 3.00 GB; it did not exit within 5 s')


def test_error_line_names_the_error_not_jax_closing_note():
  stderr = ('Traceback (most recent call last):\n  File "x.py", line 1\n'
            'jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory\n'
            '--------------------\nFor simplicity, JAX has removed its internal '
            'frames from the traceback of the following exception.\n\n')
  assert vs_peers.error_line(stderr) == (
      'jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory')
  assert vs_peers.error_line('') == 'no output'


def test_search_tries_each_length_once(monkeypatch):
  # 2M fails, 1M fits: the search reports 1M and keeps 2M's own error
  # instead of trying 2M again with what is left of the budget.
  calls = []

  def fake_worker(python, peer, argv, timeout, cpus=None):
    length = int(argv[argv.index('--length') + 1])
    calls.append(length)
    # A try asks whether the length fits: no matmul peak measured.
    assert '--no-matmul-peak' in argv
    return {'error': 'exit 1: OOM'} if length > 1 << 20 else {
        'step_s': [1.0], 'first_s': 2.0, 'rss_bytes': 1e9}
  monkeypatch.setattr(vs_peers, 'run_worker', fake_worker)
  args = vs_peers.parse_args(['--search', f'{1 << 20},{1 << 21}'])
  found = vs_peers.search_max_length(args, {}, log=lambda *a, **k: None)
  assert calls == [1 << 21, 1 << 20]
  assert found['fits'] == 1 << 20
  assert found['tries'][str(1 << 21)] == {'error': 'exit 1: OOM'}


def test_tpu_device_peak_is_labelled_as_arrays_only():
  # A TPU runtime's peak_bytes_in_use leaves out the step's temporaries.
  result = dict(step_s=[2.0], first_s=5.0, rss_bytes=3e9,
                device_peak_bytes=1.5e9, versions=dict(device='tpu'))
  assert vs_peers._brief(result).endswith(  # pylint: disable=protected-access
      'device arrays peak (no temporaries) 1.50 GB')
  result['versions']['device'] = 'gpu'
  assert vs_peers._brief(result).endswith(  # pylint: disable=protected-access
      ', device peak 1.50 GB')
