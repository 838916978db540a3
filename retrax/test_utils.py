"""Helpers for tests of Trax-style programs (Trax's `trax.test_utils`)."""

import sys


def ensure_flag(flag_str):
  """Makes sure absl flag `flag_str` is readable and set, parsing flags if needed.

  Under pytest no `main` parses absl's flags, so reading one raises
  `UnparsedFlagAccessError`; then the known flags of `sys.argv` are parsed
  (the rest, e.g. pytest's own options, are left alone). Raises
  `AssertionError` if the flag's value is empty.
  """
  try:
    from absl import flags
  except ImportError as e:
    raise ImportError('retrax.test_utils.ensure_flag needs absl-py '
                      '(pip install absl-py).') from e
  flag_values = flags.FLAGS
  try:
    getattr(flag_values, flag_str)
  except flags.UnparsedFlagAccessError:
    flag_values(sys.argv[:1] + [a for a in sys.argv[1:] if a.startswith('--')
                                and _is_known(flag_values, a)],
                known_only=True)
  value = getattr(flag_values, flag_str)
  if not value:
    raise AssertionError(f'absl flag {flag_str!r} is not set.')
  return value


def _is_known(flag_values, arg):
  name = arg[2:].split('=', 1)[0]
  if name.startswith('no'):
    name = name[2:] if name[2:] in flag_values else name
  return name in flag_values
