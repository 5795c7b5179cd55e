"""Where a split env <-> policy cycle loses time on one GPU: env and policy alone and at once.

    python scripts/gpu/cycle_overlap.py --num-envs 16 --env-workers 4 --steps 32 --out overlap.json

On one set of workers (pixel env workers on host cores, the pixel CNN policy on the GPU) it
times chains of ``env.step`` and of ``policy.probe`` calls alone and both at once, as
``loomrl.cycle.measure_costs`` does, at group sizes num_envs / 2 and num_envs. The same is
repeated with

* env workers without rendering (state observations): the policy still acts on stored pixel
  observations, so the policy's work is unchanged and only the renderer leaves the GPU;
* the policy acting on the whole batch at once (``batch_invariant=False``) instead of row by row.

Then it runs the real cycle on the pixel workers with k = 1 (env and policy alternate: the
temporal cycle) and k = 2, 4 (pipelined groups), interleaved over rounds, so that the ratio of
k = 1 to k = 2 is measured on the same processes; with ``--layouts slices,blocks`` also k = 2, 4
with each group on whole env workers (``k=2b``, ``k=4b``: one call per worker a step, one
group's workers stepping at a time) beside the default slices of every worker; with
``--handoffs driver,direct`` also each run whose groups lie on one env worker with the env
workers calling the policy themselves (``k=4bd``). Every path's first rollout is untimed and
each round starts one path later. Before that, ``measure_costs`` (the probe
the recipe plans with) times the same workers, and the planner's cycle model predicts each k
from it twice: from the chains alone (hand-offs inside the components' costs, no hop) and from
the workers' busy times plus the cycle's hop latency. Prints one table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path


def sides(envs, pol, reply_of: dict, sizes: list[int], n: int, reps: int) -> dict:
    """{size: {env, policy, both, slowdown}} medians over reps chains (reply_of[size]: the
    stored observations the policy acts on)."""
    from loomrl.cycle import time_chain
    from loomrl.worker import wait

    w = envs.world_size
    ranks = [envs.on(r) for r in range(w)]
    out = {}
    for x in sizes:
        per = x // w
        actions = [wait(r.sample_actions(per))[0] for r in ranks]
        wait(*[r.observe(0, per) for r in ranks])  # resets envs that never were
        reply = reply_of[x]
        time_chain(ranks, pol, per, actions, reply, "both", 5)  # warm-up
        row = {}
        for side in ("env", "policy", "both"):
            row[side] = statistics.median(
                time_chain(ranks, pol, per, actions, reply, side, n)[0] for _ in range(reps)
            )
        row["slowdown"] = row["both"] / max(row["env"], row["policy"])
        out[x] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--env-workers", type=int, default=4)
    p.add_argument("--env-cores", type=float, default=4.0)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--env", default=None, help="gymnasium id (default: the recipe's env.env_id)")
    p.add_argument(
        "--state",
        action="store_true",
        help="state observations on the timed workers (an MLP policy; no renderer on the GPU)",
    )
    p.add_argument("--steps", type=int, default=32, help="S of the cycle runs")
    p.add_argument("--calls", type=int, default=40, help="calls per timed chain")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-variants", action="store_true", help="skip the batched / state rows")
    p.add_argument(
        "--render-device",
        default=None,
        help="MUJOCO_EGL_DEVICE_ID for the env workers (render on another GPU than the policy's)",
    )
    p.add_argument(
        "--graphs",
        action="store_true",
        help="the policy's forward as CUDA graphs (the recipe's default; results so far: eager)",
    )
    p.add_argument(
        "--layouts",
        default="slices",
        help="ring layouts of the split cycle, comma-separated (loomrl.cycle.RING_LAYOUTS); "
        "blocks runs appear as k=<k>b",
    )
    p.add_argument(
        "--handoffs",
        default="driver",
        help="hand-offs of the split cycle, comma-separated (loomrl.cycle.HANDOFFS); direct runs "
        "(only where every group lies on one env worker) appear with a trailing d, e.g. k=4bd",
    )
    p.add_argument("--out", default=None)
    args = p.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    import numpy as np
    import ray

    from loomrl.cluster import Cluster
    from loomrl.config import ConfigError, load_config
    from loomrl.cycle import EnvPolicyCycle, cycle_profile, measure_costs
    from loomrl.plan.cost import cycle_time
    from loomrl.recipes.embodied_ppo import Config
    from loomrl.worker import wait
    from loomrl.workers.env import EnvWorker, worker_env_config
    from loomrl.workers.policy import PolicyWorker

    n, w = args.num_envs, args.env_workers
    sizes = [n // 2, n]
    base = [
        f"env.num_envs={n}",
        f"env.image_size={args.image_size}",
        f"env.cpu_cores={args.env_cores}",
        *([f"env.env_id={args.env}"] if args.env else []),
    ]
    cfg_px = load_config(Config, None, [*base, "env.pixels=true"])
    cfg_st = load_config(Config, None, [*base, "env.pixels=false"])
    cluster = Cluster.start(log_to_driver=False)
    # With --state the timed rows (kept under "pixels_rows", the key readers know) are states.
    obs = "state" if args.state else f"pixels {args.image_size}"
    res: dict = {"args": vars(args), "obs": obs, "load_average_start": os.getloadavg()}

    render_env = {"MUJOCO_EGL_DEVICE_ID": args.render_device} if args.render_device else None

    def launch_env(cfg):
        return cluster.launch(
            EnvWorker,
            w,
            worker_env_config(cfg.env, w),
            devices=[0],
            num_cpus=cfg.env.cpu_cores,
            name="env",
            env=render_env,
        )

    # --state: the timed workers step state envs; the variants' state rows are then the same
    env_px = launch_env(cfg_st if args.state else cfg_px)
    sp = wait(env_px.on(0).spaces())[0]

    def launch_policy(kwargs):
        return cluster.launch(
            PolicyWorker,
            1,
            sp["observation_space"],
            sp["action_space"],
            n,
            cfg_px.ppo,
            0,
            "auto",
            kwargs,
            cuda_graphs=args.graphs,
            devices=[0],
            name="policy",
        )

    pol_rows = launch_policy(None)
    ranks = [env_px.on(r) for r in range(w)]
    reply_of = {}
    for x in sizes:
        parts = [wait(r.observe(0, x // w))[0] for r in ranks]
        reply_of[x] = ray.put({k: np.concatenate([q[k] for q in parts]) for k in parts[0]})

    res["pixels_rows"] = sides(env_px, pol_rows, reply_of, sizes, args.calls, args.reps)
    if not args.no_variants:
        pol_batch = launch_policy({"batch_invariant": False})
        res["pixels_batched"] = sides(env_px, pol_batch, reply_of, sizes, args.calls, args.reps)
        pol_batch.kill()
    probe_sizes = sorted({n // d for d in (1, 2, 4) if (n // d) % w == 0})
    costs = measure_costs(env_px, pol_rows, n, probe_sizes, args.steps)
    res["probe_samples"] = costs["samples"]
    per_worker = n // w
    # (k, layout): blocks only where they cut differently (k > 1 divides the worker count)
    runs = [(k, "slices") for k in (1, 2, 4) if k <= per_worker]
    if "blocks" in args.layouts.split(","):
        runs += [(k, "blocks") for k in sorted({2, 4, w}) if 1 < k <= w and w % k == 0]
    handoffs = args.handoffs.split(",")
    made = {}  # key -> cycle; direct only where its groups allow it
    for k, lay in runs:
        for how in handoffs:
            key = k if lay == "slices" else f"{k}b"
            if how == "direct":
                key = f"{key}d"
            try:
                made[key] = EnvPolicyCycle(
                    env_px, pol_rows, per_worker, k, True, layout=lay, handoff=how
                )
            except ConfigError as e:
                print(f"skipped k={k} {lay} {how}: {e}")
    cycles: dict = {key: [] for key in made}
    busy: dict = {key: [] for key in cycles}
    for c in made.values():  # untimed: each path's first rollout
        c.collect(args.steps)
    for r_ in range(args.rounds):
        keys = list(made)
        for key in keys[r_ % len(keys) :] + keys[: r_ % len(keys)]:
            r = made[key].collect(args.steps)
            cycles[key].append(r.wall_s / args.steps)
            busy[key].append((r.env_busy_s / w, r.policy_busy_s))
    res["cycle_busy_s"] = {str(k): v for k, v in busy.items()}
    res["cycle_step_s"] = {k: v for k, v in cycles.items() if v}
    env_px.kill()  # its cores go to the state env workers
    if not args.no_variants and not args.state:
        env_st = launch_env(cfg_st)
        res["state_env_rows"] = sides(env_st, pol_rows, reply_of, sizes, args.calls, args.reps)
        env_st.kill()

    res["load_average_end"] = os.getloadavg()
    cluster.shutdown()

    print(f"num_envs={n} env_workers={w} obs={obs} (s per call, medians)")
    for name in ("pixels_rows", "pixels_batched", "state_env_rows"):
        label = name.replace("pixels_", "timed_") if args.state else name
        for x, r in res.get(name, {}).items():
            print(
                f"{label:<16} size {x:>3}: env {1e3 * r['env']:7.2f} ms  policy "
                f"{1e3 * r['policy']:7.2f} ms  both {1e3 * r['both']:7.2f} ms  "
                f"slowdown {r['slowdown']:.2f}"
            )
    med = {k: statistics.median(v) for k, v in res["cycle_step_s"].items()}
    res["cycle_step_median_s"] = med
    models = {}
    for label, hops in (
        ("chains", "chained"),
        ("busy+hop", "busy_hops"),
        ("fixed+hop", "fixed_hops"),
    ):
        prof = cycle_profile(
            costs, n, args.steps, 1, args.env_cores, None, host_env_workers=w, hops=hops
        )
        cyc = prof.cycles[0]
        a, b = prof.components["env"], prof.components["policy"]
        models[label] = {
            "hop_s": cyc.hop_s,
            "overlap_slowdown": cyc.overlap_slowdown,
            "step_s": {
                k: cycle_time(
                    a, b, args.steps, n, ("split", 0, 1, k), cyc.overlap_slowdown, cyc.hop_s
                )
                / args.steps
                for k in med
                if isinstance(k, int)
            },
        }
    res["model"] = models
    for k, v in med.items():
        pred = "  ".join(
            f"{label} {1e3 * m['step_s'][k]:6.2f} ({100 * (v - m['step_s'][k]) / m['step_s'][k]:+.0f}%)"
            for label, m in models.items()
            if k in m["step_s"]
        )
        eb = statistics.median(b[0] for b in busy[k])
        pb = statistics.median(b[1] for b in busy[k])
        print(
            f"cycle k={k}: {1e3 * v:7.2f} ms per step ({[round(1e3 * x, 2) for x in cycles[k]]})"
            f"  k=1 / k={k}: {med[1] / v:.3f}  busy env {eb:.3f} s, policy {pb:.3f} s"
            f"  predicted: {pred}"
        )
    print(
        "hop_s {:.2f} ms, overlap slowdown {:.2f} (busy) / {:.2f} (chains)".format(
            1e3 * models["busy+hop"]["hop_s"],
            models["busy+hop"]["overlap_slowdown"],
            models["chains"]["overlap_slowdown"],
        )
    )
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2, default=str))


if __name__ == "__main__":
    main()
