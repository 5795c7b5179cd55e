"""``python -m loomrl ...``: the same as the ``loomrl`` command (run | plan | profile | ...)."""

import sys

from loomrl.cli import main

if __name__ == "__main__":
    sys.exit(main())
