"""``Flow.adapt``'s decisions on synthetic iterations (no workers): the iterations a machine
with known true costs would record, so that each decision can be checked against the truth."""

from __future__ import annotations

import copy

from test_adapt import PROFILE

from loomrl.adapt import AdaptConfig, refresh_profile
from loomrl.flow import Flow, FlowResult
from loomrl.plan import load_profile
from loomrl.plan.search import fixed_plan, search_all


def _iteration(plan, truth) -> FlowResult:
    """One iteration of ``plan`` on a machine whose costs are ``truth``: each component's calls
    back to back, taking what ``truth`` says, and the iteration as long as ``truth`` predicts
    ``plan`` (a record of no component spans it, so that no overhead is read into it)."""
    measured = fixed_plan(truth, plan.tree, plan.micro_batch).predicted_s
    timeline = []
    for name, devs in plan.assignment().items():
        c, t = truth.components[name], 0.0
        for k in range(plan.num_micro_batches):
            d = c.alpha + plan.micro_batch * c.per_item[len(devs)]
            timeline.append(
                {
                    "component": name,
                    "kind": "run",
                    "rank": 0,
                    "micro_batch": k,
                    "start": t,
                    "end": t + d,
                    "items": plan.micro_batch,
                }
            )
            t += d
    span = {"component": "-", "kind": "run", "rank": 0, "start": 0.0, "end": measured, "items": 0}
    return FlowResult([], measured, plan.predicted_s, [*timeline, span], {})


def _flow(profile) -> Flow:
    """A Flow planned on ``profile`` whose redeploys only switch the plan (no workers)."""
    flow = Flow(None)  # type: ignore[arg-type]  # no cluster: nothing is launched
    flow._launch = lambda plan, keep=None, carry_state=True: None  # type: ignore[method-assign]
    flow.profile_ = profile
    flow.plan_ = search_all(profile)["best"]
    return flow


def _iterations(flow: Flow, truth, n: int, cfg: AdaptConfig) -> list[dict]:
    events = []
    for _ in range(n):
        ev = flow.adapt(_iteration(flow.plan_, truth), 100, cfg)
        if ev is not None:
            events.append(ev)
    return events


def _true_s(flow: Flow, truth) -> float:
    return fixed_plan(truth, flow.plan_.tree, flow.plan_.micro_batch).predicted_s


def test_after_the_costs_move_a_plan_measured_slower_before_may_be_chosen_again():
    """Spatial (planned on the profile) runs slower than temporal on the machine at first: the
    run moves to temporal. Then b becomes 5x dearer: temporal now takes 2.55 s, spatial 2.3 s.
    Spatial's 1.3 s measured before the change says nothing about it now: the run moves back,
    and the event says why."""
    prof = load_profile(PROFILE)
    cheap_b = refresh_profile(prof, {"b": 0.2})
    cfg = AdaptConfig(window=2)
    flow = _flow(prof)
    assert flow.plan_.mode == "spatial"
    (first,) = _iterations(flow, cheap_b, 5, cfg)
    assert first["action"] == "replan" and flow.plan_.mode == "temporal"
    assert first["costs_drifted"] is False  # spatial's prediction was wrong; costs never moved
    (second,) = _iterations(flow, prof, 3, cfg)  # b back to the profile's cost: 5x dearer
    assert second["costs_drifted"] is True
    assert second["action"] == "replan", second.get("kept_because")
    assert flow.plan_.mode == "spatial" and _true_s(flow, prof) < 2.55
    assert second["best_ran_s"] is None  # spatial's earlier times were set aside
    assert "before the costs moved no longer count" in second["changed_because"]


def test_a_mispredicted_new_plan_does_not_send_the_run_back_to_one_measured_slower():
    """The machine's costs never move; the profile mispredicts how a scales. The run moves to
    temporal, whose measured times make spatial look best again: spatial ran slower, and the
    run stays (no oscillation), saying so with both measured times."""
    truth, stale = copy.deepcopy(PROFILE), copy.deepcopy(PROFILE)
    truth["components"]["a"]["time"]["per_item"] = {1: 0.5, 2: 0.1}
    truth["components"]["b"]["time"]["per_item"] = {1: 0.2}
    stale["components"]["a"]["time"]["per_item"] = {1: 0.8, 2: 0.5}
    truth_p = load_profile(truth)
    flow = _flow(load_profile(stale))
    first, *later = _iterations(flow, truth_p, 12, AdaptConfig(window=2))
    assert first["action"] == "replan" and flow.plan_.mode == "temporal"
    assert later and all(e["action"] == "recalibrate" for e in later)
    kept = later[0]
    assert kept["best_mode"] == "spatial" and kept["costs_drifted"] is False
    # Temporal's first window had no earlier times of its own: b, on one device in both plans,
    # took what it took in spatial's window, so the costs did not move (a's 2 devices, where
    # the profile was wrong, are no evidence either way).
    assert kept["costs_judged_by"] == "components"
    assert kept["kept_because"].startswith("the best plan ran slower than this one before")
    assert kept["best_ran_s"] > kept["plan_ran_s"]
    assert flow.plan_.mode == "temporal"


def test_max_replans_counts_the_replans_of_earlier_attempts():
    """A restart starts a new Flow: the run's earlier re-plans still count against the
    per-run max_replans."""
    prof = load_profile(PROFILE)
    flow = _flow(prof)
    cfg = AdaptConfig(window=2, max_replans=1)
    events = []
    for _ in range(3):
        ev = flow.adapt(
            _iteration(flow.plan_, refresh_profile(prof, {"b": 0.2})), 100, cfg, replans_before=1
        )
        if ev is not None:
            events.append(ev)
    (ev,) = events
    assert ev["action"] == "recalibrate" and flow.plan_.mode == "spatial"
    assert ev["kept_because"] == "max_replans (1) reached (1 in earlier attempts of the run)"


def test_a_machine_change_in_the_first_window_after_a_re_plan_sets_earlier_times_aside():
    """The machine runs b 5x cheaper than profiled: spatial (1.3 s) is slower than temporal
    there, and the run moves to temporal. At once, before temporal has a time of its own, the
    machine gets faster (a 5x, b 10x cheaper than profiled): spatial now takes 0.29 s, temporal
    0.35 s. Temporal's own times cannot show the change; b's calls can (one device in both
    plans, each now half as long as in spatial's window): spatial's 1.3 s describes the old
    machine and no longer keeps the run from it."""
    prof = load_profile(PROFILE)
    cfg = AdaptConfig(window=2)
    flow = _flow(prof)
    (first,) = _iterations(flow, refresh_profile(prof, {"b": 0.2}), 2, cfg)
    assert first["action"] == "replan" and flow.plan_.mode == "temporal"
    faster = refresh_profile(prof, {"a": 0.2, "b": 0.1})
    (second, *_) = _iterations(flow, faster, 2, cfg)
    assert second["action"] == "replan", second.get("kept_because")
    assert second["costs_judged_by"] == "components" and second["costs_drifted"] is True
    assert flow.plan_.mode == "spatial" and _true_s(flow, faster) < 0.35
    assert second["best_ran_s"] is None  # spatial's 1.3 s was set aside
    assert "before the costs moved no longer count" in second["changed_because"]
