"""Run by test_model_families_multiprocess.py, as 2 processes or as 1.

`python model_families_worker.py OUT [COORDINATOR PROCESS_ID]`: trains each
model family of `FAMILIES` for 2 steps on the same global batches (each of
2 processes feeds its half, `devices.host_shard`) and process 0 writes
`{family: [train and eval losses]}` to OUT (.json).
"""

import functools
import json
import sys

import supervised_toys as toys
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax.supervised import devices
from retrax.supervised import training

VOCAB, LENGTH, BATCH = 32, 16, 4
_SMALL = dict(d_model=16, d_ff=32, n_heads=2, dropout=0.0)
_LSH = functools.partial(tl.LSHSelfAttention, chunk_len=4, n_hashes=2)
_CHUNKED = functools.partial(tl.SelfAttention, chunk_len=4)

# Every family trains on (x, x, weights): a language model reads x and the
# loss takes x as targets; Terraformer reads (source, target) = (x, x) and
# passes the target tokens on to the loss itself.
FAMILIES = {
    'TransformerLM (dense)': functools.partial(
        models.TransformerLM, VOCAB, n_layers=1, max_len=LENGTH, **_SMALL),
    'ReformerLM (LSH, reversible)': functools.partial(
        models.ReformerLM, VOCAB, n_layers=2, max_len=LENGTH,
        attention_type=_LSH, d_attention_key=8, d_attention_value=8,
        **_SMALL),
    'ReformerLM (chunked SelfAttention)': functools.partial(
        models.ReformerLM, VOCAB, n_layers=1, max_len=LENGTH,
        attention_type=_CHUNKED, d_attention_key=8, d_attention_value=8,
        **_SMALL),
    'ConfigurableTerraformer': functools.partial(
        models.ConfigurableTerraformer, VOCAB, n_encoder_layers=1,
        n_decoder_layers=1, max_len=LENGTH, d_attention_key=8,
        d_attention_value=8, encoder_attention_type=_LSH,
        encoder_decoder_attention_type=_CHUNKED, **_SMALL),
    'GRULM': functools.partial(models.GRULM, VOCAB, d_model=16, n_layers=1),
}


def losses(make_model, n_processes):
  def stream(seed):
    batches = toys.copy_batches(seed, BATCH, LENGTH, VOCAB)
    return devices.host_shard(batches) if n_processes > 1 else batches
  task = training.TrainTask(stream(0), tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(0.01))
  eval_task = training.EvalTask(stream(100),
                                [tl.WeightedCategoryCrossEntropy()])
  loop = training.Loop(make_model(), task, eval_tasks=eval_task,
                       eval_at=lambda _: True, random_seed=0,
                       options=training.LoopOptions(progress_bar=False))
  loop.run(2)
  return [v for mode in ('train', 'eval') for _, v in loop.history.get(
      mode, 'metrics/WeightedCategoryCrossEntropy')]


def main(out, coordinator=None, process_id=None):
  n_processes = 1
  if coordinator is not None:
    n_processes = 2
    devices.initialize_distributed(coordinator, n_processes, int(process_id))
  result = {name: losses(make, n_processes) for name, make in FAMILIES.items()}
  if process_id in (None, '0'):
    with open(out, 'w') as f:
      json.dump(result, f)


if __name__ == '__main__':
  main(*sys.argv[1:])
