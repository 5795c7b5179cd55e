"""The env <-> policy cycle with each way of handing off, on the same workers.

    python scripts/handoff_cycle.py --rounds 8 --handoffs driver,direct,pipe --out handoff_cycle.json

The embodied benchmark's CPU config planned as hybrid (``cycle_repeat.one_plan``), then on its
workers the cycle at k = 1 and 2 with ``handoff="driver"`` (every call submitted by the driver),
``handoff="direct"`` (the env worker calls the policy itself) and ``handoff="pipe"`` (replies
and actions over a socket), one rollout of S steps each per round, taking turns, the order
turned each round. Prints seconds per rollout (medians and ranges) and, per k, the first
hand-off's median over each other's.
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    from cycle_repeat import one_plan

    from loomrl.cycle import EnvPolicyCycle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64, help="steps per env per rollout (S)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--handoffs", default="driver,direct", help="comma-separated, first: baseline")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    hands = args.handoffs.split(",")
    with one_plan("hybrid", args.num_envs, args.steps) as (place, _policy, cycle):
        per_worker = args.num_envs // place.workers
        cycles = {
            f"k={k} {h}": EnvPolicyCycle(cycle.envs, cycle.policy, per_worker, k, True, handoff=h)
            for k in (1, 2)
            for h in hands
        }
        for c in cycles.values():  # untimed: each path's first rollout
            c.collect(args.steps)
        timed: dict[str, list[float]] = {name: [] for name in cycles}
        names = list(cycles)
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                timed[name].append(cycles[name].collect(args.steps).wall_s)
    med = {k: statistics.median(v) for k, v in timed.items()}
    print(f"placement {place.describe()}, S={args.steps}, {args.rounds} rounds")
    for name, v in timed.items():
        print(f"{name:<12} s per rollout: median {med[name]:.4f}, {min(v):.4f}-{max(v):.4f}")
    ratios = {
        f"k={k} {hands[0]} / {h}": med[f"k={k} {hands[0]}"] / med[f"k={k} {h}"]
        for k in (1, 2)
        for h in hands[1:]
    }
    for name, x in ratios.items():
        print(f"{name}: {x:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "placement": place.describe(),
                    "rollout_s": timed,
                    "median_s": med,
                    "ratio": ratios,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
