"""``python -m loomrl.plan PROFILE --devices N``: the same as ``loomrl plan``."""

import sys

from loomrl.plan.cli import plan_main

if __name__ == "__main__":
    sys.exit(plan_main(sys.argv[1:]))
