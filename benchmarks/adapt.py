"""Run-time adaptation: detection lag, redeploy stall, oscillations, throughput lost.

Run:  python benchmarks/adapt.py --scenario stale --out runs/bench_adapt_stale.json
      python benchmarks/adapt.py --scenario drift --out runs/bench_adapt_drift.json
      (each about 2 minutes on 2 cores)

The demo workflow (encode -> transform -> reduce) on --devices CPU slots, transform limited to
one device. Two scenarios:
  stale  the plan comes from a stale profile (encode measured 100x cheaper and transform 100x
         dearer than they are, as a profile taken on other data would be): the planner pipelines
         encode beside transform, while sharing all devices phase by phase is much faster.
  drift  the profile is right at first; from step --drift-step on transform does
         --drift-factor times the work (thrown away, outputs unchanged).

Three runs of --steps iterations on the same items:
  static    the initial plan throughout (a planner without adaptation)
  adaptive  the same, with ``Flow.adapt`` after every iteration (--threshold, --window)
  oracle    the adaptive run's final plan from the start
Reported: detection lag (iterations from the first affected one to the decision, inclusive;
the first iteration of fresh workers is warm-up and not judged), the redeploy stall, re-plans,
oscillations (returns to an earlier plan), seconds from onset on (from iteration 1 at least) per
run, and the throughput the adaptive run lost there against the oracle's steady speed. Outputs must be identical in all runs (checked).
The last line: ``detection_lag: <n> redeploy_stall_s: <s> replans: <n> oscillations: <n>
throughput_lost: <fraction> adaptive_vs_static: <ratio>``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def run(flow, plan, args, adapt: bool) -> dict:
    from loomrl.adapt import AdaptConfig, plan_key
    from loomrl.recipes.demo import make_items

    flow.apply(plan)
    times, keys, digest = [], [], hashlib.sha256()
    acfg = AdaptConfig(threshold=args.threshold, window=args.window)
    for step in range(args.steps):
        keys.append(plan_key(flow.plan_))
        res = flow.run(make_items(step, args.batch, args.seed))
        times.append(res.measured_s)
        digest.update("".join(res.outputs).encode())
        if adapt:
            ev = flow.adapt(res, args.steps - step - 1, acfg)
            if ev is not None:
                ev["step"] = step
                print(
                    f"  step {step}: {ev['action']} errors "
                    f"{[round(e, 2) for e in ev['errors']]} -> {ev.get('mode', '-')}",
                    file=sys.stderr,
                )
    return {
        "times": times,
        "plans": keys,
        "events": list(flow.adapt_events) if adapt else [],
        "digest": digest.hexdigest(),
        "final_plan": flow.plan_,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenario", choices=("stale", "drift"), default="stale")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--drift-step", type=int, default=5)
    p.add_argument("--drift-factor", type=float, default=4.0)
    p.add_argument("--threshold", type=float, default=0.15)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--size", type=int, default=384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    from loomrl import Cluster
    from loomrl.adapt import detection_lag, oscillations, refresh_profile, throughput_lost
    from loomrl.flow import Flow
    from loomrl.plan.search import search_all
    from loomrl.profiler import profile_flow
    from loomrl.recipes.demo import DemoConfig, build, make_items

    stale = args.scenario == "stale"
    cfg = DemoConfig(
        size=args.size,
        encode_reps=24,
        transform_reps=2 if stale else 8,
        reduce_reps=4,
        transform_devices=[1],
        drift_step=None if stale else args.drift_step,
        drift_factor=args.drift_factor,
    )
    onset = 0 if stale else args.drift_step
    cluster = Cluster.start(num_gpus=0, num_devices=args.devices, log_to_driver=False)
    load = os.getloadavg()
    try:
        flow = Flow(cluster)
        build(flow, cfg)
        t = time.time()
        prof = profile_flow(flow, make_items(0, args.batch, args.seed))
        prof_s = time.time() - t
        if stale:
            prof = refresh_profile(prof, {"encode": 0.01, "transform": 100.0})
        initial = search_all(prof)["best"]
        print(f"profile {prof_s:.1f}s; initial plan {initial.mode}:\n{initial}", file=sys.stderr)
        out = {}
        for name, adapt in (("static", False), ("adaptive", True)):
            flow.profile_ = prof
            out[name] = run(flow, initial, args, adapt)
        final = out["adaptive"]["final_plan"]
        out["oracle"] = run(flow, final, args, False)
        flow.shutdown()
    finally:
        cluster.shutdown()

    digests = {k: v["digest"] for k, v in out.items()}
    if len(set(digests.values())) != 1:
        print(f"outputs differ between runs: {digests}", file=sys.stderr)
        return 1
    d = onset
    # Every run's iteration 0 is fresh workers' warm-up: compare from iteration max(onset, 1).
    first = max(d, 1)
    post = {k: sum(v["times"][first:]) for k, v in out.items()}
    events = out["adaptive"]["events"]
    replans = [e for e in events if e["action"] == "replan"]
    # Iterations judged from onset to the first decision, re-plan or not (iteration 0 of fresh
    # workers is not judged); a decision before onset is a false alarm, not the detection.
    lag = detection_lag([e["step"] for e in events], onset=d, first_judged=1)
    stall = replans[0]["stall_s"] if replans else 0.0
    osc = oscillations(out["adaptive"]["plans"])
    # Against the oracle's steady speed after onset (its first iteration is warm-up).
    lost = throughput_lost(
        out["adaptive"]["times"], statistics.median(out["oracle"]["times"][first:]), first
    )
    print(
        f"demo on {args.devices} devices, batch {args.batch}, {args.steps} steps, scenario "
        f"{args.scenario} (onset step {d}); load average at start {load[0]:.1f}"
    )
    print(
        f"initial plan: {initial.mode} {initial.assignment()}  final: {final.mode} "
        f"{final.assignment()}"
    )
    for k, v in out.items():
        print(
            f"{k:<9} after onset s: {post[k]:7.2f}   per step: "
            + " ".join(f"{x:.2f}" for x in v["times"])
        )
    for e in events:
        print(
            f"event step {e['step']}: {e['action']} errors "
            f"{[round(x, 3) for x in e['errors']]} predicted {e['predicted_s']:.3f} "
            f"refreshed {e['refreshed_s']:.3f} best {e['best_s']:.3f} ({e['best_mode']}); "
            f"costs drifted: {e['costs_drifted']}; "
            + (
                f"kept: {e['kept_because']}"
                if "kept_because" in e
                else f"changed: {e['changed_because']}"
            )
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "load_average": load,
                    "profile_s": prof_s,
                    "initial_plan": initial.to_dict(),
                    "final_plan": final.to_dict(),
                    "times": {k: v["times"] for k, v in out.items()},
                    "events": events,
                    "after_onset_s": post,
                    "detection_lag": lag,
                    "redeploy_stall_s": stall,
                    "replans": len(replans),
                    "oscillations": osc,
                    "throughput_lost": lost,
                },
                indent=2,
                default=str,
            )
        )
    print(
        f"detection_lag: {lag} redeploy_stall_s: {stall:.2f} replans: {len(replans)} "
        f"oscillations: {osc} throughput_lost: {lost:.3f} "
        f"adaptive_vs_static: {post['static'] / post['adaptive']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
