"""Does one pixel policy call cost the same in every process? The same measurement in fresh ones.

    python scripts/gpu/policy_launches.py --launches 6 --out policy_launches.json

The embodied benchmark's split cycle is policy-bound on the GPU machines, and the policy's busy
time per rollout differed by up to 1.9x from one launch of workers to the next while staying
steady within a launch. This starts ``--launches`` fresh Python processes one after another;
each builds the built-in CNN policy on the GPU and times ``scripts/gpu/policy_call.py``'s call
paths (``act`` as the worker acts, ``act_graph`` with its forward replayed as a CUDA graph,
``forward`` alone, ``h2d``) at 8 and 16 rows, twice, a few
seconds apart. A spread between processes that the repeat within a process does not show is a
property of the process (its CUDA context, its memory, its core), not of the cycle around it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path


def one_launch(reps: int, q) -> None:
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parents[1])]  # policy_call, and loomrl from the checkout
    from policy_call import measure

    first = measure(reps, [8, 16])
    time.sleep(3.0)
    again = measure(reps, [8, 16])
    q.put(
        {"pid": os.getpid(), "cores": len(os.sched_getaffinity(0)), "first": first, "again": again}
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--launches", type=int, default=6)
    p.add_argument("--reps", type=int, default=60)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    rows = []
    for i in range(args.launches):
        q = ctx.Queue()
        proc = ctx.Process(target=one_launch, args=(args.reps, q))
        proc.start()
        proc.join(timeout=300)
        if q.empty():
            proc.kill()
            raise SystemExit(f"launch {i} gave no result (exit code {proc.exitcode})")
        rows.append(q.get())
        r = rows[-1]
        print(
            f"launch {i}: "
            + "  ".join(
                f"{k} n={n} {1e3 * r['first'][n][k]:.2f}/{1e3 * r['again'][n][k]:.2f}"
                for n in (8, 16)
                for k in ("act", "act_graph", "forward", "h2d")
                if k in r["first"][n]
            )
            + "  (ms, first/again)",
            flush=True,
        )
    for n in (8, 16):
        for k in ("act", "act_graph", "forward"):
            if k not in rows[0]["first"][n]:
                continue
            xs = [r["first"][n][k] for r in rows]
            drift = [abs(r["again"][n][k] / r["first"][n][k] - 1) for r in rows]
            print(
                f"n={n} {k}: across launches {1e3 * min(xs):.2f}-{1e3 * max(xs):.2f} ms "
                f"(max/min {max(xs) / min(xs):.2f}); within a launch, repeat differs by at most "
                f"{100 * max(drift):.1f}%"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2, default=str))


if __name__ == "__main__":
    main()
