"""`python -m retrax` runs the CLI (`retrax.app.cli`)."""

import sys

from retrax.app.cli import main

sys.exit(main())
