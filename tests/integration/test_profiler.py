"""Automatic profiling on the run's own workers: reuse, state snapshots, one-device shares."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loomrl import Worker
from loomrl.flow import Flow
from loomrl.profiler import (
    FEW_PER_DEVICE,
    ProfileRun,
    item_cv,
    measure,
    sampling_se,
    second_call_items,
)


def _born(folder: str, name: str, devices: tuple) -> None:
    Path(folder, f"{name}-{len(devices)}-{os.getpid()}").touch()


class Tally(Worker):
    """Stateful: every output carries how many items this worker had seen before the call."""

    def __init__(self, folder: str):
        super().__init__()
        _born(folder, "tally", self.devices)
        self.seen = 0

    def count(self, items: list[dict]) -> list[dict]:
        before, self.seen = self.seen, self.seen + len(items)
        return [{**it, "before": before, "pid": os.getpid()} for it in items]

    def save_state(self) -> dict:
        return {"seen": self.seen}

    def load_state(self, state: dict) -> None:
        self.seen = state["seen"]


class Leaky(Tally):
    """Stateful without save_state/load_state: must never be reused after profiling."""

    save_state = None  # type: ignore[assignment]
    load_state = None  # type: ignore[assignment]


class Emit(Worker):
    stateless = True

    def __init__(self, folder: str):
        super().__init__()
        _born(folder, "emit", self.devices)

    def emit(self, items: list[dict]) -> list[tuple]:
        return [(it["i"], it["before"], it["pid"], os.getpid()) for it in items]

    def emit_first(self, items: list[dict]) -> list[dict]:
        return [dict(it) for it in items]


def _flow(cluster, folder, cls, **kw):
    flow = Flow(cluster)
    t = flow.group(cls, folder, name="tally", single_process=True, **kw)
    e = flow.group(Emit, folder, name="emit", valid_devices=[4])
    flow.chain(t.count, e.emit)
    return flow


def test_second_call_follows_the_budget_between_two_and_a_few_items_per_device():
    # Budget for 1.5 more item-times: still two per device (the fixed cost needs two sizes).
    assert second_call_items(4, 16, per_item_s=1.0, budget_s=1.5) == 8
    # A large budget stops at FEW_PER_DEVICE: calls do not grow with the batch.
    assert second_call_items(2, 4096, per_item_s=1.0, budget_s=1e6) == 2 * FEW_PER_DEVICE
    assert second_call_items(2, 4096, per_item_s=1.0, budget_s=3.2) == 6
    # Fewer than two items per device: the whole sample (one size more than the first call).
    assert second_call_items(4, 6, per_item_s=1.0, budget_s=0.0) == 6
    assert second_call_items(1, 2, per_item_s=1.0, budget_s=0.0) == 2


def test_item_cv_reads_the_spread_of_item_costs_from_rank_times():
    assert item_cv([([1.0, 1.0, 1.0], [2, 2, 2])]) == 0.0
    # One item per rank costing 1 or 3 (mean 2): squared deviations 4 + 2 over 3 + 1 degrees
    # of freedom (pooled sample variance), over the mean cost per item.
    got = item_cv([([1.0, 3.0, 1.0, 3.0], [1, 1, 1, 1]), ([3.0, 1.0], [1, 1])])
    assert got == pytest.approx((6 / 4) ** 0.5 / 2)
    # Two items per rank: a share's variance is twice an item's.
    assert item_cv([([2.0, 6.0], [2, 2])]) == pytest.approx((8 / 2) ** 0.5 / 2)
    # Shares of unequal size, or a single busy rank, say nothing about the spread.
    assert item_cv([([1.0, 5.0], [1, 2]), ([4.0, 0.0], [3, 0])]) == 0.0


def test_sampling_se_moves_each_component_by_its_mean_error_through_the_planner():
    from loomrl.plan import load_profile
    from loomrl.plan.search import search_all

    prof = load_profile(
        {
            "devices": 1,
            "device_memory_gb": 80,
            "batch": 8,
            "granularities": [8],
            "components": {
                "a": {"valid_devices": [1], "time": {"alpha": 2.0, "per_item": {1: 1.0}}},
                "b": {"valid_devices": [1], "time": {"alpha": 0.0, "per_item": {1: 0.5}}},
            },
            "edges": [["a", "b"]],
        }
    )
    plan = search_all(prof)["temporal"]
    assert plan.predicted_s == pytest.approx(2.0 + 8 + 4)
    # a's 4 items spread by cv 0.5: its per-item mean is off by 0.25 -> 8 * 0.25 = 2 s of 14.
    assert sampling_se(prof, plan, {"a": 0.5}, {"a": 4}) == pytest.approx(2.0 / 14)
    # Two components: their moves (2 s and 4 * 0.5 = 2 s) add in quadrature.
    both = sampling_se(prof, plan, {"a": 0.5, "b": 0.5}, {"a": 4, "b": 1})
    assert both == pytest.approx((2.0**2 + 2.0**2) ** 0.5 / 14)
    # Constant items, or none seen, say nothing.
    assert sampling_se(prof, plan, {"a": 0.0}, {"a": 4}) == 0.0
    assert sampling_se(prof, plan, {"a": 0.5}, {}) == 0.0


def test_overhead_counts_what_the_run_does_not_reuse():
    run = ProfileRun(
        samples=[],
        switch_s={},
        seconds=10.0,
        split_s={"launch": 3.0, "warmup": 2.0, "calls": 1.0, "state": 0.5},
        reused={"a": [0, 1], "b": [0, 1]},
        start_s={"a": [1.0, 0.5], "b": [2.0, 1.5]},
    )
    assert run.overhead_s == 1.5
    run.keep({"a": [0, 1], "b": [1]})  # b moves: its profiled group is not the run's
    assert run.reused == {"a": [0, 1]}
    assert run.split_s["discarded"] == 3.5 and run.split_s["launch"] == 1.0
    assert run.overhead_s == 5.0
    assert run.summary(50.0)["overhead_fraction"] == 0.1
    assert "10% of one iteration" in run.describe(50.0)
    run.split_s["warmup"] = -1e-9  # a part that took no time, as a difference of clock readings
    assert "warm-up 0.0s" in run.describe(50.0) and "-0.0s" not in run.describe(50.0)


def test_profiled_workers_run_the_plan_with_their_state_restored(cluster, tmp_path):
    flow = _flow(cluster, str(tmp_path), Tally, valid_devices=[4])
    items = [{"i": i} for i in range(8)]
    try:
        plan = flow.plan("temporal", sample=items)
        out = flow.run(items).outputs
    finally:
        flow.shutdown()
    assert plan.assignment() == {"tally": [0, 1, 2, 3], "emit": [0, 1, 2, 3]}
    assert flow.profile_run.reused == {"tally": [0, 1, 2, 3], "emit": [0, 1, 2, 3]}
    born = sorted(p.name for p in tmp_path.iterdir())
    # One tally process and four emit ranks in all: the profiler's workers ran the iteration.
    assert len([b for b in born if b.startswith("tally-")]) == 1, born
    assert len([b for b in born if b.startswith("emit-")]) == 4, born
    tally_pid = int(next(b for b in born if b.startswith("tally-")).rsplit("-", 1)[1])
    assert {o[2] for o in out} == {tally_pid}
    # Profiling fed the tally several calls; the snapshot put it back: the run starts from zero.
    assert [o[0] for o in out] == list(range(8))
    assert {o[1] for o in out} == {0}
    split = flow.profile_run.split_s
    assert {"launch", "warmup", "calls", "state"} <= set(split) and split["calls"] > 0


def test_each_rank_of_a_data_parallel_group_is_a_one_device_sample(cluster, tmp_path):
    flow = Flow(cluster)
    e = flow.group(Emit, str(tmp_path), name="emit")
    t = flow.group(Tally, str(tmp_path), name="tally", single_process=True, valid_devices=[4])
    flow.chain(e.emit_first, t.count)
    items = [{"i": i} for i in range(64)]
    try:
        run = measure(flow, items)  # the profiling alone: a plan may start other groups
    finally:
        flow.shutdown()
    emit = [s for s in run.samples if s[0] == "emit"]
    # Calls on four devices: one item per device, the next item per device alone, both
    # together (the budget of 10% of 16 item-times allows no more), and each rank's share of
    # each as a one-device sample.
    assert sorted((n, x) for _, n, x, *_ in emit if n == 4) == [(4, 4.0), (4, 4.0), (4, 8.0)]
    assert sorted(x for _, n, x, *_ in emit if n == 1) == [1.0] * 8 + [2.0] * 4
    # No one-device rank was started or called on its own: every emit sample came from 3 calls.
    assert {n for _, n, *_ in emit} == {1, 4}
    born = [p.name for p in tmp_path.iterdir() if p.name.startswith("emit-")]
    assert len(born) == 4, born
    # The next stage got the inputs it needed (two items per device), not the whole sample.
    tally = [s for s in run.samples if s[0] == "tally"]
    assert max(x for _, _, x, *_ in tally) == 8.0


def test_a_stateful_class_without_snapshots_gets_fresh_workers(cluster, tmp_path):
    flow = _flow(cluster, str(tmp_path), Leaky, valid_devices=[4])
    items = [{"i": i} for i in range(8)]
    try:
        flow.plan("temporal", sample=items)
        out = flow.run(items).outputs
    finally:
        flow.shutdown()
    assert "tally" not in flow.profile_run.reused
    born = [p.name for p in tmp_path.iterdir() if p.name.startswith("tally-")]
    assert len(born) == 2  # the profiler's process, then the run's own
    assert {o[1] for o in out} == {0}


def test_one_device_share_of_a_single_process_worker(cluster, tmp_path):
    flow = _flow(cluster, str(tmp_path), Tally)
    items = [{"i": i} for i in range(8)]
    try:
        plan = flow.plan("temporal", sample=items)
    finally:
        flow.shutdown()
    counts = {(c, n) for c, n, *_ in flow.profile_run.samples}
    assert {("tally", 1), ("tally", 4), ("emit", 4)} <= counts
    # On CPU the one-device share is the same process with one thread: the profiler starts one
    # tally process (on 4 devices); another exists only if the plan moved tally elsewhere.
    born = sorted(
        p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir() if p.name.startswith("tally-")
    )
    moved = plan.assignment()["tally"] != [0, 1, 2, 3]
    assert born == sorted(
        ["tally-4"] + ([f"tally-{len(plan.assignment()['tally'])}"] if moved else [])
    )


def test_an_auto_run_records_its_profiling_in_the_summary(cluster, tmp_path, capsys):
    import json

    from loomrl.cli import _normalise_overrides, load_recipe_config

    root = Path(__file__).resolve().parents[2]
    mod, cfg = load_recipe_config(
        root / "examples/demo_matmul.yaml",
        _normalise_overrides(
            ["placement=auto", "steps=4", "batch=8", "demo.size=96", f"output_dir={tmp_path}"]
        ),
    )
    mod.main(cfg)
    said = capsys.readouterr().err  # where profiling is, before the plan (it can take minutes)
    assert [ln.split(" (")[0] for ln in said.splitlines() if ln.startswith("profiling ")][:3] == [
        "profiling encode",
        "profiling transform",
        "profiling reduce",
    ]
    assert said.index("profiling reduce") < said.index("incl. profiling")
    s = json.loads((tmp_path / "run_summary.json").read_text())
    prof = s["profiling"]
    assert prof["budget"] == 0.1 and prof["samples"] > 0
    assert 0 < prof["overhead_s"] <= prof["seconds"] <= s["planning_s"]
    assert prof["overhead_fraction"] == pytest.approx(prof["overhead_s"] / s["planned_iteration_s"])
    # The three warm iterations timed every item: the prediction comes from them since, and the
    # plan on disk is that refreshed one, on the same devices.
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["method"] == "refreshed"
    assert plan["predicted_s"] == pytest.approx(s["predicted_iteration_s"])
    assert s["plan"]["assignment"] == plan["assignment"]
    assert {"launch", "warmup", "calls", "state"} <= set(prof["split_s"])
    # Every stage's items were timed; the prediction's sampling error is reported beside them.
    assert set(prof["items"]) == {"encode", "transform", "reduce"}
    assert all(n >= 2 for n in prof["items"].values())
    assert prof["prediction_se"] is not None and prof["prediction_se"] >= 0


def test_a_calibrated_run_says_when_its_prediction_arrives(cluster, tmp_path, capsys):
    from loomrl.cli import _normalise_overrides, load_recipe_config

    root = Path(__file__).resolve().parents[2]
    mod, cfg = load_recipe_config(
        root / "examples/demo_matmul.yaml",
        _normalise_overrides(
            [
                "placement=temporal",
                "run.profile=calibrate",
                "steps=3",
                "batch=8",
                "demo.size=96",
                f"output_dir={tmp_path}",
            ]
        ),
    )
    mod.main(cfg)
    said = capsys.readouterr().err
    # The cost-free plan's 0 s is said not to be a prediction; the second iteration (step 1)
    # brings one.
    assert "profile=calibrate: no costs measured yet" in said
    (line,) = [ln for ln in said.splitlines() if "plan calibrated" in ln]
    assert line.startswith("step 1: plan calibrated from this iteration's measured phases: ")
    assert float(line.split(": ")[2].split("s per")[0]) > 0
    summary = json.loads((tmp_path / "run_summary.json").read_text())
    assert summary["planned_iteration_s"] is None  # chosen without costs: no prediction
    assert summary["predicted_iteration_s"] > 0


@pytest.mark.timeout(240)
def test_a_profile_that_cannot_be_written_prints_its_plans_and_says_why(
    cluster, tmp_path, monkeypatch, capsys
):
    """After minutes of measuring, a full disk under profile.yaml gave a bare OSError traceback
    and lost what the measuring found."""
    import errno

    from loomrl import config
    from loomrl.cli import main

    real = config.atomic_write_text

    def full(path, text):
        if Path(path).name == "profile.yaml":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, text)

    monkeypatch.setattr(config, "atomic_write_text", full)
    root = Path(__file__).resolve().parents[2]
    assert main(["profile", str(root / "examples/demo_matmul.yaml"), f"output_dir={tmp_path}"]) == 2
    out, err = capsys.readouterr()
    assert "temporal:" in out and "profiled" in out  # the plans, printed anyway
    assert "could not write the profile to" in err and "No space left on device" in err
    assert "Traceback" not in err and not (tmp_path / "profile.yaml").exists()
