"""Decoding speed of every predict-mode model: retrax's compiled decoder vs Trax 1.4.1.

`python benchmarks/decode.py --vs-trax` runs this: for each model, the same
constructor arguments build it in retrax (in this process) and in Trax 1.4.1
(a subprocess of the oracle venv, one model at a time), both decode
`--tokens` tokens at batch 1 with `autoregressive_sample` (temperature 1,
no early stop; an encoder-decoder from a 16-token source), and the second
call is timed, continuing from the state the first left (as decoding twice
in trax/intro.ipynb does). retrax's first call compiles its programs; the
`recompiles` column counts XLA compilations during the timed call (must be
0). Trax's `autoregressive_sample` runs one jitted step per token from
Python (`tl.Accelerate`). Sizes: 2 layers (encoder and decoder),
d_model 128, d_ff 256, 4 heads, vocabulary 256.

This file runs under both interpreters: it needs only numpy and the library
it is handed (`retrax` or `trax`), whose `models` and `layers` mirror each
other, so one `build` makes the same model in both.

Run directly, it is the Trax side (in the oracle venv):
  python benchmarks/decode_vs_trax.py --models Transformer,RNNLM --tokens 128
"""

import argparse
import functools
import json
import os
import subprocess
import time

import numpy as np

VOCAB = 256
SOURCE_LEN = 16
_SIZES = dict(d_model=128, d_ff=256)
_MEM = 1024  # Predict memory of efficient attention: two decodings fit.
_SELF_ATTENTION = ('SelfAttention', dict(predict_mem_len=_MEM,
                                         predict_drop_len=_MEM))
_TERRAFORMER_MAX_LEN = 256  # Its predict mode pads the source to max_len.

# name: (constructor, arguments, source: None (a language model), 'short'
# (SOURCE_LEN tokens) or 'padded' (SOURCE_LEN tokens zero-padded to max_len)).
SPECS = {
    'TransformerLM': ('TransformerLM', dict(
        vocab_size=VOCAB, n_layers=2, n_heads=4, max_len=2048, **_SIZES), None),
    'Transformer': ('Transformer', dict(
        input_vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=2,
        n_heads=4, max_len=2048, **_SIZES), 'short'),
    'ReformerLM': ('ReformerLM', dict(
        vocab_size=VOCAB, n_layers=2, n_heads=4, d_attention_key=32,
        d_attention_value=32, max_len=2048, attention_type=_SELF_ATTENTION,
        **_SIZES), None),
    'Reformer': ('Reformer', dict(
        input_vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=2,
        n_heads=4, max_len=2048, **_SIZES), 'short'),
    'ConfigurableTransformerLM': ('ConfigurableTransformerLM', dict(
        vocab_size=VOCAB, n_layers=2, n_heads=4, max_len=2048, **_SIZES),
                                  None),
    'ConfigurableTransformer': ('ConfigurableTransformer', dict(
        input_vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=2,
        n_heads=4, max_len=2048, **_SIZES), 'short'),
    'ConfigurableTerraformer': ('ConfigurableTerraformer', dict(
        input_vocab_size=VOCAB, n_encoder_layers=2, n_decoder_layers=2,
        n_heads=4, d_attention_key=32, d_attention_value=32,
        max_len=_TERRAFORMER_MAX_LEN, encoder_attention_type=_SELF_ATTENTION,
        encoder_decoder_attention_type=_SELF_ATTENTION, **_SIZES), 'padded'),
    'RNNLM': ('RNNLM', dict(vocab_size=VOCAB, d_model=128, n_layers=2), None),
    'GRULM': ('GRULM', dict(vocab_size=VOCAB, d_model=128, n_layers=2), None),
    'LSTMSeq2SeqAttn': ('LSTMSeq2SeqAttn', dict(
        input_vocab_size=VOCAB, target_vocab_size=VOCAB, d_model=128,
        n_encoder_layers=2, n_decoder_layers=2, n_attention_heads=4),
                        'short'),
}

# Trax's Reformer decoder builds `tl.SelfAttention` itself and asserts it has
# predict_mem_len and predict_drop_len, which only gin can set; these are
# retrax's defaults for them.
TRAX_GIN = {'Reformer': 'SelfAttention.predict_mem_len = 2048\n'
                        'SelfAttention.predict_drop_len = 256'}


def build(lib, name):
  """`(model in predict mode, initialized; source or None)` of `SPECS[name]` in `lib`."""
  constructor, kwargs, source_kind = SPECS[name]
  kwargs = dict(kwargs)
  for key, value in kwargs.items():
    if isinstance(value, tuple) and isinstance(value[0], str):
      kwargs[key] = functools.partial(getattr(lib.layers, value[0]),
                                      **value[1])
  model = getattr(lib.models, constructor)(mode='predict', **kwargs)
  tokens = lib.shapes.ShapeDtype((1, 1), np.int32)
  source = None
  if source_kind is not None:
    source = np.random.RandomState(1).randint(2, VOCAB, (1, SOURCE_LEN))
    if source_kind == 'padded':
      source = np.pad(source, ((0, 0), (0, _TERRAFORMER_MAX_LEN - SOURCE_LEN)))
    source = source.astype(np.int32)
  signature = tokens if source is None else (
      lib.shapes.ShapeDtype(source.shape, np.int32), tokens)
  model.init(signature)
  return model, source


def time_decoding(sample, model, source, n_tokens, compiles=None):
  """`{'first_s', 'second_s', 'tok_per_s', 'recompiles'}` of two `sample` calls.

  The second call is timed; `compiles` (a list that grows at each XLA
  compilation, or None) counts those it makes.
  """
  kwargs = dict(inputs=source, batch_size=1, temperature=1.0, eos_id=None,
                max_length=n_tokens)
  if 'rng' in sample.__code__.co_varnames:
    kwargs['rng'] = 0
  else:  # Trax samples with np.random's state; eos_id -1 never matches.
    np.random.seed(0)
    kwargs['eos_id'] = -1
  times, counts = [], []
  for _ in range(2):
    counts.append(len(compiles or ()))
    start = time.perf_counter()
    out = np.asarray(sample(model, **kwargs))
    times.append(time.perf_counter() - start)
  assert out.shape == (1, n_tokens), out.shape
  return dict(first_s=times[0], second_s=times[1],
              tok_per_s=n_tokens / times[1],
              recompiles=None if compiles is None else
              len(compiles) - counts[1])


def _load():
  return os.getloadavg()[0]


def trax_worker(names, n_tokens):
  """Times Trax 1.4.1 on each model in turn (inside the oracle venv): RESULT lines."""
  from trax import layers, models, shapes  # pylint: disable=import-outside-toplevel
  from trax.supervised import decoding  # pylint: disable=import-outside-toplevel
  lib = argparse.Namespace(layers=layers, models=models, shapes=shapes)
  for name in names:
    row = dict(model=name, load=_load())
    try:
      if name in TRAX_GIN:
        import gin  # pylint: disable=import-outside-toplevel
        gin.parse_config(TRAX_GIN[name])
      model, source = build(lib, name)
      if name in TRAX_GIN:
        gin.clear_config()
      row.update(time_decoding(decoding.autoregressive_sample, model, source,
                               n_tokens))
    except Exception as e:  # pylint: disable=broad-except
      row['error'] = f'{type(e).__name__}: {" ".join(str(e).split())[:300]}'
    print('RESULT ' + json.dumps(row), flush=True)


def retrax_row(name, n_tokens, compiles):
  """Times retrax's compiled decoder on model `name` (this process)."""
  from retrax import layers, models, shapes  # pylint: disable=import-outside-toplevel
  from retrax.supervised import decoding  # pylint: disable=import-outside-toplevel
  lib = argparse.Namespace(layers=layers, models=models, shapes=shapes)
  row = dict(model=name, load=_load())
  model, source = build(lib, name)
  row.update(time_decoding(decoding.autoregressive_sample, model, source,
                           n_tokens, compiles))
  return row


def trax_rows(names, n_tokens, python, timeout):
  """Runs `trax_worker` in the oracle venv: `{model: row}`."""
  cmd = [python, os.path.abspath(__file__), '--models', ','.join(names),
         '--tokens', str(n_tokens)]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  rows = {name: dict(model=name, error='no result') for name in names}
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    lines = proc.stdout.splitlines()
  except subprocess.TimeoutExpired as e:
    out = e.stdout or b''
    lines = (out.decode() if isinstance(out, bytes) else out).splitlines()
  for line in lines:
    if line.startswith('RESULT '):
      row = json.loads(line[len('RESULT '):])
      rows[row['model']] = row
  return rows


def _fmt(row, key, spec):
  return format(row[key], spec) if key in row else 'fails'


def table(retrax, trax):
  """The printed table's lines."""
  lines = [f'{"model":26s} {"retrax tok/s":>12s} {"Trax tok/s":>10s} '
           f'{"ratio":>7s} {"recompiles":>10s} {"1st call s retrax/Trax":>22s} '
           f'{"load retrax/Trax":>16s}']
  for name, mine in retrax.items():
    theirs = trax.get(name, {})
    ratio = (f'{mine["tok_per_s"] / theirs["tok_per_s"]:6.1f}x'
             if 'tok_per_s' in theirs else '   n/a')
    firsts = f'{mine["first_s"]:.1f} / {_fmt(theirs, "first_s", ".1f")}'
    loads = f'{mine["load"]:.1f} / {_fmt(theirs, "load", ".1f")}'
    lines.append(f'{name:26s} {mine["tok_per_s"]:12.1f} '
                 f'{_fmt(theirs, "tok_per_s", "10.1f"):>10s} {ratio:>7s} '
                 f'{mine["recompiles"]:10d} {firsts:>22s} {loads:>16s}')
  return lines


def run(names, n_tokens, python, timeout, out_path):
  """`decode.py --vs-trax`: retrax's rows, then Trax's, a table and JSON."""
  import jax  # pylint: disable=import-outside-toplevel
  compiles = []
  jax.monitoring.register_event_duration_secs_listener(
      lambda name, *a, **k: compiles.append(name)
      if 'backend_compile' in name else None)
  print(f'{n_tokens} tokens, batch 1, 2 layers, d_model 128, vocab {VOCAB}; '
        f'devices {jax.devices()}', flush=True)
  retrax = {}
  for name in names:
    retrax[name] = retrax_row(name, n_tokens, compiles)
    print(f'retrax {name}: {retrax[name]}', flush=True)
  trax = trax_rows(names, n_tokens, python, timeout)
  for name in names:
    print(f'Trax 1.4.1 {name}: {trax[name]}', flush=True)
  print('\n'.join(table(retrax, trax)))
  ratios = [retrax[n]['tok_per_s'] / trax[n]['tok_per_s'] for n in names
            if 'tok_per_s' in trax[n]]
  if ratios:
    print(f'min ratio {min(ratios):.1f}x (target >= 5x)')
  with open(out_path, 'w') as f:
    json.dump(dict(tokens=n_tokens, specs={n: repr(SPECS[n]) for n in names},
                   retrax=retrax, trax=trax), f, indent=1)
  print(f'wrote {out_path}')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--models', default=','.join(SPECS))
  parser.add_argument('--tokens', type=int, default=128)
  args = parser.parse_args()
  trax_worker(args.models.split(','), args.tokens)


if __name__ == '__main__':
  main()
