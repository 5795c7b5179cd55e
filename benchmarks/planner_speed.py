"""Planner search time: 3-component chain at 8..4,096 devices, 6-component PPO graph at 1,024,
a chain with an env <-> policy cycle at 256..4,096.

    python benchmarks/planner_speed.py --out planner_speed.json

Valid device counts are powers of two (tensor/data-parallel sizes), ten
micro-batch sizes. The ``chain3_all`` rows repeat the chain with every count
1..N valid (the dense case: RLinf's search considers every count); ``chain3_irr``
the same with each count's cost off the smooth curve by up to 30% (three seeds); ``chain3_flat``
with costs that hardly change with the count (a fixed cost beside a small per-item one); ``ppo6_x8``
and ``ppo6_all`` the PPO graph with every multiple of 8 and every count valid; ``cycle_all`` an
env <-> policy cycle (4 steps, ring groups of any size) feeding an actor, every count 1..N valid
for all three (O(N^2 K) splits of the cycle for every micro-batch size); ``ppo5_all`` the PPO
graph without the critic's training, every count valid, at 128 and 256 devices (and at each of
``--ppo5-devices``: 512 takes minutes).
Each case is timed over --repeat runs (the table shows the best; ``ppo5_all`` once) of the
dynamic programme (``search_s``) and of the whole ``search_all`` call (which
also lays out, costs and simulates the four returned plans); ``peak_mb`` is the process's
peak resident memory during the case's runs (Linux; None elsewhere). The last line
printed is ``max_1024_s: <x> max_4096_s: <y>``: the slowest of the
repeats of the 3-chain DP at 1,024 and 4,096 devices.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

# The checkout's loomrl, found without an install (python benchmarks/planner_speed.py puts only
# benchmarks/ on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loomrl.plan import load_profile, search_all  # noqa: E402


def chain3(devices: int, every_count: bool = False, jitter: float = 0.0, seed: int = 0, flat=False):
    """``jitter``: each count's cost off the smooth curve by a factor in 1 +- jitter. ``flat``:
    per-item costs of about a second on one device, beside a fixed 0.3 s a call, and memory
    that fits everywhere: every count costs about the same, so fronts are wide."""
    valid = [2**i for i in range(13) if 2**i <= devices]
    if every_count:
        valid = list(range(1, devices + 1))
    rng = np.random.default_rng(seed)

    def comp(alpha: float, scale: float, mem: float, switch: float) -> dict:
        off = 1 + jitter * rng.uniform(-1, 1, len(valid))
        return {
            "valid_devices": valid,
            "time": {
                "alpha": alpha,
                "per_item": {
                    d: scale * d**-0.9 * float(f) for d, f in zip(valid, off, strict=True)
                },
            },
            "memory_gb": {d: 10 + mem / d for d in valid},
            "switch_s": switch,
        }

    if flat:
        comps = {
            name: {
                "valid_devices": valid,
                "time": {"alpha": 0.3, "per_item": {d: b * d**-0.9 for d in valid}},
                "memory_gb": {d: 10 + 60 / d for d in valid},
                "switch_s": 1.0,
            }
            for name, b in (("rollout", 1.0), ("inference", 0.5), ("actor", 1.5))
        }
    else:
        comps = {
            "rollout": comp(0.5, 400.0, 300, 3.0),
            "inference": comp(0.1, 60.0, 200, 1.0),
            "actor": comp(0.3, 200.0, 400, 4.0),
        }
    return load_profile(
        {
            "devices": devices,
            "device_memory_gb": 80,
            "batch": 512,
            "granularities": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            "components": comps,
            "edges": [["rollout", "inference"], ["inference", "actor"]],
        }
    )


def cycle_all(devices: int):
    """env <-> policy for 4 steps, then the actor trains on the batch; every count valid."""
    valid = list(range(1, devices + 1))

    def comp(alpha: float, scale: float, mem: float, switch: float) -> dict:
        return {
            "valid_devices": valid,
            "time": {"alpha": alpha, "per_item": {d: scale * d**-0.9 for d in valid}},
            "memory_gb": {d: 10 + mem / d for d in valid},
            "switch_s": switch,
        }

    return load_profile(
        {
            "devices": devices,
            "device_memory_gb": 80,
            "batch": 512,
            "granularities": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            "components": {
                "env": comp(0.05, 20.0, 100, 1.0),
                "policy": comp(0.2, 100.0, 300, 3.0),
                "actor": comp(0.3, 200.0, 400, 4.0),
            },
            "edges": [["env", "policy"], ["policy", "env"], ["policy", "actor"]],
            "cycles": [{"members": ["env", "policy"], "steps": 4}],
        }
    )


_PPO_NAMES = ["rollout", "reward", "ref_logprob", "critic_value", "actor_train", "critic_train"]


def ppo6(devices: int, valid: list[int] | None = None, names: list[str] = _PPO_NAMES):
    """The PPO graph (``names``: the components kept, with the edges between them)."""
    valid = valid or [2**i for i in range(13) if 2**i <= devices]
    scale = {
        "rollout": 0.2,
        "reward": 0.04,
        "ref_logprob": 0.05,
        "critic_value": 0.05,
        "actor_train": 0.16,
        "critic_train": 0.12,
    }
    comps = {
        n: {
            "valid_devices": valid,
            "time": {"alpha": 0.2, "per_item": {d: scale[n] * d**-0.5 for d in valid}},
            "memory_gb": {d: 42 + 30 / d for d in valid},
            "switch_s": 4.0,
        }
        for n in names
    }
    edges = [
        ["rollout", "reward"],
        ["rollout", "ref_logprob"],
        ["rollout", "critic_value"],
        ["reward", "actor_train"],
        ["ref_logprob", "actor_train"],
        ["critic_value", "actor_train"],
        ["critic_value", "critic_train"],
        ["reward", "critic_train"],
    ]
    edges = [e for e in edges if set(e) <= set(names)]
    return load_profile(
        {
            "devices": devices,
            "device_memory_gb": 80,
            "batch": 1024,
            "granularities": [16, 32, 64, 128, 256, 512, 1024],
            "components": comps,
            "edges": edges,
        }
    )


def ppo5(devices: int):
    """The PPO graph without critic_train (5 nodes), every count 1..N valid."""
    return ppo6(devices, list(range(1, devices + 1)), _PPO_NAMES[:5])


def _peak_mb(reset: bool = False) -> float | None:
    """The process's peak resident memory in MB since the last reset (Linux: VmHWM, which
    writing 5 to clear_refs resets); None where it cannot be read."""
    try:
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure(profile, repeat: int) -> dict:
    dp, total, plan = [], [], None
    _peak_mb(reset=True)
    for _ in range(repeat):
        t = time.perf_counter()
        plans = search_all(profile)
        total.append(time.perf_counter() - t)
        plan = plans["best"]
        dp.append(plan.search_s)
    return {
        "search_s": min(dp),
        "search_s_max": max(dp),
        "search_all_s": min(total),
        "mode": plan.mode,
        "predicted_s": plan.predicted_s,
        "micro_batch": plan.micro_batch,
        "peak_mb": _peak_mb(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out",
        default="planner_speed.json",
        help="write the results as JSON here (default: planner_speed.json; '' writes none)",
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--ppo5-devices",
        type=int,
        nargs="*",
        default=[],
        help="more device counts for the ppo5_all case (beside 128 and 256), e.g. 512",
    )
    args = ap.parse_args()
    rows = []
    for n in (8, 64, 256, 1024, 4096):
        rows.append({"case": "chain3", "devices": n, **measure(chain3(n), args.repeat)})
    for n in (1024, 4096):
        rows.append({"case": "chain3_all", "devices": n, **measure(chain3(n, True), args.repeat)})
    for n in (1024, 4096):  # flat: every count costs about the same
        rows.append(
            {
                "case": "chain3_flat",
                "devices": n,
                **measure(chain3(n, True, flat=True), args.repeat),
            }
        )
    for n in (1024, 4096):  # irregular: each count's cost off the curve by up to 30%
        for seed in range(3):
            prof = chain3(n, True, jitter=0.3, seed=seed)
            rows.append(
                {"case": "chain3_irr", "devices": n, "seed": seed, **measure(prof, args.repeat)}
            )
    rows.append({"case": "ppo6", "devices": 1024, **measure(ppo6(1024), args.repeat)})
    # the general DAG with many valid counts: every multiple of 8, and every count
    x8 = list(range(8, 257, 8))
    rows.append({"case": "ppo6_x8", "devices": 256, **measure(ppo6(256, x8), args.repeat)})
    every = list(range(1, 65))
    rows.append({"case": "ppo6_all", "devices": 64, **measure(ppo6(64, every), args.repeat)})
    for n in (256, 1024, 4096):  # a cycle whose members allow every count
        rows.append({"case": "cycle_all", "devices": n, **measure(cycle_all(n), args.repeat)})
    for n in (128, 256, *args.ppo5_devices):  # a dense 5-node DAG: large sets to pair
        rows.append({"case": "ppo5_all", "devices": n, **measure(ppo5(n), 1)})
    print(
        f"{'case':<11} {'devices':>7} {'dp_s':>9} {'search_all_s':>12}  {'mode':<8} {'m':>5} {'predicted_s':>12}"
    )
    for r in rows:
        print(
            f"{r['case']:<11} {r['devices']:>7} {r['search_s']:>9.4f} {r['search_all_s']:>12.4f}  "
            f"{r['mode']:<8} {r['micro_batch']:>5} {r['predicted_s']:>12.3f}"
        )
    result = {
        "rows": rows,
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
    }
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    # the whole search_all call: listing a cycle's splits cost both the search and the costing
    cyc = {r["devices"]: r["search_all_s"] for r in rows if r["case"] == "cycle_all"}
    print(
        f"dense cycle (search_all): 256: {cyc[256]:.4f} 1024: {cyc[1024]:.4f} 4096: {cyc[4096]:.4f}"
    )
    # worst of the repeats, so the lines are upper bounds
    d = {r["devices"]: r["search_s_max"] for r in rows if r["case"] == "chain3_all"}
    print(f"every count valid: max_1024_s: {d[1024]:.4f} max_4096_s: {d[4096]:.4f}")
    irr = {
        n: max(r["search_s_max"] for r in rows if r["case"] == "chain3_irr" and r["devices"] == n)
        for n in (1024, 4096)
    }
    print(f"irregular costs: max_1024_s: {irr[1024]:.4f} max_4096_s: {irr[4096]:.4f}")
    flat = {r["devices"]: r["search_s_max"] for r in rows if r["case"] == "chain3_flat"}
    print(f"flat costs: max_1024_s: {flat[1024]:.4f} max_4096_s: {flat[4096]:.4f}")
    c = {r["devices"]: r["search_s_max"] for r in rows if r["case"] == "chain3"}
    print(f"max_1024_s: {c[1024]:.4f} max_4096_s: {c[4096]:.4f}")


if __name__ == "__main__":
    main()
