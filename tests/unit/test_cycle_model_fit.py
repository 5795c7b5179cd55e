"""scripts/gpu/cycle_model_fit.py reads runs planned with either cycle model."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "cycle_model_fit", ROOT / "scripts/gpu/cycle_model_fit.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_trial_rows_from_chained_and_fixed_hops_runs():
    fit = _script()
    # A GPU run planned with chained costs (no cycle_costs kept), and a CPU run that planned
    # with fixed_hops (its profile's intercepts moved into the hop; cycle_costs kept).
    gpu = fit.trial_rows(str(ROOT / "docs/results/gpu/balance/embodied_px_e64_s16_pklr2_c2.json"))
    cpu = fit.trial_rows(str(ROOT / "docs/results/embodied_modes_cpu2_run6.json"))
    for rows in (gpu, cpu):
        assert rows and all(math.isfinite(x) and x > 0 for _, _, _, *t in rows for x in t), rows
    # On the GPU run the chained column is what its planner predicted for each trial.
    import json

    d = json.loads(
        (ROOT / "docs/results/gpu/balance/embodied_px_e64_s16_pklr2_c2.json").read_text()
    )
    hybrid = next(r for r in d["results"] if r["mode"] == "hybrid")
    update = hybrid["profile"]["actor_train"]["time"]["alpha"]
    planned = [t["predicted_s"] - update for t in hybrid["trials"]["trials"]]
    chained = [ch for _, mode, _, _, ch, _ in gpu if mode == "hybrid"]
    assert len(chained) == len(planned) == 3
    assert all(abs(a / b - 1) < 0.01 for a, b in zip(chained, planned, strict=True))
    # There fixed_hops is the closer model at k = 4.
    k4 = [r for r in gpu if r[2] == "k4"]
    assert k4 and all(abs(m / fx - 1) < abs(m / ch - 1) for _, _, _, m, ch, fx in k4)
