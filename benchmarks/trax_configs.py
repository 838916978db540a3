"""Trax 1.4.1's own gin configs on retrax: parse, train, build (not CI).

    git --git-dir=<mirror of google/trax> archive v1.4.1 | tar -x -C /tmp/trax141
    pip install -e ".[gin]"
    python benchmarks/trax_configs.py --trax-src /tmp/trax141 [--steps 20]
        [--parts parse,synthetic,models] [--json out.json]

Three measures of "Trax's experiments run unchanged", each config in a fresh
interpreter (gin's registry and bindings are per process):

* parse: every `trax/supervised/configs/*.gin` parses (with the configs'
  folder on gin's search path, for their `include`s). On Trax 1.4.1, 52 of
  the 75 parse; the other 23 import the `t5` package.
* synthetic: the 7 configs on synthetic data train `--steps` steps through
  `python -m retrax.trainer --config_file=X.gin --config='train.steps=N'`,
  as written otherwise (their sizes, batch and schedule); prints the train
  loss at the first and last step.
* models: the configs that read TFDS or T2T data build their `train.model`
  from the config and train one step on random data of the dataset's kind
  (sequences are cut to `--length` tokens; `t5` imports are skipped).
"""

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

SYNTHETIC = ('reformer_copy', 'gru_copy', 'reformer_addition', 'rse_addition',
             'terraformer_copy', 'terraformer_purelsh_copy',
             'terraformer_copy_self_attn')

# The models of configs on TFDS/T2T data, their data's kind and a length:
# 'lm' (tokens), 'seq2seq' (source and target tokens), 'image' (images and
# class labels, (height, width, channels)), 'text_class' (tokens and labels).
# The length is `--length` where None; the hourglass shortens by 3 and needs
# a multiple of 3 (Trax too), the IMDB encoder's positions stop at 512.
MODELS = {
    'reformer_enwik8': ('lm', None, None),
    'reformer_imagenet64': ('lm', None, None),
    'reformer_wmt_ende': ('seq2seq', None, None),
    'terraformer_wmt_ende': ('seq2seq', None, None),
    'transformer_lm1b_8gb_testing': ('lm', None, None),
    'wide_resnet_cifar10_8gb': ('image', (32, 32, 3), None),
    'mlp_mnist': ('image', (28, 28, 1), None),
    'hourglass_enwik8': ('lm', None, 1026),
    'transformer_imdb_tfds': ('text_class', None, 512),
    'lstm_lm1b': ('lm', None, None),
}


def _run(args, timeout):
  """`(rc, stdout, stderr, seconds)` of a fresh interpreter's run."""
  start = time.perf_counter()
  try:
    out = subprocess.run([sys.executable, *args], capture_output=True,
                         text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return 124, '', f'timed out after {timeout} s', timeout
  return out.returncode, out.stdout, out.stderr, time.perf_counter() - start


def parse_all(config_dir):
  """`{file: 'ok' or the error's first line}` for every config."""
  code = ('import glob, json, os, sys, gin\n'
          'from retrax import compat\n'
          'compat.install()  # The configs `import trax.models` etc.\n'
          'gin.add_config_file_search_path(sys.argv[1])\n'
          'res = {}\n'
          'for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.gin"))):\n'
          '  gin.clear_config()\n'
          '  try:\n'
          '    gin.parse_config_file(f); res[os.path.basename(f)] = "ok"\n'
          '  except Exception as e:\n'
          '    res[os.path.basename(f)] = (type(e).__name__ + ": " +\n'
          '                                str(e).splitlines()[0])[:160]\n'
          'print(json.dumps(res))\n')
  rc, out, err, _ = _run(['-c', code, config_dir], 600)
  if rc:
    raise RuntimeError(err[-2000:])
  return json.loads(out.strip().splitlines()[-1])


def _train_losses(output_dir):
  """`{step: train loss}` from a run's metrics log."""
  losses = {}
  with open(os.path.join(output_dir, 'metrics.jsonl')) as f:
    for line in f:
      record = json.loads(line)
      if record['mode'] == 'train' and record['metric'] == 'training/loss':
        losses[record['step']] = record['value']
  return losses


def train_synthetic(config_dir, name, steps, timeout):
  """Trains one synthetic-data config through `python -m retrax.trainer`."""
  with tempfile.TemporaryDirectory() as tmp:
    rc, _, err, seconds = _run(
        ['-m', 'retrax.trainer',
         f'--config_file={os.path.join(config_dir, name + ".gin")}',
         f'--config=train.steps = {steps}',
         f'--config=train.eval_frequency = {max(1, steps // 4)}',
         '--config=train.eval_steps = 1', f'--output_dir={tmp}/run'], timeout)
    losses = _train_losses(f'{tmp}/run') if rc == 0 else {}
  first, last = (losses[min(losses)], losses[max(losses)]) if losses else (
      None, None)
  return dict(config=name, rc=rc, seconds=round(seconds, 1),
              losses={str(k): v for k, v in sorted(losses.items())},
              falling=bool(losses) and max(losses) == steps and last < first,
              error='' if rc == 0 else err.strip().splitlines()[-1][:300])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--trax-src', required=True,
                      help='a Trax v1.4.1 checkout (its trax/ folder inside)')
  parser.add_argument('--parts', default='parse,synthetic,models')
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--length', type=int, default=1024,
                      help='tokens per sequence in the one-step model runs')
  parser.add_argument('--timeout', type=int, default=3600)
  parser.add_argument('--json', help='write the results here too')
  args = parser.parse_args(argv)
  config_dir = os.path.join(args.trax_src, 'trax', 'supervised', 'configs')
  if not glob.glob(os.path.join(config_dir, '*.gin')):
    parser.error(f'no gin configs in {config_dir}')
  parts = args.parts.split(',')
  results = {}
  if 'parse' in parts:
    results['parse'] = parse_all(config_dir)
    _print_parse(results['parse'])
  if 'synthetic' in parts:
    results['synthetic'] = []
    for name in SYNTHETIC:
      row = train_synthetic(config_dir, name, args.steps, args.timeout)
      results['synthetic'].append(row)
      _print_synthetic(row)
  if 'models' in parts:
    results['models'] = []
    for name in MODELS:
      row = one_step(config_dir, name, args.length, args.timeout)
      results['models'].append(row)
      print(f'{name:30s} rc {row["rc"]}  {row["seconds"]:7.1f} s  '
            f'{row["summary"]}', flush=True)
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)
  return 0


def _print_parse(parsed):
  ok = sorted(name for name, outcome in parsed.items() if outcome == 'ok')
  print(f'parse: {len(ok)} of {len(parsed)} configs parse')
  for name, outcome in sorted(parsed.items()):
    if outcome != 'ok':
      print(f'  {name}: {outcome}')


def _print_synthetic(row):
  losses = list(row['losses'].values())
  trend = (f'train loss {losses[0]:.6f} -> {losses[-1]:.6f}'
           f' ({"falling" if row["falling"] else "NOT falling"})'
           if losses else row['error'])
  print(f'{row["config"]:30s} rc {row["rc"]}  {row["seconds"]:7.1f} s  '
        f'{trend}', flush=True)


# The one-step run of a TFDS/T2T config, in its own interpreter.
_ONE_STEP = '''
import json, os, re, sys, tempfile
import jax
import numpy as np
import gin
from retrax import compat
compat.install()
from retrax import data
from retrax.supervised import trainer_lib
config_dir, name, kind, shape, length = sys.argv[1:6]
text = open(os.path.join(config_dir, name + '.gin')).read()
skipped = re.findall(r'^import t5[^\\n]*$', text, flags=re.M)
text = re.sub(r'^import t5[^\\n]*$', '', text, flags=re.M)
gin.add_config_file_search_path(config_dir)
gin.parse_config(text, skip_unknown=bool(skipped))
length, rng = int(length), np.random.default_rng(0)

def batches():
  while True:
    if kind in ('lm', 'seq2seq'):
      x = rng.integers(1, 200, (1, length)).astype(np.int32)
      y = rng.integers(1, 200, (1, length)).astype(np.int32)
      yield (x, y if kind == 'seq2seq' else x, np.ones_like(x, np.float32))
    elif kind == 'image':
      x = rng.random((2,) + eval(shape)).astype(np.float32)
      yield x, rng.integers(0, 10, (2,)).astype(np.int32), np.ones(2, np.float32)
    else:
      x = rng.integers(1, 200, (2, length)).astype(np.int32)
      yield x, rng.integers(0, 2, (2,)).astype(np.int32), np.ones(2, np.float32)

with tempfile.TemporaryDirectory() as tmp:
  loop = trainer_lib.train(output_dir=tmp, steps=1, eval_steps=1,
                           eval_frequency=1,
                           inputs=data.make_inputs(batches(), batches()))
  losses = [r for r in map(json.loads, open(os.path.join(tmp, 'metrics.jsonl')))
            if r['mode'] == 'train' and r['metric'] == 'training/loss']
  model = gin.query_parameter('train.model').configurable.name
  n_weights = sum(int(np.prod(w.shape)) for w in
                  jax.tree_util.tree_leaves(loop.model.weights))
  print(f'{model}: {n_weights:,} weights, step {loop.step}, train loss '
        f'{losses[-1]["value"]:.4f}' + (' (t5 import skipped)' if skipped else ''))
'''


def one_step(config_dir, name, length, timeout):
  """Builds `name`'s model from the config and trains it one step."""
  kind, shape, own_length = MODELS[name]
  rc, out, err, seconds = _run(
      ['-c', _ONE_STEP, config_dir, name, kind, repr(shape),
       str(own_length or length)], timeout)
  # On an error, its last line (JAX's traceback note follows it).
  lines = [line for line in (out if rc == 0 else err).strip().splitlines()
           if not line.startswith(('For simplicity', '-----'))]
  return dict(config=name, rc=rc, seconds=round(seconds, 1),
              summary=lines[-1][:300] if lines else '')


if __name__ == '__main__':
  sys.exit(main())
