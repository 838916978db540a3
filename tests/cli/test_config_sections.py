"""RunConfig sections, flat/dotted keys, old run_config.json files, --help, typed options."""

import json

import pytest

from retrax.app import cli
from retrax.app import jobs
from retrax.runs import config as config_lib
from retrax.runs import loading

# The flat layout of run_config.json written before the config had sections.
_OLD_RUN_CONFIG = {
    'model': 'TransformerLM', 'attention': 'full', 'data': 'duplication',
    'tokenizer': 'bytes', 'eval_fraction': 0.1, 'vocab_size': 32,
    'length': 16, 'd_model': 24, 'd_ff': 32, 'n_layers': 1, 'n_heads': 2,
    'd_head': 8, 'n_hashes': 2, 'chunk_len': 8, 'dropout': 0.0,
    'batch_size': 4, 'steps': 7, 'eval_every': 5, 'checkpoint_every': 5,
    'learning_rate': 0.01, 'warmup_steps': 0, 'seed': 3,
    'output_dir': 'elsewhere', 'n_samples': 1, 'trax_files': False}


def test_every_key_has_one_section_field_and_default():
  config = config_lib.RunConfig()
  # Keys added since: matmul_dtype, temperature, log_every, report_to.
  assert sorted(config_lib.KEYS) == sorted([*_OLD_RUN_CONFIG, 'matmul_dtype',
                                            'temperature', 'log_every',
                                            'report_to'])
  for name, key in config_lib.KEYS.items():
    assert getattr(getattr(config, key.section), key.field) == key.default
    assert config.get(name) == config.get(f'{key.section}.{key.field}')
  assert config.model.name == 'ReformerLM' and config.data.source == (
      'duplication')


def test_old_run_config_json_is_read(tmp_path):
  (tmp_path / jobs.CONFIG_FILE).write_text(json.dumps(_OLD_RUN_CONFIG))
  config = loading.config_of_run(str(tmp_path))
  assert config.model == config_lib.ModelConfig(
      name='TransformerLM', attention='full', vocab_size=32, length=16,
      d_model=24, d_ff=32, n_layers=1, n_heads=2, d_head=8, n_hashes=2,
      chunk_len=8, dropout=0.0)
  assert config.train.output_dir == str(tmp_path)
  assert (config.train.steps, config.train.seed, config.train.trax_files) == (
      7, 3, False)
  # Written back, the file keeps its flat layout (newer keys: defaults).
  assert config.to_dict() == dict(_OLD_RUN_CONFIG, output_dir=str(tmp_path),
                                  matmul_dtype='float32', temperature=0.0,
                                  log_every=0, report_to='')


def test_missing_keys_take_defaults_unknown_keys_are_errors(tmp_path):
  (tmp_path / jobs.CONFIG_FILE).write_text(json.dumps({'d_model': 16}))
  config = loading.config_of_run(str(tmp_path))
  assert config.model.d_model == 16 and config.model.d_ff == 128
  (tmp_path / jobs.CONFIG_FILE).write_text(json.dumps({'d_modle': 16}))
  with pytest.raises(config_lib.ConfigError, match='d_modle'):
    loading.config_of_run(str(tmp_path))


def test_toml_tables_and_dotted_keys(tmp_path):
  path = tmp_path / 'c.toml'
  path.write_text('steps = 9\n[model]\nname = "TransformerLM"\nd_model = 48\n'
                  '[data]\nbatch_size = 2\n')
  config = config_lib.load(str(path), ['model.n_layers=3', 'n_heads=4'])
  assert (config.model.name, config.model.d_model, config.model.n_layers,
          config.model.n_heads) == ('TransformerLM', 48, 3, 4)
  assert (config.data.batch_size, config.train.steps) == (2, 9)
  path.write_text('[model]\nbogus = 1\n')
  with pytest.raises(config_lib.ConfigError, match="'model.bogus'"):
    config_lib.load(str(path))


def test_precedence_file_then_set_then_options(tmp_path):
  path = tmp_path / 'c.toml'
  path.write_text('d_model = 16\nd_ff = 16\nn_layers = 5\n')
  config = config_lib.load(str(path), ['d_model=32', 'd_ff=32'],
                           flags={'d_model': 64})
  assert (config.model.d_model, config.model.d_ff, config.model.n_layers) == (
      64, 32, 5)


def test_typed_options_parse_once_into_the_config():
  args = cli.build_parser().parse_args(
      ['train', '--d_model', '48', '--dropout', '0.25', '--trax_files',
       'false', '--output-dir', 'r', '--set', 'n_layers=3', '--model',
       'TransformerLM'])
  assert args.d_model == 48 and args.dropout == 0.25
  assert args.trax_files is False
  config = cli._load_config(args)
  assert (config.model.name, config.model.d_model, config.model.dropout,
          config.model.n_layers) == ('TransformerLM', 48, 0.25, 3)
  assert (config.train.trax_files, config.train.output_dir) == (False, 'r')
  # A string option is taken as typed (no quote stripping, no JSON).
  args = cli.build_parser().parse_args(['train', '--output_dir', '"q"'])
  assert cli._load_config(args).train.output_dir == '"q"'


@pytest.mark.parametrize('argv', [['train', '--d_model', 'wide'],
                                  ['train', '--dropout', 'x'],
                                  ['train', '--trax_files', 'maybe'],
                                  ['train', '--n_heads', '0']])
def test_bad_option_values_exit_2(argv, capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  assert 'error' in capsys.readouterr().err


def test_help_lists_every_key_with_its_default(capsys):
  with pytest.raises(SystemExit):
    cli.main(['train', '--help'])
  out = ' '.join(capsys.readouterr().out.split())
  for section in config_lib.SECTIONS:
    assert f'{section} config:' in out
  for name, key in config_lib.KEYS.items():
    assert f'--{name} ' in out, name
    assert f'(default: {key.default!r})' in out, name


def test_user_input_errors_have_one_type(tmp_path):
  from retrax import errors
  from retrax import local_paths
  from retrax.data import tasks
  from retrax.supervised import devices
  with pytest.raises(devices.ClusterConfigError) as e:
    devices.initialize_distributed(num_processes=2, env={})
  with pytest.raises(tasks.TextDataError) as e2:
    path = tmp_path / 'short.txt'
    path.write_text('abc\n')
    tasks.text_lm_inputs(str(path), 32, 2)
  with pytest.raises(local_paths.RemotePathError) as e3:
    local_paths.check_local('gs://bucket/x', 'test')
  for info in (e, e2, e3):
    assert isinstance(info.value, errors.UserInputError)
    assert isinstance(info.value, ValueError)  # What callers caught before.
  assert issubclass(config_lib.ConfigError, errors.UserInputError)


def test_short_text_file_is_a_one_line_usage_error(tmp_path, capsys):
  path = tmp_path / 'short.txt'
  path.write_text('abc\n' * 3)
  assert cli.main(['train', '--data', f'text:{path}', '--length', '32',
                   '--output_dir', str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert 'fewer than one row' in err and '\n' not in err
