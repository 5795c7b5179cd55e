"""scripts/gpu/cycle_model_fit.py reads runs planned with either cycle model."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def _script():
    return load_script("scripts/gpu/cycle_model_fit.py")


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
    # (the result's top level is its last round, the second)
    chained = [ch for run, mode, _, _, ch, _ in gpu if mode == "hybrid" and run.endswith("#1")]
    assert len(chained) == len(planned) == 3
    assert all(abs(a / b - 1) < 0.01 for a, b in zip(chained, planned, strict=True))
    # There fixed_hops is the closer model at k = 4.
    k4 = [r for r in gpu if r[2] == "k4"]
    assert k4 and all(abs(m / fx - 1) < abs(m / ch - 1) for _, _, _, m, ch, fx in k4)


def test_trials_below_the_probed_sizes_are_marked_and_every_round_is_read():
    fit = _script()
    # AG planned k = 32 and 64 (groups of 2 and 1 envs) from a probe that timed 16-64 envs.
    ag = fit.trial_rows(
        str(ROOT / "docs/results/gpu/fixed_hops/embodied_px_e64_s16_pk2971841286_c2.json")
    )
    split = {plan for _, _, plan, *_ in ag if plan != "col"}
    assert split == {"k32*", "k64*"}
    assert {run.rsplit("#", 1)[1] for run, *_ in ag} == {"0", "1"}  # both rounds' trials
    # A run without the probe's samples: its smallest probed group comes from its env workers
    # (16 envs on 8 workers: 16 and 8), so k = 4 is past it and k = 2 is not.
    ab = fit.trial_rows(str(ROOT / "docs/results/gpu/graphs/embodied_px_e16_s32_i96_call_ab.json"))
    assert {"k4*", "k2"} <= {plan for _, _, plan, *_ in ab} and "k4" not in {r[2] for r in ab}


def test_a_benchmark_cut_off_before_its_summary_is_read_from_its_raw_runs(tmp_path):
    """embodied_modes rewrites --out after every run ("complete": false, the runs by mode):
    such a file yields the same trial rows as the summary would."""
    import json

    fit = _script()
    src = ROOT / "docs/results/gpu/one_h200/embodied_px_e16_s32_c3.json"
    d = json.loads(src.read_text())
    partial = {
        "args": d["args"],
        "complete": False,
        "runs": {r["mode"]: r["rounds"] for r in d["results"]},
    }
    cut = tmp_path / src.name
    cut.write_text(json.dumps(partial))
    whole, raw = fit.trial_rows(str(src)), fit.trial_rows(str(cut))
    assert len(whole) == len(raw) > 0
    assert sorted(r[1:] for r in whole) == sorted(r[1:] for r in raw)
