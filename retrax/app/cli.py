"""The `retrax` command line: train | sample | eval | convert | plot | bench | info.

Parses arguments once, into a typed `config.RunConfig` (its model, data,
train and sample sections) for `train`, and calls the library. Errors retrax
raises on purpose (`retrax.Error`: user input, argument, checkpoint and
training errors) and missing files exit with code 2 and a one-line message
saying what to do, as do disk errors (full, read-only, no permission: the
path, what was kept, what to do); any other exception is a bug and keeps its
traceback, as does a `LayerError` around one (`retrax.errors.deliberate`).
SIGTERM or Ctrl-C during training saves the last completed step and exits
with 143 or 130 (see `retrax.supervised.interrupts`).
"""

import argparse
import errno
import os
import platform
import signal
import sys

from retrax import run_layout
from retrax import suggest
from retrax.errors import deliberate
from retrax.errors import Error
from retrax.errors import one_line
from retrax.errors import UserInputError
import retrax
from retrax.runs import config as config_lib

# Only what parsing needs is imported here: `--version`, `--help` and argument
# errors answer without importing JAX; each command imports what it uses.


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors, recording its option names for suggestions."""

  def __init__(self, *args, **kwargs):
    self.option_names = []  # Before argparse adds -h through add_argument.
    super().__init__(*args, **kwargs)

  def add_argument(self, *args, **kwargs):
    action = super().add_argument(*args, **kwargs)
    self.option_names.extend(action.option_strings)
    return action

  def error(self, message):
    self.exit(2, f'{self.prog}: error: {message} (see {self.prog} --help)\n')


def _seed(text):
  """An argparse type: an int in [0, 2**32), what random seeds take."""
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'expected an int; got {text!r}') from None
  if not 0 <= value < 2 ** 32:
    raise argparse.ArgumentTypeError(f'expected an int in [0, 2**32); got '
                                     f'{value}')
  return value


# Arguments that name files or directories, checked against the system's
# limits before any command runs (else ENAMETOOLONG, or os.makedirs
# recursing through thousands of levels).
_PATH_ARGS = ('output_dir', 'output_dirs', 'src', 'dst', 'out', 'config')
_NAME_MAX, _PATH_MAX = 255, 4095


def _check_paths(args):
  for dest in _PATH_ARGS:
    values = getattr(args, dest, None)
    for path in values if isinstance(values, list) else [values]:
      if not isinstance(path, str):
        continue
      data = path.encode('utf-8', 'surrogateescape')
      longest = max((len(c) for c in data.split(b'/')), default=0)
      if len(data) > _PATH_MAX or longest > _NAME_MAX:
        raise UserInputError(
            f'{dest} {path[:60]!r}... is {len(data)} bytes with a name of '
            f'{longest}; paths here are limited to {_PATH_MAX} bytes and '
            f'names to {_NAME_MAX}: choose a shorter one.')


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


_FLAG_ALIASES = {'output_dir': ['--output-dir']}


def _flag_type(key):
  """An argparse type parsing a flag's text as `key`'s type."""
  if key.name in config_lib.POSITIVE_KEYS:
    return _count

  def parse(text):
    if key.kind is str:
      return text
    if key.kind is bool:
      lowered = text.lower()
      if lowered in ('true', '1', 'yes'):
        return True
      if lowered in ('false', '0', 'no'):
        return False
      raise argparse.ArgumentTypeError(f'expected true or false; got {text!r}')
    try:
      return key.kind(text)
    except ValueError:
      raise argparse.ArgumentTypeError(
          f'expected {key.kind.__name__}; got {text!r}') from None
  parse.__name__ = key.kind.__name__
  return parse


def _add_config_args(p):
  """`--config`, `--set` and one typed option per config key, by section."""
  p.add_argument('--config', metavar='TOML', help='a TOML file of config keys')
  p.add_argument('--set', metavar='KEY=VALUE', action='append', default=[],
                 help='override one config key (repeatable)')
  for section in config_lib.SECTIONS:
    group = p.add_argument_group(f'{section} config')
    for key in config_lib.KEYS.values():
      if key.section == section:
        action = group.add_argument(
            f'--{key.name}', *_FLAG_ALIASES.get(key.name, []), dest=key.name,
            type=_flag_type(key), default=None, metavar=key.kind.__name__.upper(),
            help=f'{key.help} (default: {key.default!r})'.replace('%', '%%'))
        p.option_names.extend(action.option_strings)


def _load_config(args):
  """The RunConfig of `--config`, `--set` and the typed options (in that order)."""
  flags = {name: getattr(args, name) for name in config_lib.KEYS
           if getattr(args, name, None) is not None}
  return config_lib.load(args.config, args.set, flags=flags)


def _join_cluster(args):
  """Joins a multi-process run (flags, or the cluster's environment)."""
  import jax
  from retrax.supervised import devices
  devices.initialize_distributed(args.coordinator, args.num_processes,
                                 args.process_id)
  return jax.process_index() == 0


def cmd_train(args):
  from retrax.app import jobs
  chief = _join_cluster(args)
  config = _load_config(args)
  loop = jobs.train(config, quiet=args.quiet, mesh=args.mesh)
  if not chief:
    return
  if config.sample.n_samples and not args.no_sample:
    jobs.print_samples(config)
  jobs.print_next_steps(config.train.output_dir, loop.step,
                        text=config.data.source.startswith('text:'))


def cmd_sample(args):
  from retrax.app import run_commands
  run_commands.print_samples(args.output_dir, n=args.n,
                             temperature=args.temperature, prompt=args.prompt,
                             max_length=args.max_length)


def cmd_eval(args):
  from retrax.app import run_commands
  run_commands.print_eval(args.output_dir, n_batches=args.batches,
                          seed=args.seed, data=args.data)


def cmd_convert(args):
  from retrax.checkpoints import convert
  from retrax.checkpoints import hf_files
  if args.to == 'hf' or hf_files.is_hf_directory(args.src):
    from retrax.app import hf_runs  # It builds models: imported only for HF.
    print(hf_runs.convert(args.src, args.dst, to=args.to, force=args.force))
    print(hf_runs.convention_note(args.src, args.to))
    if args.to != 'hf':
      print(hf_runs.tokenizer_note(args.src, args.dst))
    return
  if os.path.isfile(os.path.join(args.src, run_layout.GIN_CONFIG_FILE)):
    from retrax.app import trax_runs  # A run of Trax's trainer: builds a model.
    if trax_runs.is_trax_run(args.src):
      print(trax_runs.convert(args.src, args.dst, to=args.to,
                              force=args.force))
      return
  print(convert.convert(args.src, args.dst, to=args.to, force=args.force))


def cmd_plot(args):
  from retrax.app import plot
  print(plot.plot_metrics(args.output_dirs, args.out,
                          log_loss=not args.linear))


def cmd_bench(args):
  from retrax.app import bench
  bench.main(quick=args.quick)


def cmd_info(args):
  del args
  import jax
  import numpy
  import optax
  print(f'retrax {retrax.__version__}')
  print(f'python {platform.python_version()} ({platform.machine()})')
  print(f'jax {jax.__version__}, numpy {numpy.__version__}, optax '
        f'{optax.__version__}')
  print(f'backend {jax.default_backend()}: {jax.device_count()} device(s): '
        + ', '.join(str(d) for d in jax.devices()))


class _Version(argparse.Action):
  """--version: prints `retrax <version>`."""

  def __call__(self, parser, namespace, values, option_string=None):
    print(f'retrax {retrax.__version__}')
    parser.exit()


def _add_train(sub):
  p = sub.add_parser('train', help='train a model (default: a small Reformer '
                     'with LSH attention on the duplication task), then sample',
                     epilog='Every config key has an option above; `--set '
                     'KEY=VALUE` and a --config TOML file (flat keys, or '
                     'tables [model], [data], [train], [sample]) take the '
                     'same keys. Options win over --set, --set over the file.')
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
  p.add_argument('--mesh', metavar='data=D,fsdp=F',
                 help='device mesh over all processes: batch over every '
                 'device, weights and optimizer slots split over fsdp')
  p.set_defaults(func=cmd_train)


def _add_run_commands(sub):
  """`sample` and `eval`: commands on a trained run directory."""
  p = sub.add_parser('sample', help='sample from a trained run')
  p.add_argument('output_dir')
  p.add_argument('-n', type=_count, default=4, help='number of samples')
  p.add_argument('--temperature', type=_temperature, default=None,
                 help="0 = greedy (default: the run's temperature key, 0)")
  p.add_argument('--prompt', default=None,
                 help='the text to continue (default: a different piece of '
                 'held-out text, or of the eval data, for each sample); runs '
                 'without a tokenizer take token ids ("3 7 1")')
  p.add_argument('--max_length', '--max-length', type=_count, default=None,
                 help='text runs: tokens to generate (default: as many as '
                 'the model\'s length allows)')
  p.set_defaults(func=cmd_sample)
  p = sub.add_parser('eval', help='evaluate a trained run')
  p.add_argument('output_dir')
  p.add_argument('--batches', type=_count, default=8,
                 help='eval batches (default 8)')
  p.add_argument('--seed', type=_seed, default=0,
                 help='seed of the random keys the model draws in eval mode '
                 '(LSH hashing); the same seed gives the same numbers '
                 '(default 0)')
  p.add_argument('--data', metavar='text:FILE', default=None,
                 help="evaluate on this text file instead of the run's data "
                 '(runs that record none: a Loop\'s, a converted one)')
  p.set_defaults(func=cmd_eval)


def _add_tool_commands(sub):
  """`convert`, `plot`, `bench` and `info`."""
  p = sub.add_parser('convert', help='convert between Trax checkpoints '
                     '(model.pkl.gz) and retrax native checkpoints, and '
                     'between Hugging Face Reformer directories and runs')
  p.add_argument('src')
  p.add_argument('dst')
  p.add_argument('--to', choices=('native', 'trax', 'hf'), default=None,
                 help='target format (default: the other one; a Hugging Face '
                 'directory becomes a run; hf: a ReformerLM run becomes a '
                 'Hugging Face directory)')
  p.add_argument('--force', action='store_true',
                 help='write even if DST holds files: replaces only the files '
                 'the conversion writes, deletes nothing else')
  p.set_defaults(func=cmd_convert)
  p = sub.add_parser('plot', help="plot a run's metrics to PNG (several "
                     'runs: compared in one figure)')
  p.add_argument('output_dirs', nargs='+', metavar='RUN',
                 help='run directories (each holding metrics.jsonl)')
  p.add_argument('--out', default=None, help='PNG path (default: '
                 'RUN/metrics.png; several runs: ./A_vs_B.png)')
  p.add_argument('--linear', action='store_true',
                 help='losses on a linear axis (default: log scale)')
  p.set_defaults(func=cmd_plot)
  p = sub.add_parser('bench', help='train, decode and data speed on this '
                     'machine (the package alone; benchmarks/ has more)')
  p.add_argument('--quick', action='store_true',
                 help='fewer steps, no 1K-length model (under 2 minutes)')
  p.set_defaults(func=cmd_bench)
  p = sub.add_parser('info', help='versions and devices')
  p.set_defaults(func=cmd_info)


def build_parser():
  parser = _Parser(prog='retrax', description='Trax, revived on today\'s JAX.')
  parser.add_argument('--version', action=_Version, nargs=0,
                      help="print retrax's version and exit")
  sub = parser.add_subparsers(dest='command')
  _add_train(sub)
  _add_run_commands(sub)
  _add_tool_commands(sub)
  parser.set_defaults(commands=sub.choices)
  return parser


def _check_command(parser, argv):
  """Exits 2 with the nearest command if `argv`'s command is not one."""
  commands = parser.get_default('commands')
  word = next((a for a in argv if not a.startswith('-')), None)
  if word is not None and word not in commands:
    hint = (suggest.did_you_mean(word, commands) or
            f'; the commands are {", ".join(commands)}')
    parser.error(f'unknown command {word!r}{hint}')


def _check_unrecognized(command, extras):
  """Exits 2 naming the arguments no option of `command` takes, and the
  option nearest the first unknown one."""
  options = [e.split('=', 1)[0] for e in extras if e.startswith('-')]
  hint = suggest.did_you_mean(options[0], command.option_names) if options else ''
  command.error(f'unrecognized arguments: {" ".join(extras)}{hint}')


def _check_set_keys(args):
  """Raises ConfigError, suggesting the nearest key, if a `--set` names no
  config key: before a command imports JAX."""
  for item in getattr(args, 'set', None) or ():
    if '=' in item:  # Else config.load says what --set expects.
      config_lib.key_of(item.split('=', 1)[0].strip())


def parse_args(argv=None):
  """The parsed command line. Usage errors exit 2 with one line, suggesting
  the nearest command, option or config key for a typo."""
  parser = build_parser()
  argv = sys.argv[1:] if argv is None else list(argv)
  _check_command(parser, argv)
  args, extras = parser.parse_known_args(argv)
  command = parser.get_default('commands').get(args.command, parser)
  if extras:
    _check_unrecognized(command, extras)
  return args


def user_errors():
  """Errors that mean the user asked for something that cannot be done (a
  bad argument, config key, path, checkpoint or data): one line, exit 2.

  Every `retrax.Error` is one, unless `deliberate` says it wraps a bug; a
  disk that is full, read-only or not writable (`_DISK_ERRNOS`) is too,
  saying what was kept. Anything else is a bug and keeps its traceback.
  """
  return (Error, FileNotFoundError, FileExistsError, NotADirectoryError,
          IsADirectoryError)


_DISK_ERRNOS = frozenset((errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES,
                          errno.EPERM, errno.EFBIG, errno.EIO))


def _kept(args):
  """After a disk error in command `args`: (what was kept, what to do)."""
  if args.command == 'train':
    from retrax.supervised import checkpointing
    out = _load_config(args).train.output_dir
    step = checkpointing.saved_step(out)
    return ('no checkpoint had been saved' if step is None else
            f'the run keeps its checkpoints up to step {step}',
            f'free space (or make {out} writable) and run the same command '
            'again to resume')
  if args.command == 'convert':
    return (f'{args.src} is unchanged',
            'free space or choose a writable destination')
  if args.command == 'plot':
    return ('the run is unchanged and no PNG was written',
            'free space or pass --out with a writable path')
  return 'nothing was changed', "check the path's disk and permissions"


def _disk_error(args, e):
  """The one line for `OSError` `e` of the disk in command `args`."""
  kept, todo = _kept(args)
  code = errno.errorcode.get(e.errno, str(e.errno))
  where = e.filename if e.filename is not None else 'a file of the run'
  return (f'{e.strerror or e} ({code}): {where}. Nothing half-written is '
          f'left; {kept}. To go on, {todo}.')


def _error(args, message):
  print(f'retrax {args.command}: error: {message}', file=sys.stderr)
  return 2


def main(argv=None):
  args = parse_args(argv)
  if args.command is None:
    build_parser().print_help()
    return 2
  try:
    _check_paths(args)
    _check_set_keys(args)  # A typo is answered before JAX is imported.
  except Error as e:
    return _error(args, one_line(e))
  from retrax.supervised import interrupts
  try:
    rc = args.func(args)
  except user_errors() as e:
    if isinstance(e, Error) and not deliberate(e):
      raise  # A LayerError around a bug.
    return _error(args, one_line(e))
  except OSError as e:
    if e.errno in (errno.ENAMETOOLONG, errno.ELOOP):  # A path the user gave.
      return _error(args, f'{e.strerror}: {str(e.filename)[:200]}.')
    if e.errno not in _DISK_ERRNOS:
      raise
    return _error(args, _disk_error(args, e))
  except interrupts.TrainingStopped as e:  # The step is saved, logs flushed.
    # A scheduler signals every host of a run, some after they stopped at a
    # peer's signal: exiting already, they keep the code of a stop.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print(f'retrax {args.command}: {e}', file=sys.stderr)
    return interrupts.EXIT_CODES[e.signum]
  except KeyboardInterrupt:  # Ctrl-C outside a training loop: no traceback.
    print(f'retrax {args.command}: interrupted (Ctrl-C).', file=sys.stderr)
    return interrupts.EXIT_CODES[signal.SIGINT]
  return rc or 0

