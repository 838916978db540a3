"""The error type for unusable user input (shared by the CLI and the library)."""


class UserInputError(ValueError):
  """A value the user supplied (argument, config key, file, environment) cannot be used.

  The `retrax` command prints these as one line and exits with code 2; every
  other exception is a bug and keeps its traceback. A `ValueError`, so code
  that catches `ValueError` keeps working.
  """
