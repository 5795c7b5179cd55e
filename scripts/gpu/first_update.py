"""Whether a policy's rollouts slow once its own policy has been updated, and why: one plan,
planned without a trial, then per variant its workers rebuilt to their launch state (as a run's
are), rollouts timed back to back ("before"), then each after a PPO update ("after"):

    lr0         updates at learning rate 0 (a trial's: the work, no weight moved)
    lr1         updates at learning rate 1 (a run's first: the work and what is learned)
    one_thread  lr0 with the policy process's torch on one thread

The same jump from before to after under lr0 and lr1 says the update's work slows the rollouts,
under lr1 alone what the policy learned; one_thread without it, the pixel policy's intra-op
threads (its torch keeps the default count, the cores it may use; the state policy runs on one).
Each rollout's seconds inside env steps (per env worker) and inside policy calls say which side
slowed. The variants run one after another, so the host's drift between them is in the
comparison: read the jump within a variant.

    python scripts/gpu/first_update.py --device cuda --pixels --num-envs 96 --env-cores 3 \
        --out first_update.json

On one H200 (calls CM, CN: pixels, 96 envs, temporal) the trials' rollouts ran 0.25-0.28 s
back to back and 0.30-0.32 s in the first one after the policy's first update (at learning rate
1), and stayed about there. The cost probe's timed updates (on a copy of the policy, in the same
process) run before all of this here as there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for cycle_repeat

VARIANTS = {"lr0": (0.0, None), "lr1": (1.0, None), "one_thread": (0.0, 1)}


def _threads(worker: object, n: int | None = None) -> int:
    """Runs in the policy's process (``__ray_call__``): set torch's intra-op threads to ``n``
    when given; return the count in use."""
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def _row(r: object, workers: int) -> dict:
    return {
        "wall_s": r.wall_s,
        "env_busy_s": r.env_busy_s / workers,
        "policy_busy_s": r.policy_busy_s,
        "policy_calls": r.policy_calls,
        "graph_captures": r.policy_graph_captures,
    }


def main() -> None:
    import ray
    from cycle_repeat import one_plan, rebuilt

    from loomrl.worker import wait

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placement", default="temporal", choices=["temporal", "hybrid"])
    ap.add_argument("--num-envs", type=int, default=96)
    ap.add_argument("--steps", type=int, default=32, help="steps per env per rollout (S)")
    ap.add_argument("--reps", type=int, default=8, help="rollouts before and after, per variant")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--pixels", action="store_true", help="64x64 image observations (CNN)")
    ap.add_argument("--env-cores", type=float, default=1.0, help="env.cpu_cores per env worker")
    ap.add_argument("--out", default="first_update.json")
    args = ap.parse_args()

    S = args.steps
    extra = [f"env.cpu_cores={args.env_cores}", "auto_trial_steps=0"]  # no trial: no update yet
    if args.device == "cuda":
        extra.append("run.num_gpus=null")
    if args.pixels:
        extra += ["env.pixels=true", "env.image_size=64"]
    res: dict = {"args": vars(args), "variants": {}}
    with one_plan(args.placement, args.num_envs, S, extra) as (place, policy, cycle):
        actor = policy.actors[0]  # rebuilt in place: the same process throughout
        res["placement"] = place.describe()
        res["policy_threads"] = ray.get(actor.__ray_call__.remote(_threads))
        for name, (lr, threads) in VARIANTS.items():
            cycle = rebuilt(cycle, place.groups)
            ray.get(actor.__ray_call__.remote(_threads, threads or res["policy_threads"]))
            cycle.collect(S)  # warm-up: its calls record the graphs
            before = [_row(cycle.collect(S), cycle.workers) for _ in range(args.reps)]
            after = []
            for _ in range(args.reps):
                wait(policy.update(lr))
                after.append(_row(cycle.collect(S), cycle.workers))
            res["variants"][name] = {"before": before, "after": after}
    print(f"{args.placement} {res['placement']}: policy threads {res['policy_threads']}")
    for name, v in res["variants"].items():
        med = {
            when: {
                k: statistics.median(r[k] for r in rows)
                for k in ("wall_s", "env_busy_s", "policy_busy_s")
            }
            for when, rows in v.items()
        }
        b, a = med["before"], med["after"]
        print(
            f"  {name:<11} rollout {b['wall_s']:.3f} -> {a['wall_s']:.3f} s "
            f"({100 * (a['wall_s'] / b['wall_s'] - 1):+.1f}%), env busy {b['env_busy_s']:.3f} -> "
            f"{a['env_busy_s']:.3f}, policy busy {b['policy_busy_s']:.3f} -> "
            f"{a['policy_busy_s']:.3f}, captures {v['after'][-1]['graph_captures']}"
        )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
