"""Bad arguments of every command are one line and exit 2 (issue 53, item 7):
over-long paths and names, seeds no generator takes, TOML that is not
UTF-8, a malformed --coordinator, a file that is no SentencePiece model,
and a model too big for the machine's memory, refused before it is built."""

import pytest

from retrax.app import cli
from retrax.runs import config as config_lib
from retrax.app import jobs

_TINY = ['--steps', '1', '--quiet', '--no-sample', '--set', 'd_model=16',
         '--set', 'd_ff=32', '--set', 'n_layers=1', '--set', 'd_head=8']
_LONG_NAME = 'a' * 300
_DEEP = '/'.join(['b'] * 2500)


def _cases(tmp):
  (tmp / 'bad.toml').write_bytes(b'\xff\xfe steps = 1')
  (tmp / 'garbage.model').write_bytes(bytes(range(256)) * 2)
  (tmp / 't.txt').write_text('hello world\nfoo bar\n' * 20)
  run = str(tmp / 'run')
  cluster = ['--num_processes', '2', '--process_id', '0']
  return {
      'long name': (['train', '--output_dir', str(tmp / _LONG_NAME)],
                    'names to 255'),
      'long path': (['train', '--output_dir', str(tmp / _DEEP)],
                    'limited to 4095 bytes'),
      'plot long name': (['plot', str(tmp / _LONG_NAME)], 'names to 255'),
      'convert long path': (['convert', str(tmp / _DEEP), run],
                            'limited to 4095'),
      'data long name': (['train', '--output_dir', run, '--data',
                          f'text:{tmp / _LONG_NAME}'], 'does not exist'),
      'seed too big': (['train', '--output_dir', run, '--seed', str(2 ** 70)],
                       'seed must be in [0, 2**32)'),
      'seed negative': (['train', '--output_dir', run, '--set', 'seed=-1'],
                        'seed must be in [0, 2**32)'),
      'eval seed': (['eval', run, '--seed', '-1'], 'in [0, 2**32)'),
      'toml not utf-8': (['train', '--output_dir', run, '--config',
                          str(tmp / 'bad.toml')], 'not valid TOML'),
      'coordinator no port': (['train', '--output_dir', run, '--coordinator',
                               'nonsense', *cluster], 'HOST:PORT'),
      'coordinator bad port': (['train', '--output_dir', run, '--coordinator',
                                '127.0.0.1:notaport', *cluster], 'HOST:PORT'),
      'coordinator port range': (['train', '--output_dir', run,
                                  '--coordinator', '127.0.0.1:99999',
                                  *cluster], '1..65535'),
      'garbage sentencepiece': (['train', '--output_dir', run, '--data',
                                 f'text:{tmp / "t.txt"}', '--set',
                                 f'tokenizer=sentencepiece:'
                                 f'{tmp / "garbage.model"}'],
                                'is not a SentencePiece model'),
      'model too big': (['train', '--output_dir', run, '--set',
                         'd_model=100000000'], 'more than this machine'),
  }



@pytest.mark.parametrize('name', [
    'long name', 'long path', 'plot long name', 'convert long path',
    'data long name', 'seed too big', 'seed negative', 'eval seed',
    'toml not utf-8', 'coordinator no port', 'coordinator bad port',
    'coordinator port range', 'garbage sentencepiece', 'model too big'])
def test_a_bad_argument_is_one_line_exit_2(tmp_path, capsys, name):
  argv, words = _cases(tmp_path)[name]
  if argv[0] == 'train':
    argv = argv[:1] + _TINY + argv[1:]  # The case's --set wins.
  try:
    rc = cli.main(argv)
  except SystemExit as e:  # argparse's errors exit by themselves.
    rc = e.code
  err = capsys.readouterr().err.strip()
  assert rc == 2, err
  assert '\n' not in err and 'Traceback' not in err, err
  assert words in err, err


def test_the_memory_check_passes_ordinary_models_and_refuses_huge_ones():
  config = config_lib.load()
  jobs.check_memory(config, machine_bytes=2 ** 30)  # The default: tiny.
  big = config_lib.load(overrides=['d_model=4096', 'd_ff=16384',
                                   'n_layers=24'])
  assert 4e9 < 16 * jobs.n_params_estimate(big) < 8e10
  with pytest.raises(config_lib.ConfigError, match='GiB'):
    jobs.check_memory(big, machine_bytes=16 * 2 ** 30)
  jobs.check_memory(big, machine_bytes=2 ** 40)
