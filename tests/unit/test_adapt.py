"""Run-time adaptation's pure parts: drift detection, profile refresh, the switch decision."""

from __future__ import annotations

import pytest

from loomrl.adapt import (
    AdaptConfig,
    DriftDetector,
    adapt_totals,
    call_overheads,
    component_factors,
    costs_moved,
    detection_lag,
    iteration_overhead,
    measured_switch_s,
    oscillations,
    phase_overheads,
    plan_key,
    refresh_from_runs,
    refresh_profile,
    throughput_lost,
    worth_switching,
)
from loomrl.plan import load_profile
from loomrl.plan.plan import leaf, spatial, temporal
from loomrl.plan.search import fixed_plan

PROFILE = {
    "devices": 2,
    "device_memory_gb": 8,
    "batch": 4,
    "granularities": [1, 2, 4],
    "components": {
        "a": {
            "valid_devices": [1, 2],
            "time": {"alpha": 0.1, "per_item": {1: 0.2, 2: 0.1}},
            "memory_gb": {1: 1, 2: 1},
            "switch_s": 0.05,
        },
        "b": {
            "valid_devices": [1],
            "time": {"alpha": 0.0, "per_item": {1: 0.5}},
            "memory_gb": {1: 1},
        },
    },
    "edges": [["a", "b"]],
}


def test_drift_needs_a_full_window_on_one_side():
    d = DriftDetector(threshold=0.15, window=3)
    assert not d.observe(1.0, 1.5)
    assert not d.observe(1.0, 1.5)
    assert d.observe(1.0, 1.2)  # +50%, +50%, +20%
    d.reset()
    for m in (1.3, 0.7, 1.3):  # deviating, but not on one side: noise, not drift
        assert not d.observe(1.0, m)
    assert not d.observe(1.0, 0.7)  # window now (-30%, +30%, -30%)
    assert not d.observe(1.0, 0.7)  # (+30%, -30%, -30%)
    assert d.observe(1.0, 0.7)  # (-30%, -30%, -30%)
    d.reset()
    for m in (1.1, 1.14, 1.149):  # within the threshold
        assert not d.observe(1.0, m)
    assert not DriftDetector().observe(None, 5.0)  # nothing predicted: nothing to judge


def test_component_factors_compare_recorded_calls_with_the_profile():
    prof = load_profile(PROFILE)
    # a on 2 devices, 2 ranks, each took 2 calls of 1 item (micro-batch 2 over 2 ranks):
    # predicted per micro-batch = alpha + 2 items * per_item[2] = 0.1 + 2 * 0.1 = 0.3; measured,
    # the slower rank: 0.6 and 0.6.
    tl = [
        {
            "component": "a",
            "rank": r,
            "kind": "run",
            "micro_batch": k,
            "items": 1,
            "start": 0.0,
            "end": 0.6 - 0.2 * r,
        }
        for r in (0, 1)
        for k in range(2)
    ]
    # b on 1 device, one call of 4 items: predicted 0 + 4 * 0.5 = 2.0; took 1.0.
    tl.append({"component": "b", "rank": 0, "kind": "run", "items": 4, "start": 0, "end": 1.0})
    tl.append({"component": "a", "rank": 0, "kind": "onload", "items": 0, "start": 0, "end": 0.2})
    tl.append({"component": "a", "rank": 0, "kind": "offload", "items": 0, "start": 1, "end": 1.1})
    tl.append({"component": "a", "rank": 1, "kind": "onload", "items": 0, "start": 0, "end": 0.1})
    f = component_factors(prof, {"a": [0, 1], "b": [0]}, tl)
    assert f == pytest.approx({"a": 2.0, "b": 0.5})
    assert measured_switch_s(tl) == pytest.approx({"a": 0.3})
    fresh = refresh_profile(prof, f, measured_switch_s(tl))
    assert fresh.components["a"].alpha == pytest.approx(0.2)
    assert fresh.components["a"].per_item == pytest.approx({1: 0.4, 2: 0.2})
    assert fresh.components["a"].switch_s == pytest.approx(0.3)
    assert fresh.components["b"].per_item == pytest.approx({1: 0.25})
    assert prof.components["a"].alpha == 0.1  # the original is untouched


def test_call_overheads_take_the_smallest_gap_between_calls():
    def run(c, rank, start, end):
        return {"component": c, "rank": rank, "kind": "run", "items": 1, "start": start, "end": end}

    tl = [
        run("s", 0, 0.0, 1.0),
        run("s", 0, 1.1, 2.0),  # gap 0.1
        run("s", 0, 2.5, 3.0),  # gap 0.5: waited for input
        run("s", 1, 0.0, 1.0),
        run("s", 1, 1.3, 2.0),  # gap 0.3
        run("p", 0, 0.0, 5.0),  # one call per rank: no gap
    ]
    assert call_overheads(tl) == pytest.approx({"s": 0.2})  # median of 0.1 and 0.3
    # A co-resident partner on the same device alternates with "x": its turn is not overhead.
    x = [run("x", 0, 0.0, 1.0), run("x", 0, 2.05, 3.0), run("y", 0, 1.0, 2.0)]
    x += [run("y", 0, 3.5, 4.0), run("z", 0, -1.0, -0.5)]  # outside the gap: no effect
    for r in x:
        r["devices"] = [0]
    # x's gap (1.0 -> 2.05) holds y's turn (1.0 s) and the hand-offs x -> y -> x (0.05 s), which
    # y's gap (2.0 -> 3.5) holds too: each of the two gets half of what its gap leaves.
    assert call_overheads(x)["x"] == pytest.approx(0.05 / 2)
    assert call_overheads(x)["y"] == pytest.approx((1.5 - 0.95) / 2)
    prof = load_profile(PROFILE)
    fresh = refresh_profile(prof, {"a": 2.0}, overhead_s={"a": 0.05})
    assert fresh.components["a"].alpha == pytest.approx(0.1 * 2 + 0.05)


def test_iteration_overhead_is_what_lies_outside_every_record():
    tl = [
        {"component": "a", "rank": 0, "kind": "run", "start": 0.03, "end": 0.5},
        {"component": "b", "rank": 0, "kind": "run", "start": 0.4, "end": 0.9},
    ]
    assert iteration_overhead(tl, 0.95) == pytest.approx(0.03 + 0.05)
    assert iteration_overhead([], 1.0) == 0.0
    # Into the profile: every plan's prediction moves by the same seconds, in the simulator too.
    from loomrl.plan.search import search_all
    from loomrl.plan.simulate import simulate

    prof = load_profile(PROFILE)
    fresh = refresh_profile(prof, {}, iteration_overhead_s=0.08)
    assert fresh.iteration_overhead_s == 0.08
    assert load_profile(fresh.to_dict()).iteration_overhead_s == 0.08
    assert "iteration_overhead_s" not in prof.to_dict()
    before, after = search_all(prof), search_all(fresh)
    for mode, plan in before.items():
        if plan is not None:
            assert after[mode].predicted_s == pytest.approx(plan.predicted_s + 0.08)
            sim = simulate(after[mode], fresh)
            assert sim.mean_s == pytest.approx(sim.analytic_s)


def test_refresh_from_runs_averages_what_the_iterations_measured():
    from types import SimpleNamespace

    def it(b_end, measured):
        tl = [
            {"component": "a", "rank": 0, "kind": "run", "items": 4, "start": 0.1, "end": 0.6},
            {"component": "b", "rank": 0, "kind": "run", "items": 4, "start": 0.6, "end": b_end},
        ]
        return SimpleNamespace(timeline=tl, phases={}, measured_s=measured)

    prof = load_profile(PROFILE)
    # b on one device was profiled at 0.5 s per item: 2 s for 4 items; it took 1.4 and 2.4 s.
    factors, fresh = refresh_from_runs(prof, {"a": [0], "b": [1]}, [it(2.0, 2.2), it(3.0, 3.0)])
    assert factors["b"] == pytest.approx((1.4 + 2.4) / 2 / 2.0)
    assert fresh.components["b"].per_item[1] == pytest.approx(0.5 * factors["b"])
    # Head 0.1 s in both, tail 0.2 s in the first: 0.2 s on average outside the components.
    assert fresh.iteration_overhead_s == pytest.approx((0.3 + 0.1) / 2)


def test_a_negative_iteration_overhead_is_refused_with_the_key():
    from loomrl.errors import ConfigError

    with pytest.raises(ConfigError, match="iteration_overhead_s: must be a number of seconds"):
        load_profile({**PROFILE, "iteration_overhead_s": -1})


def test_phase_overhead_is_the_call_beyond_the_busiest_rank():
    tl = [
        {"component": "a", "rank": 0, "kind": "onload", "start": 0.1, "end": 0.2},
        {"component": "a", "rank": 0, "kind": "run", "start": 0.2, "end": 1.0},
        {"component": "a", "rank": 1, "kind": "run", "start": 0.1, "end": 1.1},
        {"component": "b", "rank": 0, "kind": "run", "start": 1.3, "end": 2.0},
    ]
    # a's call took 1.25 s on the driver; its busiest rank worked 1.0 s (rank 0: 0.1 + 0.8).
    got = phase_overheads(tl, {"a": (0.0, 1.25), "b": (1.2, 1.9), "c": (2.0, 3.0)})
    assert got == pytest.approx({"a": 0.25, "b": 0.0})  # b's record outlasts it: never < 0


def test_a_component_the_profile_does_not_know_is_skipped():
    prof = load_profile(PROFILE)
    tl = [{"component": "z", "rank": 0, "kind": "run", "items": 1, "start": 0, "end": 1}]
    assert component_factors(prof, {"z": [0]}, tl) == {}
    # a on 3 devices: no cost for that count, so no factor.
    tl = [{"component": "a", "rank": 0, "kind": "run", "items": 1, "start": 0, "end": 1}]
    assert component_factors(prof, {"a": [0, 1, 2]}, tl) == {}


def test_switching_must_pay_for_the_stall_and_beat_the_margin():
    assert worth_switching(1.0, 0.8, stall_s=1.0, iterations_left=10)  # saves 2 s for 1 s
    assert not worth_switching(1.0, 0.8, stall_s=3.0, iterations_left=10)  # saves 2 s for 3 s
    assert not worth_switching(1.0, 0.97, stall_s=0.0, iterations_left=100)  # 3% < 5%
    assert not worth_switching(1.0, 0.5, stall_s=0.0, iterations_left=0)  # nothing left to gain
    assert worth_switching(1.0, 0.97, stall_s=0.0, iterations_left=100, min_gain=0.01)


def test_plan_key_ignores_the_prediction():
    prof = load_profile(PROFILE)
    t = fixed_plan(prof, temporal(leaf("a", 2), leaf("b", 2, used=1)), 4)
    s = fixed_plan(prof, spatial(leaf("a", 1), leaf("b", 1)), 2)
    fresh = refresh_profile(prof, {"a": 3.0})
    t2 = fixed_plan(fresh, temporal(leaf("a", 2), leaf("b", 2, used=1)), 4)
    assert t2.predicted_s != t.predicted_s and plan_key(t2) == plan_key(t)
    assert plan_key(s) != plan_key(t)
    assert plan_key(fixed_plan(prof, spatial(leaf("a", 1), leaf("b", 1)), 1)) != plan_key(s)


def test_adapt_config_reports_every_problem():
    p = AdaptConfig(threshold=0, window=0, min_gain=-1, max_replans=-1).problems("adapt_")
    assert p == [
        "adapt_threshold: must be a finite share > 0 of the predicted iteration time (0.15: 15% "
        "off the prediction counts as drift), got 0",
        "adapt_window: must be >= 1 iteration (how many in a row must miss the prediction; 3 is "
        "the default), got 0",
        "adapt_min_gain: must be a finite share >= 0 (0.05: a new plan must be predicted 5% "
        "faster), got -1",
        "adapt_max_replans: must be >= 0 redeploys per run (0: refresh the prediction but never "
        "move), got -1",
    ]
    # Never crossed, an infinite threshold or gain would turn adaptation off without a word.
    p = AdaptConfig(threshold=float("inf"), min_gain=float("nan")).problems("run.adapt_")
    assert [x.split(":")[0] for x in p] == ["run.adapt_threshold", "run.adapt_min_gain"]
    assert "got inf" in p[0] and "got nan" in p[1]


def test_adapt_settings_are_run_keys_refused_with_the_key_the_value_and_the_fix():
    from loomrl.run import RunConfig

    rc = RunConfig(adapt=True, adapt_threshold=float("inf"), adapt_min_gain=-0.1)
    assert [x.split(":")[0] for x in rc.validate()] == ["adapt_threshold", "adapt_min_gain"]
    assert RunConfig(adapt_min_gain=0.2).adapt_config().min_gain == 0.2


def test_costs_moved_when_a_plans_own_times_leave_its_earlier_ones():
    assert not costs_moved([], [2.0, 2.0], 0.15)  # a plan just started: nothing to compare
    assert not costs_moved([1.0, 1.0], [], 0.15)
    assert not costs_moved([1.0, 1.1, 0.9], [1.1, 1.1], 0.15)  # noise around the same time
    assert costs_moved([1.0, 1.0, 5.0], [1.2, 1.2], 0.15)  # medians: one stall is no move
    assert costs_moved([1.0, 1.0], [0.8, 0.8], 0.15)  # faster counts too


def _row(attempt, action, plan_from, plan_to, stall=0.0):
    return {
        "attempt": attempt,
        "action": action,
        "plan_from": plan_from,
        "plan_to": plan_to,
        **({"stall_s": stall} if action == "replan" else {}),
    }


def test_adapt_totals_count_every_attempt_and_returns_within_one():
    rows = [
        _row(0, "replan", "A", "B", 1.0),
        _row(0, "recalibrate", "B", "B"),
        _row(0, "replan", "B", "A", 2.0),  # back to A: a return
        # attempt 1 left no row; attempt 2 starts on A again (the restart, not a return)
        _row(2, "replan", "A", "B", 0.5),
    ]
    t = adapt_totals(rows, attempts=3)
    assert {k: t[k] for k in ("decisions", "replans", "oscillations")} == {
        "decisions": 4,
        "replans": 3,
        "oscillations": 1,
    }
    assert t["redeploy_stall_s"] == pytest.approx(3.5)
    assert [(a["attempt"], a["decisions"], a["replans"]) for a in t["per_attempt"]] == [
        (0, 3, 2),
        (1, 0, 0),
        (2, 1, 1),
    ]
    # The same as oscillations() over the plan each iteration ran, within an attempt.
    assert t["per_attempt"][0]["oscillations"] == oscillations(list("AABBA"))
    # Rows of an earlier version name no attempt or plans: counted in the first, never returns.
    old = adapt_totals([{"action": "replan", "stall_s": 1.0}, {"action": "recalibrate"}])
    assert (old["decisions"], old["replans"], old["oscillations"]) == (2, 1, 0)
    assert len(old["per_attempt"]) == 1
    assert adapt_totals([], attempts=2)["per_attempt"][1]["decisions"] == 0


def test_adapt_with_a_plan_file_is_refused_not_silently_off(tmp_path):
    from loomrl.run import RunConfig

    prof = load_profile(PROFILE)
    path = tmp_path / "plan.json"
    fixed_plan(prof, spatial(leaf("a", 1), leaf("b", 1)), 2).save(path)
    assert RunConfig(placement=str(path)).validate() == []
    (problem,) = RunConfig(placement=str(path), adapt=True).validate()
    assert problem.startswith(
        f"adapt: true needs a profile to refresh and re-plan from, but "
        f"placement='{path}' is a plan file"
    )
    assert "run.adapt=false" in problem
    assert RunConfig(placement="auto", adapt=True).validate() == []


def _events(errors: list[float], threshold: float = 0.15, window: int = 3) -> list[int]:
    """The iterations at which a detector fed ``errors`` (relative, predicted 1 s) decides,
    starting over after each decision as ``Flow.adapt`` does."""
    d, out = DriftDetector(threshold, window), []
    for step, e in enumerate(errors):
        if d.observe(1.0, 1.0 + e):
            out.append(step)
            d.reset()
    return out


def test_temporary_drift_is_never_acted_on_and_persistent_drift_after_one_window():
    blip = [0.0, 0.3, 0.3, 0.0, 0.3, 0.3, -0.3, -0.3, 0.3, 0.0]  # never 3 alike in a row
    assert _events(blip) == []
    lasting = [0.0] * 5 + [0.5] * 8  # drift from step 5 on, for good
    assert _events(lasting) == [7, 10]  # once per full window until the profile catches up
    assert detection_lag(_events(lasting), onset=5) == 3  # the window, counted inclusively
    assert detection_lag(_events(lasting, window=5), onset=5) == 5
    assert detection_lag([2, 9], onset=5) == 5  # a false alarm before onset is no detection
    assert detection_lag([2], onset=5) is None
    # A stale plan from the start: iteration 0 (fresh workers' warm-up) is never judged, so the
    # detector sees iterations 1, 2, 3 and decides at 3.
    judged = [1 + s for s in _events([0.5] * 3)]
    assert judged == [3] and detection_lag(judged, onset=0) == 3


def test_oscillations_count_returns_to_a_plan_that_ran_before():
    assert oscillations([]) == 0
    assert oscillations(list("AAABBBCC")) == 0
    assert oscillations(list("AABBAA")) == 1
    assert oscillations(list("ABABAB")) == 4
    assert oscillations(list("ABCA")) == 1


def test_throughput_lost_is_the_extra_share_over_the_reference_speed():
    times = [9.0, 2.0, 2.0, 1.0, 1.0]  # warm-up, two slow iterations, then the best plan's speed
    assert throughput_lost(times, reference_s=1.0, start=1) == pytest.approx(6 / 4 - 1)
    assert throughput_lost(times, reference_s=1.0, start=3) == pytest.approx(0.0)
    assert throughput_lost(times, reference_s=2.0, start=3) == pytest.approx(-0.5)
    assert throughput_lost(times, reference_s=1.0, start=5) == 0.0
    with pytest.raises(ValueError, match="reference_s=0"):
        throughput_lost(times, reference_s=0.0)


def test_the_adapted_record_reads_back_and_says_why_it_cannot_run_as_it_is(tmp_path):
    import json

    from loomrl.adapt import adapted_record, carry_problems, plan_id, read_adapted
    from loomrl.errors import PlanError
    from loomrl.plan.search import search_all

    prof = refresh_profile(load_profile(PROFILE), {"b": 0.2})
    plan = search_all(prof)["best"]
    path = tmp_path / "adapted.json"
    path.write_text(json.dumps(adapted_record(plan, prof, 7, 1, "auto", None, 2)))
    a = read_adapted(path)
    assert (a.step, a.attempt, a.placement, a.micro_batch, a.devices) == (7, 1, "auto", None, 2)
    assert plan_id(a.plan) == plan_id(plan) and a.profile.components == prof.components
    assert carry_problems(a, "auto", None, 2, None) == []
    assert carry_problems(a, "hybrid", 2, 4, plan.memory_gb / 2) == [
        "run.placement is 'hybrid' now, the plan was adapted under 'auto'",
        "run.micro_batch is 2 now, the plan was adapted under null",
        "this cluster has 4 device(s), the plan was adapted on 2",
        f"the plan's peak memory is {plan.memory_gb:.1f} GB per device, a device here has "
        f"{plan.memory_gb / 2:.1f} GB",
    ]
    raw = json.loads(path.read_text())
    raw["profile"]["components"]["a"]["time"]["per_item"] = {"1": -1}
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="adapted.json: its profile is not valid: .*per_item"):
        read_adapted(path)
    raw = json.loads(path.read_text())
    raw["step"] = "seven"
    path.write_text(json.dumps(raw))
    with pytest.raises(PlanError, match="adapted.json: step is 'seven', not a whole number"):
        read_adapted(path)
    with pytest.raises(PlanError, match="nothing.json cannot be read"):
        read_adapted(tmp_path / "nothing.json")


def _calls(**seconds):
    """One iteration's timeline: one call of 2 items on rank 0 per component, taking
    ``seconds[component]``."""
    return [
        {"component": c, "kind": "run", "rank": 0, "items": 2, "start": 0.0, "end": s}
        for c, s in seconds.items()
    ]


def test_cost_baseline_keeps_the_windows_factors_and_device_counts():
    from loomrl.adapt import cost_baseline

    prof = load_profile(PROFILE)
    spatial_ = {"a": [0], "b": [1]}
    # a on 1 device: 0.1 + 2 * 0.2 = 0.5 s predicted; b: 2 * 0.5 = 1.0 s. The median over the
    # three iterations: one stall of b does not count.
    b = cost_baseline(prof, spatial_, [_calls(a=0.5, b=0.2), _calls(a=0.5, b=0.2), _calls(b=5.0)])
    assert b["devices"] == {"a": 1, "b": 1}
    assert b["factors"] == pytest.approx({"a": 1.0, "b": 0.2})


def test_costs_moved_across_compares_only_components_on_the_same_device_count():
    from loomrl.adapt import cost_baseline, costs_moved_across

    prof = load_profile(PROFILE)
    before = cost_baseline(prof, {"a": [0], "b": [1]}, [_calls(a=0.5, b=0.2)] * 2)
    temporal_ = {"a": [0, 1], "b": [0]}
    # b runs on one device in both plans: its calls tell the machine; a moved to two devices,
    # where the profile extrapolates: a 3x off is a misprediction, not a machine change.
    assert costs_moved_across(before, prof, temporal_, [_calls(a=0.9, b=0.2)] * 2, 0.15) is False
    assert costs_moved_across(before, prof, temporal_, [_calls(a=0.3, b=0.1)] * 2, 0.15) is True
    assert costs_moved_across(before, prof, temporal_, [_calls(a=0.3, b=0.4)] * 2, 0.15) is True
    # b within the threshold, and one stalled iteration among three: no move
    steady = [_calls(a=0.3, b=0.22), _calls(a=0.3, b=0.19), _calls(a=0.3, b=2.0)]
    assert costs_moved_across(before, prof, temporal_, steady, 0.15) is False
    # Both alike: weighed by their work. a unchanged (0.5 s), b's calls 2x dearer (0.5 -> 1.0 s):
    # 1.5 s measured against 1.0 s at the baseline's costs, a 50% move, not 100%.
    both = cost_baseline(prof, {"a": [0], "b": [1]}, [_calls(a=0.5, b=0.5)])
    assert costs_moved_across(both, prof, {"a": [0], "b": [1]}, [_calls(a=0.5, b=1.0)], 0.4)
    assert not costs_moved_across(both, prof, {"a": [0], "b": [1]}, [_calls(a=0.5, b=1.0)], 0.6)
    # Nothing to tell from: no baseline, no component alike, no iteration
    assert costs_moved_across(None, prof, temporal_, [_calls(a=0.3, b=0.1)], 0.15) is None
    only_a = cost_baseline(prof, {"a": [0]}, [_calls(a=0.5)])
    assert costs_moved_across(only_a, prof, temporal_, [_calls(a=0.1, b=0.1)], 0.15) is None
    assert costs_moved_across(before, prof, temporal_, [], 0.15) is None


def test_the_adapted_record_keeps_the_measured_times_and_an_older_one_still_reads(tmp_path):
    import json

    from loomrl.adapt import (
        adapted_record,
        carries_measured,
        cost_baseline,
        plan_id,
        read_adapted,
    )
    from loomrl.errors import PlanError
    from loomrl.plan.search import search_all

    prof = refresh_profile(load_profile(PROFILE), {"b": 0.2})
    r = search_all(prof)
    plan, other = r["best"], r["spatial"]
    measured = {plan_key(other): [1.3, 1.25], plan_key(plan): [0.95]}
    base = cost_baseline(prof, other.assignment(), [_calls(a=0.5, b=0.2)])
    rec = adapted_record(plan, prof, 7, 1, "auto", None, 2, measured, base, 80.0)
    assert [m["plan_id"] for m in rec["measured"]] == [plan_id(other), plan_id(plan)]
    path = tmp_path / "adapted.json"
    path.write_text(json.dumps(rec))
    a = read_adapted(path)
    assert a.measured == measured and a.baseline == base and a.device_memory_gb == 80.0
    # Only on the cluster they were measured on: another device count or device memory is
    # another machine.
    assert carries_measured(a, 2, 80.0)
    assert not carries_measured(a, 4, 80.0)
    assert not carries_measured(a, 2, 40.0) and not carries_measured(a, 2, None)
    # A record written before the times were kept still reads, with none.
    for k in ("measured", "baseline", "device_memory_gb"):
        del rec[k]
    path.write_text(json.dumps(rec))
    a = read_adapted(path)
    assert (a.measured, a.baseline, a.device_memory_gb) == ({}, None, None)
    assert carries_measured(a, 2, None) and not carries_measured(a, 2, 80.0)
    for key, bad, said in (
        ("measured", {"x": [1.0]}, r"measured is \{'x': \[1\.0\]\}, not a list"),
        ("measured", [{"plan_key": "k", "times_s": [-1]}], r"measured\[0\] is .*times_s"),
        ("baseline", {"factors": {"a": "x"}, "devices": {}}, "baseline is .*'factors'"),
        ("device_memory_gb", 0, "device_memory_gb is 0, not a number of GB > 0 or null"),
    ):
        path.write_text(json.dumps({**rec, key: bad}))
        with pytest.raises(PlanError, match=f"adapted.json: {said}"):
            read_adapted(path)
