"""`retrax.load_run` on a run made from Python: model.json + the Loop's checkpoint."""

import functools
import json
import os
import pathlib

import numpy as np
import pytest

import retrax
from retrax import layers as tl
from retrax import models
from retrax import optimizers
from retrax import run_layout
from retrax.models import registry
from retrax.supervised import decoding
from retrax.supervised import training


def _batches(seed=0):
  rng = np.random.default_rng(seed)
  while True:
    x = rng.integers(1, 16, size=(2, 8)).astype(np.int32)
    yield x, x, np.ones((2, 8), np.float32)


def _train(model, out):
  task = training.TrainTask(_batches(), tl.WeightedCategoryCrossEntropy(),
                            optimizers.Adam(1e-2), n_steps_per_checkpoint=2)
  loop = training.Loop(model, [task], output_dir=out, random_seed=0,
                       options=training.LoopOptions(progress_bar=False,
                                                    write_trax_files=False))
  loop.run(2)
  return loop


@pytest.mark.slow
def test_loop_run_of_a_retrax_model_loads_back(tmp_path):
  out = str(tmp_path / 'run')
  model = models.TransformerLM(vocab_size=16, d_model=8, d_ff=16, n_layers=1,
                               n_heads=2, max_len=16, dropout=0.0)
  loop = _train(model, out)
  doc = json.loads(pathlib.Path(out, run_layout.MODEL_FILE).read_text())
  assert doc['constructor'] == 'TransformerLM'
  assert doc['kwargs']['d_model'] == 8 and 'mode' not in doc['kwargs']

  run = retrax.load_run(out, mode='eval', batch_size=2)
  assert run.config is None and run.tokenizer is None
  assert os.path.basename(run.checkpoint) == 'ckpt_000000002'
  x = next(_batches(5))[0]
  reference = models.TransformerLM(vocab_size=16, d_model=8, d_ff=16,
                                   n_layers=1, n_heads=2, max_len=16,
                                   dropout=0.0, mode='eval')
  reference.init(retrax.shapes.signature(x))
  reference.weights = loop.model.weights
  np.testing.assert_allclose(np.asarray(run.model(x)),
                             np.asarray(reference(x)), rtol=1e-6, atol=1e-6)

  # Predict mode: greedy decoding equals re-running the eval model on the
  # growing sequence and taking the argmax of the last position.
  predicted = retrax.load_run(out)
  tokens = np.asarray(decoding.autoregressive_sample(
      predicted.model, batch_size=1, temperature=0.0, eos_id=None,
      max_length=4, prompt=x[:1, :3]))[0]
  seq = list(x[0, :3])
  for _ in range(4):
    inp = np.asarray([seq], np.int32)
    one = models.TransformerLM(vocab_size=16, d_model=8, d_ff=16, n_layers=1,
                               n_heads=2, max_len=16, dropout=0.0, mode='eval')
    one.init(retrax.shapes.signature(inp))
    one.weights = loop.model.weights
    # The model shifts right: position i predicts token i from tokens < i.
    logits = np.asarray(one(np.concatenate([inp, [[0]]], axis=1)))
    seq.append(int(np.argmax(logits[0, len(seq)])))
  np.testing.assert_array_equal(tokens, seq[3:])


def test_layer_arguments_are_stored_by_name(tmp_path):
  attention = functools.partial(tl.SelfAttention, chunk_len=4,
                                n_chunks_before=1)
  model = models.ReformerLM(vocab_size=16, d_model=8, d_ff=16,
                            d_attention_key=4, d_attention_value=4,
                            n_layers=1, n_heads=2, max_len=8, dropout=0.0,
                            attention_type=attention)
  spec = registry.constructor_of(model)
  assert spec['kwargs']['attention_type'] == {
      'layer': 'SelfAttention', 'kwargs': {'chunk_len': 4,
                                           'n_chunks_before': 1}}
  path = registry.write_model_file(str(tmp_path), model)
  again = registry.build_from_file(path, mode='eval')
  sig = retrax.shapes.ShapeDtype((1, 8), np.int32)
  assert (registry.constructor_of(again)['kwargs'] == spec['kwargs'])
  w1, _ = model.init(sig)
  w2, _ = again.init(sig)
  shapes = lambda w: [np.shape(a) for a in retrax.fastmath.tree_leaves(w)]
  assert shapes(w1) == shapes(w2)


def test_models_with_unstorable_arguments_have_no_model_file(tmp_path):
  model = models.MLP(layer_widths=(4,), activation_fn=lambda: tl.Relu())
  assert registry.constructor_of(model) is None
  assert registry.write_model_file(str(tmp_path), model) is None
  plain = tl.Serial(tl.Dense(2))
  assert registry.constructor_of(plain) is None
  with pytest.raises(FileNotFoundError, match='no model.json'):
    retrax.load_run(str(tmp_path))
