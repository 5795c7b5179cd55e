"""Whether a trial should time an S-step rollout whole or estimate it from two shorter ones:
one plan's rollouts of L, 2L and S steps timed in turns (a PPO update after each pass, as in a
run), then both estimators resampled from them against the median of the S-step rollouts.
Resampling treats the rollouts as independent draws, though the host's slow spells make
rollouts seconds apart alike, and judges the whole-rollout estimate on the rollouts it draws
from: read the spreads as a comparison of the two estimators, not as a trial's error.

    python scripts/trial_lengths.py --placement hybrid --out trial_lengths.json

The estimate from L and 2L is 3 x m(2L) - 2 x m(L) at S = 4L: their noise, magnified. The
recipe's trials use it only for rollouts longer than 2 x auto_trial_steps.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics


def _summary(est: list[float], truth: float) -> dict[str, float]:
    return {
        "bias": statistics.fmean(est) / truth - 1,
        "spread": statistics.pstdev(est) / truth,
        "within_5pct": sum(abs(x / truth - 1) <= 0.05 for x in est) / len(est),
    }


def main() -> None:
    # beside this script (on the path when run as python scripts/trial_lengths.py): its setup
    from cycle_repeat import one_plan

    from loomrl.cycle_trial import _trial_estimate  # the trials' own estimate
    from loomrl.worker import wait

    ap = argparse.ArgumentParser()
    ap.add_argument("--placement", default="hybrid", choices=["temporal", "hybrid", "auto"])
    ap.add_argument("--num-envs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=64, help="S, the rollout to predict")
    ap.add_argument("--short", type=int, default=16, help="L: the estimate times L and 2L")
    ap.add_argument("--reps", type=int, default=20, help="rollouts of each length")
    ap.add_argument("--out", default="trial_lengths.json")
    args = ap.parse_args()
    if args.steps <= 2 * args.short:
        ap.error(
            f"--steps {args.steps}: must exceed 2 x --short ({2 * args.short}), the only case estimated"
        )

    S, L = args.steps, args.short
    with one_plan(args.placement, args.num_envs, S) as (place, policy, cycle):
        cycle.collect(L)  # warm-up
        timed: dict[int, list[float]] = {L: [], 2 * L: [], S: []}
        for _ in range(args.reps):
            for steps, v in timed.items():
                v.append(cycle.collect(steps).wall_s)
            wait(policy.update(1.0))
    truth = statistics.median(timed[S])
    gen = random.Random(0)
    # As the trials estimate: medians of 2 rollouts of L and of 2L, or of 3 rollouts of S.
    from_short, whole = [], []
    for _ in range(20000):
        short = {n: gen.sample(timed[n], 2) for n in (L, 2 * L)}
        from_short.append(_trial_estimate(short, S, L))
        whole.append(_trial_estimate({S: gen.sample(timed[S], 3)}, S, L))
    res = {
        "args": vars(args),
        "placement": place.describe(),
        "timed_s": {str(k): v for k, v in timed.items()},
        "median_s": truth,
        "from_short": _summary(from_short, truth),
        "whole": _summary(whole, truth),
    }
    print(f"{args.placement} k={place.groups}: median {S}-step rollout {truth:.3f} s")
    for name in ("from_short", "whole"):
        r = res[name]
        print(
            f"  {name:<10} bias {100 * r['bias']:+.1f}%  spread {100 * r['spread']:.1f}%  "
            f"within 5% {100 * r['within_5pct']:.0f}% of draws"
        )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
