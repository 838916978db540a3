"""'Did you mean ...?' for a name the user mistyped: a config key, an option, a command."""

import difflib


def nearest(name, choices):
  """The choice closest to `name` (difflib's ratio >= 0.6), or None."""
  matches = difflib.get_close_matches(name, list(choices), n=1)
  return matches[0] if matches else None


def did_you_mean(name, choices):
  """`"; did you mean 'x'?"` for the choice nearest `name`, or '' if none is near."""
  match = nearest(name, choices)
  return f'; did you mean {match!r}?' if match else ''
