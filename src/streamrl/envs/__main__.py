"""``python -m streamrl.envs list | play NAME ...``: the terminal player, which lives with the
command line (``streamrl/play.py``); this entry point only starts it."""

import sys

from streamrl.play import main

if __name__ == "__main__":
    sys.exit(main())
