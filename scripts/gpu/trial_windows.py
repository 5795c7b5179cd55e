"""Which ring-group counts k a trial would start from under each cycle model, on stored runs.

    PYTHONPATH=. python scripts/gpu/trial_windows.py docs/results/gpu/confirm/*/embodied_px_*.json \
        docs/results/gpu/launch_many/*/embodied_px_*.json

For every hybrid and auto run (every round, and the finished runs of a benchmark cut off before its
summary) that ``benchmarks/embodied_modes.py`` kept with its probe's costs (``cycle_costs``), this
rebuilds the cycle's profile under fixed_hops and under chained as the recipe does
(``profile_of_costs`` on a one-node host with the run's env workers) and prints the window the trial
would time first (``_near_best_k``: the model's best split k and its neighbours), the model's best
plan, and the k whose rollouts the run's own trial measured fastest. A window that holds the
measured-best k needs no walk to find it.
"""

from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace
from typing import Any

MODELS = ("fixed_hops", "chained")


def windows(
    run: dict[str, Any], steps: int, pixels: bool, cpu_cores: int = 16, env_cores: float = 3.0
) -> dict[str, Any]:
    """For one run's entry at S = ``steps`` (``pixels``: its env workers render): {"measured":
    its trial's fastest plan ("col" or "k<N>"), and per cycle model {"window": [k...], "best":
    plan}} (the host: one device, ``cpu_cores``)."""
    from loomrl.cycle import placement_from_plan, split_plans_and_past
    from loomrl.cycle_trial import _near_best_k, profile_of_costs
    from loomrl.plan import search_all
    from loomrl.recipes.embodied_ppo import Config

    costs = run["cycle_costs"]
    cfg = Config()
    cfg.env.num_envs, cfg.env.cpu_cores, cfg.env.pixels = costs["num_envs"], env_cores, pixels
    host = SimpleNamespace(
        nodes=[SimpleNamespace(num_cpus=cpu_cores, devices=[0])], num_devices=1, has_cuda=True
    )
    hw, n = costs["env_workers"], costs["num_envs"]

    def name(place: Any) -> str:
        return "col" if place.colocated else f"k{place.groups}"

    out: dict[str, Any] = {}
    for hops in MODELS:
        prof = profile_of_costs(host, cfg, steps, hw, costs, hops)
        splits, past = split_plans_and_past(prof)
        near = _near_best_k(splits, cfg, hw, past)
        best = search_all(prof)["best"]
        out[hops] = {
            "window": [placement_from_plan(p, n, hw).groups for p in near],
            "best": name(placement_from_plan(best, n, hw)),
        }
    fastest = min(run["trials"]["trials"], key=lambda t: t["rollout_s"])["placement"]
    out["measured"] = "col" if fastest["colocated"] else f"k{fastest['groups']}"
    return out


def runs_of(stored: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, run) for every round of every mode in a stored benchmark (a mode's entry keeps
    each round's probe and trials under "rounds", its top level the last round's), or, where it
    was cut off before its summary, every run it finished ("runs" by mode)."""
    if "results" in stored:
        return [
            (f"{r['mode']}#{i}", {**r, **rr})
            for r in stored["results"]
            for i, rr in enumerate(r.get("rounds") or [r])
        ]
    return [(f"{m}#{i}", rr) for m, rs in stored.get("runs", {}).items() for i, rr in enumerate(rs)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("files", nargs="+")
    args = p.parse_args()
    held = {m: 0 for m in MODELS}
    total = 0
    for f in args.files:
        stored = json.load(open(f))
        for label, run in runs_of(stored):
            if run.get("mode") == "temporal" or not run.get("cycle_costs") or not run.get("trials"):
                continue
            a = stored["args"]
            w = windows(run, a["steps"], a["pixels"], env_cores=a["env_cores"])
            total += 1
            k = w["measured"]
            for m in MODELS:  # a co-located best is timed whatever the window (auto) or absent
                held[m] += k == "col" or int(k[1:]) in w[m]["window"]
            print(
                f"{f}: {label}, measured best {k}; "
                + "; ".join(f"{m} window k={w[m]['window']} best {w[m]['best']}" for m in MODELS)
            )
    if not total:
        print("no hybrid or auto runs with cycle_costs in these files", file=sys.stderr)
        return 1
    print(
        ", ".join(f"{m}: the measured best in the window in {held[m]} of {total}" for m in MODELS)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
