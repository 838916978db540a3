"""`python -m retrax` runs the CLI."""

import sys

from retrax.cli import main

sys.exit(main())
