"""The planner on random DAG profiles against the planner of an earlier commit: same plans.

    python scripts/plan_pairing_equivalence.py --count 300 --base 06b5fe9

For the way the search pairs the point sets of two sub-graphs (``search._DP._pairs`` and
``_combine``, made and tested in chunks since the commit after ``--base``) and filters them
(``search._pareto_idx``). Loads ``loomrl/plan/search.py`` and ``cost.py`` as they were at
``--base`` (as ``scripts/plan_cycle_equivalence.py`` does) and runs both planners'
``search_all`` on ``--count`` random profiles: the tests' random profiles (2-5 components,
chains and DAGs, a cycle, core limits, most counts valid) on up to 40 devices, and every fourth
a PPO-like DAG of 4-6 components with every count valid on up to ``--max-devices`` devices.
Each profile is searched by the base as shipped and by the checkout as shipped, with tiny
chunks (1 and 7 pairs: many chunks per pairing), with the windows of pairs on every set
(``_ALL_PAIRS = 0``, on both; the checkout's narrowed however few, ``_NARROW_ABOVE = 0``), with
the Pareto filter's bucket tables (``search._dominated_early``) on every set of F, P, memory
and u of more than ``_BLOCK`` points, in chunks of 8, and with its exact tables by rank
(``search._front_by_ranks``) on every set of more than ``_BLOCK`` points, in chunks of 4, with
pairs made in chunks of 64 of which only each chunk's front is kept (``search._chunk_front``).
Every mode's plan must be the same (predicted_s, micro_batch, the tree and the rest of the
plan's JSON but search_s), and where no plan fits, the same error message. The last line reads
``differences: <n> of <checked>``; exit status 1 when n > 0.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# The checkout's loomrl and the tests' random profiles, found without an install
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit"), str(ROOT / "scripts")]
from _plan_random import random_profile  # noqa: E402
from plan_cycle_equivalence import load_base, outcome, parse_args  # noqa: E402

from loomrl.plan import load_profile  # noqa: E402

new_search = importlib.import_module("loomrl.plan.search")
BASE = "06b5fe9"  # the last commit before the pairs were made in chunks


@contextlib.contextmanager
def _set(module, **values):
    saved = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def ppo_like(rng: np.random.Generator, max_devices: int):
    """A DAG of 4-6 components (rollout first, the trainers last), every count 1..N valid,
    costs off a smooth curve by up to 20%, memory that binds on few devices."""
    v = int(rng.integers(4, 7))
    n = int(rng.integers(8, max_devices + 1))
    names = [f"c{i}" for i in range(v)]
    valid = list(range(1, n + 1))
    comps = {}
    for name in names:
        base = float(rng.uniform(0.02, 0.3))
        p = float(rng.uniform(0.3, 0.9))
        off = 1 + 0.2 * rng.uniform(-1, 1, n) * (rng.random() < 0.5)
        comps[name] = {
            "valid_devices": valid,
            "time": {
                "alpha": round(float(rng.uniform(0.05, 0.5)), 3),
                "per_item": {d: base * d**-p * float(f) for d, f in zip(valid, off, strict=True)},
            },
            "memory_gb": {d: 40 + float(rng.uniform(10, 60)) / d for d in valid},
            "switch_s": round(float(rng.uniform(0.5, 5)), 2),
        }
    edges = [[names[0], x] for x in names[1:-1]] + [[x, names[-1]] for x in names[1:-1]]
    edges += [
        [names[i], names[j]]
        for i in range(1, v - 1)
        for j in range(i + 1, v - 1)
        if rng.random() < 0.2
    ]
    batch = int(rng.choice([256, 512, 1024]))
    grans = sorted(int(g) for g in rng.choice([8, 16, 32, 64, 128, batch], size=3, replace=False))
    return load_profile(
        {
            "devices": n,
            "device_memory_gb": 80,
            "batch": batch,
            "granularities": grans,
            "components": comps,
            "edges": edges,
        }
    )


def _profile(seed: int, max_devices: int):
    rng = np.random.default_rng(seed)
    if seed % 4 == 3:
        return ppo_like(rng, max_devices)
    v = int(rng.integers(2, 6))
    return random_profile(
        rng,
        v,
        int(rng.integers(4, 41 if v < 5 else 25)),
        dag=bool(rng.random() < 0.6),
        cycle=bool(rng.random() < 0.3),
        cores=bool(rng.random() < 0.25),
        dense=bool(rng.random() < 0.7),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, 48, BASE)
    bad = checked = 0
    t_old = t_new = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        old_search = load_base(args.base, Path(tmp))
        for i in range(args.count):
            seed = args.seed + i
            prof = _profile(seed, args.max_devices)
            t = time.perf_counter()
            want = outcome(old_search, prof)
            with _set(old_search, _ALL_PAIRS=0):
                want_w = outcome(old_search, prof)
            t_old += time.perf_counter() - t
            t = time.perf_counter()
            runs = {"shipped": (outcome(new_search, prof), want)}
            for chunk in (1, 7):
                with _set(new_search, _PAIR_CHUNK=chunk):
                    runs[f"chunk {chunk}"] = (outcome(new_search, prof), want)
                with _set(new_search, _PAIR_CHUNK=chunk, _ALL_PAIRS=0, _NARROW_ABOVE=0):
                    runs[f"chunk {chunk}, windows"] = (outcome(new_search, prof), want_w)
            # the Pareto filter's tables on every set of four rows, in small chunks
            with _set(
                new_search, _TABLE_ABOVE=0, _TABLE_CHUNK=8, _TABLE_BUCKETS=16, _EXACT_ABOVE=1 << 62
            ):
                runs["tables"] = (outcome(new_search, prof), want)
            # the exact tables by rank (and the cube) on every set of more than _BLOCK points,
            # in tiny chunks, and only the front of each chunk of 64 pairs kept
            exact = dict(_EXACT_ABOVE=0, _EXACT_CHUNK=4, _EXACT_PER_POINT=1 << 30)
            with _set(new_search, **exact, _CUBE_PER_POINT=1 << 30, _CHUNK_FRONT_ABOVE=0):
                with _set(new_search, _PAIR_CHUNK=64):
                    runs["exact tables"] = (outcome(new_search, prof), want)
            t_new += time.perf_counter() - t
            for name, (got, ref) in runs.items():
                checked += 1
                if got != ref:
                    bad += 1
                    diff = sorted(k for k in set(got) | set(ref) if got.get(k) != ref.get(k))
                    print(f"DIFFERENCE seed {seed} ({name}, {prof.devices} devices) in {diff}")
    print(f"seconds: base {t_old:.1f} now {t_new:.1f}")
    print(f"differences: {bad} of {checked}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
