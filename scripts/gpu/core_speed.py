"""Is the host's speed the same on every core, and over time? One process, pinned core by core.

    python scripts/gpu/core_speed.py --sweeps 3 --out core_speed.json

The pixel policy's row-by-row forward is bound by the host launching kernels, and it ran 1.8x
slower in some fresh processes than in others (``policy_launches.py``). This pins one process to
each core in turn and times, there: a pure-Python loop (the host alone) and, when a GPU is
present, the built-in CNN policy's forward over 8 rows, row by row, with one synchronise. It
sweeps all cores ``--sweeps`` times: a core slow in every sweep is a property of the core; slow
cores that move between sweeps are the host's load changing under us.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def python_loop() -> float:
    t = time.perf_counter()
    x = 0
    for i in range(200_000):
        x += i * i % 7
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sweeps", type=int, default=3)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import gymnasium as gym
    import numpy as np
    import torch

    from loomrl.policies import make_policy

    cores = sorted(os.sched_getaffinity(0))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    net = make_policy(
        gym.spaces.Box(0, 255, (3, 64, 64), np.uint8),
        gym.spaces.Box(-3.0, 3.0, (1,), np.float32),
        0,
    ).to(dev)
    x = torch.rand(8, 3, 64, 64, device=dev)

    def forward() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            net._rows(x)  # row by row, as the worker acts
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    def stat() -> list[int]:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]

    sweeps, steals = [], []
    for s in range(args.sweeps):
        row, a = {}, stat()
        for c in cores:
            os.sched_setaffinity(0, {c})
            forward()
            python_loop()
            row[c] = {
                "python_ms": 1e3 * statistics.median(python_loop() for _ in range(args.reps)),
                "forward_ms": 1e3 * statistics.median(forward() for _ in range(args.reps)),
            }
        sweeps.append(row)
        b = stat()
        steals.append((b[7] - a[7]) / max(1, sum(b) - sum(a)))  # time the hypervisor took
        py = [v["python_ms"] for v in row.values()]
        fw = [v["forward_ms"] for v in row.values()]
        print(
            f"sweep {s}: python loop {min(py):.2f}-{max(py):.2f} ms, forward 8 rows "
            f"{min(fw):.2f}-{max(fw):.2f} ms over {len(cores)} cores; host CPU steal {100 * steals[-1]:.1f}%",
            flush=True,
        )
        print(
            "  forward ms per core: "
            + " ".join(f"{c}:{v['forward_ms']:.1f}" for c, v in row.items())
        )
        print(
            "  python ms per core: " + " ".join(f"{c}:{v['python_ms']:.1f}" for c, v in row.items())
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps({"device": dev, "sweeps": sweeps, "steal_share": steals}, indent=2)
        )


if __name__ == "__main__":
    main()
