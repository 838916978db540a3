"""Typos in commands, options and config keys: one line naming the nearest, exit 2."""

import difflib

import pytest

from retrax.app import cli
from retrax.runs import config as config_lib
from retrax import suggest


def _usage_error(argv, capsys):
  with pytest.raises(SystemExit) as info:
    cli.main(argv)
  assert info.value.code == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and 'Traceback' not in err, err
  return err.strip()


@pytest.mark.parametrize('argv,prefix,nearest', [
    (['trian'], 'retrax: error:', "did you mean 'train'?"),
    (['evl', 'runs/x'], 'retrax: error:', "did you mean 'eval'?"),
    (['train', '--stepz', '3'], 'retrax train: error:',
     "did you mean '--steps'?"),
    (['train', '--stepz=3'], 'retrax train: error:', "did you mean '--steps'?"),
    (['train', '--output-dri', 'x'], 'retrax train: error:',
     "did you mean '--output-dir'?"),
    (['sample', 'runs/x', '--temprature', '1'], 'retrax sample: error:',
     "did you mean '--temperature'?"),
])
def test_typos_name_the_nearest(argv, prefix, nearest, capsys):
  err = _usage_error(argv, capsys)
  assert err.startswith(prefix) and nearest in err, err
  assert 'usage:' not in err


@pytest.mark.parametrize('item,nearest', [('d_modle=64', "'d_model'"),
                                          ('model.n_layer=2', "'model.n_layers'")])
def test_set_key_typos_name_the_nearest(item, nearest, capsys):
  assert cli.main(['train', '--set', item]) == 2
  err = capsys.readouterr().err
  assert err.count('\n') == 1 and err.startswith('retrax train: error: ')
  assert f'did you mean {nearest}?' in err and 'known keys' not in err


def test_the_suggestion_is_difflibs_nearest():
  # An independent check of the choice: difflib's own ranking.
  keys = list(config_lib.KEYS)
  for typo in ('d_modle', 'n_head', 'learnign_rate', 'checkpoint_evry'):
    assert suggest.nearest(typo, keys) == difflib.get_close_matches(
        typo, keys, n=1)[0]
  assert suggest.nearest('zzzz', keys) is None
  assert suggest.did_you_mean('zzzz', keys) == ''


def test_no_near_match_lists_the_choices(capsys):
  err = _usage_error(['frobnicate'], capsys)
  assert 'unknown command' in err and 'train, sample, eval' in err
  assert cli.main(['train', '--set', 'zzzz=1']) == 2
  err = capsys.readouterr().err
  assert 'known keys:' in err and 'd_model' in err and 'did you mean' not in err
  err = _usage_error(['train', 'stray'], capsys)
  assert 'unrecognized arguments: stray' in err and 'did you mean' not in err


def test_config_files_and_run_configs_suggest_too(tmp_path):
  path = tmp_path / 'c.toml'
  path.write_text('d_modle = 64\n')
  with pytest.raises(config_lib.ConfigError, match="did you mean 'd_model'"):
    config_lib.load(str(path))
  with pytest.raises(config_lib.ConfigError, match="did you mean 'n_layers'"):
    config_lib.RunConfig().replace(n_layer=3)


def test_bad_values_are_one_line_usage_errors(capsys):
  err = _usage_error(['train', '--steps', 'x'], capsys)
  assert err == ("retrax train: error: argument --steps: expected an int >= "
                 "1; got 'x' (see retrax train --help)")
