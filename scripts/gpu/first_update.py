"""Whether a policy's rollouts slow once its process has run a PPO update, and whether the
policy process's intra-op threads are why: one plan, planned without a trial (no update runs in
the policy's process before the first pattern), its rollouts timed back to back ("fresh"), then
after one update at learning rate 0 ("after_update"), then again with the policy's torch on one
thread ("one_thread"), and with an update before each ("one_thread_updates"). Each rollout's
seconds inside env steps (per env worker) and inside policy calls say which side slowed.

    python scripts/gpu/first_update.py --device cuda --pixels --num-envs 96 --env-cores 3 \
        --out first_update.json

On one H200 (calls CM, CN: pixels, 96 envs, temporal) the trials' rollouts ran 0.25-0.28 s
back to back and 0.30-0.32 s in the first one after the process's first update, and stayed
about there. The pixel policy's torch keeps its default thread count (the cores it may use),
where the state policy runs on one thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for cycle_repeat


def _threads(worker: object, n: int | None = None) -> int:
    """Runs in the policy's process (``__ray_call__``): set torch's intra-op threads to ``n``
    when given; return the count in use."""
    import torch

    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def main() -> None:
    import ray
    from cycle_repeat import one_plan

    from loomrl.worker import wait

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placement", default="temporal", choices=["temporal", "hybrid"])
    ap.add_argument("--num-envs", type=int, default=96)
    ap.add_argument("--steps", type=int, default=32, help="steps per env per rollout (S)")
    ap.add_argument("--reps", type=int, default=8, help="rollouts per pattern")
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
    res: dict = {"args": vars(args), "patterns": {}}
    with one_plan(args.placement, args.num_envs, S, extra) as (place, policy, cycle):
        actor = policy.actors[0]
        res["placement"] = place.describe()
        res["threads_before"] = ray.get(actor.__ray_call__.remote(_threads))
        cycle.collect(S)  # warm-up: its calls record the graphs

        def time(name: str, update_each: bool = False) -> None:
            rows = []
            for _ in range(args.reps):
                if update_each:
                    wait(policy.update(0.0))
                r = cycle.collect(S)
                rows.append(
                    {
                        "wall_s": r.wall_s,
                        "env_busy_s": r.env_busy_s / cycle.workers,
                        "policy_busy_s": r.policy_busy_s,
                        "policy_calls": r.policy_calls,
                        "graph_captures": r.policy_graph_captures,
                    }
                )
            res["patterns"][name] = rows

        time("fresh")
        wait(policy.update(0.0))  # the process's first update
        time("after_update")
        res["threads_after"] = ray.get(actor.__ray_call__.remote(_threads, 1))
        time("one_thread")
        time("one_thread_updates", update_each=True)
    print(f"{args.placement} {res['placement']}: policy threads {res['threads_before']}")
    for name, rows in res["patterns"].items():
        med = {
            k: statistics.median(r[k] for r in rows)
            for k in ("wall_s", "env_busy_s", "policy_busy_s")
        }
        print(
            f"  {name:<19} rollout {med['wall_s']:.3f} s, env busy {med['env_busy_s']:.3f}, "
            f"policy busy {med['policy_busy_s']:.3f}, captures {rows[-1]['graph_captures']}"
        )
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
