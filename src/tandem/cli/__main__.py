"""``python -m tandem.cli``: the same as the ``tandem`` command."""

import sys

from tandem.cli import main

sys.exit(main())
