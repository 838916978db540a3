"""`retrax convert` with Hugging Face's ReformerModelWithLMHead, both ways.

Without torch: HF directories written here with HF's tensor names and
layouts (`_hf_tensors`, from transformers' modeling_reformer) convert into a
run whose weights sit where HF's layout says, and back bit for bit; the HF
models stored in tests/fixtures/hf_reformer (with their logits, loss and
greedy generation, written there by transformers) give, converted, HF's
logits for HF's inputs, its loss and its tokens. With the torch peer venv
(../shared/tools/setup_torch_peer.sh; skipped without it): HF's own models,
built afresh, give the same logits in retrax, and a run written back loads in
transformers with the same tensors and logits.
"""

import functools
import json
import os
import pathlib
import subprocess

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy as st_numpy

import retrax
from retrax.app import cli
from retrax.app import hf_runs
from retrax import layers as tl
from retrax import models
from retrax.models import registry
from retrax.models.reformer import hf_reformer
from retrax.checkpoints import convert
from retrax.checkpoints import hf_files
from retrax.checkpoints import native
from retrax.checkpoints.tree import flatten_weights_and_state
from retrax.supervised import checkpointing
from retrax.supervised import decoding
from tests.backend_tolerance import float32_tolerance

PEER_SCRIPT = pathlib.Path(__file__).with_name('hf_reformer_peer.py')
FIXTURES = pathlib.Path(__file__).parents[1] / 'fixtures' / 'hf_reformer'
# ReformerConfig kwargs: 'lsh_axial' has mixed layers, axial positions,
# factorised buckets and a chunked feed-forward; 'local_plain' local
# attention and learned positions.
SPECS = json.loads((FIXTURES / 'specs.json').read_text())
# HF's LSH draws rotations [head size, num_hashes, sum(num_buckets) / 2].
ROTATIONS = np.load(FIXTURES / 'rotations.npy')


def _hf_tensors(cfg, rng, dtype=np.float32):
  """Random tensors under HF's names, in HF's (torch Linear: [out, in]) shapes."""
  m, f, v = cfg['hidden_size'], cfg['feed_forward_size'], cfg['vocab_size']
  hd = cfg['num_attention_heads'] * cfg['attention_head_size']
  shapes = {'reformer.embeddings.word_embeddings.weight': (v, m),
            'reformer.encoder.layer_norm.weight': (2 * m,),
            'reformer.encoder.layer_norm.bias': (2 * m,),
            'lm_head.decoder.weight': (v, 2 * m), 'lm_head.decoder.bias': (v,),
            'lm_head.bias': (v,)}
  if cfg['axial_pos_embds']:
    (a0, a1), (d0, d1) = cfg['axial_pos_shape'], cfg['axial_pos_embds_dim']
    shapes['reformer.embeddings.position_embeddings.weights.0'] = (a0, 1, d0)
    shapes['reformer.embeddings.position_embeddings.weights.1'] = (1, a1, d1)
  else:
    shapes['reformer.embeddings.position_embeddings.embedding.weight'] = (
        cfg['max_position_embeddings'], m)
  for i, kind in enumerate(cfg['attn_layers']):
    p = f'reformer.encoder.layers.{i}.'
    projections = ['query', 'key', 'value'] if kind == 'local' else [
        'query_key', 'value']
    for name in projections:
      shapes[f'{p}attention.self_attention.{name}.weight'] = (hd, m)
    shapes.update({
        f'{p}attention.layer_norm.weight': (m,),
        f'{p}attention.layer_norm.bias': (m,),
        f'{p}attention.output.dense.weight': (m, hd),
        f'{p}feed_forward.layer_norm.weight': (m,),
        f'{p}feed_forward.layer_norm.bias': (m,),
        f'{p}feed_forward.dense.dense.weight': (f, m),
        f'{p}feed_forward.dense.dense.bias': (f,),
        f'{p}feed_forward.output.dense.weight': (m, f),
        f'{p}feed_forward.output.dense.bias': (m,)})
  return {k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}


def _write_hf_dir(path, cfg, tensors):
  path.mkdir()
  (path / 'config.json').write_text(json.dumps(dict(
      cfg, model_type='reformer', architectures=['ReformerModelWithLMHead'])))
  st_numpy.save_file(tensors, str(path / 'model.safetensors'),
                     metadata={'format': 'pt'})
  return path


def _same_files(a, b):
  """HF directories `a` and `b` hold equal configs and bit-identical tensors."""
  assert (json.loads((a / 'config.json').read_text()) ==
          json.loads((b / 'config.json').read_text()))
  ta, tb = hf_files.read_tensors(a), hf_files.read_tensors(b)
  assert sorted(ta) == sorted(tb)
  for k in ta:
    assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, k
    assert ta[k].tobytes() == tb[k].tobytes(), k


def test_config_maps_to_reformer_lm_arguments():
  kwargs = hf_reformer.lm_kwargs(SPECS['lsh_axial'])
  lsh, local = kwargs['attention_type'][0], kwargs['attention_type'][1]
  assert [a.func for a in kwargs['attention_type']] == [
      tl.LSHSelfAttention, tl.SelfAttention, tl.LSHSelfAttention]
  assert lsh.keywords == dict(chunk_len=4, n_chunks_before=1, n_chunks_after=0,
                              n_hashes=2, n_buckets=[2, 4])
  assert local.keywords == dict(chunk_len=4, n_chunks_before=1,
                                n_chunks_after=0)
  assert (kwargs['vocab_size'], kwargs['d_model'], kwargs['d_ff'],
          kwargs['n_layers'], kwargs['n_heads'], kwargs['d_attention_key'],
          kwargs['d_attention_value'], kwargs['max_len']) == (
              20, 16, 32, 3, 2, 4, 4, 32)
  assert (kwargs['pos_type'], kwargs['pos_axial_shape'],
          kwargs['pos_d_axial_embs']) == ('axial', (4, 8), (4, 12))
  assert kwargs['ff_activation'] is tl.Gelu and kwargs['ff_chunk_size'] == 4
  assert kwargs['dropout'] == 0.05  # HF's default hidden_dropout_prob.
  assert kwargs['shift_right'] is False  # HF's position t predicts t+1.
  plain = hf_reformer.lm_kwargs(SPECS['local_plain'])
  assert plain['pos_type'] is None and plain['ff_activation'] is tl.FastGelu
  assert plain['attention_type'][0].keywords['chunk_len'] == 8


def test_run_arguments_map_back_to_the_hf_config():
  model = models.MODELS['ReformerLM'](
      **hf_reformer.lm_kwargs(SPECS['lsh_axial']), mode='eval')
  cfg = hf_reformer.hf_config(registry.constructor_of(model)['kwargs'])
  for key, value in SPECS['lsh_axial'].items():
    if key != 'layer_norm_eps':  # Without a base config: Trax's 1e-6.
      assert cfg[key] == value, key
  assert cfg['layer_norm_eps'] == 1e-6 and cfg['is_decoder']
  assert cfg['lsh_num_chunks_after'] == cfg['local_num_chunks_after'] == 0
  # Unchunked SelfAttention is one local chunk covering max_len positions.
  full = models.MODELS['ReformerLM'](20, d_model=8, n_layers=1, max_len=64,
                                     pos_type=None, mode='eval')
  cfg = hf_reformer.hf_config(registry.constructor_of(full)['kwargs'])
  assert (cfg['attn_layers'], cfg['local_attn_chunk_length'],
          cfg['local_num_chunks_before'], cfg['hidden_act'],
          cfg['axial_pos_embds']) == (['local'], 64, 0, 'gelu_fast', False)


def _error_of(fn, *args):
  with pytest.raises(hf_reformer.HFReformerError) as e:
    fn(*args)
  message = str(e.value)
  assert '\n' not in message
  return message


@pytest.mark.parametrize('change, named', [
    (dict(is_decoder=False), 'is_decoder'),
    (dict(hidden_act='mish'), 'hidden_act'),
    (dict(layer_norm_eps=1e-3), 'layer_norm_eps'),
    (dict(lsh_num_chunks_after=1), 'lsh_num_chunks_after'),
    (dict(attn_layers=['local', 'global']), 'attn_layers'),
    (dict(axial_pos_embds_dim=[4, 4]), 'axial_pos_embds_dim'),
    (dict(num_hashes=0), 'num_hashes'),
    (dict(hidden_act={'gelu': 1}), 'hidden_act'),
    (dict(axial_pos_shape=32), 'axial_pos_shape'),
    (dict(hidden_dropout_prob=None), 'hidden_dropout_prob'),
    (dict(attn_layers=3), 'attn_layers'),
])
def test_hf_settings_retrax_cannot_compute_are_refused(change, named):
  assert named in _error_of(hf_reformer.lm_kwargs,
                            dict(SPECS['lsh_axial'], **change))


@pytest.mark.parametrize('change, named', [
    (dict(pos_type='sin-cos'), 'pos_type'),
    (dict(ff_activation=functools.partial(tl.LeakyRelu, a=0.1)), 'LeakyRelu'),
    (dict(d_attention_value=8), 'd_attention_value'),
    (dict(attention_type=[functools.partial(tl.SelfAttention, chunk_len=4),
                          functools.partial(tl.SelfAttention, chunk_len=8)]),
     'local attention layers differ'),
    (dict(attention_type=functools.partial(tl.LSHSelfAttention, bias=True)),
     'bias'),
])
def test_runs_hf_cannot_express_are_refused(change, named):
  kwargs = dict(vocab_size=20, d_model=16, d_ff=32, n_layers=2, n_heads=2,
                max_len=32, mode='eval')
  model = models.MODELS['ReformerLM'](**dict(kwargs, **change))
  assert named in _error_of(hf_reformer.hf_config,
                            registry.constructor_of(model)['kwargs'])


def _flat_weights(run_dir):
  run = retrax.load_run(run_dir, mode='eval')
  return flatten_weights_and_state(run.model.weights, run.model.state)[0]


def test_safetensors_directory_converts_and_comes_back_bit_for_bit(tmp_path):
  cfg = SPECS['lsh_axial']
  tensors = _hf_tensors(cfg, np.random.RandomState(0))
  hf_dir = _write_hf_dir(tmp_path / 'hf', cfg, tensors)
  assert cli.main(['convert', str(hf_dir), str(tmp_path / 'run')]) == 0
  flat = [np.asarray(w) for w in _flat_weights(tmp_path / 'run')]
  np.testing.assert_array_equal(
      flat[1][0, :, 0, :],
      tensors['reformer.embeddings.position_embeddings.weights.0'][:, 0, :])
  q = tensors['reformer.encoder.layers.0.attention.self_attention.'
              'query_key.weight']
  for h in range(2):  # Rows h*D .. h*D+D-1 of HF's [H*D, M] are head h.
    np.testing.assert_array_equal(flat[5][h], q[4 * h:4 * h + 4].T)
  o = tensors['reformer.encoder.layers.0.attention.output.dense.weight']
  np.testing.assert_array_equal(flat[7][1], o[:, 4:8].T)
  np.testing.assert_array_equal(
      flat[10], tensors['reformer.encoder.layers.0.feed_forward.dense.dense.'
                        'weight'].T)
  np.testing.assert_array_equal(flat[-2], tensors['lm_head.decoder.weight'].T)
  np.testing.assert_array_equal(flat[-1], tensors['lm_head.decoder.bias'])
  assert cli.main(['convert', str(tmp_path / 'run'), str(tmp_path / 'back'),
                   '--to', 'hf']) == 0
  _same_files(hf_dir, tmp_path / 'back')


def test_checkpoint_convert_points_hf_directories_to_hf_runs(tmp_path):
  cfg = SPECS['local_plain']
  hf_dir = _write_hf_dir(tmp_path / 'hf', cfg,
                         _hf_tensors(cfg, np.random.RandomState(0)))
  with pytest.raises(convert.CheckpointFormatError, match='hf_runs.convert'):
    convert.convert(hf_dir, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def test_bfloat16_and_plain_positions_round_trip(tmp_path):
  cfg = SPECS['local_plain']
  tensors = _hf_tensors(cfg, np.random.RandomState(1), ml_dtypes.bfloat16)
  del tensors['lm_head.decoder.bias']  # transformers 4: lm_head.bias, tied.
  hf_dir = _write_hf_dir(tmp_path / 'hf', cfg, tensors)
  hf_runs.convert(hf_dir, tmp_path / 'run')
  flat = _flat_weights(tmp_path / 'run')
  assert flat[1].dtype == ml_dtypes.bfloat16
  assert np.asarray(flat[-1]).tobytes() == tensors['lm_head.bias'].tobytes()
  np.testing.assert_array_equal(
      np.asarray(flat[1]).astype(np.float32),
      tensors['reformer.embeddings.position_embeddings.embedding.weight']
      .astype(np.float32))
  hf_runs.convert(tmp_path / 'run', tmp_path / 'back', to='hf')
  _same_files(hf_dir, tmp_path / 'back')


def test_a_trained_run_without_hf_config_writes_a_full_hf_config(tmp_path):
  model = models.MODELS['ReformerLM'](
      20, d_model=16, d_ff=32, d_attention_key=4, d_attention_value=4,
      n_layers=2, n_heads=2, max_len=32, pos_axial_shape=(4, 8),
      pos_d_axial_embs=(8, 8),
      attention_type=[functools.partial(tl.SelfAttention, chunk_len=4),
                      functools.partial(tl.LSHSelfAttention, chunk_len=4,
                                        n_buckets=4)], mode='eval')
  signature = retrax.shapes.ShapeDtype((1, 32), np.int32)
  model.init(signature)
  native.save_native(checkpointing.permanent_path(tmp_path / 'run', 7),
                     {'weights': model.weights, 'input_signature': signature},
                     {'step': 7})
  registry.write_model_file(tmp_path / 'run', model)
  hf_runs.convert(tmp_path / 'run', tmp_path / 'hf', to='hf')
  cfg = json.loads((tmp_path / 'hf' / 'config.json').read_text())
  assert (cfg['attn_layers'], cfg['num_buckets'], cfg['axial_pos_shape'],
          cfg['hidden_act'], cfg['lsh_attention_probs_dropout_prob']) == (
              ['local', 'lsh'], 4, [4, 8], 'gelu_fast', 0.1)
  tensors = hf_files.read_tensors(tmp_path / 'hf')
  flat = flatten_weights_and_state(model.weights, model.state)[0]
  np.testing.assert_array_equal(tensors['lm_head.decoder.weight'],
                                np.asarray(flat[-2]).T)
  np.testing.assert_array_equal(tensors['lm_head.bias'], np.asarray(flat[-1]))


def test_sharded_pytorch_weights_are_one_line(tmp_path):
  hf_dir = tmp_path / 'hf'
  hf_dir.mkdir()
  (hf_dir / 'config.json').write_text(json.dumps(SPECS['local_plain']))
  (hf_dir / 'pytorch_model.bin.index.json').write_text('{"weight_map": {}}')
  assert 'save_pretrained' in _error_of(hf_runs.convert, hf_dir,
                                        tmp_path / 'run')


def test_pytorch_bin_without_torch_is_one_line(tmp_path, capsys):
  try:
    import torch  # noqa: F401
    pytest.skip('torch is installed here; the error is for its absence')
  except ImportError:
    pass
  hf_dir = tmp_path / 'hf'
  hf_dir.mkdir()
  (hf_dir / 'config.json').write_text(json.dumps(SPECS['local_plain']))
  (hf_dir / 'pytorch_model.bin').write_bytes(b'PK\x03\x04')
  assert cli.main(['convert', str(hf_dir), str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert '\n' not in err and 'safetensors' in err
  # The CPU wheel: plain `pip install torch` fetches a CUDA build of GBs.
  assert ('pip install torch --index-url https://download.pytorch.org/whl/cpu'
          in err)
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize('via_cli', [True, False])
def test_hf_directory_without_weights_names_what_it_looked_for(
    tmp_path, capsys, via_cli):
  hf_dir = tmp_path / 'hf'
  hf_dir.mkdir()
  (hf_dir / 'config.json').write_text(json.dumps(SPECS['local_plain']))
  (hf_dir / 'tf_model.h5').write_bytes(b'')
  if via_cli:
    assert cli.main(['convert', str(hf_dir), str(tmp_path / 'run')]) == 2
    message = capsys.readouterr().err.strip()
  else:
    message = _error_of(hf_runs.convert, hf_dir, tmp_path / 'run')
  assert '\n' not in message and str(hf_dir) in message
  assert ('looked for model.safetensors, model.safetensors.index.json, '
          'pytorch_model.bin, pytorch_model.bin.index.json; found '
          'config.json, tf_model.h5.') in message
  assert not (tmp_path / 'run').exists()


# --- against HF's outputs stored in tests/fixtures/hf_reformer ------------------


@pytest.fixture(scope='module')
def stored_hf(tmp_path_factory):
  """`{name: (run converted from the stored HF model, HF's outputs)}`."""
  out = tmp_path_factory.mktemp('stored_hf')
  return {name: (hf_runs.convert(FIXTURES / name, out / name),
                 dict(np.load(FIXTURES / f'{name}.npz')))
          for name in SPECS}


@pytest.fixture
def fixed_rotations(monkeypatch):
  """Makes retrax's LSH hash with ROTATIONS, as the stored HF outputs did."""
  normal = jax.random.normal

  def fixed_normal(key, shape=(), dtype=float, *args, **kwargs):
    if tuple(shape) == ROTATIONS.shape:  # LSH's rotations [d, hashes, r].
      return jax.numpy.asarray(ROTATIONS, dtype)
    return normal(key, shape, dtype, *args, **kwargs)
  monkeypatch.setattr(jax.random, 'normal', fixed_normal)


_RTOL = float32_tolerance(rtol=1e-5, atol=0)['rtol']


def _relative_error(got, expected):
  assert got.shape == expected.shape
  return float(np.abs(got - expected).max() / np.abs(expected).max())


def _eval_model(run_dir, batch_size=2):
  """The run's eval-mode model and its logits function (compiled once)."""
  model = retrax.load_run(run_dir, mode='eval', batch_size=batch_size).model
  call = jax.jit(lambda x, state: model.pure_fn(x, model.weights, state,
                                                model.rng))
  return model, call


@pytest.mark.parametrize('name', sorted(SPECS))
def test_converted_runs_give_hf_logits_and_loss_for_hf_inputs(
    stored_hf, name, fixed_rotations):
  run_dir, hf = stored_hf[name]
  with open(os.path.join(run_dir, 'model.json')) as f:
    assert json.load(f)['kwargs']['shift_right'] is False
  model, call = _eval_model(run_dir)
  assert not registry.shifts_right(model)
  ids = hf['ids'].astype(np.int32)  # HF's inputs as they are, no shift.
  logits = np.asarray(call(ids, model.state)[0])
  # Measured: 2e-6 on a CPU, 1.5e-4 on a TPU v5e.
  assert _relative_error(logits, hf['logits']) <= _RTOL
  scored = hf_runs.scored_outputs(model, logits, ids,
                                  np.ones(ids.shape, np.float32))
  loss = float(tl.WeightedCategoryCrossEntropy()(scored))
  assert abs(loss - float(hf['loss'])) <= 1e-5 * float(hf['loss'])


def test_trax_convention_keeps_trax_s_shift(stored_hf):
  """Built with Trax's ShiftRight, the same weights give for `ids` HF's
  logits for `[0] + ids[:-1]`; scoring and decoding stay Trax's."""
  run_dir, hf = stored_hf['local_plain']
  converted = retrax.load_run(run_dir, mode='eval').model
  kwargs = dict(hf_reformer.lm_kwargs(SPECS['local_plain']), mode='eval')
  del kwargs['shift_right']  # Trax's default.
  model = models.MODELS['ReformerLM'](**kwargs)
  ids = hf['ids'].astype(np.int32)
  model.init(retrax.shapes.ShapeDtype(ids.shape, np.int32))
  # The same weights; Trax's tree has the ShiftRight's empty entry first.
  model.weights = model.weights[:1] + tuple(converted.weights)
  assert registry.shifts_right(model)
  logits = np.asarray(jax.jit(model.pure_fn)(ids, model.weights, model.state,
                                             model.rng)[0])
  assert _relative_error(logits, hf['shifted_logits']) <= _RTOL
  weights = np.ones(ids.shape, np.float32)
  assert hf_runs.scored_outputs(model, logits, ids, weights)[1] is ids
  assert hf_runs.decoding_start(model, ids) == (0, ids)


@pytest.mark.slow
def test_lsh_logits_vary_between_hashings_as_hf_s_do(stored_hf):
  """LSH hashes with random rotations on every call, in HF and here: eight
  retrax draws differ from HF's eight stored draws as much as those differ
  among themselves, and pick the same top token as often. (Measured: 0.99x
  the distance and 1.01x the agreement; with Trax's shift, 1.58x and 0.48x.)"""
  run_dir, hf = stored_hf['lsh_axial']
  model, call = _eval_model(run_dir)
  ids = hf['ids'].astype(np.int32)
  ours, state = [], model.state
  for _ in hf['draws']:  # Each call advances the hashing key in the state.
    logits, state = call(ids, state)
    ours.append(np.asarray(logits))
  assert np.abs(ours[0] - ours[1]).max() > 0.1
  distance = lambda a, b: np.abs(a - b).mean()
  agreement = lambda a, b: (a.argmax(-1) == b.argmax(-1)).mean()
  theirs = list(hf['draws'])
  assert (_mean_over_pairs(ours, theirs, distance) <=
          1.2 * _mean_over_pairs(theirs, theirs, distance))
  assert (_mean_over_pairs(ours, theirs, agreement) >=
          0.8 * _mean_over_pairs(theirs, theirs, agreement))


def _mean_over_pairs(a, b, fn):
  """`fn(a[i], b[j])` averaged over the pairs, i != j when `a is b`."""
  return np.mean([fn(x, y) for i, x in enumerate(a) for j, y in enumerate(b)
                  if a is not b or i != j])


@pytest.mark.parametrize('mode', ['predict', 'eval'])
def test_greedy_sampling_continues_a_prompt_as_hf_generate(stored_hf, mode):
  """Fast decoding, and eval mode's rerun of the whole sequence per token."""
  run_dir, hf = stored_hf['local_plain']
  model = retrax.load_run(run_dir, mode=mode, batch_size=2).model
  prompt = hf['prompt'].astype(np.int32)
  start, rest = hf_runs.decoding_start(model, prompt)
  np.testing.assert_array_equal(start, prompt[:, :1])  # No start symbol.
  out = decoding.autoregressive_sample(
      model, batch_size=2, temperature=0.0, start_id=start, prompt=rest,
      eos_id=None, max_length=hf['generated'].shape[1],
      eval_mode=mode == 'eval')
  np.testing.assert_array_equal(out, hf['generated'])
  if mode == 'eval':  # The stream reruns the sequence its own way.
    stream = decoding.autoregressive_sample_stream(
        model, batch_size=2, temperature=0.0, start_id=start, prompt=rest,
        eval_mode=True)
    np.testing.assert_array_equal(
        np.stack([next(stream) for _ in range(out.shape[1])], axis=1), out)


def test_convert_says_which_convention_the_logits_follow(tmp_path, capsys):
  run_dir, back = tmp_path / 'run', tmp_path / 'back'
  assert cli.main(['convert', str(FIXTURES / 'local_plain'), str(run_dir)]) == 0
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == str(run_dir) and len(printed) == 3
  assert printed[2].startswith('no tokenizer: ')  # tests/cli/test_hf_tokenizer.py
  assert "load_run(DST).model(x) gives HF's model(x).logits" in printed[1]
  assert 'shift_right=false' in printed[1]
  assert cli.main(['convert', str(run_dir), str(back), '--to', 'hf']) == 0
  printed = capsys.readouterr().out.splitlines()
  assert printed[0] == str(back)
  assert "HF's model(x).logits are the run's logits for x" in printed[1]
  trax_run = tmp_path / 'trax_run'  # Trained in retrax: Trax's shift.
  trax_run.mkdir()
  model = models.MODELS['ReformerLM'](20, d_model=8, d_ff=8, n_layers=1,
                                      n_heads=1, max_len=16, mode='eval')
  registry.write_model_file(trax_run, model)
  assert "model([0] + x[:-1]).logits are the run's logits for x" in (
      hf_runs.convention_note(trax_run, 'hf'))


# --- against transformers, in the torch peer venv -------------------------------


def _torch_python():
  """The torch peer's python with transformers' Reformer, or None."""
  default = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.expanduser(
      '~/.cache'), 'torch-peer-venv', 'bin', 'python')
  python = os.environ.get('TORCH_PY') or default
  if not os.path.isfile(python):
    return None
  probe = subprocess.run([python, '-c', 'import transformers.models.reformer'],
                         capture_output=True, check=False)
  return python if probe.returncode == 0 else None


def _peer(python, *args):
  result = subprocess.run([python, str(PEER_SCRIPT), *map(str, args)],
                          capture_output=True, text=True, check=False,
                          env=dict(os.environ, TOKENIZERS_PARALLELISM='false'))
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope='module')
def hf_models(tmp_path_factory):
  """HF's models of SPECS saved by save_pretrained, with their logits."""
  python = _torch_python()
  if python is None:
    pytest.skip('no torch peer venv (source ../shared/tools/'
                'setup_torch_peer.sh, or set TORCH_PY)')
  out = tmp_path_factory.mktemp('hf_models')
  ids = np.random.RandomState(5).randint(1, 20, size=(2, 16)).astype(np.int64)
  np.save(out / 'ids.npy', ids)
  np.save(out / 'rotations.npy', ROTATIONS)
  (out / 'spec.json').write_text(json.dumps(SPECS))
  _peer(python, 'build', out / 'spec.json', out)
  return python, out, ids


@pytest.mark.parametrize('name', sorted(SPECS))
def test_logits_equal_hf_after_convert(hf_models, name, tmp_path,
                                       fixed_rotations):
  _, out, ids = hf_models
  hf_runs.convert(out / name, tmp_path / 'run')
  model = retrax.load_run(tmp_path / 'run', mode='eval',
                          batch_size=len(ids)).model
  got = np.asarray(model(ids.astype(np.int32)))  # HF's inputs, unshifted.
  assert _relative_error(got, np.load(out / f'{name}.logits.npy')) <= 1e-5


def test_hf_round_trip_is_bit_identical_and_loads_in_transformers(hf_models,
                                                                  tmp_path):
  python, out, _ = hf_models
  hf_runs.convert(out / 'lsh_axial', tmp_path / 'run')
  hf_runs.convert(tmp_path / 'run', tmp_path / 'back', to='hf')
  _same_files(out / 'lsh_axial', tmp_path / 'back')
  _peer(python, 'load', tmp_path / 'back', out / 'ids.npy',
        out / 'rotations.npy', tmp_path / 'logits.npy')
  np.testing.assert_array_equal(np.load(tmp_path / 'logits.npy'),
                                np.load(out / 'lsh_axial.logits.npy'))
