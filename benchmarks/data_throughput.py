"""Throughput of the retrax.data text pipeline, against a hand-written loop.

Claim: the pipeline streams a large text file (default 1 GB) through
tokenization and batching with bounded memory, at a speed close to a plain
Python read + encode + pad loop doing the same work.

The script writes a synthetic corpus (Zipf-distributed pseudo-words, lines of
5-60 words) into a temporary folder, then for each tokenizer (UTF-8 bytes and
a SentencePiece model trained here on a sample of the corpus) runs, each in a
fresh child process so that peak RSS is per run:

* baseline: ``for line in open(...)``: encode, group 32 lines, pad into an
  int64 array, weights = (ids != 0);
* pipeline: ``Serial(TextLines, Tokenize, Dup, Batch(32), AddLossWeights)``;
* grouped (SentencePiece only): the same with ``Tokenize(group_size=256)``,
  which encodes 256 lines per call on all cores.

It prints examples/s, tokens/s, peak RSS and pipeline/baseline speed ratio.

Usage::

  python benchmarks/data_throughput.py --size-mb 64     # about a minute
  python benchmarks/data_throughput.py                  # 1 GB
"""

import argparse
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from retrax import data

_BLOCK_BYTES = 1 << 20


def write_corpus(path, size_mb, seed=0, n_blocks=64):
  """Writes ~size_mb MiB of text: shuffled copies of n_blocks random blocks."""
  rng = np.random.RandomState(seed)
  letters = np.array(list('abcdefghijklmnopqrstuvwxyz'))
  words = np.array([''.join(rng.choice(letters, rng.randint(1, 10)))
                    for _ in range(20000)], dtype=object)
  probs = 1.0 / np.arange(1, len(words) + 1)  # Zipf's law.
  probs /= probs.sum()
  blocks = []
  for _ in range(n_blocks):
    # ~6 bytes per word: draw all words of a 1 MiB block at once.
    drawn = words[rng.choice(len(words), _BLOCK_BYTES // 5, p=probs)]
    lengths = rng.randint(5, 61, size=len(drawn) // 5)
    lines, start, size = [], 0, 0
    for n in lengths:
      line = ' '.join(drawn[start:start + n])
      start += n
      if start > len(drawn) or size >= _BLOCK_BYTES:
        break
      if rng.rand() < 0.1:
        line = line.capitalize() + '.'
      lines.append(line)
      size += len(line) + 1
    blocks.append(('\n'.join(lines) + '\n').encode('utf-8'))
  with open(path, 'wb') as f:
    for _ in range(size_mb):
      f.write(blocks[rng.randint(n_blocks)])
  return os.path.getsize(path)


def _peak_rss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _pad_batch(rows):
  out = np.zeros((len(rows), max(len(r) for r in rows)), np.int64)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def _baseline(path, encode, batch_size):
  """Hand-written loop: read lines, encode, pad batches, make weights."""
  n_examples = n_tokens = 0
  rows = []
  with open(path, encoding='utf-8', errors='replace') as f:
    for line in f:
      line = line.rstrip('\n')
      if not line.strip():
        continue
      rows.append(encode(line))
      if len(rows) == batch_size:
        x = _pad_batch(rows)
        w = (x != 0).astype(np.float32)
        n_examples += len(rows)
        n_tokens += int(w.sum())
        rows = []
  return n_examples, n_tokens


def _pipeline(path, tokenize, batch_size):
  """The same work through retrax.data."""
  pipeline = data.Serial(
      data.TextLines(path, skip_empty=True),
      tokenize,
      data.Dup(),
      data.Batch(batch_size),
      data.AddLossWeights(id_to_mask=0),
  )
  n_examples = n_tokens = 0
  for _, _, w in pipeline():
    n_examples += w.shape[0]
    n_tokens += int(w.sum())
  return n_examples, n_tokens


def _make_run(kind, tokenizer, model, batch_size):
  """Builds the (kind, tokenizer) measurement; run in a child process."""
  if tokenizer == 'bytes':
    encoder = data.ByteTextEncoder(num_reserved_ids=0)
    encode = encoder.encode_array
    tok = data.Tokenize(vocab_type='bytes')
  else:
    encoder = data.SentencePieceVocabulary(model)
    encode = lambda s: np.asarray(encoder.encode(s), np.int64)
    tok = data.Tokenize(vocab_type='sentencepiece', vocab_file=model,
                        group_size=256 if kind == 'grouped' else 1)
  if kind == 'baseline':
    return lambda path: _baseline(path, encode, batch_size)
  return lambda path: _pipeline(path, tok, batch_size)


def _child(conn, kind, tokenizer, model, batch_size, path):
  run = _make_run(kind, tokenizer, model, batch_size)
  start = time.perf_counter()
  n_examples, n_tokens = run(path)
  seconds = time.perf_counter() - start
  conn.send((n_examples, n_tokens, seconds, _peak_rss_mb()))
  conn.close()


def measure(kind, tokenizer, model, batch_size, path):
  ctx = multiprocessing.get_context('fork')
  parent, child = ctx.Pipe()
  proc = ctx.Process(target=_child,
                     args=(child, kind, tokenizer, model, batch_size, path))
  proc.start()
  result = parent.recv()
  proc.join()
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--size-mb', type=int, default=1024,
                      help='corpus size in MiB (default 1024 = 1 GiB)')
  parser.add_argument('--batch-size', type=int, default=32)
  parser.add_argument('--spm-vocab', type=int, default=8000)
  parser.add_argument('--spm-sample-mb', type=int, default=4,
                      help='MiB of the corpus used to train SentencePiece')
  parser.add_argument('--tokenizers', default='bytes,sentencepiece')
  parser.add_argument('--tmpdir', default=None)
  args = parser.parse_args(argv)

  tmp = tempfile.mkdtemp(prefix='retrax_data_bench_', dir=args.tmpdir)
  try:
    path = os.path.join(tmp, 'corpus.txt')
    start = time.perf_counter()
    size = write_corpus(path, args.size_mb)
    print(f'corpus: {size / 2**20:.0f} MiB in {time.perf_counter() - start:.1f}'
          f' s at {path}')
    model = None
    if 'sentencepiece' in args.tokenizers:
      sample = os.path.join(tmp, 'sample.txt')
      with open(path, 'rb') as src, open(sample, 'wb') as dst:
        dst.write(src.read(min(size, args.spm_sample_mb << 20)))
      start = time.perf_counter()
      model = data.train_sentencepiece(sample, os.path.join(tmp, 'spm'),
                                       vocab_size=args.spm_vocab,
                                       num_threads=os.cpu_count() or 1)
      print(f'sentencepiece: trained {args.spm_vocab} pieces on '
            f'{args.spm_sample_mb} MiB in {time.perf_counter() - start:.1f} s')
    print(f'{"tokenizer":<14}{"run":<10}{"examples/s":>12}{"tokens/s":>14}'
          f'{"MiB/s":>8}{"peak RSS MiB":>14}{"seconds":>9}')
    for tokenizer in args.tokenizers.split(','):
      results = {}
      kinds = ['baseline', 'pipeline']
      if tokenizer == 'sentencepiece':
        kinds.append('grouped')  # Tokenize(group_size=256): batched encode.
      for kind in kinds:
        n_ex, n_tok, secs, rss = measure(kind, tokenizer, model,
                                         args.batch_size, path)
        results[kind] = (n_ex, n_tok, secs)
        print(f'{tokenizer:<14}{kind:<10}{n_ex / secs:>12,.0f}'
              f'{n_tok / secs:>14,.0f}{size / 2**20 / secs:>8.1f}'
              f'{rss:>14.0f}{secs:>9.1f}')
      be, bt, bs = results.pop('baseline')
      for kind, (pe, pt, ps) in results.items():
        if (be, bt) != (pe, pt):
          raise RuntimeError(f'{tokenizer}/{kind}: saw {pe} examples / {pt} '
                             f'tokens, baseline {be} / {bt}.')
        print(f'{tokenizer:<14}ratio     {kind}/baseline speed = '
              f'{bs / ps:.2f}x  ({pe:,} examples, {pt:,} tokens)')
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == '__main__':
  main()
