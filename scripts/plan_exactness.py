"""The planner's search against references, on many more random profiles than the tests run.

    python scripts/plan_exactness.py --brute 1000 --dense-brute 1000 --plain 120

``--brute N``: N random profiles (2-4 components, chains and DAGs, cycles, memory and core
caps, up to 12 devices) searched as shipped and by brute force (``exhaustive_times``).
``--dense-brute N``: the same with every shortcut of the many-counts path forced on (the
scout's grids, the windows of pairs narrowed however few, the hybrid cases on every graph).
``--plain N``: larger profiles with most device counts valid (3-5 components, 10-40 devices),
searched as shipped and by the plain DP (no scout, no bounds, every pair made). Every mode's
optimum must agree (relative 1e-9); the last line reads ``mismatches: <n> of <checked>`` and
the exit status is 1 when n > 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The checkout's loomrl, found without an install (python scripts/plan_exactness.py puts only
# scripts/ on the path), and the tests' random profiles.
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit")]
from _plan_random import random_profile  # noqa: E402

from loomrl.errors import PlanError  # noqa: E402

search = importlib.import_module("loomrl.plan.search")


def _times(prof) -> dict:
    try:
        return {k: (p.predicted_s if p else None) for k, p in search.search_all(prof).items()}
    except PlanError:
        return {k: None for k in ("best", *search.MODES)}


def _same(a: dict, b: dict) -> bool:
    for k in b:
        if (a[k] is None) != (b[k] is None):
            return False
        if b[k] is not None and abs(a[k] - b[k]) > 1e-9 * max(1.0, abs(b[k])):
            return False
    return True


@contextlib.contextmanager
def _patched(**values):
    """Module constants and _DP methods set for the block, then restored."""
    saved = {}
    for name, value in values.items():
        owner = search._DP if name.startswith("_DP.") else search
        attr = name.removeprefix("_DP.")
        saved[(owner, attr)] = getattr(owner, attr)
        setattr(owner, attr, value)
    try:
        yield
    finally:
        for (owner, attr), value in saved.items():
            setattr(owner, attr, value)


def _random(rng: np.random.Generator, large: bool = False):
    """A small profile (2-4 components, up to 12 devices, a few counts each), or a larger one
    with most counts valid (3-5 components, 10-40 devices)."""
    v = int(rng.integers(3, 6) if large else rng.integers(2, 5))
    top = (40 if v < 5 else 20) if large else (13 if v < 4 else 7)
    n = int(rng.integers(10 if large else 2, top))
    return random_profile(
        rng,
        v,
        n,
        dag=bool(rng.random() < (0.6 if large else 0.5)),
        cycle=bool(rng.random() < 0.3),
        cores=bool(rng.random() < 0.25),
        dense=large,
    )


def _plain(prof) -> dict:
    with _patched(
        _scout=lambda dp, grans: (np.full(2, np.inf), []),
        _ALL_PAIRS=1 << 62,
        **{"_DP._hybrid": lambda self, s, out, F, *rest: np.ones(len(F), bool)},
    ):
        return _times(prof)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brute", type=int, default=300)
    ap.add_argument("--dense-brute", type=int, default=300)
    ap.add_argument("--plain", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    bad = checked = 0

    def check(kind: str, seed: int, got: dict, want: dict) -> None:
        nonlocal bad, checked
        checked += 1
        if not _same(got, want):
            bad += 1
            print(f"MISMATCH {kind} seed {seed}: search {got} reference {want}", flush=True)

    for i in range(args.brute):
        prof = _random(np.random.default_rng(args.seed + i))
        check("brute", args.seed + i, _times(prof), search.exhaustive_times(prof))
    with _patched(_DENSE_OPTIONS=0, _ALL_PAIRS=0, _NARROW_ABOVE=0, _REFINE_ABOVE=0):
        for i in range(args.dense_brute):
            seed = args.seed + 100_000 + i
            prof = _random(np.random.default_rng(seed))
            check("dense-brute", seed, _times(prof), search.exhaustive_times(prof))
    for i in range(args.plain):
        seed = args.seed + 200_000 + i
        prof = _random(np.random.default_rng(seed), large=True)
        check("plain", seed, _times(prof), _plain(prof))
    print(f"mismatches: {bad} of {checked}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
