"""``python -m substrate.cli``: the ``ate`` command."""

import sys

from substrate.cli.main import main

sys.exit(main())
