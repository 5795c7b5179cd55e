"""What a run's summary says of adaptation when a worker died and the run restarted: the whole
run's decisions, as adapt.jsonl keeps them, and each attempt's; and which plan a restarted or
resumed run starts on after adapting (no Ray: the cluster is a stand-in, the iterations
synthetic)."""

from __future__ import annotations

import copy
import dataclasses
import json
import types

import pytest
from test_adapt import PROFILE
from test_adapt_decisions import _flow, _iteration

from loomrl.adapt import ADAPTED_FILE, read_adapted, refresh_profile
from loomrl.flow import Flow
from loomrl.plan import load_profile
from loomrl.run import Run, RunConfig
from loomrl.worker import Worker


@dataclasses.dataclass
class _Cfg:
    run: RunConfig
    resume: bool = False


class _Cluster:
    """Stands in for the cluster of a Run and of a Flow whose launches do nothing."""

    def __init__(self, devices: int = 2):
        self.num_devices = devices
        self.has_cuda = False
        self.device_memory_gb = None

    def shutdown(self) -> None:
        pass


@pytest.fixture
def start(tmp_path, monkeypatch):
    import signal

    import loomrl.cluster

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(lambda **kw: _Cluster()))
    before = signal.getsignal(signal.SIGTERM)  # a Run sets its own until it closes

    def make(resume: bool = False, **kw):
        kw = {"adapt": True, **kw}
        rc = RunConfig(
            output_dir=str(tmp_path / "run"),
            tensorboard=False,
            progress=False,
            steps=20,
            adapt_window=2,
            **kw,
        )
        return Run(_Cfg(rc, resume=resume), rc)

    yield make
    signal.signal(signal.SIGTERM, before)


PROF = load_profile(PROFILE)
CHEAP_B = refresh_profile(PROF, {"b": 0.2})  # the machine at first: temporal is faster


def _steps(run: Run, flow, truth, steps: range) -> None:
    for step in steps:
        run.record(step, _iteration(flow.plan_, truth), flow)


def test_the_summary_counts_the_adaptation_of_every_attempt(start):
    first = start()
    _steps(first, _flow(PROF), CHEAP_B, range(5))  # re-plans at step 1, then its worker dies
    second = start(resume=True)  # the restart: a new Flow, planned from the profile again
    second.steps_done = 5
    flow = _flow(PROF)
    _steps(second, flow, CHEAP_B, range(5, 8))  # re-plans to temporal at step 6
    _steps(second, flow, PROF, range(8, 12))  # b 5x dearer: back to spatial at step 9
    s = second.summary(12, None, {})
    rows = [json.loads(x) for x in (second.dir / "adapt.jsonl").read_text().splitlines()]
    assert [(r["step"], r["attempt"], r["action"]) for r in rows] == [
        (1, 0, "replan"),
        (6, 1, "replan"),
        (9, 1, "replan"),
    ]
    a = s["adapt"]
    assert s["replans"] == a["replans"] == 3
    assert a["decisions"] == len(rows)
    # The second attempt went back to the plan it had started on; the restart itself, which
    # started again on spatial, is not adaptation returning to it.
    assert a["oscillations"] == 1
    assert a["redeploy_stall_s"] == pytest.approx(sum(r["stall_s"] for r in rows))
    assert [
        (p["attempt"], p["decisions"], p["replans"], p["oscillations"]) for p in a["per_attempt"]
    ] == [
        (0, 1, 1, 0),
        (1, 2, 2, 1),
    ]


def test_max_replans_is_per_run_across_restarts(start):
    first = start(adapt_max_replans=1)
    _steps(first, _flow(PROF), CHEAP_B, range(3))  # the run's one re-plan, at step 1
    second = start(resume=True, adapt_max_replans=1)
    second.steps_done = 3
    flow = _flow(PROF)
    _steps(second, flow, CHEAP_B, range(3, 6))
    assert flow.plan_.mode == "spatial"  # the restart may not re-plan again
    (kept,) = second.adapt_rows
    assert kept["kept_because"] == "max_replans (1) reached (1 in earlier attempts of the run)"
    s = second.summary(6, None, {})
    assert s["replans"] == 1 and s["adapt"]["decisions"] == 2


# ------------------------------------------------------------------ the plan a restart starts on


class _Step(Worker):
    def work(self, items):
        return items


SAMPLE = [0, 1, 2, 3]  # PROFILE's batch


def _declared(devices: int = 2) -> Flow:
    """A Flow of PROFILE's workflow (a -> b) on ``devices`` devices whose launches do nothing."""
    flow = Flow(_Cluster(devices))  # type: ignore[arg-type]
    flow._launch = lambda plan, keep=None, carry_state=True: None  # type: ignore[method-assign]
    a, b = flow.group(_Step, name="a"), flow.group(_Step, name="b")
    flow.chain(a.work, b.work)
    return flow


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.yaml"
    path.write_text(json.dumps(PROFILE))
    return str(path)


def test_a_profile_of_a_bigger_workflow_is_refused_naming_what_this_one_lacks():
    """PPO's profile (rollout, reward, critic, ...) given to a GRPO run: a plan searched on it
    would place components the run never declared (a KeyError in the launch)."""
    from loomrl.errors import PlanError

    flow = Flow(_Cluster(2))  # type: ignore[arg-type]
    flow._launch = lambda *a, **kw: pytest.fail("launched")  # type: ignore[method-assign]
    a = flow.group(_Step, name="a")
    flow.chain(a.work)
    with pytest.raises(PlanError, match=r"costs for component\(s\) \['b'\] that this workflow"):
        flow.plan("auto", profile=load_profile(PROFILE))


def _adapted_first(start, profile_file, **kw) -> Run:
    """The first attempt: planned spatial on the profile, the machine runs b 5x cheaper, the run
    re-plans to temporal at step 1; its worker dies after step 4 (nothing more is written)."""
    first = start(profile=profile_file, **kw)
    flow = _declared()
    first.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"
    _steps(first, flow, CHEAP_B, range(5))
    assert [r["action"] for r in first.adapt_rows] == ["replan"]
    assert flow.plan_.mode == "temporal"
    return first


def test_a_restart_starts_on_the_adapted_plan_and_profile(start, profile_file, capsys):
    _adapted_first(start, profile_file)
    second = start(resume=True, profile=profile_file)
    second.steps_done = 5
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    # Not spatial planned on run.profile again, which would take adapt_window slow iterations
    # to find the same drift: temporal, predicted with b's refreshed cost.
    assert flow.plan_.mode == "temporal"
    assert flow.profile_.components["b"].per_item[1] == pytest.approx(0.1)
    _steps(second, flow, CHEAP_B, range(5, 10))
    assert second.adapt_rows == []  # the prediction holds: nothing drifts
    assert "adapt: resuming on the plan adapted at step 1 (attempt 0" in capsys.readouterr().err
    s = second.summary(10, None, {})
    assert s["adapt_start"]["start"] == "adapted"
    assert (s["adapt_start"]["adapted_step"], s["adapt_start"]["adapted_attempt"]) == (1, 0)
    assert s["plan"]["mode"] == "temporal" and s["replans"] == 1
    assert s["adapt_start"]["carried_plans"] == 1  # spatial's times, measured by attempt 0


def test_an_in_process_restart_after_a_dead_worker_starts_on_the_adapted_plan(
    start, profile_file, tmp_path
):
    from loomrl.cli import run_with_restarts
    from loomrl.errors import WorkerDiedError

    modes = []

    def main(cfg):
        run = Run(cfg, cfg.run)
        try:
            flow = _declared()
            run.apply_plan(flow, SAMPLE)
            modes.append(flow.plan_.mode)
            for step in range(6):
                run.record(step, _iteration(flow.plan_, CHEAP_B), flow)
                if step == 3 and not cfg.resume:
                    raise WorkerDiedError("b", 0, "here", "work")
            return run.summary(6, None, {})
        finally:
            run.close()

    rc = RunConfig(
        output_dir=str(tmp_path / "run"),
        tensorboard=False,
        progress=False,
        steps=6,
        adapt=True,
        adapt_window=2,
        max_restarts=1,
        profile=profile_file,
    )
    s = run_with_restarts(types.SimpleNamespace(main=main), _Cfg(rc))
    # No checkpoint: the restart began at step 0 again, its rows of the first attempt dropped,
    # but on the plan that attempt adapted to.
    assert modes == ["spatial", "temporal"]
    assert s["adapt_start"]["start"] == "adapted" and s["adapt"]["decisions"] == 0


def test_a_resume_on_another_device_count_plans_again_from_the_refreshed_profile(
    start, profile_file, capsys
):
    _adapted_first(start, profile_file)
    second = start(resume=True, profile=profile_file)
    flow = _declared(devices=1)
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.devices == 1 and flow.profile_.devices == 1
    assert flow.profile_.components["b"].per_item[1] == pytest.approx(0.1)  # still refreshed
    err = capsys.readouterr().err
    assert "cannot run as it is (this cluster has 1 device(s), the plan was adapted on 2)" in err
    assert "planned again from the profile it refreshed" in err
    assert second.adapt_start["start"] == "replanned"
    # Times measured on 2 devices describe another cluster: none is kept, nor the record's.
    assert second.adapt_start["carried_plans"] == 0
    assert flow.measured_state() == {"measured": {}, "baseline": None}
    assert read_adapted(second.dir / ADAPTED_FILE).measured == {}
    # The re-plan is the record now: the next resume on this cluster starts on it.
    third = start(resume=True, profile=profile_file)
    third.apply_plan(_declared(devices=1), SAMPLE)
    assert third.adapt_start["start"] == "adapted" and third.plan.devices == 1
    assert third.adapt_start["adapted_step"] == second.adapt_start["adapted_step"]


def test_a_profile_of_another_device_count_than_the_cluster_is_no_reason_to_plan_again(
    start, profile_file
):
    """run.profile plans for 2 devices on a cluster of 3 from the start: a resume on the same
    cluster keeps the adapted plan (only a cluster other than the one it adapted on moves it)."""
    first = start(profile=profile_file)
    first.cluster = _Cluster(3)
    flow = _declared(devices=3)
    first.apply_plan(flow, SAMPLE)
    _steps(first, flow, CHEAP_B, range(3))
    assert flow.plan_.mode == "temporal"
    second = start(resume=True, profile=profile_file)
    second.apply_plan(_declared(devices=3), SAMPLE)
    assert second.adapt_start["start"] == "adapted" and second.plan.mode == "temporal"


def test_a_resume_in_another_mode_plans_again_from_the_refreshed_profile(start, profile_file):
    _adapted_first(start, profile_file)
    second = start(resume=True, profile=profile_file, placement="spatial")
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"
    assert flow.profile_.components["b"].per_item[1] == pytest.approx(0.1)
    said = second.adapt_start["said"]
    assert "run.placement is 'spatial' now, the plan was adapted under 'auto'" in said


def test_no_plan_from_the_refreshed_profile_falls_back_to_the_start_and_says_so(
    start, profile_file
):
    _adapted_first(start, profile_file)
    second = start(resume=True, profile=profile_file)
    flow = _declared()
    # Resumed on GPUs of 0.5 GB: the adapted plan needs more, and so does every plan of the
    # refreshed profile planned for them. Planned as at the start (run.profile, whose plans
    # are not checked against the devices' memory) instead of failing.
    flow.cluster.has_cuda, flow.cluster.device_memory_gb = True, 0.5
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"
    assert second.adapt_start["start"] == "configured"
    said = second.adapt_start["said"]
    assert (
        "cannot be resumed (the plan's peak memory is 1.0 GB per device, a device here has "
        "0.5 GB): no plan from its refreshed profile (" in said
    )
    assert "planning as at the start (placement=auto with run.profile=" in said


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"step": 1, "attempt": 0, "plac', "is not JSON"),  # cut short
        ("[1, 2]", "is not a JSON object (got list)"),
        (
            '{"step": 1, "attempt": 0, "placement": "auto", "plan": {}}',
            "lacks ['devices', 'profile']",
        ),
    ],
)
def test_a_corrupt_adapted_record_falls_back_to_the_start_and_says_why(
    start, profile_file, capsys, text, said
):
    first = _adapted_first(start, profile_file)
    (first.dir / ADAPTED_FILE).write_text(text)
    second = start(resume=True, profile=profile_file)
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"  # as at the start: run.profile, placement=auto
    err = capsys.readouterr().err
    assert f"adapt: the adapted plan cannot be used: {first.dir / ADAPTED_FILE} {said}" in err
    assert "planning as at the start (placement=auto with run.profile=" in err
    assert second.adapt_start["start"] == "configured"


def test_a_missing_adapted_record_of_a_run_that_adapted_is_said(start, profile_file, capsys):
    first = _adapted_first(start, profile_file)
    (first.dir / ADAPTED_FILE).unlink()
    second = start(resume=True, profile=profile_file)
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"
    assert "adapted.json is missing, though earlier attempts adapted (1 decision(s)" in (
        capsys.readouterr().err
    )


def test_a_resume_without_adaptation_keeps_the_placement_asked_for(start, profile_file):
    _adapted_first(start, profile_file)
    second = start(resume=True, profile=profile_file, adapt=False)
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial"
    assert flow.profile_.components["b"].per_item[1] == pytest.approx(0.5)  # run.profile's
    assert second.adapt_start["start"] == "configured"
    assert "run.adapt is false: the plan adapted at step 1" in second.adapt_start["said"]


def test_a_run_that_never_adapted_resumes_as_it_started(start, profile_file):
    first = start(profile=profile_file)
    flow = _declared()
    first.apply_plan(flow, SAMPLE)
    _steps(first, flow, PROF, range(4))  # the profile is right: nothing drifts
    second = start(resume=True, profile=profile_file)
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "spatial" and second.adapt_start is None
    assert second.summary(4, None, {})["adapt_start"] is None


# ------------------------------------------------------------------ what a restart remembers


def _profile_file(tmp_path, name, profile) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(profile.to_dict()))
    return str(path)


def test_a_restart_does_not_return_to_a_plan_an_earlier_attempt_measured_slower(start, tmp_path):
    """The profile mispredicts how a scales (the machine's costs never move): the first
    attempt moves from spatial to temporal, which runs faster, and its worker dies. The
    restart's temporal window makes spatial look best again, but spatial ran slower in the
    first attempt: the run stays on temporal, saying the time is an earlier attempt's."""
    truth, stale = copy.deepcopy(PROFILE), copy.deepcopy(PROFILE)
    truth["components"]["a"]["time"]["per_item"] = {1: 0.5, 2: 0.1}
    truth["components"]["b"]["time"]["per_item"] = {1: 0.2}
    stale["components"]["a"]["time"]["per_item"] = {1: 0.8, 2: 0.5}
    truth_p, path = load_profile(truth), _profile_file(tmp_path, "stale.json", load_profile(stale))
    first = start(profile=path)
    flow = _declared()
    first.apply_plan(flow, SAMPLE)
    _steps(first, flow, truth_p, range(2))
    assert [r["action"] for r in first.adapt_rows] == ["replan"]
    assert flow.plan_.mode == "temporal"
    second = start(resume=True, profile=path)
    second.steps_done = 2
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "temporal" and second.adapt_start["carried_plans"] == 1
    said = second.adapt_start["said"]
    assert "the times 1 plan(s) ran since the costs last moved still count" in said
    _steps(second, flow, truth_p, range(2, 8))
    assert flow.plan_.mode == "temporal"
    kept = second.adapt_rows[0]
    assert kept["action"] == "recalibrate" and kept["best_mode"] == "spatial"
    assert kept["kept_because"].startswith("the best plan ran slower than this one before")
    assert kept["kept_because"].endswith("; it ran in an earlier attempt of the run)")
    assert kept["best_ran_in_earlier_attempt"] is True
    assert kept["plan_ran_in_earlier_attempt"] is False
    assert kept["costs_judged_by"] == "components" and kept["costs_drifted"] is False
    assert all(r["action"] == "recalibrate" for r in second.adapt_rows)


def test_a_restart_judges_its_first_window_against_the_earlier_attempts_last_one(
    start, profile_file
):
    """The first attempt moves from spatial to temporal (b 5x cheaper than profiled) and its
    worker dies at once. On the restart the machine is faster (a 5x, b 10x cheaper than
    profiled): spatial 0.29 s, temporal 0.35 s. Temporal has no time of its own to show it;
    b's calls against the first attempt's last window do: spatial's 1.3 s, measured on the
    old machine, no longer counts, and the run moves to spatial."""
    first = start(profile=profile_file)
    flow = _declared()
    first.apply_plan(flow, SAMPLE)
    _steps(first, flow, CHEAP_B, range(2))
    assert flow.plan_.mode == "temporal"
    second = start(resume=True, profile=profile_file)
    second.steps_done = 2
    flow = _declared()
    second.apply_plan(flow, SAMPLE)
    assert flow.plan_.mode == "temporal"
    _steps(second, flow, refresh_profile(PROF, {"a": 0.2, "b": 0.1}), range(2, 4))
    (ev,) = second.adapt_rows
    assert ev["action"] == "replan", ev.get("kept_because")
    assert ev["costs_judged_by"] == "components" and ev["costs_drifted"] is True
    assert flow.plan_.mode == "spatial"
