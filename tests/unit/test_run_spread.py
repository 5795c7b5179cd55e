"""scripts/run_spread.py: the spread of one plan's runs and the least error of one prediction."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402

SPLIT = {"env_devices": [0], "policy_devices": [1], "groups": 2, "colocated": False}
COLO = {"env_devices": [0, 1], "policy_devices": [0], "groups": 1, "colocated": True}


def _doc() -> dict:
    def run(place: dict, s: float) -> dict:
        return {"feasible": True, "placement": place, "measured_s": s}

    return {
        "complete": True,
        "results": [
            {"mode": "hybrid", "rounds": [run(SPLIT, 0.10), run(SPLIT, 0.12)]},
            {"mode": "auto", "rounds": [run(SPLIT, 0.11), run(COLO, 0.2)]},
            {"mode": "spatial", "feasible": False, "reason": "no spatial plan fits"},
        ],
    }


def test_runs_of_one_placement_are_pooled_across_modes_and_a_lone_run_has_no_spread():
    mod = load_script("scripts/run_spread.py")
    (row,) = mod.spreads(_doc())
    assert row["placement"] == SPLIT and row["measured_s"] == [0.10, 0.11, 0.12]
    assert row["spread"] == pytest.approx(0.2)
    # The best single prediction, 0.11, is 0.01 off each end: 1/11 of it.
    assert row["least_error"] == pytest.approx(0.02 / 0.22)


def test_summary_counts_placements_no_prediction_can_meet(tmp_path, capsys):
    mod = load_script("scripts/run_spread.py")
    near = {"feasible": True, "placement": COLO, "measured_s": 0.100}
    doc = _doc()
    doc["results"].append({"mode": "temporal", "rounds": [near, {**near, "measured_s": 0.104}]})
    rows = mod.spreads(doc)
    s = mod.summary(rows, tol=0.05)
    # COLO: 0.100, 0.104 and 0.2 (auto's run): 100% spread; SPLIT 20%: both beyond 5%.
    assert s["placements"] == 2 and s["share_no_prediction_within_tol"] == 1.0
    s = mod.summary(mod.spreads(doc), tol=0.5)
    assert s["share_spread_over_tol"] == 0.5 and s["share_no_prediction_within_tol"] == 0.0
    assert mod.summary([]) == {"placements": 0}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    (tmp_path / "partial.json").write_text(json.dumps({"complete": False, "runs": {}}))
    assert mod.main([str(tmp_path / "*.json"), "--out", str(tmp_path / "o.json")]) == 0
    assert "1 benchmark file(s), 2 placements" in capsys.readouterr().out
    assert json.loads((tmp_path / "o.json").read_text())["summary"]["placements"] == 2
    assert mod.main([str(tmp_path / "partial.json")]) == 1
