"""``python -m streamrl`` is the ``streamrl`` command."""

import sys

from streamrl.cli import main

sys.exit(main())
