"""`python -m retrax.trainer`, as Trax users run `python -m trax.trainer`.

The runner lives in `retrax.app.trainer`; this module keeps Trax's path (and
`retrax.compat`'s `trax.trainer`) for the command.
"""

import sys

from retrax.app import trainer

if __name__ == '__main__':
  sys.exit(trainer.main())
