"""Random small workload profiles for the planner's property tests (seeded)."""

from __future__ import annotations

import numpy as np

from loomrl.plan import load_profile


def random_profile(
    rng: np.random.Generator,
    v: int,
    n: int,
    dag: bool = False,
    cycle: bool = False,
    cores: bool = False,
    dense: bool = False,
):
    """A random profile; ``dense``: most counts 1..n valid (else at most three)."""
    names = [f"c{i}" for i in range(v)]
    batch = int(rng.choice([4, 8, 12]))
    grans = [g for g in (1, 2, 4, batch) if batch % g == 0]
    grans = sorted(set(int(g) for g in rng.choice(grans, size=min(len(grans), 3), replace=False)))
    cap = float(rng.uniform(30, 90))
    comps = {}
    for name in names:
        k = (
            int(rng.integers(max(1, n // 2), n + 1))
            if dense
            else int(rng.integers(1, min(n, 3) + 1))
        )
        valid = sorted(set(int(x) for x in rng.choice(np.arange(1, n + 1), size=k, replace=False)))
        base = float(rng.uniform(0.2, 3.0))
        p = float(rng.uniform(0.5, 1.0))
        comps[name] = {
            "valid_devices": valid,
            "time": {
                "alpha": round(float(rng.uniform(0, 1)), 3),
                "per_item": {d: round(base * d**-p, 4) for d in valid},
            },
            "memory_gb": {d: round(float(rng.uniform(5, 60)) / d**0.5, 2) for d in valid},
            "switch_s": round(float(rng.uniform(0, 2)), 3),
        }
        if cores:
            comps[name]["cpu_cores"] = {d: int(rng.integers(1, 6)) * d for d in valid}
    if dag:
        edges = [
            [names[i], names[j]] for i in range(v) for j in range(i + 1, v) if rng.random() < 0.5
        ]
    else:
        edges = [[names[i], names[i + 1]] for i in range(v - 1)]
    raw = {
        "devices": n,
        "device_memory_gb": cap,
        "batch": batch,
        "granularities": grans,
        "components": comps,
        "edges": edges,
    }
    if cycle and v >= 2:
        a, b = names[-2], names[-1]
        raw["edges"] = [e for e in edges if set(e) != {a, b}] + [[a, b], [b, a]]
        raw["cycles"] = [{"members": [a, b], "steps": int(rng.integers(1, 4))}]
        if rng.random() < 0.5:  # hand-off latency between the sides' calls
            raw["cycles"][0]["hop_s"] = float(rng.uniform(0.0, 2.0))
    if cores:
        raw["cpu_cores_per_node"] = int(rng.integers(4, 24))
    if cycle and v >= 2 and rng.random() < 0.3:  # ring groups of at least min_group items
        raw["cycles"][0]["min_group"] = int(rng.integers(1, batch + 1))
    return load_profile(raw)
