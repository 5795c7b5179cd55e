"""The planner on profiles with a 2-cycle, against the planner of an earlier commit: same plans.

    python scripts/plan_cycle_equivalence.py --count 300 --base d9335ce

Loads ``loomrl/plan/search.py`` and ``loomrl/plan/cost.py`` as they were at ``--base`` (by
``git show``, into a temporary directory) and runs both planners' ``search_all`` on ``--count``
random profiles with a cycle: members with dense and sparse valid counts (some on host cores,
count 0), memory caps that bind, CPU core limits, hop_s, overlap_slowdown, cycles that end on
their first member, min_group, other components upstream and downstream, sometimes a second
cycle, up to ``--max-devices`` devices. Every mode's plan must be the same (predicted_s,
micro_batch, the tree and the rest of the plan's JSON but search_s), and where no plan fits,
the same error message. The default base
is the last commit before cycle options were searched as blocks of counts
(``loomrl.plan._cycles``). The last line reads ``differences: <n> of <checked>`` and the exit
status is 1 when n > 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's loomrl, found without an install

from loomrl.errors import PlanError  # noqa: E402
from loomrl.plan import load_profile  # noqa: E402

new_search = importlib.import_module("loomrl.plan.search")
BASE = "d9335ce"


def load_base(rev: str, where: Path):
    """The search module of ``rev``, importing the cost module of ``rev`` (the rest of the
    package as it is now: neither changed the profile, graph, plan or simulate modules)."""
    src = {
        name: subprocess.run(
            ["git", "show", f"{rev}:loomrl/plan/{name}.py"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for name in ("cost", "search")
    }
    cost_name, search_name = "_base_plan_cost", "_base_plan_search"
    src["search"] = src["search"].replace(
        "from loomrl.plan.cost import", f"from {cost_name} import"
    )
    mods = {}
    for name, mod_name in (("cost", cost_name), ("search", search_name)):
        path = where / f"{mod_name}.py"
        path.write_text(src[name])
        spec = importlib.util.spec_from_file_location(mod_name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = mod
        spec.loader.exec_module(mod)
        mods[name] = mod
    return mods["search"]


def _component(rng, n: int, dense: bool, zero: bool, ties: bool) -> dict:
    if dense:
        valid = [d for d in range(1, n + 1) if rng.random() < 0.85] or [1]
    else:
        k = int(rng.integers(1, min(n, 6) + 1))
        valid = sorted(set(int(x) for x in rng.choice(np.arange(1, n + 1), size=k, replace=False)))
    if zero:
        valid = [0, *valid]
    base = float(rng.uniform(0.05, 3.0))
    p = float(rng.uniform(0.3, 1.0))
    jitter = float(rng.choice([0.0, 0.0, 0.3]))
    digits = 2 if ties else 5  # coarse rounding makes equal costs on nearby counts: ties
    per = {
        d: round(base * max(d, 1) ** -p * (1 + jitter * float(rng.uniform(-1, 1))), digits)
        or 10.0**-digits
        for d in valid
    }
    mem = {
        d: round(float(rng.uniform(5, 70)) / max(d, 1) ** float(rng.uniform(0.2, 1)), 1)
        for d in valid
    }
    return {
        "valid_devices": valid,
        "time": {"alpha": round(float(rng.uniform(0, 1)), 2), "per_item": per},
        "memory_gb": mem,
        "switch_s": round(float(rng.uniform(0, 3)), 2),
    }


def random_profile(rng, max_devices: int):
    """A random profile with one 2-cycle (see the module docstring)."""
    r = rng.random()
    top = 48 if r < 0.7 else (160 if r < 0.95 else max_devices)
    n = int(rng.integers(2, max(top, 3) + 1))
    batch = int(rng.choice([4, 8, 12, 16, 64]))
    divs = [d for d in range(1, batch + 1) if batch % d == 0]
    grans = sorted(set(int(g) for g in rng.choice(divs, size=min(len(divs), 3), replace=False)))
    ties = rng.random() < 0.3
    names = ["env", "policy"]
    comps = {}
    for name in names:
        dense = rng.random() < (0.6 if n <= 160 else 0.4)
        comps[name] = _component(rng, n, dense, rng.random() < 0.1, ties)
    if ties and rng.random() < 0.5:  # identical members: mirrored splits cost the same
        comps["policy"] = dict(comps["env"])
    edges = [["env", "policy"], ["policy", "env"]]
    extra = int(rng.integers(0, 3))
    for j in range(extra):
        name = f"c{j}"
        comps[name] = _component(rng, n, rng.random() < 0.5, False, ties)
        edges.append(["policy", name] if j == 0 or rng.random() < 0.5 else [name, "env"])
    if "c1" in comps and ["c1", "env"] not in edges:
        edges.append(["c0", "c1"])
    cyc: dict = {"members": ["env", "policy"], "steps": int(rng.integers(1, 5))}
    if rng.random() < 0.4:
        cyc["hop_s"] = round(float(rng.uniform(0, 1.5)), 2)
    if rng.random() < 0.3:
        cyc["overlap_slowdown"] = round(float(rng.uniform(1, 1.6)), 2)
    if rng.random() < 0.3:
        cyc["ends_with"] = "env"
    if rng.random() < 0.3:
        cyc["min_group"] = int(rng.integers(1, batch + 1))
    cycles = [cyc]
    if rng.random() < 0.15:  # a second cycle downstream (agent <-> tool)
        for name in ("agent", "tool"):
            comps[name] = _component(rng, n, rng.random() < 0.5, rng.random() < 0.1, ties)
        edges += [["policy", "agent"], ["agent", "tool"], ["tool", "agent"]]
        second: dict = {"members": ["agent", "tool"], "steps": int(rng.integers(1, 4))}
        if rng.random() < 0.4:
            second["ends_with"] = "agent"
        cycles.append(second)
    raw = {
        "devices": n,
        "device_memory_gb": round(float(rng.uniform(15, 90)), 1),
        "batch": batch,
        "granularities": grans,
        "components": comps,
        "edges": edges,
        "cycles": cycles,
    }
    if rng.random() < 0.3:
        for c in comps.values():
            c["cpu_cores"] = {d: int(rng.integers(0, 4)) * max(d, 1) for d in c["valid_devices"]}
        raw["cpu_cores_per_node"] = int(rng.integers(4, 4 * n + 8))
    return load_profile(raw)


def outcome(module, prof) -> dict:
    """Per mode the plan's JSON but search_s (None when the mode has no plan), or the error."""
    try:
        plans = module.search_all(prof)
    except PlanError as e:
        return {"error": str(e)}
    out = {}
    for mode, plan in plans.items():
        if plan is None:
            out[mode] = None
            continue
        d = plan.to_dict()
        d.pop("search_s")
        out[mode] = d
    for mode in ("temporal", "spatial", "hybrid"):  # the message a mode with no plan gives
        if out.get(mode) is None:
            try:
                module.search(prof, mode=mode)
            except PlanError as e:
                out[f"{mode}_error"] = str(e)
    return out


def parse_args(argv: list[str] | None, doc: str, max_devices: int, base: str) -> argparse.Namespace:
    """The options of an equivalence script: how many random profiles, from which seed, up to
    how many devices, against which commit."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-devices", type=int, default=max_devices)
    ap.add_argument("--base", default=base, help=f"the commit to compare with (default {base})")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__, 320, BASE)
    bad = checked = 0
    t_old = t_new = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        old_search = load_base(args.base, Path(tmp))
        for i in range(args.count):
            seed = args.seed + i
            try:
                prof = random_profile(np.random.default_rng(seed), args.max_devices)
            except PlanError:
                continue  # a profile the loader refuses
            t = time.perf_counter()
            want = outcome(old_search, prof)
            t_old += time.perf_counter() - t
            t = time.perf_counter()
            got = outcome(new_search, prof)
            t_new += time.perf_counter() - t
            checked += 1
            if got != want:
                bad += 1
                diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
                print(f"DIFFERENCE seed {seed} ({prof.devices} devices) in {diff}", flush=True)
    print(f"seconds: base {t_old:.1f} now {t_new:.1f}")
    print(f"differences: {bad} of {checked}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
