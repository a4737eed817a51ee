"""`python -m draftsman ...`: the CLI, where the `draftsman` script is not installed."""

import sys

from draftsman.cli.main import main

sys.exit(main())
