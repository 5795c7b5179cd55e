"""scripts/gpu/trial_windows.py rebuilds a stored GPU run's trial window under each model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def _script():
    return load_script("scripts/gpu/trial_windows.py")


def test_windows_of_a_stored_one_h200_run():
    mod = _script()
    stored = json.loads(
        (ROOT / "docs/results/gpu/confirm/cf/embodied_px_e128_s32_c3.json").read_text()
    )
    run = next(r for r in stored["results"] if r["mode"] == "hybrid")
    w = mod.windows(run, stored["args"]["steps"], stored["args"]["pixels"], env_cores=3.0)
    # That run's trial timed k = 2 fastest (0.280 s against k = 4's 0.403 and k = 8's 0.814).
    assert w["measured"] == "k2"
    # fixed_hops hides each call's fixed cost behind the ring and starts at k = 8; chained
    # pays it per call, and its window holds k = 2.
    assert w["fixed_hops"]["window"] == [4, 8, 16] and w["fixed_hops"]["best"] == "k8"
    assert 2 in w["chained"]["window"] and 8 not in w["chained"]["window"]


def test_every_round_and_a_cut_off_benchmarks_runs_are_read():
    mod = _script()
    gpu = ROOT / "docs/results/gpu/confirm"
    done = mod.runs_of(json.loads((gpu / "cf/embodied_px_e128_s32_c3.json").read_text()))
    labels = sorted(label for label, _ in done)
    assert labels == [f"{m}#{i}" for m in ("auto", "hybrid", "temporal") for i in (0, 1)]
    # the two hybrid rounds are their own runs, with their own trials
    hybrid = [run["trials"]["trials"] for label, run in done if label.startswith("hybrid")]
    assert hybrid[0] != hybrid[1]
    # 96:32 was cut off after five runs (its second temporal never ran)
    cut = mod.runs_of(json.loads((gpu / "cg/embodied_px_e96_s32_c3.json").read_text()))
    assert sorted(label for label, _ in cut) == [
        "auto#0",
        "auto#1",
        "hybrid#0",
        "hybrid#1",
        "temporal#0",
    ]
