"""`python -m retrax.trainer`: Trax's experiment runner, for gin and TOML configs.

With gin files (`--config_file=reformer_copy.gin`, as Trax's README runs its
experiments; needs gin-config, e.g. `pip install retrax[gin]`), it runs
Trax's `trainer_lib.train` from the bindings, exactly as `python -m
trax.trainer` did: `--config` adds bindings (`--config='train.steps=20'`),
`--dataset`, `--model` and `--data_dir` bind `data_streams.dataset_name`,
`train.model` and `data_streams.data_dir`. The run directory gets the
checkpoints and logs of every retrax run, and `config.gin`, the bindings it
ran with, written once the run directory's lock is taken (a live run's is
kept). Without `--output_dir` it is `runs/<model>_<dataset>_<time>`. A gin
file is a program (its `import`s run modules): run only configs you trust.

With a TOML file it is `retrax train --config FILE --output_dir DIR` (the
keys of `retrax train --help`; `--config KEY=VALUE` overrides one).
"""

import argparse
import datetime
import os
import re
import sys

from retrax import run_layout
from retrax.app import cli
from retrax.errors import deliberate
from retrax.errors import Error
from retrax.errors import one_line
from retrax.errors import UserInputError


def _parser():
  parser = argparse.ArgumentParser(
      prog='python -m retrax.trainer',
      description='Trains from gin config files (Trax\'s experiments) or a '
                  'TOML config (the keys of `retrax train`).')
  parser.add_argument('--config_file', action='append', default=[],
                      required=True, help='a .gin file (repeatable) or a '
                      'TOML file')
  parser.add_argument('--config', action='append', default=[],
                      metavar='BINDING', help='a gin binding such as '
                      "'train.steps=20' (TOML: KEY=VALUE); repeatable")
  parser.add_argument('--output_dir', help='the run directory (resumed if it '
                      'holds a run); default runs/<model>_<dataset>_<time>')
  parser.add_argument('--dataset', help='gin: data_streams.dataset_name')
  parser.add_argument('--model', help='gin: train.model (a trax.models name)')
  parser.add_argument('--data_dir', help='gin: data_streams.data_dir')
  return parser


def _import_gin():
  try:
    import gin
  except ImportError:
    raise UserInputError(
        'gin config files need the gin-config package: pip install '
        '"retrax[gin]" (or pip install gin-config).') from None
  return gin


def _bindings(args):
  """`--config` plus the bindings Trax's `--dataset/--model/--data_dir` make."""
  bindings = list(args.config)
  if args.dataset:
    bindings.append(f'data_streams.dataset_name = {args.dataset!r}')
  if args.data_dir:
    bindings.append(f'data_streams.data_dir = {args.data_dir!r}')
  if args.model:
    bindings.append(f'train.model = @trax.models.{args.model}')
  return bindings


def parse_gin_configs(config_files, bindings):
  """Parses Trax gin files and bindings under Trax's names; returns gin.

  A config's own folder is searched for the files it includes (Trax's
  `terraformer_copy.gin` includes `reformer_copy.gin`). Parse errors, unknown
  names and missing packages (`t5`) become `UserInputError`s.
  """
  for path in config_files:  # Before gin registers Trax's names here.
    if not os.path.isfile(path):
      raise UserInputError(f'--config_file {path}: no such file.')
  gin = _import_gin()
  from retrax import compat
  compat.install()  # `import trax.models` in the files; registers the names.
  for path in config_files:
    gin.add_config_file_search_path(os.path.dirname(os.path.abspath(path)))
  try:
    gin.parse_config_files_and_bindings(config_files, bindings)
  except ModuleNotFoundError as e:
    # gin re-raises the import's error with the file and line appended.
    missing = re.search(r"No module named '([^']+)'", str(e))
    raise UserInputError(
        f'the config imports {missing.group(1) if missing else e.name!r}, '
        'which is not installed (Trax\'s T5 and BERT configs need the t5 '
        f'package and TensorFlow): {e}') from None
  except (ValueError, SyntaxError, OSError) as e:
    raise UserInputError(f'gin config: {one_line(e)}') from None
  return gin


def _default_output_dir(gin):
  """`runs/<model>_<dataset>_<time>`, as Trax's `~/trax/...` default."""
  try:
    model = gin.query_parameter('train.model').configurable.name
  except ValueError:
    raise UserInputError('the gin config binds no train.model; add '
                         "--model NAME or --config 'train.model = "
                         "@trax.models.NAME'.") from None
  try:
    dataset = gin.query_parameter('data_streams.dataset_name')
  except ValueError:
    dataset = 'synthetic'
  stamp = datetime.datetime.now().strftime('%Y%m%d_%H%M')
  return os.path.join('runs', f'{model}_{dataset}_{stamp}')


def train_from_gin(config_files, bindings, output_dir=None):
  """Parses the configs and runs Trax's `trainer_lib.train` from them.

  Returns the `Loop` (or the legacy trainer's state) that `train` returns.
  """
  gin = parse_gin_configs(config_files, bindings)
  from retrax.checkpoints import atomic
  from retrax.supervised import trainer_lib
  from retrax.checkpoints import ownership
  output_dir = os.path.expanduser(output_dir or _default_output_dir(gin))
  print(f'retrax.trainer: run directory {output_dir}', file=sys.stderr)
  os.makedirs(output_dir, exist_ok=True)
  lock = None
  if _first_process():  # The writer of the run directory (the chief's).
    # The lock first: a live run's config.gin is not overwritten before its
    # lock refuses this one. The Loop's lock in this process takes it over.
    lock = ownership.RunLock(output_dir)
    with atomic.atomic_write(os.path.join(output_dir,
                                          run_layout.GIN_CONFIG_FILE)) as f:
      f.write(gin.config_str().encode())
  # The gin-configured `train` (registered by `retrax.trax_gin`): gin
  # supplies `model` and the rest, which the signature cannot show.
  try:
    result = trainer_lib.train(output_dir=output_dir)  # type: ignore[call-arg]
  finally:
    if lock is not None:
      lock.release()  # A no-op once the Loop's lock took it over.
  if lock is not None:  # As `retrax train` ends: where the run is, what next.
    from retrax.app import jobs
    from retrax.supervised import checkpointing
    jobs.print_next_steps(output_dir, checkpointing.saved_step(output_dir))
  return result


# A launcher's rank variables: the process that writes the run directory
# (process 0) is known before JAX joins the others.
_RANK_VARIABLES = ('JAX_PROCESS_ID', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK',
                   'PMI_RANK', 'TPU_WORKER_ID')


def _first_process():
  return all(os.environ.get(name, '0').strip() in ('0', '')
             for name in _RANK_VARIABLES)


def _main_gin(args):
  try:
    train_from_gin(args.config_file, _bindings(args), args.output_dir)
  except cli.user_errors() as e:
    if isinstance(e, Error) and not deliberate(e):
      raise  # A LayerError around a bug.
    # As `retrax train`'s: a bad binding's value, data a config names that
    # needs TensorFlow or is not prepared: one line (gin's note joined in).
    print(f'retrax.trainer: error: {one_line(e)}', file=sys.stderr)
    return 2
  print('retrax.trainer: finished training.', file=sys.stderr)
  return 0


def main(argv=None):
  args = _parser().parse_args(argv)
  if any(path.endswith('.gin') for path in args.config_file):
    return _main_gin(args)
  if len(args.config_file) != 1 or not args.output_dir:
    print('retrax.trainer: error: a TOML config takes one --config_file and '
          'an --output_dir.', file=sys.stderr)
    return 2
  train_argv = ['train', '--config', args.config_file[0], '--output_dir',
                args.output_dir]
  for item in args.config:
    train_argv += ['--set', item]
  return cli.main(train_argv)

