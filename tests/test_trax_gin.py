"""Trax's gin configs on retrax (`retrax.trax_gin`, `python -m retrax.trainer`).

Registering with gin lasts for the rest of a process (gin's registry, classes
configured in place), so each check runs in a fresh interpreter. The gin
files are tests/fixtures/gin/, written with the configurable names Trax's
experiment configs use.
"""

import json
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

# Not importorskip: the checks run in fresh interpreters, each registering
# Trax's names itself.
if importlib.util.find_spec('gin') is None:
  pytest.skip('gin-config is not installed', allow_module_level=True)

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GIN_DIR = os.path.join(_ROOT, 'tests', 'fixtures', 'gin')


def _python(code, *args, cwd=_ROOT):
  """Runs `code` in a fresh interpreter; its completed process."""
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code), *args],
                        cwd=cwd, capture_output=True, text=True, timeout=600,
                        check=False)


def _ok(code, *args):
  out = _python(code, *args)
  assert out.returncode == 0, out.stderr[-4000:]
  return out.stdout


def test_registering_declares_every_trax_name_and_bindings_reach_them():
  # `import retrax as trax`, no compat: importing retrax installs nothing,
  # importing gin changes nothing, one explicit call registers every name
  # Trax registers and rebinds nothing (references taken before it see the
  # bindings too), and `import trax` stays unredirected.
  with open(os.path.join(_GIN_DIR, 'trax_configurables.txt')) as f:
    trax_names = [line for line in f.read().splitlines() if line[0] != '#']
  out = _ok('''
      import json, sys
      import numpy as np
      import retrax as trax
      from retrax import layers as tl
      from retrax import models
      from retrax.layers.attention.lsh import LSHSelfAttention
      from retrax.lr import multifactor
      from retrax.models import registry
      for module in trax.trax_gin._DECLARING_MODULES:  # Declares every name.
        __import__(module)
      def retrax_finders():
        return [f for f in sys.meta_path
                if type(f).__module__.startswith('retrax')]
      assert not retrax_finders()
      public = {(m, n): v for m, mod in list(sys.modules.items())
                if m.startswith('retrax') for n, v in vars(mod).items()
                if not n.startswith('_')}
      def spec(**kwargs):  # What the run's model.json records.
        model = models.ReformerLM(
            10, d_model=8, d_ff=8, n_layers=1, n_heads=1, d_attention_key=4,
            d_attention_value=4, **kwargs)
        return registry.constructor_of(model)
      lsh_spec = spec(attention_type=tl.LSHSelfAttention)
      import gin
      assert spec(attention_type=tl.LSHSelfAttention) == lsh_spec
      trax.trax_gin.register()
      assert spec(attention_type=tl.LSHSelfAttention) == lsh_spec
      missing, stand_ins = [], []
      for name in json.loads(sys.argv[1]):
        found = gin.config._REGISTRY.get_match(name)
        if found is None or found.selector != name:
          missing.append(name)
        elif found.wrapped.__module__ == 'retrax.data.tensorflow_only':
          stand_ins.append(name.split('.')[-1])
      assert not retrax_finders() and 'trax' not in sys.modules
      changed = sorted(f'{m}.{n}' for (m, n), v in public.items()
                       if getattr(sys.modules[m], n) is not v)
      assert not changed, changed
      for name, fn in registry.MODELS.items():
        assert getattr(models, name) is fn, name
      # Bindings of a layer given by a gin reference travel with the model.
      gin.parse_config("""
          LSHSelfAttention.n_hashes = 2
          CausalAttention.max_inference_length = 64
      """)
      assert spec(attention_type=tl.LSHSelfAttention)['kwargs'][
          'attention_type'] == {'layer': 'LSHSelfAttention',
                                'kwargs': {'n_hashes': 2}}
      causal = gin.get_configurable('trax.layers.CausalAttention')
      assert causal is not tl.CausalAttention  # gin's configured function.
      assert spec(attention_type=causal)['kwargs']['attention_type'] == {
          'layer': 'CausalAttention', 'kwargs': {'max_inference_length': 64}}
      # A model that compares a layer argument with retrax's function sees
      # through gin's (HourglassLM's relative attention).
      relative = gin.get_configurable('trax.layers.RelativeAttentionWrapper')
      hourglass = dict(d_model=8, d_ff=8, n_heads=2, vanilla_layers=(1, 1),
                       hierarchy='1@2')
      assert (str(models.HourglassLM(8, vanilla_attn_type=relative,
                                     **hourglass)) ==
              str(models.HourglassLM(8, **hourglass)))
      gin.clear_config()
      gin.parse_config("""
          LSHSelfAttention.n_hashes = 3
          LSHSelfAttention.chunk_len = 8
          ReformerLM.vocab_size = 11
          ReformerLM.d_model = 24
          ReformerLM.d_ff = 32
          ReformerLM.n_layers = 1
          ReformerLM.n_heads = 2
          ReformerLM.attention_type = @trax.layers.LSHSelfAttention
          multifactor.constant = 0.5
          multifactor.factors = 'constant * linear_warmup'
          multifactor.warmup_steps = 10
      """)
      # A model constructor called through its public name, after parsing.
      model = trax.models.ReformerLM(mode='eval')
      model.init(trax.shapes.ShapeDtype((1, 16), np.int32))
      lsh = [l for l in model.walk() if isinstance(l, tl.LSHSelfAttention)]
      assert lsh and {l._n_hashes for l in lsh} == {3}, lsh
      assert {l._chunk_len for l in lsh} == {8}
      assert model(np.zeros((1, 16), np.int32)).shape == (1, 16, 11)
      # A class is configured in place: any import path sees the bindings.
      assert LSHSelfAttention(n_heads=1, d_qk=4, d_v=4)._n_hashes == 3
      assert LSHSelfAttention(n_heads=1, d_qk=4, d_v=4, n_hashes=5)._n_hashes == 5
      # Schedules: constant * min(1, step / warmup).
      for schedule in (trax.lr.multifactor(), multifactor(),
                       trax.supervised.lr_schedules.multifactor()):
        assert abs(float(schedule(5)) - 0.25) < 1e-7
        assert abs(float(schedule(40)) - 0.5) < 1e-7
      gin.clear_config()
      assert LSHSelfAttention(n_heads=1, d_qk=4, d_v=4)._n_hashes == 1
      # One configured function under every name Trax gives it.
      from retrax.data import preprocessing, tf_inputs
      assert (trax.data.lm1b_preprocess is tf_inputs.lm1b_preprocess is
              preprocessing.lm1b_preprocess)
      assert trax.supervised.train is trax.supervised.trainer_lib.train
      from retrax.data import tensorflow_only
      print(json.dumps([missing, stand_ins,
                        sorted(tensorflow_only.TF_ONLY_NAMES)]))
  ''', json.dumps(trax_names))
  missing, stand_ins, tf_only = json.loads(out.splitlines()[-1])
  assert len(trax_names) == 186 and not missing
  # Only Trax's TensorFlow data functions that retrax lacks are stand-ins.
  assert set(stand_ins) <= set(tf_only)
  assert 'CreateMathQAInputs' in stand_ins and 'batcher' not in stand_ins


def test_under_compat_positional_arguments_win_and_mode_is_not_bindable():
  # gin imported before `compat.install()`, which registers at once.
  # retrax's models and attention layers are decorated (`*args, **kwargs`);
  # gin still sees their parameters (Trax's decoding_test leaves
  # `TransformerLM.vocab_size = 13` bound, then calls TransformerLM(10)).
  _ok('''
      import gin
      import pytest
      from retrax import compat
      compat.install()
      import trax
      gin.parse_config("""
          TransformerLM.vocab_size = 13
          TransformerLM.d_model = 16
          CausalAttention.d_feature = 8
      """)
      model = trax.models.TransformerLM(10, d_ff=16, n_layers=1, n_heads=2)
      assert str(model).endswith('Dense_10\\n]'), str(model)[-40:]
      assert trax.models.TransformerLM(d_ff=16, n_layers=1, n_heads=2
                                       ).sublayers[-1].name == 'Dense_13'
      assert 'CausalAttention' in str(trax.layers.CausalAttention(4))
      # The configured function under each of its names: the defining module
      # and the package that takes Trax's `trax.layers.attention` path.
      from retrax.layers import attention
      from retrax.layers.attention import dense
      assert (attention.CausalAttention is dense.CausalAttention is
              trax.layers.CausalAttention)
      for binding in ('TransformerLM.no_such = 1',
                      'CausalAttention.no_such = 1'):
        with pytest.raises(ValueError, match='no_such'):
          gin.parse_config(binding)
      with pytest.raises(ValueError, match='mode'):
        gin.parse_config('LSHSelfAttention.mode = "predict"')
      # Parses, as in Trax; the call says what to use instead.
      gin.parse_config("data.CreateMathQAInputs.dataset_path = '/nowhere'")
      from retrax.data.tensorflow_only import TensorFlowOnlyError
      with pytest.raises(TensorFlowOnlyError, match='TextLines'):
        gin.get_configurable('data.CreateMathQAInputs')()
  ''')


def test_a_gin_file_trains_from_the_trainer(tmp_path):
  out_dir = tmp_path / 'run'
  out = subprocess.run(
      [sys.executable, '-m', 'retrax.trainer',
       f'--config_file={os.path.join(_GIN_DIR, "copy_lsh.gin")}',
       '--config=train.steps = 20', f'--output_dir={out_dir}'],
      cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
  assert out.returncode == 0, out.stderr[-4000:]
  records = [json.loads(line) for line in
             (out_dir / 'metrics.jsonl').read_text().splitlines()]
  loss = {r['step']: r['value'] for r in records
          if r['metric'] == 'metrics/loss' and r['mode'] == 'eval'}
  assert sorted(loss) == [1, 10, 20]
  assert loss[20] < loss[1] - 0.05, loss
  model = json.loads((out_dir / 'model.json').read_text())
  assert model['constructor'] == 'ReformerLM'
  assert model['kwargs']['d_model'] == 32 and model['kwargs']['n_layers'] == 2
  assert model['kwargs']['attention_type']['kwargs']['n_hashes'] == 3
  config = (out_dir / 'config.gin').read_text()
  assert 'LSHSelfAttention.n_hashes = 3' in config
  assert 'train.steps = 20' in config
  # Without gin (as if not installed), the run rebuilds with the layer
  # arguments gin bound; registering says what to install.
  _ok('''
      import sys
      sys.modules['gin'] = None  # `import gin` raises ImportError.
      import numpy as np
      import pytest
      import retrax
      from retrax import layers as tl
      from retrax.errors import UserInputError
      run = retrax.load_run(sys.argv[1], mode='eval')
      with pytest.raises(UserInputError, match='pip install'):
        retrax.trax_gin.register()
      lsh = [l for l in run.model.walk() if isinstance(l, tl.LSHSelfAttention)]
      assert len(lsh) == 2 and {l._n_hashes for l in lsh} == {3}
      assert {l._n_buckets for l in lsh} == {4}
      assert run.checkpoint.endswith('ckpt_000000020')
      assert run.model(np.ones((1, 16), np.int32)).shape == (1, 16, 10)
  ''', str(out_dir))


def test_a_live_runs_config_gin_is_kept_when_its_lock_refuses(tmp_path):
  from retrax.checkpoints import ownership
  out_dir = tmp_path / 'run'
  out_dir.mkdir()
  (out_dir / 'config.gin').write_text('# the live run\'s bindings\n')
  lock = ownership.RunLock(str(out_dir))  # A live run: this process.
  try:
    out = _python('import sys; from retrax.app import trainer; '
                  'sys.exit(trainer.main(sys.argv[1:]))',
                  f'--config_file={os.path.join(_GIN_DIR, "copy_lsh.gin")}',
                  f'--output_dir={out_dir}')
  finally:
    lock.release()
  assert out.returncode == 2, out.stderr[-3000:]
  assert 'is in use by process' in out.stderr.strip().splitlines()[-1]
  assert (out_dir / 'config.gin').read_text() == (
      '# the live run\'s bindings\n')


def test_includes_and_errors_of_the_trainer(tmp_path):
  gin_file = tmp_path / 'bad.gin'
  gin_file.write_text('NoSuchLayer.x = 1\n')
  cases = {
      str(gin_file): 'No configurable matching',
      str(tmp_path / 'none.gin'): 'no such file',
  }
  t5_file = tmp_path / 't5.gin'
  t5_file.write_text('import t5.data.preprocessors\n')
  cases[str(t5_file)] = "imports 't5'"
  copy_lsh = os.path.join(_GIN_DIR, 'copy_lsh.gin')
  t2t_file = tmp_path / 't2t.gin'  # Data that needs TensorFlow.
  t2t_file.write_text(f"include '{copy_lsh}'\n"
                      'train.inputs = @trax.data.batcher\n'
                      'batcher.data_streams = @data.data_streams\n'
                      "data_streams.dataset_name = 't2t_enwik8_l65k'\n")
  cases[str(t2t_file)] = 't2t_enwik8_l65k'
  bad_value = tmp_path / 'bad_value.gin'  # A value the model refuses.
  bad_value.write_text(f"include '{copy_lsh}'\nReformerLM.n_layers = -1\n")
  cases[str(bad_value)] = 'n_layers'
  for path, message in cases.items():
    out = _python('import sys; from retrax.app import trainer; '
                  'sys.exit(trainer.main(sys.argv[1:]))',
                  f'--config_file={path}', f'--output_dir={tmp_path / "o"}')
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.strip().splitlines()
              if 'run directory' not in line]  # The info line before training.
    assert len(errors) == 1 and message in errors[0], out.stderr
  # Nothing was trained; the parse errors made no directory at all.
  assert sorted(os.listdir(tmp_path / 'o')) == ['config.gin', 'retrax.lock']
  # Trax's own command, under compat.
  out = subprocess.run(
      [sys.executable, '-m', 'retrax.compat', '-m', 'trax.trainer',
       f'--config_file={tmp_path / "none.gin"}'], cwd=tmp_path,
      capture_output=True, text=True, timeout=300, check=False)
  assert out.returncode == 2 and 'none.gin: no such file' in out.stderr
  # An include is found beside the including file; bindings override.
  _ok('''
      import sys
      from retrax.app import trainer
      gin = trainer.parse_gin_configs([sys.argv[1]], ['train.steps = 3'])
      assert gin.query_parameter('ReformerLM.n_layers') == 1
      assert gin.query_parameter('ReformerLM.d_model') == 32
      assert gin.query_parameter('train.steps') == 3
  ''', os.path.join(_GIN_DIR, 'includes_copy.gin'))
