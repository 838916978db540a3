"""The `retrax` command line: train | sample | eval | convert | plot | bench | info.

Parses arguments and calls the library; errors in what the user typed exit
with code 2 and a one-line message saying what to do.
"""

import argparse
import sys


class UsageError(Exception):
  """A user error: printed as one line, exit code 2."""


def _count(text):
  """An argparse type: an int >= 1."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(
        f'expected an int >= 1; got {text!r}') from None
  if value < 1:
    raise argparse.ArgumentTypeError(f'expected an int >= 1; got {value}')
  return value


def _temperature(text):
  """An argparse type: a float >= 0."""
  try:
    value = float(text)
  except ValueError:
    value = float('nan')
  if not value >= 0 or value == float('inf'):
    raise argparse.ArgumentTypeError(f'expected a finite number >= 0; got '
                                     f'{text!r}')
  return value


def _add_config_args(p):
  p.add_argument('--config', metavar='TOML', help='a TOML file of config keys')
  p.add_argument('--set', metavar='KEY=VALUE', action='append', default=[],
                 help='override one config key (repeatable)')
  p.add_argument('--output_dir', '--output-dir', dest='output_dir',
                 help='run directory (checkpoints, metrics); resumes if it '
                 'holds a run of the same model')
  p.add_argument('--steps', type=_count, help='training steps')
  p.add_argument('--model', help='ReformerLM | TransformerLM')
  p.add_argument('--attention', help='lsh | local | full')
  p.add_argument('--data', help="'duplication' or 'text:PATH' (the last "
                 'eval_fraction, 10%%, of the file is held out for eval)')
  p.add_argument('--tokenizer', help="text data: 'bytes' (default) or "
                 "'sentencepiece:MODEL_FILE' (vocab_size from the model)")


def _load_config(args):
  from retrax import config as config_lib  # pylint: disable=g-import-not-at-top
  overrides = list(args.set)
  for key in ('output_dir', 'steps', 'model', 'attention', 'data',
              'tokenizer'):
    value = getattr(args, key, None)
    if value is not None:
      overrides.append(f'{key}={value}')
  try:
    return config_lib.load(args.config, overrides)
  except config_lib.ConfigError as e:
    raise UsageError(str(e)) from e


def _join_cluster(args):
  """Joins a multi-process run (flags, or the cluster's environment)."""
  from retrax.supervised import devices  # pylint: disable=g-import-not-at-top
  try:
    devices.initialize_distributed(args.coordinator, args.num_processes,
                                   args.process_id)
  except ValueError as e:
    raise UsageError(str(e)) from e
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def cmd_train(args):
  chief = _join_cluster(args)
  from retrax import jobs  # pylint: disable=g-import-not-at-top
  config = _load_config(args)
  loop = jobs.train(config, quiet=args.quiet)
  if not chief:
    return
  if config.n_samples and not args.no_sample:
    jobs.print_samples(config)
  jobs.print_next_steps(config, loop.step)


def cmd_sample(args):
  from retrax import jobs  # pylint: disable=g-import-not-at-top
  jobs.print_samples(jobs.config_of_run(args.output_dir), n=args.n,
                     temperature=args.temperature, prompt=args.prompt,
                     max_length=args.max_length)


def cmd_eval(args):
  from retrax import jobs  # pylint: disable=g-import-not-at-top
  jobs.print_eval(jobs.config_of_run(args.output_dir), n_batches=args.batches)


def cmd_convert(args):
  from retrax.checkpoints import convert  # pylint: disable=g-import-not-at-top
  print(convert.convert(args.src, args.dst, to=args.to, force=args.force))


def cmd_plot(args):
  from retrax import plot  # pylint: disable=g-import-not-at-top
  print(plot.plot_metrics(args.output_dir, args.out))


def cmd_bench(args):
  from retrax import bench  # pylint: disable=g-import-not-at-top
  bench.main(quick=args.quick)


def cmd_info(args):
  del args
  import platform  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import retrax  # pylint: disable=g-import-not-at-top
  print(f'retrax {retrax.__version__}')
  print(f'python {platform.python_version()} ({platform.machine()})')
  print(f'jax {jax.__version__}, numpy {numpy.__version__}, optax '
        f'{optax.__version__}')
  print(f'backend {jax.default_backend()}: {jax.device_count()} device(s): '
        + ', '.join(str(d) for d in jax.devices()))


class _Version(argparse.Action):
  """--version: prints `retrax <version>` (importing retrax only then)."""

  def __call__(self, parser, namespace, values, option_string=None):
    import retrax  # pylint: disable=g-import-not-at-top
    print(f'retrax {retrax.__version__}')
    parser.exit()


def build_parser():
  parser = argparse.ArgumentParser(
      prog='retrax', description='Trax, revived on today\'s JAX.')
  parser.add_argument('--version', action=_Version, nargs=0,
                      help="print retrax's version and exit")
  sub = parser.add_subparsers(dest='command')
  p = sub.add_parser('train', help='train a model (default: a small Reformer '
                     'with LSH attention on the duplication task), then sample')
  _add_config_args(p)
  p.add_argument('--quiet', action='store_true', help='no progress bar')
  p.add_argument('--no-sample', action='store_true',
                 help='do not print samples after training')
  p.add_argument('--coordinator', metavar='HOST:PORT',
                 help='multi-process run: address of process 0 (or '
                 'JAX_COORDINATOR_ADDRESS; SLURM/Open MPI are detected)')
  p.add_argument('--num_processes', '--num-processes', type=_count,
                 help='multi-process run: number of processes')
  p.add_argument('--process_id', '--process-id', type=int,
                 help='multi-process run: this process (0 writes the run)')
  p.set_defaults(func=cmd_train)
  p = sub.add_parser('sample', help='sample from a trained run')
  p.add_argument('output_dir')
  p.add_argument('-n', type=_count, default=4, help='number of samples')
  p.add_argument('--temperature', type=_temperature, default=0.0,
                 help='0 = greedy (default)')
  p.add_argument('--prompt', default=None,
                 help='text runs: the text to continue')
  p.add_argument('--max_length', '--max-length', type=_count, default=None,
                 help='text runs: tokens to generate (default: as many as '
                 'the model\'s length allows)')
  p.set_defaults(func=cmd_sample)
  p = sub.add_parser('eval', help='evaluate a trained run')
  p.add_argument('output_dir')
  p.add_argument('--batches', type=_count, default=8,
                 help='eval batches (default 8)')
  p.set_defaults(func=cmd_eval)
  p = sub.add_parser('convert', help='convert between Trax checkpoints '
                     '(model.pkl.gz) and retrax native checkpoints')
  p.add_argument('src')
  p.add_argument('dst')
  p.add_argument('--to', choices=('native', 'trax'), default=None,
                 help='target format (default: the other one)')
  p.add_argument('--force', action='store_true',
                 help='write even if DST holds files: replaces only the files '
                 'the conversion writes, deletes nothing else')
  p.set_defaults(func=cmd_convert)
  p = sub.add_parser('plot', help="plot a run's metrics to PNG")
  p.add_argument('output_dir')
  p.add_argument('--out', default=None, help='PNG path (default: in the run)')
  p.set_defaults(func=cmd_plot)
  p = sub.add_parser('bench', help='train, decode and data speed on this '
                     'machine (the package alone; benchmarks/ has more)')
  p.add_argument('--quick', action='store_true',
                 help='fewer steps, no 1K-length model (under 2 minutes)')
  p.set_defaults(func=cmd_bench)
  p = sub.add_parser('info', help='versions and devices')
  p.set_defaults(func=cmd_info)
  return parser


# Errors that mean the user asked for something that cannot be done (a bad
# argument, config key, path or checkpoint, bad data): one line, exit 2.
# Anything else is a bug and keeps its traceback. Library modules are looked
# up only if already imported (an error of theirs implies they are).
_USER_ERRORS = (
    ('retrax.config', 'ConfigError'),
    ('retrax.checkpoints.errors', 'CheckpointError'),
    ('retrax.layers.validation', 'ArgumentError'),
    ('retrax.supervised.batch_checks', 'TrainingError'),
)


def _is_user_error(e):
  types = [UsageError, FileNotFoundError, FileExistsError, NotADirectoryError,
           IsADirectoryError, PermissionError]
  for module, name in _USER_ERRORS:
    if module in sys.modules:
      types.append(getattr(sys.modules[module], name))
  return isinstance(e, tuple(types))


def main(argv=None):
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 2
  try:
    rc = args.func(args)
  except Exception as e:  # pylint: disable=broad-except
    if not _is_user_error(e):
      raise
    message = ' '.join(str(e).split())
    print(f'retrax {args.command}: error: {message}', file=sys.stderr)
    return 2
  return rc or 0


if __name__ == '__main__':
  sys.exit(main())
