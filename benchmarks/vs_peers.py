"""retrax vs real Trax 1.4.1 and HF transformers' Reformer, side by side in one run.

    python benchmarks/vs_peers.py [--lengths 1024,4096,16384,65536] [--steps 3]
        [--pin 0] [--trax-python ~/.cache/trax-oracle-venv/bin/python]
        [--torch-python "$TORCH_PY"] [--decode-tokens 256,2048]
        [--decode-batches 1,8] [--bf16] [--tiny] [--axial-pos] [--json out.json]

The model (issue 22): ReformerLM, vocab 256, d_model 256, d_ff 1024, 4 heads
of 64, 6 layers, batch 1, `LSHSelfAttention(n_hashes=2, chunk_len=64)`,
dropout 0, Adam(1e-4), trained by `training.Loop` on random tokens. retrax
and Trax run the SAME Trax program (`trax_train_program`): under retrax through
`retrax.compat` (`import trax` is retrax), under Trax in its own interpreter.
HF runs `ReformerModelWithLMHead` with the same sizes (LSH layers, axial
position embeddings off, dropout 0, torch.optim.Adam). Every (peer, length)
runs in its own subprocess, peers interleaved at each length; each reports
the median step time (steps after the first), the first step (compilation
included), its peak RSS (`ru_maxrss`) and, for retrax, the matmul peak of
this machine measured there (jitted `jnp.dot` at the model's shapes, best of
5, fp32 and bf16 with fp32 accumulation). Per-step FLOPs are a closed-form
count (`train_flops`): matmuls only, 3x the forward plus one more forward in
the reversible blocks (recomputed in the backward pass); hashing included.

Decode rows: LSH predict mode (`predict_mem_len` = the tokens generated),
`autoregressive_sample` under retrax and Trax, cached `generate` (sampling)
under HF; tokens/s summed over the batch, the second call timed (the first
compiles). Ratios are peer time / retrax time (>1: retrax is faster), and
retrax rate / peer rate for decoding.

`--bf16` adds a column for retrax with the opt-in bfloat16 matmul policy
(`RETRAX_MATMUL_DTYPE=bfloat16`); its ratio column is its speedup over
float32 retrax.

`--tiny` (toy sizes, for the CPU test) shrinks the model; any size flag
overrides it.

`--pin 0` runs every worker on CPU 0 alone (its `sched_setaffinity`, and
`OMP_NUM_THREADS` to match): each system's work per token on one core, with
no gain from using a second one. The table then also gives the
matmul-bound floor of the step (its closed-form FLOPs at the measured fp32
and bf16 matmul peaks) and the largest speed-up over each peer that floor
allows.
"""

import argparse
import functools
import importlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
# decode.py's helpers import only numpy, so every peer's interpreter has them.
Clock = importlib.import_module('decode').Clock
# The closed-form FLOPs and the Markdown table.
report = importlib.import_module('vs_peers_report')

RESULT_TAG = 'VS_PEERS_RESULT '
PROGRESS_TAG = 'vs_peers worker: '
FULL = dict(vocab=256, d_model=256, d_ff=1024, n_heads=4, d_head=64,
            n_layers=6, n_hashes=2, chunk_len=64)
TINY = dict(vocab=32, d_model=32, d_ff=64, n_heads=2, d_head=16, n_layers=2,
            n_hashes=2, chunk_len=8)


# --- The Trax program (runs under retrax via retrax.compat, and under Trax) ---

def axial_shape(length):
  """`(a, b)`, a * b = `length` (a power of two), a the power of two nearest
  below its square root: the axial position encoding's two table lengths."""
  if length < 4 or length & (length - 1):
    raise ValueError(f'--axial-pos needs lengths that are powers of two >= 4;'
                     f' got {length}.')
  a = 1 << ((length.bit_length() - 1) // 2)
  return a, length // a


def axial_depths(d_model):
  """The two axial tables' depths, summing to `d_model`."""
  return d_model // 2, d_model - d_model // 2


def _trax_lm(cfg, length, mode, mem_len=None):
  import trax.layers as tl
  from trax import models
  predict = {} if mem_len is None else dict(predict_mem_len=mem_len,
                                            predict_drop_len=mem_len)
  attention = functools.partial(tl.LSHSelfAttention, n_hashes=cfg['n_hashes'],
                                chunk_len=cfg['chunk_len'], **predict)
  extra = {}
  if cfg.get('axial_pos'):  # Two small tables instead of one of max_len rows.
    extra.update(pos_type='axial', pos_axial_shape=axial_shape(length),
                 pos_d_axial_embs=axial_depths(cfg['d_model']))
  return models.ReformerLM(
      vocab_size=cfg['vocab'], d_model=cfg['d_model'], d_ff=cfg['d_ff'],
      d_attention_key=cfg['d_head'], d_attention_value=cfg['d_head'],
      n_layers=cfg['n_layers'], n_heads=cfg['n_heads'], dropout=0.0,
      max_len=length, attention_type=attention, mode=mode, **extra)


def _sync_jax():
  import jax
  for a in jax.live_arrays():
    a.block_until_ready()


def progress(message):
  """A worker's progress line on stderr: what a timed-out worker had done
  (`run_json_command` reports the last one)."""
  print(f'{PROGRESS_TAG}{message}', file=sys.stderr, flush=True)


def trax_train_program(cfg, length, steps):
  """ReformerLM-LSH trained by `training.Loop`: step times and the last loss."""
  import trax.layers as tl
  from trax import optimizers
  from trax.supervised import training
  rng = np.random.RandomState(0)

  def batches():
    while True:
      x = rng.randint(1, cfg['vocab'], size=(1, length)).astype(np.int32)
      yield x, x, np.ones((1, length), np.float32)
  task = training.TrainTask(batches(), tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(1e-4),
                            n_steps_per_checkpoint=10**9)
  clock = Clock()
  loop = training.Loop(_trax_lm(cfg, length, 'train'), [task])
  setup_s = clock.elapsed()[0]
  progress(f'model and loop set up in {setup_s:.1f} s')
  times = []
  for step in range(steps + 1):
    clock = Clock()
    loop.run(1)
    _sync_jax()
    times.append(clock.elapsed())
    progress(f'step {step + 1} of {steps + 1} in {times[-1][0]:.1f} s')
  return dict(setup_s=setup_s, first_s=times[0][0],
              step_s=[wall for wall, _ in times[1:]],
              step_cpu_s=[cpu for _, cpu in times[1:]])


def trax_decode_program(cfg, tokens, batch):
  """Tokens/s of `autoregressive_sample` in LSH predict mode (2nd call timed)."""
  from trax import shapes
  from trax.supervised import decoding
  model = _trax_lm(cfg, tokens + 1, 'predict', mem_len=tokens)
  model.init(shapes.ShapeDtype((batch, 1), np.int32))
  state = model.state
  walls = []
  for _ in range(2):
    model.state = state
    clock = Clock()
    out = decoding.autoregressive_sample(model, batch_size=batch, eos_id=-1,
                                         max_length=tokens, temperature=1.0)
    walls.append(clock.elapsed()[0])
    if np.shape(out) != (batch, tokens):
      raise RuntimeError(f'decoded shape {np.shape(out)}, expected '
                         f'{(batch, tokens)}')
  return dict(first_s=walls[0], tok_s=batch * tokens / walls[1])


def matmul_peak(cfg, length, repeats=5, max_rows=16384):
  """Best GFLOP/s of jitted `jnp.dot` at the model's shapes, fp32 and bf16.

  Shapes: `[rows, d_model] x [d_model, d_ff]`, `[rows, d_ff] x [d_ff,
  d_model]`, `[rows, d_model] x [d_model, heads * d_head]` (rows =
  min(length, max_rows)) and the chunked attention `[n_chunks, C, d_head] x
  [n_chunks, d_head, 2C]`. bf16 accumulates in fp32.
  """
  import jax
  import jax.numpy as jnp
  rows = min(length, max_rows)
  d, ff, hd, c = cfg['d_model'], cfg['d_ff'], cfg['n_heads'] * cfg['d_head'], \
      cfg['chunk_len']
  n_chunks = max(1, rows * cfg['n_hashes'] // c)
  shapes = [((rows, d), (d, ff)), ((rows, ff), (ff, d)), ((rows, d), (d, hd)),
            ((n_chunks, c, cfg['d_head']), (n_chunks, cfg['d_head'], 2 * c))]
  dot = jax.jit(lambda a, b: jnp.matmul(a, b,
                                        preferred_element_type=jnp.float32))
  peaks = {}
  for dtype in ('float32', 'bfloat16'):
    best = 0.0
    for sa, sb in shapes:
      a = jnp.ones(sa, dtype)
      b = jnp.ones(sb, dtype)
      flops = 2 * math.prod(sa) * sb[-1]
      dot(a, b).block_until_ready()
      for _ in range(repeats):
        clock = Clock()
        dot(a, b).block_until_ready()
        best = max(best, flops / clock.elapsed()[0] / 1e9)
    peaks[dtype] = best
  return peaks


# --- HF transformers (PyTorch) -------------------------------------------------

def _hf_model(cfg, max_len):
  import torch
  import transformers
  torch.manual_seed(0)
  axial = dict(axial_pos_shape=axial_shape(max_len),
               axial_pos_embds_dim=axial_depths(cfg['d_model'])
               ) if cfg.get('axial_pos') else {}
  config = transformers.ReformerConfig(
      vocab_size=cfg['vocab'], hidden_size=cfg['d_model'],
      feed_forward_size=cfg['d_ff'], num_attention_heads=cfg['n_heads'],
      attention_head_size=cfg['d_head'], attn_layers=['lsh'] * cfg['n_layers'],
      lsh_attn_chunk_length=cfg['chunk_len'], num_hashes=cfg['n_hashes'],
      num_buckets=report.default_n_buckets(max_len, cfg['chunk_len']),
      lsh_num_chunks_before=1, lsh_num_chunks_after=0, is_decoder=True,
      axial_pos_embds=bool(cfg.get('axial_pos')), **axial,
      max_position_embeddings=max_len,
      hidden_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0,
      hidden_act='gelu_new', tie_word_embeddings=False, pad_token_id=0,
      eos_token_id=None)
  device = 'cuda' if torch.cuda.is_available() else 'cpu'
  return transformers.ReformerModelWithLMHead(config).to(device), device


def _torch_sync(device):
  import torch
  if device == 'cuda':
    torch.cuda.synchronize()


def hf_train(cfg, length, steps):
  """HF ReformerModelWithLMHead trained with Adam: step times."""
  import torch
  clock = Clock()
  model, device = _hf_model(cfg, length)
  model.train()
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
  setup_s = clock.elapsed()[0]
  rng = np.random.RandomState(0)
  times = []
  for _ in range(steps + 1):
    x = torch.from_numpy(rng.randint(1, cfg['vocab'], size=(1, length))).to(
        device)
    clock = Clock()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    _torch_sync(device)
    times.append(clock.elapsed()[0])
  return dict(setup_s=setup_s, first_s=times[0], step_s=times[1:])


def hf_decode(cfg, tokens, batch):
  """Tokens/s of HF's cached sampling `generate` (2nd call timed)."""
  import torch
  model, device = _hf_model(cfg, tokens + 1)
  model.eval()
  start = torch.zeros((batch, 1), dtype=torch.long, device=device)
  walls = []
  with torch.no_grad():
    for _ in range(2):
      clock = Clock()
      out = model.generate(input_ids=start, do_sample=True, use_cache=True,
                           max_new_tokens=tokens, min_new_tokens=tokens,
                           pad_token_id=0)
      _torch_sync(device)
      walls.append(clock.elapsed()[0])
  if tuple(out.shape) != (batch, tokens + 1):
    raise RuntimeError(f'generated shape {tuple(out.shape)}')
  return dict(first_s=walls[0], tok_s=batch * tokens / walls[1])


# --- Workers (one per subprocess) ----------------------------------------------

def _peak_rss_bytes():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _versions(peer):
  if peer == 'hf':
    import torch
    import transformers
    return dict(torch=torch.__version__, transformers=transformers.__version__,
                device='cuda' if torch.cuda.is_available() else 'cpu',
                threads=torch.get_num_threads())
  import jax
  return dict(jax=jax.__version__, device=jax.devices()[0].platform)


def _device_peak_bytes(peer):
  """Peak accelerator memory in use, where the runtime reports it.

  On a TPU the runtime's figure leaves out the compiled step's temporaries
  (the 2M-token step: 1.33 GB beside the 14 GiB the TPU compiler planned
  and ran, 2026-12-07): `benchmarks/step_peak.py --tpu` plans those.
  """
  if peer == 'hf':
    import torch
    return torch.cuda.max_memory_allocated() if torch.cuda.is_available() \
        else None
  import jax
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get('peak_bytes_in_use')


def worker(args):
  """Runs one peer's measurement and prints it as one tagged JSON line."""
  cfg = json.loads(args.cfg)
  if args.peer.startswith('retrax'):
    sys.path.insert(0, os.path.dirname(_HERE))
    import retrax.compat
    retrax.compat.install()
    from retrax.fastmath import precision
    precision.set_matmul_dtype(
        'bfloat16' if args.peer == 'retrax-bf16' else 'float32')
  hf = args.peer == 'hf'
  if args.worker == 'train':
    result = (hf_train if hf else trax_train_program)(cfg, args.length,
                                                      args.steps)
    # The search's tries skip it: they need whether a length fits, and the
    # peak's eight compiled matmuls cost seconds of a chip call.
    if args.peer == 'retrax' and not args.no_matmul_peak:
      result['peak_gflops'] = matmul_peak(cfg, args.length)
  else:
    result = {str(b): (hf_decode if hf else trax_decode_program)(
        cfg, args.tokens, b) for b in _ints(args.decode_batches)}
  result.update(rss_bytes=_peak_rss_bytes(), versions=_versions(args.peer),
                device_peak_bytes=_device_peak_bytes(args.peer))
  print(RESULT_TAG + json.dumps(result), flush=True)


class Budget:
  """Wall-clock seconds left for workers (`None`: unlimited)."""

  def __init__(self, seconds):
    self._end = None if seconds is None else time.monotonic() + seconds

  def timeout(self, per_worker):
    """This worker's timeout, or None when the budget is spent."""
    if self._end is None:
      return per_worker
    left = int(self._end - time.monotonic())
    return min(per_worker, left) if left >= 10 else None


def pinned_argv_env(cpus):
  """`(extra worker argv, env)` that run a worker on the CPUs `cpus` only.

  The worker sets its own affinity (`--cpus`) before importing JAX or
  torch: XLA:CPU sizes its thread pool by the affinity mask. torch's and
  XLA's OpenMP/Eigen pools read `OMP_NUM_THREADS`, set to match so that no
  peer runs more threads than it has cores. `cpus` None: `([], None)`.
  """
  if not cpus:
    return [], None
  return (['--cpus', ','.join(map(str, sorted(cpus)))],
          dict(os.environ, OMP_NUM_THREADS=str(len(cpus))))


def run_worker(python, peer, argv, timeout, cpus=None):
  """One worker subprocess (on `cpus` if given); its result dict, or `{'error': why}`."""
  if timeout is None:
    return {'error': 'skipped: --budget spent'}
  pin_argv, env = pinned_argv_env(cpus)
  cmd = [python, os.path.abspath(__file__), '--peer', peer] + argv + pin_argv
  return run_json_command(cmd, timeout, env)


def run_json_command(cmd, timeout, env=None):
  """A worker command's tagged result, or `{'error': why}`; a timed-out
  one's error names the last progress line it wrote (where it was). A
  worker that wrote its result and then did not exit in time (on a TPU
  machine the runtime's shutdown after a large step can take that long)
  keeps its result, marked `exit_timed_out_s`."""
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=env)
  except subprocess.TimeoutExpired as e:
    # (Captured output comes back as bytes here, whatever `text` says.)
    stdout, stderr = (x.decode(errors='replace') if isinstance(x, bytes)
                      else (x or '') for x in (e.stdout, e.stderr))
    result = _tagged_result(stdout)
    if result is not None:
      return dict(result, exit_timed_out_s=timeout)
    lines = [line[len(PROGRESS_TAG):] for line in stderr.splitlines()
             if line.startswith(PROGRESS_TAG)]
    last = lines[-1] if lines else 'no progress line (still starting)'
    return {'error': f'timed out after {timeout} s; last: {last}',
            'stderr_tail': stderr[-4000:]}
  result = _tagged_result(proc.stdout)
  if result is not None:
    return result
  return {'error': f'exit {proc.returncode}: {error_line(proc.stderr)[:300]}',
          'stderr_tail': proc.stderr[-4000:]}


def _tagged_result(stdout):
  """The last result line a worker wrote to `stdout`, parsed; None if none."""
  for line in reversed(stdout.splitlines()):
    if line.startswith(RESULT_TAG):
      return json.loads(line[len(RESULT_TAG):])
  return None


def error_line(stderr):
  """The line of a worker's stderr that names its error: the last one,
  skipping JAX's closing note on filtered tracebacks and separator rules."""
  for line in reversed(stderr.strip().splitlines()):
    line = line.strip()
    if line and not line.startswith('For simplicity, JAX') and set(line) != {'-'}:
      return line
  return 'no output'


# --- Driver and table ----------------------------------------------------------

def _ints(text):
  return [int(v) for v in text.split(',') if v]


def peers_of(args):
  """`{peer: interpreter}` in run order: retrax first."""
  peers = {'retrax': sys.executable}
  if args.bf16:
    peers['retrax-bf16'] = sys.executable
  if args.trax_python:
    peers['trax'] = os.path.expanduser(args.trax_python)
  if args.torch_python:
    peers['hf'] = os.path.expanduser(args.torch_python)
  return peers


def measure(args, cfg, log=print):
  """All rows, peers interleaved at each length; the raw results."""
  peers = peers_of(args)
  common = ['--cfg', json.dumps(cfg)]
  budget = Budget(args.budget)
  cpus = set(_ints(args.pin)) if args.pin else None
  results = dict(cfg=cfg, peers=list(peers), train={}, decode={},
                 cpus=sorted(cpus or os.sched_getaffinity(0)),
                 load_before=os.getloadavg())
  for length in _ints(args.lengths):
    row = results['train'][str(length)] = {}
    for peer, python in peers.items():
      row[peer] = run_worker(python, peer, common + [
          '--worker', 'train', '--length', str(length), '--steps',
          str(args.steps)], budget.timeout(args.timeout), cpus)
      log(f'train L={length} {peer}: {_brief(row[peer])}', flush=True)
  for tokens in _ints(args.decode_tokens):
    row = results['decode'][str(tokens)] = {}
    for peer, python in peers.items():
      row[peer] = run_worker(python, peer, common + [
          '--worker', 'decode', '--tokens', str(tokens), '--decode-batches',
          args.decode_batches], budget.timeout(args.timeout), cpus)
      log(f'decode {tokens} tokens {peer}: {_brief(row[peer])}', flush=True)
  results['load_after'] = os.getloadavg()
  return results


def search_max_length(args, cfg, log=print):
  """Longest power-of-two-times-start length whose training step runs.

  Tries `--search` START,STOP[,MAX]'s STOP first; if it runs, doubles while
  the budget lasts up to MAX (default STOP), else halves down to START. Each
  try is a
  retrax worker subprocess (one timed step after the first), so running
  out of memory ends only that try. Returns `{'fits': L or None, 'tries':
  ...}`.
  """
  bounds = _ints(args.search)
  if len(bounds) not in (2, 3) or not 0 < bounds[0] <= bounds[1] <= bounds[-1]:
    raise ValueError(f'--search: expected START,STOP[,MAX] with START <= STOP '
                     f'<= MAX; got {args.search!r}.')
  start, stop, most = bounds[0], bounds[1], bounds[-1]
  budget = Budget(args.budget)
  tries, fits, length = {}, None, stop
  while start <= length <= most and str(length) not in tries:
    result = run_worker(sys.executable, 'retrax', [
        '--cfg', json.dumps(cfg), '--worker', 'train', '--length',
        str(length), '--steps', '1', '--no-matmul-peak'],
        budget.timeout(args.timeout))
    tries[str(length)] = result
    log(f'search L={length}: {_brief(result)}', flush=True)
    if 'error' in result:
      if fits is not None or result['error'].startswith('skipped'):
        break
      length //= 2
    else:
      fits, length = length, 2 * length
  return dict(fits=fits, tries=tries)


def _brief(result):
  if 'error' in result:
    return result['error']
  if 'step_s' in result:
    device = result.get('device_peak_bytes')
    tpu = result.get('versions', {}).get('device') == 'tpu'
    label = 'device arrays peak (no temporaries)' if tpu else 'device peak'
    slow_exit = result.get('exit_timed_out_s')
    return (f"median {statistics.median(result['step_s']):.3f} s, first "
            f"{result['first_s']:.1f} s, RSS {result['rss_bytes'] / 1e9:.2f} GB"
            + (f', {label} {device / 1e9:.2f} GB' if device else '')
            + (f'; it did not exit within {slow_exit} s' if slow_exit else ''))
  return ', '.join(f"batch {b}: {r['tok_s']:.1f} tok/s"
                   for b, r in result.items() if isinstance(r, dict) and
                   'tok_s' in r)


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default='1024,4096,16384,65536')
  parser.add_argument('--steps', type=int, default=3,
                      help='timed training steps after the first')
  parser.add_argument('--trax-python', help='interpreter with Trax 1.4.1')
  parser.add_argument('--torch-python',
                      help='interpreter with torch and transformers')
  parser.add_argument('--decode-tokens', default='256,2048')
  parser.add_argument('--decode-batches', default='1,8')
  parser.add_argument('--timeout', type=int, default=600,
                      help='seconds per worker subprocess')
  parser.add_argument('--bf16', action='store_true',
                      help='also retrax with bfloat16 matmuls')
  parser.add_argument('--tiny', action='store_true',
                      help='toy model sizes (tests)')
  for key in FULL:
    parser.add_argument('--' + key.replace('_', '-'), type=int, dest=key)
  parser.add_argument('--axial-pos', action='store_true',
                      help="axial position encoding (pos_type='axial': "
                      'two tables of ~sqrt(L) rows) instead of a learned '
                      'table of L rows, whose weights and Adam slots grow '
                      'with the length (every peer)')
  parser.add_argument('--budget', type=float,
                      help='wall seconds for all workers (the rest skipped)')
  parser.add_argument('--search', metavar='START,STOP[,MAX]',
                      help='instead of the table: the longest trainable L')
  parser.add_argument('--pin', metavar='CPUS',
                      help='run every worker on these CPUs only, e.g. 0 '
                      '(Linux; each peer then uses that many threads)')
  parser.add_argument('--json', help='also write the raw results here')
  # Internal: one measurement in this process.
  parser.add_argument('--worker', choices=['train', 'decode'],
                      help=argparse.SUPPRESS)
  parser.add_argument('--peer', choices=['retrax', 'retrax-bf16', 'trax', 'hf'],
                      help=argparse.SUPPRESS)
  parser.add_argument('--cfg', help=argparse.SUPPRESS)
  parser.add_argument('--cpus', help=argparse.SUPPRESS)
  parser.add_argument('--length', type=int, help=argparse.SUPPRESS)
  parser.add_argument('--tokens', type=int, help=argparse.SUPPRESS)
  parser.add_argument('--no-matmul-peak', action='store_true',
                      help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def config_of(args):
  cfg = dict(TINY if args.tiny else FULL)
  cfg.update({k: getattr(args, k) for k in FULL if getattr(args, k)})
  if args.axial_pos:
    cfg['axial_pos'] = 1
  return cfg


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    if args.cpus:  # Before any thread pool exists (see `pinned_argv_env`).
      os.sched_setaffinity(0, set(_ints(args.cpus)))
    return worker(args)
  cfg = config_of(args)
  print(f'config {cfg}; load average {os.getloadavg()}; '
        f'{os.cpu_count()} CPUs' + (f', workers pinned to CPU {args.pin}'
                                     if args.pin else ''), flush=True)
  if args.search:
    return report_search(args, cfg)
  results = measure(args, cfg)
  print(f'load average after: {results["load_after"]}')
  for peer in results['peers']:
    versions = [r.get('versions') for row in results['train'].values()
                for p, r in row.items() if p == peer and 'versions' in r]
    print(f'{peer}: {versions[0] if versions else "no result"}')
  print(report.format_table(results))
  for line in report.errors(results):
    print('FAILED', line)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)


def report_search(args, cfg):
  """Runs `search_max_length` and prints its one-line verdict."""
  found = search_max_length(args, cfg)
  fits = found['fits']
  if fits is None:
    print(f'MAX LENGTH: no length from {args.search} trained')
  else:
    print(f"MAX LENGTH: L={fits} trains ({_brief(found['tries'][str(fits)])})")
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(found, f, indent=1)


if __name__ == '__main__':
  main()
  if '--worker' in sys.argv:
    # The result is written and flushed: leave without the runtime's
    # orderly teardown. On the TPU machine a process took 20 s or more to
    # exit after a 64K step (2026-12-07), and the next worker cannot take
    # the chip until this one has let it go.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
