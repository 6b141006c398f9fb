"""``python -m rl_lightning``."""

import sys

from rl_lightning.cli import main

if __name__ == "__main__":
    sys.exit(main())
