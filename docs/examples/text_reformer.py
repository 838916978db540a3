# %% [markdown]
# # A Reformer language model on a text file, trained and sampled
#
# A notebook-style walk-through (each `# %%` block is a cell; VS Code and
# Jupytext open it as a notebook). It trains a small byte-level `ReformerLM`
# with LSH attention on any text file, evaluates it on a held-out tail of the
# file, and samples text from a prompt. Run it whole:
#
#     python docs/examples/text_reformer.py [TEXT_FILE] [--steps 600]
#
# By default it reads the repository's `LICENSE` (11 KB of English). Measured
# with the defaults on the project's 2-core CPU while ~20 other jobs shared it
# (load 17-25): 240 s of CPU time (16 min wall), held-out loss 6.00 -> 2.06
# nats per byte (accuracy 0.53), and the sample
# 'Licensed under the Work or Derivative Works thereof, in or shall of auther
# ted communications, or p'. On an unshared machine the wall time is at most
# about the CPU time (4 min), under the 5 minutes this example aims for;
# `--steps` trades time for quality.
# In a notebook, `import retrax.compat; retrax.compat.install()` first lets
# the same cells be written with `import trax`.

# %%
import argparse
import functools
import os
import time

import numpy as np

import retrax as trax
from retrax import layers as tl
from retrax.supervised import decoding
from retrax.supervised import training

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TEXT = os.path.join(HERE, '..', '..', 'LICENSE')

# %% [markdown]
# ## Data: bytes of the file, a held-out tail, random training windows
#
# Byte-level: token ids are the UTF-8 bytes (vocabulary 256), so no tokenizer
# is needed (`trax.data.Tokenize(vocab_type='sentencepiece', vocab_file=...)`
# plugs in here for subwords). The last 10% of the file is never trained on.


# %%
def read_ids(path, eval_fraction=0.1):
  """(train_ids, eval_ids): the file's bytes, split into head and tail."""
  with open(path, 'rb') as f:
    ids = np.frombuffer(f.read(), np.uint8).astype(np.int32)
  split = int(len(ids) * (1 - eval_fraction))
  return ids[:split], ids[split:]


def random_windows(ids, length, seed):
  """Endless (inputs, targets) pairs: random windows of the training bytes."""
  rng = np.random.default_rng(seed)
  while True:
    start = rng.integers(0, len(ids) - length)
    window = ids[start:start + length]
    yield window, window


def held_out_windows(ids, length):
  """The held-out bytes cut into consecutive windows, over and over."""
  while True:
    for start in range(0, len(ids) - length + 1, length):
      window = ids[start:start + length]
      yield window, window


def streams(path, length, batch_size):
  train_ids, eval_ids = read_ids(path)
  if len(eval_ids) < length or len(train_ids) < 2 * length:
    raise ValueError(f'{path}: {len(train_ids)} + {len(eval_ids)} bytes is too '
                     f'short for windows of {length}.')
  pipeline = lambda source: trax.data.Serial(  # pylint: disable=g-long-lambda
      source, trax.data.Batch(batch_size), trax.data.AddLossWeights())
  train = pipeline(lambda _: random_windows(train_ids, length, seed=0))
  evals = pipeline(lambda _: held_out_windows(eval_ids, length))
  return train(), evals()


# %% [markdown]
# ## The model: ReformerLM with LSH attention
#
# Since Trax 1.3.7 models end in logits, so the loss is
# `WeightedCategoryCrossEntropy` (it takes logits; `CrossEntropyLoss` wants
# log-probabilities and retrax warns if it gets logits).


# %%
def reformer(mode, d_model, n_layers, length):
  # ReformerLM builds each attention layer as attention_type(n_heads=..., d_qk=
  # ..., causal=True, mode=...); the partial fixes LSH's own settings.
  attention = functools.partial(
      tl.LSHSelfAttention, chunk_len=32, n_hashes=2,
      predict_mem_len=length, predict_drop_len=length)
  return trax.models.ReformerLM(
      vocab_size=256, d_model=d_model, d_ff=2 * d_model, n_layers=n_layers,
      n_heads=2, d_attention_key=d_model // 2, d_attention_value=d_model // 2,
      max_len=length, dropout=0.0, attention_type=attention, mode=mode)


def train(path, output_dir, n_steps, d_model, n_layers, length, batch_size):
  train_stream, eval_stream = streams(path, length, batch_size)
  task = training.TrainTask(
      train_stream, tl.WeightedCategoryCrossEntropy(),
      trax.optimizers.Adam(0.002),
      lr_schedule=trax.lr.warmup_and_rsqrt_decay(min(100, n_steps), 0.002),
      n_steps_per_checkpoint=n_steps)
  eval_task = training.EvalTask(
      eval_stream, [tl.WeightedCategoryCrossEntropy(),
                    tl.WeightedCategoryAccuracy()], n_eval_batches=4)
  loop = training.Loop(reformer('train', d_model, n_layers, length), task,
                       eval_tasks=[eval_task], output_dir=output_dir,
                       eval_at=lambda step: step in (1, n_steps))
  loop.run(n_steps)
  return loop


# %% [markdown]
# ## Sampling: the same model in predict mode, weights from the checkpoint
#
# `init_from_file` reads the `model.pkl.gz` the Loop wrote (Trax's file);
# `retrax.load_run(output_dir)` does the same from the run's `model.json`.


# %%
def sample(output_dir, prompt, d_model, n_layers, length, n_bytes,
           temperature=0.5):
  model = reformer('predict', d_model, n_layers, length)
  model.init_from_file(os.path.join(output_dir, 'model.pkl.gz'),
                       weights_only=True,
                       input_signature=trax.shapes.ShapeDtype((1, 1), np.int32))
  prompt_ids = np.frombuffer(prompt.encode('utf-8'), np.uint8).astype(np.int32)
  out = decoding.autoregressive_sample(
      model, prompt=prompt_ids[None], temperature=temperature, eos_id=None,
      max_length=min(n_bytes, length - len(prompt_ids)),
      rng=trax.fastmath.random.get_prng(0))
  return prompt + bytes(np.asarray(out[0], np.uint8)).decode('utf-8',
                                                             'replace')


# %%
def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('text', nargs='?', default=DEFAULT_TEXT)
  parser.add_argument('--output_dir', default='runs/text_reformer')
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--d_model', type=int, default=128)
  parser.add_argument('--n_layers', type=int, default=2)
  parser.add_argument('--length', type=int, default=128)
  parser.add_argument('--batch_size', type=int, default=16)
  parser.add_argument('--prompt', default='Licensed under the ')
  parser.add_argument('--n_bytes', type=int, default=80)
  args = parser.parse_args(argv)
  t0 = time.time()
  loop = train(args.text, args.output_dir, args.steps, args.d_model,
               args.n_layers, args.length, args.batch_size)
  t_train = time.time() - t0
  text = sample(args.output_dir, args.prompt, args.d_model, args.n_layers,
                args.length, args.n_bytes)
  history = loop.history
  eval_loss = history.get('eval', 'metrics/WeightedCategoryCrossEntropy')
  print(f'held-out loss (nats/byte): {eval_loss[0][1]:.3f} at step '
        f'{eval_loss[0][0]} -> {eval_loss[-1][1]:.3f} at step '
        f'{eval_loss[-1][0]}; trained in {t_train:.0f} s, '
        f'{time.time() - t0:.0f} s in all')
  print(f'SAMPLE {text!r}')
  return loop, text


if __name__ == '__main__':
  main()
