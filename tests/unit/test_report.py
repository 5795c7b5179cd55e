"""loomrl report: loading a run directory, the table's numbers, the figure and the Chrome trace."""

from __future__ import annotations

import json

import pytest

from loomrl.plan import Interval, Plan, layout, leaf, load_profile, search, temporal
from loomrl.report import (
    FIGURE_FILE,
    TRACE_FILE,
    ReportError,
    busy_seconds,
    export_chrome_trace,
    load_run,
    report_main,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def hand_plan() -> Plan:
    """gen then train on devices 0-1; predicted 10 s: gen runs 4 s, train 4 s, two 1 s switches."""
    tree = layout(temporal(leaf("gen", 2, used=2), leaf("train", 2, used=2)))
    timeline = (
        Interval("gen", (0, 2), 0.0, 1.0, -1, "switch"),
        Interval("gen", (0, 2), 1.0, 5.0, 0),
        Interval("train", (0, 2), 5.0, 6.0, -1, "switch"),
        Interval("train", (0, 2), 6.0, 10.0, 0),
    )
    return Plan(
        tree,
        micro_batch=4,
        predicted_s=10.0,
        devices=2,
        batch=4,
        mode="temporal",
        timeline=timeline,
    )


def records(t: float) -> list[dict]:
    """One iteration of length ``t`` on two ranks per component: gen busy t/2 - 1 s, train t/2 - 1 s."""
    out = []
    for rank in (0, 1):

        def rec(comp, kind, s, e, mb=-1, rank=rank):
            return {
                "component": comp,
                "rank": rank,
                "devices": [rank],
                "kind": kind,
                "micro_batch": mb,
                "start": s,
                "end": e,
                "items": 0 if mb < 0 else 4,
            }

        out += [
            rec("gen", "onload", 0.0, 1.0),
            rec("gen", "run", 1.0, t / 2, 0),
            rec("gen", "offload", t / 2, t / 2 + 0.5),
            rec("train", "run", t / 2 + 0.5, t - 0.5, 0),
        ]
    return out


# measured: step 0 is warm-up (20 s); after it 11, 13, 12 -> median 12 s (step 3), +20% vs 10 s.
TIMES = {0: 20.0, 1: 11.0, 2: 13.0, 3: 12.0}


def write_run(d, plan: Plan | None = None, times=TIMES, summary=True):
    d.mkdir(parents=True, exist_ok=True)
    plan = plan or hand_plan()
    plan.save(d / "plan.json")
    with open(d / "timeline.jsonl", "w") as f:
        for step, t in times.items():
            f.write(
                json.dumps(
                    {
                        "step": step,
                        "measured_s": t,
                        "predicted_s": plan.predicted_s,
                        "records": records(t),
                    }
                )
                + "\n"
            )
    if summary:
        warm = sorted(list(times.values())[1:])
        (d / "run_summary.json").write_text(
            json.dumps(
                {
                    "predicted_iteration_s": plan.predicted_s,
                    "measured_iteration_s": warm[len(warm) // 2],
                }
            )
        )
    return d


def test_busy_seconds_is_the_union_of_spans():
    assert busy_seconds([(0, 2), (1, 3), (5, 6)]) == 4.0
    assert busy_seconds([(5, 6), (0, 1), (0, 1), (1, 2)]) == 3.0
    assert busy_seconds([(2, 2), (3, 1)]) == 0.0
    assert busy_seconds([]) == 0.0


def test_load_run_reads_every_file_and_picks_the_median_warm_iteration(tmp_path):
    run = load_run(write_run(tmp_path / "r"))
    assert [it.step for it in run.iterations] == [0, 1, 2, 3]
    assert run.plan.predicted_s == 10.0 and len(run.plan.timeline) == 4
    assert run.measured_median_s == 12.0
    assert run.median_iteration().step == 3
    assert run.summary["measured_iteration_s"] == 12.0
    assert run.iteration(1).measured_s == 11.0
    with pytest.raises(ReportError, match="step 9 is not in timeline.jsonl"):
        run.iteration(9)


def test_a_refreshed_prediction_is_reported_beside_the_planned_one(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    # Steps 0-1 ran on the planned 10 s; from step 2 on the prediction was refreshed to 12.5 s.
    lines = (d / "timeline.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for r in rows[2:]:
        r["predicted_s"] = 12.5
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"predicted_iteration_s": 12.5, "planned_iteration_s": 10.0}
    (d / "run_summary.json").write_text(json.dumps(summary))
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "planned iteration          10.0000 s  (measured vs planned +20.0%)" in out
    # Steps 2 and 3 (13 and 12 s) ran on the refreshed prediction: median 12.5 s, +0.0%.
    assert "after the refresh          12.5000 s  (median of 2 iteration(s)" in out
    assert "+0.0%" in out
    # Without a refresh, neither line appears.
    write_run(tmp_path / "plain")
    report_main([str(tmp_path / "plain")])
    assert "planned iteration" not in capsys.readouterr().out


def test_a_prediction_adaptation_refreshed_is_judged_against_the_iterations_run_on_it(
    tmp_path, capsys
):
    """profile=calibrate has no planned time, and run.adapt refreshes the prediction as costs
    move: the iterations run on the last prediction are still set against it, not only the
    median over the whole plan."""
    d = write_run(tmp_path / "run")
    rows = [json.loads(line) for line in (d / "timeline.jsonl").read_text().splitlines()]
    rows[2]["predicted_s"] = 12.0  # step 2 (13 s) alone ran on the refreshed prediction
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "run_summary.json").write_text(json.dumps({"predicted_iteration_s": 12.0}))
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "planned iteration" not in out
    assert "after the refresh          13.0000 s  (median of 1 iteration(s)" in out
    # The per-component table sets an iteration run on that prediction against it (the
    # median of all warm ones, step 3, ran on the one before).
    assert "busy time per component, step 2 " in out


def test_a_run_that_failed_says_how_it_ended(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    summary = {
        "status": "failed",
        "steps_done": 3,
        "error": "LoomError: no reply from env 1\n\tpid: 7",
    }
    (d / "run_summary.json").write_text(json.dumps(summary))
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "run failed after 3 step(s): LoomError: no reply from env 1\n" in out  # its first line
    assert "pid: 7" not in out
    early = tmp_path / "early"  # stopped before its first iteration: no timeline to show
    early.mkdir()
    (early / "run_summary.json").write_text(json.dumps({**summary, "steps_done": 0}))
    assert report_main([str(early)]) == 2
    assert "no iteration to report; the run failed after 0 step(s): LoomError: no reply" in (
        capsys.readouterr().err
    )
    done = write_run(tmp_path / "done")  # a finished run's summary adds no such line
    (done / "run_summary.json").write_text(json.dumps({"status": "finished", "steps_done": 4}))
    assert report_main([str(done)]) == 0
    assert "step(s):" not in capsys.readouterr().out


def test_a_resumed_run_reports_its_earlier_attempts(tmp_path, capsys):
    from loomrl.run import earlier_attempts

    d = write_run(tmp_path / "run", summary=False)
    assert earlier_attempts(d) == []  # no summary yet: a first attempt
    first = {"status": "failed", "error": "WorkerDiedError: x", "steps_done": 3, "wall_s": 40.0}
    (d / "run_summary.json").write_text(json.dumps({**first, "measured_iteration_s": 2.0}))
    (one,) = earlier_attempts(d)
    assert one == {**first, "measured_iteration_s": 2.0}
    # The second attempt's summary carries the first; a third attempt sees both, in order.
    second = {"status": "interrupted", "steps_done": 5, "wall_s": 20.0, "attempts": [one]}
    (d / "run_summary.json").write_text(json.dumps({**second, "wall_s_total": 60.0}))
    assert [a["status"] for a in earlier_attempts(d)] == ["failed", "interrupted"]
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert (
        "attempts                2 (before this one: failed after 3 step(s)); wall time of all 60.0 s"
        in out
    )
    (d / "run_summary.json").write_text("{not json")
    assert earlier_attempts(d) == []


def test_an_attempt_that_wrote_no_summary_is_listed_as_killed(tmp_path, capsys):
    from loomrl.run import ATTEMPT_FILE, earlier_attempts

    d = write_run(tmp_path / "run", summary=False)
    first = {"status": "failed", "error": "E: x", "steps_done": 3, "wall_s": 40.0}
    (d / "run_summary.json").write_text(json.dumps({**first, "measured_iteration_s": 2.0}))
    mark = {"started": 100.0, "updated": 130.5, "steps_done": 7, "measured_iteration_s": 1.5}
    (d / ATTEMPT_FILE).write_text(json.dumps(mark))
    one, killed = earlier_attempts(d)  # the summary's attempt, then the one killed after it
    assert one["status"] == "failed"
    assert killed["status"] == "killed" and "SIGKILL" in killed["error"]
    assert (killed["steps_done"], killed["wall_s"], killed["measured_iteration_s"]) == (
        7,
        30.5,
        1.5,
    )
    (d / "run_summary.json").unlink()  # killed in its first attempt: nothing else to list
    assert [a["status"] for a in earlier_attempts(d)] == ["killed"]
    (d / ATTEMPT_FILE).write_text(json.dumps({"started": "soon", "steps_done": True}))
    (bad,) = earlier_attempts(d)  # listed, with what could not be read left unknown
    assert bad["status"] == "killed" and bad["wall_s"] is None and bad["steps_done"] is None
    (d / ATTEMPT_FILE).write_text("{cut sho")
    assert earlier_attempts(d) == []
    summary = {"status": "finished", "steps_done": 9, "wall_s_total": 50.0, "attempts": [killed]}
    (d / "run_summary.json").write_text(json.dumps(summary))
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "(before this one: killed after 7 step(s)); wall time of all 50.0 s" in out
    assert "no summary written" not in out  # the cut-short marker says nothing
    (d / ATTEMPT_FILE).write_text(json.dumps(mark))  # an attempt running (or killed) now
    assert report_main([str(d)]) == 0
    said = "no summary written: still running, or killed outright (7 step(s) done, the last at "
    assert said in capsys.readouterr().out
    # left by the attempt that wrote the summary (killed before removing it): not pending
    (d / "run_summary.json").write_text(json.dumps({**summary, "attempt_started": mark["started"]}))
    assert report_main([str(d)]) == 0
    assert "no summary written" not in capsys.readouterr().out


def test_load_run_skips_a_cut_short_line_and_needs_no_summary(tmp_path):
    d = write_run(tmp_path / "r", summary=False)
    with open(d / "timeline.jsonl", "a") as f:
        f.write('{"step": 4, "measured_s": 1')  # the crash cut it short
    run = load_run(d)
    assert [it.step for it in run.iterations] == [0, 1, 2, 3]
    assert run.summary == {} and run.predicted_s == 10.0


def test_a_timeline_line_that_is_no_object_or_no_utf8_is_skipped(tmp_path, caplog):
    d = write_run(tmp_path / "r", summary=False)
    with open(d / "timeline.jsonl", "ab") as f:
        f.write(b"[1]\n7\n\xff\xfe damaged block\n")
    run = load_run(d)
    assert [it.step for it in run.iterations] == [0, 1, 2, 3]
    assert "line 5 unreadable (a line must be an object, got list); skipped" in caplog.text
    assert "line 7 unreadable" in caplog.text


def test_a_summary_whose_attempts_is_no_list_reports_none(tmp_path, capsys):
    from loomrl.run import earlier_attempts

    d = write_run(tmp_path / "r", summary=False)
    (d / "run_summary.json").write_text(json.dumps({"status": "finished", "attempts": 7}))
    assert report_main([str(d)]) == 0
    assert "attempts  " not in capsys.readouterr().out
    # a resume of that run lists the attempt that wrote the summary, and no earlier one
    assert [a["status"] for a in earlier_attempts(d)] == ["finished"]


def test_report_writes_figure_trace_and_prints_the_numbers(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "predicted iteration" in out and "10.0000 s" in out
    assert "measured median" in out and "12.0000 s" in out
    assert "+20.0%" in out
    assert "step 3" in out
    # step 3 (12 s): gen busy 1..6 = 5 s vs 4 s predicted; train 6.5..11.5 = 5 s vs 4 s.
    gen = next(line for line in out.splitlines() if line.strip().startswith("gen "))
    assert gen.split()[1:] == ["4.0000", "5.0000", "+25.0%"]
    train = next(line for line in out.splitlines() if line.strip().startswith("train "))
    assert train.split()[1:] == ["4.0000", "5.0000", "+25.0%"]
    # switching: predicted 2 s (0-1, 5-6); measured onload 0-1 + offload 6-6.5 = 1.5 s
    sw = next(line for line in out.splitlines() if "(switching)" in line)
    assert sw.split()[1:] == ["2.0000", "1.5000", "-25.0%"]
    assert (d / FIGURE_FILE).read_bytes()[:8] == PNG_MAGIC
    assert (d / FIGURE_FILE).stat().st_size > 5000
    assert str(d / FIGURE_FILE) in out and str(d / TRACE_FILE) in out


def test_step_and_out_options(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    out_dir = tmp_path / "elsewhere" / "report"
    assert report_main([str(d), "--step", "1", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert "step 1 (measured 11.0000 s)" in out
    assert (out_dir / FIGURE_FILE).is_file() and (out_dir / TRACE_FILE).is_file()
    assert not (d / FIGURE_FILE).exists()


def test_trace_is_well_formed_and_iterations_are_end_to_end(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    assert report_main([str(d)]) == 0
    trace = json.loads((d / TRACE_FILE).read_text())
    events = trace["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    for e in xs:
        assert set(e) >= {"name", "ph", "ts", "dur", "pid", "tid"}
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ts"] >= 0 and e["dur"] >= 0
    steps = sorted((e for e in xs if e["cat"] == "iteration"), key=lambda e: e["ts"])
    assert [e["name"] for e in steps] == ["step 0", "step 1", "step 2", "step 3"]
    assert [e["ts"] for e in steps] == [0.0, 20e6, 31e6, 44e6]  # 20 + 11 + 13 s laid end to end
    assert [e["dur"] for e in steps] == [20e6, 11e6, 13e6, 12e6]
    work = [e for e in xs if e["cat"] != "iteration"]
    assert len(work) == 4 * 8  # 8 records per iteration, one device each
    assert {e["pid"] for e in work} == {0, 1}  # pid = device
    # step 1's gen run of rank 1: 1..5.5 s into the iteration, which starts at 20 s
    g = next(
        e for e in work if e["name"] == "gen" and e["args"]["step"] == 1 and e["args"]["rank"] == 1
    )
    assert (g["pid"], g["ts"], g["dur"]) == (1, 21e6, 4.5e6)
    assert {e["name"] for e in work} == {"gen", "gen onload", "gen offload", "train"}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    for e in work:
        assert names[(e["pid"], e["tid"])] == f"{e['name'].split()[0]} rank {e['args']['rank']}"
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs[0] == "device 0" and procs[1] == "device 1"


def test_export_chrome_trace_puts_deviceless_work_on_its_own_process(tmp_path):
    recs = {
        5: [
            {
                "component": "env",
                "rank": 2,
                "devices": [],
                "kind": "run",
                "micro_batch": 0,
                "start": 0.25,
                "end": 0.75,
                "items": 3,
            }
        ]
    }
    p = export_chrome_trace(recs, tmp_path / "t.json")
    events = json.loads(p.read_text())["traceEvents"]
    (x,) = [e for e in events if e["ph"] == "X" and e["cat"] == "run"]
    assert (x["pid"], x["ts"], x["dur"]) == (-2, 0.25e6, 0.5e6)
    assert x["args"]["items"] == 3
    # no iteration_s given: an iteration lasts until its last record ends
    (it,) = [e for e in events if e["ph"] == "X" and e["cat"] == "iteration"]
    assert (it["ts"], it["dur"]) == (0.0, 0.75e6)


def test_report_of_a_searched_plan(tmp_path, capsys):
    """A real planner result (hybrid: logprob and actor side by side) draws and traces too."""
    prof = load_profile(
        {
            "devices": 4,
            "device_memory_gb": 80,
            "batch": 8,
            "granularities": [1, 2, 4, 8],
            "components": {
                "rollout": {
                    "valid_devices": [1, 2, 4],
                    "time": {"alpha": 0.1, "per_item": {1: 0.8, 2: 0.4, 4: 0.2}},
                },
                "actor": {
                    "valid_devices": [1, 2, 4],
                    "time": {"alpha": 0.1, "per_item": {1: 0.4, 2: 0.2, 4: 0.1}},
                },
            },
            "edges": [["rollout", "actor"]],
        }
    )
    plan = search(prof, mode="spatial")
    assert plan.timeline
    d = write_run(tmp_path / "run", plan=plan)
    assert report_main([str(d)]) == 0
    assert (d / FIGURE_FILE).read_bytes()[:8] == PNG_MAGIC
    assert "rollout" in capsys.readouterr().out


@pytest.mark.parametrize(
    "make, needle",
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: (p / "f").write_text("x") and p / "f", "is a file, not a run directory"),
        (lambda p: p, "has no plan.json or timeline.jsonl"),
        (
            lambda p: write_run(p / "r") and (p / "r" / "timeline.jsonl").unlink() or p / "r",
            "has no timeline.jsonl",
        ),
    ],
)
def test_unusable_run_dir_exits_2_with_one_line(tmp_path, capsys, make, needle):
    assert report_main([str(make(tmp_path))]) == 2
    cap = capsys.readouterr()
    assert needle in cap.err
    assert cap.err.startswith("loomrl report: error:") and cap.err.count("\n") == 1
    assert "Traceback" not in cap.err and cap.out == ""


def test_unknown_step_and_unreadable_plan_exit_2(tmp_path, capsys):
    d = write_run(tmp_path / "r")
    assert report_main([str(d), "--step", "9"]) == 2
    assert "step 9 is not in timeline.jsonl" in capsys.readouterr().err
    (d / "plan.json").write_text("{not json")
    assert report_main([str(d)]) == 2
    assert "not a readable plan" in capsys.readouterr().err


def test_report_lists_adaptation_events(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    events = [
        {"step": 3, "errors": [0.2, 0.3, 0.25], "action": "recalibrate", "refreshed_s": 12.0},
        {
            "step": 5,
            "attempt": 1,
            "errors": [0.2, 0.3],
            "action": "recalibrate",
            "refreshed_s": 12.0,
            "kept_because": "max_replans (3) reached",
        },
        {
            "step": 7,
            "errors": [-0.5, -0.4, -0.45],
            "action": "replan",
            "mode": "hybrid",
            "assignment": {"gen": [0], "train": [1]},
            "micro_batch": 2,
            "best_s": 6.0,
            "refreshed_s": 9.0,
            "stall_s": 1.5,
            "changed_because": "predicted 6.000s against 9.000s",
        },
    ]
    (d / "adapt.jsonl").write_text("\n".join(json.dumps(e) for e in events) + "\n{broken")
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "run-time adaptation (4 event(s)" in out
    assert "step 3: off the prediction by +20%, +30%, +25%; profile refreshed" in out
    assert "step 7:" in out and "re-planned to hybrid" in out and "redeploy 1.50 s" in out
    # why it kept or changed the plan, and which attempt of a restarted run decided
    assert "step 5 (attempt 2): off" in out and "plan kept (now 12.0000 s): max_replans" in out
    assert "redeploy 1.50 s: predicted 6.000s against 9.000s" in out
    assert "unreadable line" in out
    assert "the last attempt started" not in out  # the summary has no adapt_start


def test_report_says_which_plan_a_restart_of_an_adapted_run_started_on(tmp_path, capsys):
    d = write_run(tmp_path / "run")
    s = json.loads((d / "run_summary.json").read_text())
    said = "adapt: resuming on the plan adapted at step 4 (attempt 0, plan 3e7029afc6c6)"
    s["adapt_start"] = {"start": "adapted", "adapted_step": 4, "said": said}
    (d / "run_summary.json").write_text(json.dumps(s))
    assert report_main([str(d)]) == 0  # no adapt.jsonl: a restart at step 0 dropped its rows
    out = capsys.readouterr().out
    assert "run-time adaptation (0 event(s), adapt.jsonl):" in out
    assert "  the last attempt started: resuming on the plan adapted at step 4 (attempt 0" in out


def test_a_summary_that_is_not_an_object_is_ignored_with_a_warning(tmp_path, caplog):
    d = write_run(tmp_path / "r", summary=False)
    (d / "run_summary.json").write_text("[1, 2]")
    run = load_run(d)
    assert run.summary == {} and "is not a JSON object" in caplog.text


def test_an_uncalibrated_plan_reports_no_prediction_rather_than_0_s(tmp_path, capsys):
    """profile=calibrate stopped before its second iteration: plan.json is the cost-free plan,
    whose 0 s predicts nothing; the summary (if any) says null."""
    import dataclasses

    from loomrl.report import NOT_CALIBRATED

    plan = dataclasses.replace(hand_plan(), predicted_s=0.0, method="calibrate")
    d = write_run(tmp_path / "run", plan=plan, times={0: 2.0}, summary=False)
    (d / "run_summary.json").write_text(
        json.dumps({"status": "interrupted", "steps_done": 1, "predicted_iteration_s": None})
    )
    run = load_run(d)
    assert run.calibrating and run.predicted_s is None
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert f"predicted iteration     {NOT_CALIBRATED}" in out
    assert "0.0000 s" not in out.split("busy time")[0]
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert rows["gen"][0] == "-" and rows["train"][0] == "-" and rows["(switching)"][0] == "-"
    assert (d / FIGURE_FILE).read_bytes()[:8] == PNG_MAGIC
    # Killed outright: no summary at all, and still no 0 s.
    (d / "run_summary.json").unlink()
    assert load_run(d).predicted_s is None
    # A run that finished (or a resume that ran) one iteration did not stop early either.
    (d / "run_summary.json").write_text(json.dumps({"status": "finished", "steps_done": 1}))
    assert report_main([str(d)]) == 0
    said = capsys.readouterr().out.splitlines()[1]
    assert "not known" in said and "stopped" not in said
    # A calibrated plan (its method no longer "calibrate") reports its prediction.
    write_run(tmp_path / "done", plan=dataclasses.replace(plan, method="calibrated"))
    assert load_run(tmp_path / "done").predicted_s == 0.0


def test_a_timeline_line_with_a_time_that_is_not_finite_is_skipped(tmp_path, caplog):
    """A run writes finite times only: nan or inf there is damage, which would stop the figure."""
    d = write_run(tmp_path / "r")
    rows = [json.loads(line) for line in (d / "timeline.jsonl").read_text().splitlines()]
    rows[1]["measured_s"] = float("inf")
    rows[2]["records"][0]["end"] = float("nan")
    (d / "timeline.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_run(d)
    assert [it.step for it in run.iterations] == [0, 3]
    assert "measured_s is inf, not a finite number" in caplog.text
    assert "end is nan, not a finite number" in caplog.text
    assert report_main([str(d)]) == 0


def test_a_resumed_run_is_measured_on_the_iterations_of_the_attempt_that_predicted(
    tmp_path, capsys
):
    """Steps 0-5 ran in a first attempt (killed), steps 6-8 in the resumed one, whose plan the
    summary's prediction is of: the measured median is of steps 7-8, not of all."""
    from loomrl.run import ATTEMPT_FILE

    times = {0: 20.0, 1: 30.0, 2: 30.0, 3: 30.0, 4: 30.0, 5: 30.0, 6: 15.0, 7: 11.0, 8: 13.0}
    d = write_run(tmp_path / "run", times=times, summary=False)
    summary = {
        "status": "finished",
        "steps": 9,
        "steps_done": 9,
        "predicted_iteration_s": 10.0,
        "iteration_s": [15.0, 11.0, 13.0],
        "attempts": [{"status": "killed", "steps_done": 6}],
    }
    (d / "run_summary.json").write_text(json.dumps(summary))
    run = load_run(d)
    assert [it.step for it in run.warm] == [7, 8] and run.measured_median_s == 12.0
    assert report_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "measured median            12.0000 s  (this attempt's, after warm-up: 2" in out
    assert "+20.0%" in out
    # A later attempt killed outright ran after the summary's: its steps are not told apart.
    (d / ATTEMPT_FILE).write_text(json.dumps({"started": 1.0, "updated": 2.0, "steps_done": 9}))
    assert [it.step for it in load_run(d).warm] == list(range(1, 9))
