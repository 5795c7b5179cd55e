"""A run's attempts as its summary lists them: killed ones (no summary written) included, one
after another, with the steps each had done (no Ray: the cluster is a stand-in)."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

from loomrl.run import ATTEMPT_FILE, Run, RunConfig, earlier_attempts


@dataclasses.dataclass
class _Cfg:
    run: RunConfig
    resume: bool = False


class _Cluster:
    def shutdown(self) -> None:
        pass


@pytest.fixture
def start(tmp_path, monkeypatch):
    import signal

    import loomrl.cluster

    monkeypatch.setattr(loomrl.cluster.Cluster, "start", staticmethod(lambda **kw: _Cluster()))
    rc = RunConfig(output_dir=str(tmp_path / "run"), tensorboard=False, progress=False)
    before = signal.getsignal(signal.SIGTERM)  # a Run sets its own until it closes
    yield lambda resume=False: Run(_Cfg(rc, resume=resume), rc)
    signal.signal(signal.SIGTERM, before)


_STEP = types.SimpleNamespace(measured_s=1.0, predicted_s=None, timeline=[])


def _ends(attempts):
    return [(a["status"], a["steps_done"]) for a in attempts]


def test_attempts_killed_one_after_another_are_all_listed(start):
    a = start()  # killed after 5 steps: it never writes a summary
    for step in range(5):
        a.record(step, _STEP)
    b = start(resume=True)
    b.steps_done = 5  # what a recipe's restore does; killed before its first step
    assert _ends(b.attempts) == [("killed", 5)]
    c = start(resume=True)
    assert _ends(c.attempts) == [("killed", 5), ("killed", 5)]
    c.steps_done = 5
    for step in range(5, 7):
        c.record(step, _STEP)
    s = c.summary(7, None, {})
    assert _ends(s["attempts"]) == [("killed", 5), ("killed", 5)]
    assert s["status"] == "finished" and s["steps_done"] == 7
    assert not (c.dir / ATTEMPT_FILE).exists()
    # the next resume reads the finished summary, once
    assert _ends(earlier_attempts(c.dir)) == [("killed", 5), ("killed", 5), ("finished", 7)]


def test_a_marker_left_by_the_attempt_that_wrote_the_summary_is_not_listed_twice(start):
    a = start()
    a.record(0, _STEP)
    mark = json.loads((a.dir / ATTEMPT_FILE).read_text())
    a.summary(1, None, {})
    # killed between writing its summary and removing its marker
    (a.dir / ATTEMPT_FILE).write_text(json.dumps(mark))
    assert _ends(earlier_attempts(a.dir)) == [("finished", 1)]


def test_a_failed_attempt_removes_its_marker(start):
    a = start()
    a.record(0, _STEP)
    a._write_failure(RuntimeError("boom"))
    assert not (a.dir / ATTEMPT_FILE).exists()
    (failed,) = earlier_attempts(a.dir)
    assert failed["status"] == "failed" and "boom" in failed["error"]


def test_an_interrupted_run_names_the_signal_that_stopped_it(start):
    from loomrl.run import Terminated

    a = start()
    a.record(0, _STEP)
    a._write_failure(KeyboardInterrupt())
    s = json.loads((a.dir / "run_summary.json").read_text())
    assert (s["status"], s["signal"]) == ("interrupted", "SIGINT")
    assert s["error"] == "KeyboardInterrupt: interrupted (Ctrl-C)"
    b = start(resume=True)
    b._write_failure(Terminated("SIGTERM (kill, or a scheduler's time limit)"))
    s = json.loads((b.dir / "run_summary.json").read_text())
    assert (s["status"], s["signal"]) == ("interrupted", "SIGTERM")
    assert s["error"] == "Terminated: SIGTERM (kill, or a scheduler's time limit)"


def _plan(method, predicted_s):
    tree = types.SimpleNamespace(pretty=lambda indent: "  temporal [0..1] (2 dev)")
    return types.SimpleNamespace(
        method=method,
        predicted_s=predicted_s,
        memory_gb=0.0,
        mode="temporal",
        devices=2,
        micro_batch=4,
        num_micro_batches=1,
        batch=4,
        tree=tree,
        assignment=lambda: {"actor": [0, 1]},
    )


def test_a_plan_not_yet_calibrated_predicts_nothing_in_any_record(start):
    from loomrl.run import describe_plan

    a = start()
    a.plan = _plan("calibrate", 0.0)  # profile=calibrate's cost-free plan
    said = describe_plan(a.plan)
    assert "no prediction yet (profile=calibrate: no costs measured yet" in said
    assert "0.0000" not in said and "GB" not in said
    ran = types.SimpleNamespace(measured_s=1.0, predicted_s=0.0, timeline=[])
    a.record(0, ran)
    assert ran.predicted_s is None  # the recipe logs it to metrics.jsonl next: null, not 0
    assert json.loads((a.dir / "timeline.jsonl").read_text())["predicted_s"] is None
    s = a.summary(1, None, {})
    assert s["predicted_iteration_s"] is None and s["planned_iteration_s"] is None
    a.plan = _plan("calibrated", 0.25)  # calibrated from the iterations it ran: a prediction
    ran = types.SimpleNamespace(measured_s=1.0, predicted_s=0.25, timeline=[])
    a.record(1, ran)
    assert ran.predicted_s == 0.25 and a._record()["predicted_iteration_s"] == 0.25


def test_measured_since_prediction_is_the_median_of_the_iterations_run_under_it():
    """Costs that move (responses shortening as a run learns) refresh the prediction; the summary
    judges it against the iterations since, not the plan's whole median. A plan's first
    iteration (warm-up) is left out, as in measured_iteration_s."""
    run = Run.__new__(Run)
    run.iter_times = [9.0, 8.0, 7.0, 6.0, 3.0, 2.0]
    run.plan_start = run.prediction_start = 0
    assert run.measured_since_prediction_s() == run.measured_iteration_s() == 6.0
    run.prediction_start = 4  # refreshed after iteration 3, the plan kept
    assert run.measured_since_prediction_s() == 2.5 and run.measured_iteration_s() == 6.0
    run.plan_start = run.prediction_start = 3  # re-planned after iteration 2
    assert run.measured_since_prediction_s() == 2.5  # 6.0 was the new plan's warm-up
    run.prediction_start = 6  # refreshed after the last iteration
    assert run.measured_since_prediction_s() is None
