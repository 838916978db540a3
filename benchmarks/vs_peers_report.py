"""vs_peers' closed-form FLOP count and its Markdown table of ratios.

Plain Python (no JAX), so every peer's interpreter can import it.
"""

import math
import statistics

BF16 = 'retrax-bf16'


def default_n_buckets(length, chunk_len):
  """Trax's LSH bucket count for a length (factorised above 128)."""
  n_buckets = 2 * max(1, length // chunk_len)
  if n_buckets <= 128:
    return n_buckets
  first = 2**math.ceil(math.log2(math.sqrt(n_buckets)))
  return [first, 2 * (n_buckets // (2 * first))]


def forward_flops(cfg, length):
  """Matmul FLOPs of one forward pass at batch 1: `(reversible blocks, rest)`."""
  d, heads, dh = cfg['d_model'], cfg['n_heads'], cfg['d_head']
  n_buckets = default_n_buckets(length, cfg['chunk_len'])
  rot = n_buckets if isinstance(n_buckets, int) else sum(n_buckets)
  window = 2 * cfg['chunk_len']  # Its chunk and one chunk before.
  per_token = (3 * 2 * d * heads * dh  # q, v and output projections
               + heads * cfg['n_hashes'] * (2 * dh * rot // 2  # hashing
                                            + 2 * 2 * window * dh)  # qk, pv
               + 2 * 2 * d * cfg['d_ff'])  # feed-forward
  blocks = cfg['n_layers'] * per_token * length
  head = 2 * (2 * d) * cfg['vocab'] * length  # Dense(vocab) on both halves
  return blocks, head


def train_flops(cfg, length):
  """Closed-form FLOPs of a training step: 4x forward in blocks, 3x elsewhere."""
  blocks, head = forward_flops(cfg, length)
  return 4 * blocks + 3 * head


def _fmt(value, digits=3):
  if value is None:
    return '—'
  if isinstance(value, str):
    return value
  return f'{value:.{digits}g}' if abs(value) < 1000 else f'{value:.0f}'


def _table_row(label, values, peers, ratio):
  """`| label | v_retrax | v_peer.. | ratio_peer.. |`: `ratio(retrax, peer)`.

  `ratio=None` leaves the ratio cells empty (rates already comparable).
  """
  cells = [_fmt(values.get(p)) for p in peers]
  base = values.get('retrax')
  for peer in peers[1:]:
    other = values.get(peer)
    if ratio is None or not base or not other:
      cells.append('—')
    else:  # bf16 retrax's column is its speedup over float32 retrax.
      pair = (other, base) if peer == BF16 else (base, other)
      cells.append(f'{ratio(*pair):.2f}x')
  return f'| {label} | ' + ' | '.join(cells) + ' |'


def _median_step(result):
  return statistics.median(result['step_s']) if 'step_s' in result else None


def train_rows(results):
  """Markdown rows of the training measurements, per length."""
  peers, cfg, rows = results['peers'], results['cfg'], []
  slower = lambda base, other: other / base  # peer / retrax
  lengths = sorted(int(n) for n in results['train'])
  for length in lengths:
    row = results['train'][str(length)]
    step = {p: _median_step(r) for p, r in row.items()}
    flops = train_flops(cfg, length)
    peak = row.get('retrax', {}).get('peak_gflops', {})
    rows.append(_table_row(f'train step L={length}, median s', step, peers,
                           slower))
    rows.append(_table_row(f'first step incl. compile L={length}, s', {
        p: r.get('first_s') for p, r in row.items()}, peers, slower))
    rows.append(_table_row(f'peak RSS L={length}, GB', {
        p: r['rss_bytes'] / 1e9 if 'rss_bytes' in r else None
        for p, r in row.items()}, peers, slower))
    rate = {p: flops / s / 1e9 if s else None for p, s in step.items()}
    rows.append(_table_row(
        f'GFLOP/s L={length} ({flops / 1e9:.4g} GFLOP/step, '
        f'{flops / length / 1e6:.4g} MFLOP/token, closed form)',
        rate, peers, None))
    for dtype, short in (('float32', 'fp32'), ('bfloat16', 'bf16')):
      if peak.get(dtype):
        rows.append(_table_row(
            f'fraction of {short} matmul peak ({peak[dtype]:.4g} GFLOP/s) '
            f'L={length}', {p: r / peak[dtype] if r else None
                            for p, r in rate.items()}, peers, None))
        # The step if every FLOP ran at the matmul peak: no system doing
        # this work in this precision can be faster, so a peer's time over
        # it bounds any speed-up over that peer.
        floor = flops / (peak[dtype] * 1e9)
        rows.append(_table_row(
            f'{short} matmul-bound floor L={length}, s (peer time / floor: '
            f'largest possible speed-up)',
            {p: floor if p == 'retrax' else None if p == BF16 else step.get(p)
             for p in peers},
            peers, slower))
    quarter = str(length // 4)
    if quarter in results['train']:
      rows.append(_table_row(f'step time growth L={length // 4}->{length}', {
          p: (s / _median_step(results['train'][quarter][p]) if s and
              _median_step(results['train'][quarter].get(p, {})) else None)
          for p, s in step.items()}, peers, None))
  return rows


def decode_rows(results):
  """Markdown rows of the decoding measurements (tokens/s; retrax / peer)."""
  peers, rows = results['peers'], []
  faster = lambda base, other: base / other  # retrax / peer
  for tokens in sorted(int(n) for n in results['decode']):
    row = results['decode'][str(tokens)]
    batches = sorted({int(b) for r in row.values() for b in r
                      if b.isdigit()})
    for batch in batches:
      rows.append(_table_row(f'decode {tokens} tokens, batch {batch}, tok/s', {
          p: r.get(str(batch), {}).get('tok_s') for p, r in row.items()},
                             peers, faster))
    if len(batches) > 1:
      top = batches[-1]
      rows.append(_table_row(
          f'decode {tokens} tokens: batch {top} / batch {batches[0]} tok/s', {
              p: r[str(top)]['tok_s'] / r[str(batches[0])]['tok_s']
              if str(top) in r and str(batches[0]) in r else None
              for p, r in row.items()}, peers, None))
  return rows


def format_table(results):
  """The whole Markdown table (header, train rows, decode rows)."""
  peers = results['peers']
  names = {'retrax': 'retrax', BF16: 'retrax bf16', 'trax': 'Trax 1.4.1',
           'hf': 'HF (PyTorch)'}
  header = (['', *[names[p] for p in peers]] +
            ['bf16 speedup' if p == BF16 else f'{names[p]} vs retrax'
             for p in peers[1:]])
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '---|' * len(header)]
  return '\n'.join(lines + train_rows(results) + decode_rows(results))


def errors(results):
  """`'<what>: <error>'` for every failed worker."""
  out = []
  for kind in ('train', 'decode'):
    for key, row in results[kind].items():
      out += [f'{kind} {key} {peer}: {r["error"]}' for peer, r in row.items()
              if 'error' in r]
  return out
