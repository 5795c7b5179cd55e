"""Whether a policy's rollouts slow once its own policy has been updated, and why: one plan,
planned without a trial, then per variant its workers rebuilt to their launch state (as a run's
are), rollouts timed back to back ("before"), then each after the variant's step ("after"):

    lr0          a PPO update at learning rate 0 (a trial's: the work, no weight moved)
    lr1          a PPO update at learning rate 1 (a run's first: the work and what is learned)
    eager_step   lr0 with the minibatch step run eagerly (no recorded PPO step graph)
    release      lr0, then the recorded step graph, the gradients and the allocator's cache
                 released (each update records the step again)
    copy_only    the update's copy of the rollout to the device, no PPO
    sleep        a 0.1 s pause, no work

A jump under lr0 and not under eager_step puts the slowdown on the recorded step's existence;
under release too, on what it holds (its memory pool, the gradients inside it); under
copy_only, on the copy; under sleep, on the idle gap (clocks). Each rollout's seconds inside
env steps (per env worker) and inside policy calls say which side slowed. The variants run one
after another, so the host's drift between them is in the comparison: read the jump within a
variant.

    python scripts/gpu/first_update.py --device cuda --pixels --num-envs 96 --env-cores 3 \
        --out first_update.json

On one H200 (call CP, 96 envs, temporal, the policy's torch on one thread) the rollouts went
from 0.294 to 0.338 s after updates at learning rate 0, 0.291 to 0.327 at 1, and 0.284 to 0.325
with one intra-op thread: the update's work, not what it learned; env busy unchanged, policy
busy 0.095 to 0.112 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for cycle_repeat

VARIANTS = ("lr0", "lr1", "eager_step", "release", "copy_only", "sleep")


def _threads(worker: object) -> int:
    """Runs in the policy's process (``__ray_call__``): torch's intra-op thread count."""
    import torch

    return torch.get_num_threads()


def _step(worker: Any, kind: str) -> float:
    """Runs in the policy's process (``__ray_call__``): the variant's step between two
    rollouts; returns its seconds."""
    import time

    import torch

    from loomrl.workers.policy import _to_device

    t = time.perf_counter()
    if kind == "sleep":
        time.sleep(0.1)
    elif kind == "copy_only":
        _to_device(worker.buffer, worker.device)
        if worker.device != "cpu":
            torch.cuda.synchronize()
    elif kind == "eager_step":
        saved, worker.train_step = worker.train_step, None
        try:
            worker.update(0.0)
        finally:
            worker.train_step = saved
    else:
        worker.update(1.0 if kind == "lr1" else 0.0)
        if kind == "release":
            if worker.train_step is not None:
                worker.train_step.release()
            worker.optimizer.zero_grad(set_to_none=True)
            if worker.device != "cpu":
                torch.cuda.empty_cache()
    return time.perf_counter() - t


def _act_parts(worker: Any, reps: int = 30) -> dict[str, float]:
    """Runs in the policy's process (``__ray_call__``), between rollouts: medians, in ms, of one
    act on ``num_envs`` rows from the host (``act_ms``, the worker's ``time_act``), the
    observations' copy to the device alone (``h2d_ms``), and one replay of the act graph alone
    on the device (``replay_gpu_ms``, CUDA events; 0 without a graph), so a slower act can be
    put on the copy, the device or the host's work around them."""
    import time

    import torch

    if worker.device == "cpu":
        return {
            "act_ms": 1e3 * worker.time_act(worker.num_envs, reps),
            "h2d_ms": 0.0,
            "replay_gpu_ms": 0.0,
        }
    dtype = torch.uint8 if worker.pixels else torch.float32  # as the env workers send
    host = torch.zeros((worker.num_envs, *worker.obs_shape), dtype=dtype)
    on_dev = torch.empty_like(host, device=worker.device)
    h2d, replay = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        on_dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        h2d.append(time.perf_counter() - t)
    cache = getattr(worker.net, "_graphs", None)
    if cache is not None and cache.entries:
        graph = next(reversed(cache.entries.values()))[1]  # the latest used
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            graph.replay()
            e1.record()
            torch.cuda.synchronize()
            replay.append(e0.elapsed_time(e1) / 1e3)
    med = statistics.median
    return {
        "act_ms": 1e3 * worker.time_act(worker.num_envs, reps),
        "h2d_ms": 1e3 * med(h2d),
        "replay_gpu_ms": 1e3 * med(replay) if replay else 0.0,
    }


def _row(r: object, workers: int) -> dict:
    return {
        "wall_s": r.wall_s,
        "env_busy_s": r.env_busy_s / workers,
        "policy_busy_s": r.policy_busy_s,
        "policy_calls": r.policy_calls,
        "graph_captures": r.policy_graph_captures,
    }


def _summary(name: str, before: list[dict], after: list[dict]) -> str:
    def med(rows: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    b, a = (
        {k: med(rows, k) for k in ("wall_s", "env_busy_s", "policy_busy_s")}
        for rows in (before, after)
    )
    return (
        f"  {name:<11} rollout {b['wall_s']:.3f} -> {a['wall_s']:.3f} s "
        f"({100 * (a['wall_s'] / b['wall_s'] - 1):+.1f}%), env busy {b['env_busy_s']:.3f} -> "
        f"{a['env_busy_s']:.3f}, policy busy {b['policy_busy_s']:.3f} -> "
        f"{a['policy_busy_s']:.3f}, step {med(after, 'step_s'):.3f} s, "
        f"captures {after[-1]['graph_captures']}"
    )


def main() -> None:
    import ray
    from cycle_repeat import one_plan, rebuilt

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--placement", default="temporal", choices=["temporal", "hybrid"])
    ap.add_argument("--num-envs", type=int, default=96)
    ap.add_argument("--steps", type=int, default=32, help="steps per env per rollout (S)")
    ap.add_argument("--reps", type=int, default=8, help="rollouts before and after, per variant")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--pixels", action="store_true", help="64x64 image observations (CNN)")
    ap.add_argument("--env-cores", type=float, default=1.0, help="env.cpu_cores per env worker")
    ap.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}"
    )
    ap.add_argument("--out", default="first_update.json")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        ap.error(
            f"--variants {args.variants!r}: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(VARIANTS)}"
        )

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
        print(f"{args.placement} {res['placement']}: policy threads {res['policy_threads']}")
        for name in variants:
            cycle = rebuilt(cycle, place.groups)
            cycle.collect(S)  # warm-up: its calls record the graphs
            before = [_row(cycle.collect(S), cycle.workers) for _ in range(args.reps)]
            parts = {"before": ray.get(actor.__ray_call__.remote(_act_parts))}
            after = []
            for _ in range(args.reps):
                step_s = ray.get(actor.__ray_call__.remote(_step, name))
                after.append({**_row(cycle.collect(S), cycle.workers), "step_s": step_s})
            parts["after"] = ray.get(actor.__ray_call__.remote(_act_parts))
            res["variants"][name] = {"before": before, "after": after, "act_alone": parts}
            print(_summary(name, before, after), flush=True)
            print(
                "    act alone (ms) before -> after: "
                + ", ".join(
                    f"{k} {parts['before'][k]:.2f} -> {parts['after'][k]:.2f}"
                    for k in parts["after"]
                ),
                flush=True,
            )
            with open(args.out, "w") as f:  # after every variant: a cut-off call keeps the rest
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
