"""How far one CPU trains: a ReformerLM step from 16K to 256K tokens, memory per token.

    python benchmarks/long_length.py [--lengths 16384,32768,65536,131072,262144]
        [--json out.json] [--plot out.png]
    python benchmarks/long_length.py --from-json out.json [--plot out.png]

The model is `vs_peers.py`'s (the same Trax program through `retrax.compat`):
ReformerLM, vocab 256, d_model 256, d_ff 1024, 4 heads of 64, 6 layers,
`LSHSelfAttention(n_hashes=2, chunk_len=64)`, batch 1, Adam, one
`training.Loop` step after a compiling first step, each length in its own
subprocess. For each length it prints the peak RSS of that process
(`ru_maxrss`: weights, Adam slots, the batch, compiled programs and the
step's temporaries), the RSS per token, the increment per token over the
previous length (the part that grows with L), the timed step's wall and CPU
seconds and the first step (compilation included). `--plot` draws RSS and
seconds per token against length.

On a GPU machine, `benchmarks/gpu.sh` searches the longest length that fits
(1M tokens is the Reformer paper's claim) with `vs_peers.py --search`.
"""

import argparse
import importlib
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
vs_peers = importlib.import_module('vs_peers')


def measure(lengths, timeout, log=print):
  """`{length: worker result}` for retrax at each length, in order."""
  cfg = json.dumps(vs_peers.FULL)
  results = {}
  for length in lengths:
    results[length] = vs_peers.run_worker(
        sys.executable, 'retrax', ['--cfg', cfg, '--worker', 'train',
                                   '--length', str(length), '--steps', '1'],
        timeout)
    r = results[length]
    log(f'L={length}: ' + (r['error'] if 'error' in r else
                          f"RSS {r['rss_bytes'] / 1e9:.2f} GB, step "
                          f"{r['step_s'][0]:.1f} s wall, {r['step_cpu_s'][0]:.1f} s CPU"),
        flush=True)
  return results


def rows(results):
  """Table rows: length, RSS GB, RSS bytes/token, increment bytes/token, times."""
  table, previous = [], None
  for length, r in sorted(results.items()):
    if 'error' in r:
      table.append((length, r['error']))
      continue
    rss = r['rss_bytes']
    increment = (None if previous is None else
                 (rss - previous[1]) / (length - previous[0]))
    table.append((length, rss / 1e9, rss / length, increment, r['step_s'][0],
                  r['step_cpu_s'][0], r['first_s']))
    previous = (length, rss)
  return table


def format_table(table):
  lines = ['| L | peak RSS GB | RSS bytes/token | increment bytes/token | '
           'step wall s | step CPU s | first step s |',
           '|---:|---:|---:|---:|---:|---:|---:|']
  for row in table:
    if isinstance(row[1], str):
      lines.append(f'| {row[0]} | {row[1]} | | | | | |')
      continue
    length, gb, per, inc, wall, cpu, first = row
    inc_text = '—' if inc is None else f'{inc:,.0f}'
    lines.append(f'| {length:,} | {gb:.2f} | {per:,.0f} | {inc_text} | '
                 f'{wall:.1f} | {cpu:.1f} | {first:.1f} |')
  return '\n'.join(lines)


def plot(table, path):
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  done = [r for r in table if not isinstance(r[1], str)]
  lengths = [r[0] for r in done]
  fig, (mem, time_ax) = plt.subplots(1, 2, figsize=(10, 4))
  mem.plot(lengths, [r[2] / 1e3 for r in done], 'o-', label='peak RSS / tokens')
  grown = [r for r in done if r[3] is not None]
  mem.plot([r[0] for r in grown], [r[3] / 1e3 for r in grown], 's--',
           label='increment over the previous length / extra tokens')
  mem.legend(fontsize='small')
  mem.set(xscale='log', xlabel='tokens (batch 1)', ylabel='peak RSS, KB/token',
          title='ReformerLM step: memory per token')
  time_ax.plot(lengths, [r[5] / r[0] * 1e3 for r in done], 'o-')
  time_ax.set(xscale='log', xlabel='tokens (batch 1)',
              ylabel='CPU ms per token', title='CPU time per token')
  for ax in (mem, time_ax):
    ax.minorticks_off()  # Log-scale minor labels overprint the K labels.
    ax.set_xticks(lengths, [f'{n // 1024}K' for n in lengths])
    ax.set_ylim(bottom=0)
  fig.tight_layout()
  fig.savefig(path, dpi=100)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--lengths', default='16384,32768,65536,131072,262144')
  parser.add_argument('--timeout', type=int, default=7200,
                      help='seconds per length')
  parser.add_argument('--json', help='write the raw results here')
  parser.add_argument('--plot', help='write the PNG here')
  parser.add_argument('--from-json', metavar='PATH',
                      help='table and plot from a file --json wrote, '
                           'measuring nothing')
  args = parser.parse_args(argv)
  if args.from_json:
    with open(args.from_json) as f:
      results = {int(k): v for k, v in json.load(f)['results'].items()}
  else:
    lengths = [int(v) for v in args.lengths.split(',') if v]
    print(f'config {vs_peers.FULL}; load average {os.getloadavg()}',
          flush=True)
    results = measure(lengths, args.timeout)
    print(f'load average after: {os.getloadavg()}')
  table = rows(results)
  print(format_table(table))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(dict(cfg=vs_peers.FULL, results=results), f, indent=1)
  if args.plot:
    plot(table, args.plot)


if __name__ == '__main__':
  main()
