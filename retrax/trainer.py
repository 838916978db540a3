"""`python -m retrax.trainer --config_file=... --output_dir=...`, like Trax's entry point.

The config file is TOML with `retrax train`'s keys (gin files are not read:
retrax has no gin in its core). Equivalent to
`retrax train --config FILE --output_dir DIR`.
"""

import argparse
import sys

from retrax import cli


def main(argv=None):
  parser = argparse.ArgumentParser(prog='python -m retrax.trainer')
  parser.add_argument('--config_file', required=True, help='TOML config')
  parser.add_argument('--output_dir', required=True)
  parser.add_argument('--config', action='append', default=[],
                      metavar='KEY=VALUE', help='override a config key')
  args = parser.parse_args(argv)
  if args.config_file.endswith('.gin'):
    print('retrax.trainer: error: gin files are not supported; write the '
          'settings as TOML (see `retrax train --help`).', file=sys.stderr)
    return 2
  train_argv = ['train', '--config', args.config_file, '--output_dir',
                args.output_dir]
  for item in args.config:
    train_argv += ['--set', item]
  return cli.main(train_argv)


if __name__ == '__main__':
  sys.exit(main())
