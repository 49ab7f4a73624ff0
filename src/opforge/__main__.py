"""``python -m opforge`` runs the command line (see ``opforge.cli``)."""

import sys

from .cli import main

sys.exit(main())
