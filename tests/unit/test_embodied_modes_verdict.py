"""benchmarks/embodied_modes.py: the verdict judges every round's pick against the best plan,
and the per-run prediction errors and per-placement spreads it prints."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).parent))
from _scripts import load_script  # noqa: E402


def _bench():
    return load_script("benchmarks/embodied_modes.py")


def _run(k: int, measured: float, predicted: float, its: list[float]) -> dict:
    place = {
        "env_devices": [0],
        "env_workers": 8,
        "policy_devices": [0] if k == 1 else [1],
        "groups": k,
        "colocated": k == 1,
        "mode": "temporal" if k == 1 else "hybrid",
    }
    return {
        "feasible": True,
        "placement": place,
        "measured_s": measured,
        "predicted_s": predicted,
        "iteration_s": [2.0, *its],  # the first is warm-up and is left out
    }


def test_a_slower_pick_in_any_round_fails_the_verdict():
    b = _bench()
    runs = {
        "temporal": [_run(1, 0.5, 0.5, [0.5, 0.5])],
        "hybrid": [_run(4, 0.30, 0.31, [0.30, 0.30])],
        # auto ran k = 2 first (10% slower than k = 4), then k = 4
        "auto": [_run(2, 0.33, 0.32, [0.33, 0.33]), _run(4, 0.30, 0.30, [0.30, 0.30])],
    }
    ratio, pooled = b._verdict(runs)
    assert ratio == pytest.approx(0.33 / 0.30) and ratio > b.TOLERANCE
    assert len(pooled) == 3
    # auto and hybrid ran one plan at k = 4: their iterations pool
    runs["auto"] = [_run(4, 0.32, 0.30, [0.32, 0.32])]
    ratio, pooled = b._verdict(runs)
    key = next(k for k in pooled if "k=4" in k)
    assert pooled[key] == pytest.approx(0.31) and ratio == pytest.approx(1.0)
    assert math.isnan(b._verdict({"temporal": runs["temporal"]})[0])  # no auto, no verdict


def test_the_slower_pick_counts_in_any_round_and_against_plans_auto_never_ran():
    b = _bench()
    k4, k2 = _run(4, 0.30, 0.30, [0.30, 0.30]), _run(2, 0.36, 0.35, [0.36, 0.36])
    # a slower pick in the middle round, between two good ones
    runs = {"temporal": [_run(1, 0.5, 0.5, [0.5])], "auto": [k4, k2, k4]}
    assert b._verdict(runs)[0] == pytest.approx(1.2)
    # the best plan is hybrid's k = 4, which auto never ran
    runs = {"hybrid": [k4], "auto": [k2, k2]}
    assert b._verdict(runs)[0] == pytest.approx(1.2)
    # every auto round infeasible: no verdict
    runs["auto"] = [{"feasible": False, "reason": "x"}]
    assert math.isnan(b._verdict(runs)[0])


def test_best_mode_is_the_mode_of_the_fastest_plan_not_of_autos_last_round():
    # As at 96 envs on one H200 (call CK): auto ran the split k = 2 (fastest), then the
    # co-located plan; its merged row is the fastest row and shows the co-located plan last.
    b = _bench()
    runs = {
        "temporal": [_run(1, 0.35, 0.37, [0.35, 0.35])],
        "hybrid": [_run(2, 0.25, 0.26, [0.25, 0.25])],
        "auto": [_run(2, 0.20, 0.21, [0.20, 0.20]), _run(1, 0.28, 0.29, [0.28, 0.28])],
    }
    ratio, pooled = b._verdict(runs)
    assert b._best_mode(runs, pooled) == "hybrid"
    assert ratio == pytest.approx(0.315 / 0.225) and ratio > b.TOLERANCE
    assert b._best_mode({}, {}) == "none"


def test_round_errors_and_spread_by_placement():
    b = _bench()
    runs = {
        "temporal": [_run(1, 0.50, 0.50, [0.5]), _run(1, 0.60, 0.50, [0.6])],
        # an infeasible first round keeps its number: the feasible one is round 1
        "hybrid": [{"feasible": False, "reason": "x"}, _run(4, 0.30, 0.32, [0.3])],
    }
    errs = b._round_errors(runs)
    assert [(e["mode"], e["round"]) for e in errs] == [
        ("temporal", 0),
        ("temporal", 1),
        ("hybrid", 1),
    ]
    assert [round(e["error"], 4) for e in errs] == [0.0, 0.2, -0.0625]
    spread = b._spread_by_placement(runs)
    assert sorted(spread.values()) == [[0.3, 0.3], [0.5, 0.6]]


def test_late_captures_count_graphs_recorded_after_the_first_iteration():
    b = _bench()
    runs = {
        "temporal": [{"policy_graph_captures": [4, 4, 4]}, {"policy_graph_captures": [0, 0]}],
        "hybrid": [{"feasible": False}, {"policy_graph_captures": [8, 9, 12]}],
        "auto": [{"policy_graph_captures": [None, None]}, {"policy_graph_captures": [3]}],
    }
    assert b._late_captures(runs) == {"hybrid round 1": 4}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # call AQ: auto ran k = 2 in two of three rounds, 11.4% slower than k = 4
        ("docs/results/gpu/update_graphs/embodied_px_e16_s32.json", 1.114),
        # call AU: k = 8 in both rounds, as hybrid
        ("docs/results/gpu/turns/embodied_px_e64_s16_c2_call_au.json", 1.000),
        # call AY, one H200: k = 4 then k = 2, pooled 0.362 and 0.357 s/it
        ("docs/results/gpu/one_h200/embodied_px_e16_s32_c3.json", 1.015),
        # call CM, 96 envs: k = 2 in round 0 (pooled 0.254 s/it), k = 3 in round 1 (0.219)
        ("docs/results/gpu/graphcache/cm/embodied_px_e96_s32_c3.json", 1.162),
    ],
)
def test_verdict_on_stored_gpu_runs(path, expected):
    b = _bench()
    d = json.loads((ROOT / path).read_text())
    runs = {r["mode"]: r["rounds"] for r in d["results"]}
    assert b._verdict(runs)[0] == pytest.approx(expected, abs=5e-4)


def test_rounds_turn_the_mode_order():
    bench = _bench()
    modes = ["temporal", "hybrid", "auto"]
    orders = [bench.round_order(modes, r) for r in range(4)]
    assert orders[0] == modes
    assert orders[1] == ["hybrid", "auto", "temporal"]
    assert orders[3] == modes
    # over as many rounds as modes, every mode runs once in every position
    for pos in range(3):
        assert sorted(o[pos] for o in orders[:3]) == sorted(modes)


class _Stop(Exception):
    pass


def test_out_holds_every_finished_run_when_a_later_one_is_cut_off(tmp_path, monkeypatch):
    """A run killed mid-benchmark (a time limit) leaves the runs before it in --out."""
    import loomrl.cluster

    bench = _bench()

    class FakeCluster:
        shut = 0

        def shutdown(self):
            FakeCluster.shut += 1

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(lambda **kw: FakeCluster()))
    calls = []

    def fake_run_mode(mode, args, out_dir):
        calls.append((mode, out_dir.name))
        if len(calls) == stop_at:
            raise _Stop  # this run never finishes
        k, t = (1, 0.5) if mode == "temporal" else (4, 0.3)
        r = _run(k, t, t, [t, t])
        plan_mode = r["placement"]["mode"]
        return {
            **r,
            "mode": mode,
            "plan_mode": plan_mode,
            "model_s": t,
            "collect_s": [t, t],
            "env_steps_per_s": 100.0,
        }

    monkeypatch.setattr(bench, "run_mode", fake_run_mode)
    out = tmp_path / "bench.json"
    stop_at = 5
    with pytest.raises(_Stop):
        bench.main(["--modes", "temporal,hybrid,auto", "--rounds", "2", "--out", str(out)])
    assert [m for m, _ in calls] == ["temporal", "hybrid", "auto", "hybrid", "auto"]
    assert [d for _, d in calls] == ["round0"] * 3 + ["round1"] * 2
    doc = json.loads(out.read_text())
    assert doc["complete"] is False
    assert {m: len(rs) for m, rs in doc["runs"].items()} == {"temporal": 1, "hybrid": 2, "auto": 1}
    assert FakeCluster.shut == 1  # the cluster is stopped on the way out too
    assert not out.with_name("bench.json.tmp").exists()
    # Uncut, the same benchmark ends with the whole summary, the verdict included.
    calls.clear()
    stop_at = 0
    rc = bench.main(["--modes", "temporal,hybrid,auto", "--rounds", "2", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert (rc, doc["complete"], doc["auto_vs_best"]) == (0, True, 1.0)
    assert doc["hybrid_vs_temporal"] == pytest.approx(0.5 / 0.3)
    assert [r["mode"] for r in doc["results"]] == ["temporal", "hybrid", "auto"]
    # Without auto there is no pick to judge: the benchmark measures and exits 0.
    calls.clear()
    rc = bench.main(["--modes", "temporal,hybrid", "--out", str(out)])
    doc = json.loads(out.read_text())
    assert (rc, doc["auto_mode"]) == (0, "none") and doc["auto_vs_best"] != doc["auto_vs_best"]
    with pytest.raises(SystemExit) as e:
        bench.main(["--modes", "temporal,hybird"])
    assert e.value.code == 2
