# The Japanese Trax blog's program (shared/seeds/trax_reformer_blog_ja.txt) in
# the form Trax 1.4 needs: `training.Loop` instead of the removed
# `supervised.Trainer`/`Inputs`; ReformerLM returns raw logits (sampling
# normalises them); predict-mode SelfAttention needs `predict_mem_len` and
# `predict_drop_len`; `init_from_file(..., weights_only=True)` is called with
# no signature (Trax takes the one stored in the file: the training batch of
# 16) and the model is then fed batch-1 tokens. Sizes: the blog's model with
# 2 heads of depth 16 (those of the Trax-written golden fixture).
#
#   python -m retrax.compat blog_reformer_trax14.py OUTPUT_DIR [TRAIN_STEPS]
#
# With TRAIN_STEPS 0 it decodes with the model.pkl.gz already in OUTPUT_DIR.
import functools
import os
import sys

import numpy as onp

import trax
from trax import layers as tl
from trax.supervised import training

output_dir = sys.argv[1]
train_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300


def copy_task(batch_size, vocab_size, length):
  """This task is to copy a random string w, so the input is 0w0w."""
  while True:
    assert length % 2 == 0
    w_length = (length // 2) - 1
    w = onp.random.randint(low=1, high=vocab_size-1, size=(batch_size, w_length))
    zero = onp.zeros([batch_size, 1], onp.int32)
    loss_weights = onp.concatenate([onp.zeros((batch_size, w_length)),
                                    onp.ones((batch_size, w_length+2))], axis=1)
    x = onp.concatenate([zero, w, zero, w], axis=1)
    yield (x, x, loss_weights)  # =(Inputs, Targets, Weights)


def tiny_reformer_lm(mode, attention_type=tl.SelfAttention):
  return trax.models.ReformerLM(
      d_model=32, d_ff=128, n_layers=2, vocab_size=32, n_heads=2,
      d_attention_key=16, d_attention_value=16, max_len=64,
      attention_type=attention_type, mode=mode)


onp.random.seed(0)
if train_steps:
  task = training.TrainTask(
      labeled_data=copy_task(16, 32, 10),
      loss_layer=tl.WeightedCategoryCrossEntropy(),
      optimizer=trax.optimizers.Adam(0.01),
      n_steps_per_checkpoint=train_steps)
  loop = training.Loop(tiny_reformer_lm('train'), [task],
                       output_dir=output_dir)
  loop.run(train_steps)

model_infer = tiny_reformer_lm(
    'predict', attention_type=functools.partial(
        tl.SelfAttention, predict_mem_len=16, predict_drop_len=16))
model_infer.init_from_file(os.path.join(output_dir, 'model.pkl.gz'),
                           weights_only=True)
initial_state = model_infer.state


def prediction(prompt, length=2048):
  """Sample from the ReformerLM model"""
  model_infer.state = initial_state
  cur_inputs = onp.zeros((1, 1), dtype=onp.int32)
  prompt = onp.asarray(prompt)
  all_samples = []
  for iteration in range(length):
    logits = model_infer(cur_inputs)
    if iteration < prompt.shape[0]:
      cur_samples = onp.array(prompt[iteration], dtype=int)
    else:
      logits = onp.array(logits)[0, 0, :].astype(onp.float64)
      probs = onp.exp(logits - logits.max())
      cur_samples = onp.random.choice(probs.shape[-1], p=probs / probs.sum())
      cur_samples = onp.array(cur_samples, dtype=int)
    all_samples.append(cur_samples)
    cur_inputs = onp.array(cur_samples[None, None], dtype=onp.int32)
  all_samples = onp.stack(all_samples, -1)
  return all_samples


onp.random.seed(1)
copies = 0
for _ in range(10):
  w = list(onp.random.randint(1, 31, size=4))
  sample = prediction([0] + w + [0], 10)
  print('SAMPLE', ' '.join(map(str, sample)))
  copies += list(sample[6:]) == w
print(f'COPIES {copies}/10')
