"""Automatic profiling on the run's own workers: reuse, state snapshots, one-device shares."""

from __future__ import annotations

import os
from pathlib import Path

from loomrl import Worker
from loomrl.flow import Flow
from loomrl.profiler import call_sizes


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


def _flow(cluster, folder, cls, **kw):
    flow = Flow(cluster)
    t = flow.group(cls, folder, name="tally", single_process=True, **kw)
    e = flow.group(Emit, folder, name="emit", valid_devices=[4])
    flow.chain(t.count, e.emit)
    return flow


def test_call_sizes_stay_small_as_the_batch_grows():
    assert call_sizes(1, 16) == (1, 4)
    assert call_sizes(2, 16) == (2, 8)
    assert call_sizes(2, 4096) == (2, 8)  # bounded: at most FEW_PER_DEVICE per device
    assert call_sizes(4, 4) == (4, 4)
    small, large = call_sizes(1, 2)
    assert small < large <= 2


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
