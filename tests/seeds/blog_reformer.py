# The Japanese Trax blog's program (shared/seeds/trax_reformer_blog_ja.txt), as a
# Trax user runs it. Changes from the blog are only those Trax itself needed
# between versions: `model.pkl` became `model.pkl.gz`; ReformerLM stopped ending
# in LogSoftmax (Trax 1.3+), so the model adds it back for `CrossEntropyLoss`
# and `exp(logits)` sampling; the output dir comes from argv, not `~/train_dir/`.
import os
import sys

import numpy as onp
import jax.numpy as np

import trax

output_dir = sys.argv[1]
n_epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 3


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


onp.random.seed(0)
batch_size = 16
vocab_size = 32
sentence_length = 10
copy_inputs = trax.supervised.Inputs(
    lambda _: copy_task(batch_size, vocab_size, sentence_length))

data_stream = copy_inputs.train_stream(1)
inputs, targets, weights = next(data_stream)
print(inputs[0], targets[0], weights[0])


def tiny_reformer_lm(mode):
  return trax.layers.Serial(
      trax.models.ReformerLM(
          d_model=32, d_ff=128, n_layers=2, vocab_size=32, mode=mode),
      trax.layers.LogSoftmax())


trainer = trax.supervised.Trainer(
    model=tiny_reformer_lm,
    loss_fn=trax.layers.CrossEntropyLoss,
    optimizer=trax.optimizers.Adam,
    lr_schedule=trax.lr.MultifactorSchedule,
    inputs=copy_inputs,
    output_dir=output_dir,
    has_weights=True)

train_steps = 500
eval_steps = 2
for _ in range(n_epochs):
  trainer.train_epoch(train_steps, eval_steps)

# Initialize model for inference.
model_infer = tiny_reformer_lm(mode='predict')

# Set up the initial state for sampling.
initial_state = model_infer.new_weights_and_state(
    trax.supervised.trainer_lib.ShapeDtype((1, 1), dtype=np.int32))[1]

# load pretrained weight
model_infer.init_from_file(os.path.join(output_dir, 'model.pkl.gz'),
                           weights_only=True)


def prediction(prompt, length=2048):
  """Sample from the ReformerLM model"""
  model_infer.state = initial_state
  cur_inputs = np.zeros((1, 1), dtype=np.int32)
  prompt = np.asarray(prompt)
  all_samples = []
  for iteration in range(length):
    logits = model_infer(cur_inputs)
    if iteration < prompt.shape[0]:
      cur_samples = onp.array(prompt[iteration], dtype=int)
    else:
      logits = onp.array(logits)[0, 0, :]
      probs = onp.exp(logits)
      cur_samples = onp.random.choice(probs.shape[-1], p=probs[:])
      cur_samples = onp.array(cur_samples, dtype=int)
    all_samples.append(cur_samples)
    cur_inputs = np.array(cur_samples[None, None])
  all_samples = onp.stack(all_samples, -1)
  return all_samples


prefix = [0, 1, 2, 3, 2, 0]
onp.random.seed(0)  # Not in the blog: makes this test's sampling repeatable.
print('SAMPLE', ' '.join(map(str, prediction(prefix, 10))))
