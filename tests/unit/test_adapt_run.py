"""What a run's summary says of adaptation when a worker died and the run restarted: the whole
run's decisions, as adapt.jsonl keeps them, and each attempt's (no Ray: the cluster is a
stand-in, the iterations synthetic)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_adapt import PROFILE
from test_adapt_decisions import _flow, _iteration

from loomrl.adapt import refresh_profile
from loomrl.plan import load_profile
from loomrl.run import Run, RunConfig


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
    before = signal.getsignal(signal.SIGTERM)  # a Run sets its own until it closes

    def make(resume: bool = False, **kw):
        rc = RunConfig(
            output_dir=str(tmp_path / "run"),
            tensorboard=False,
            progress=False,
            steps=20,
            adapt=True,
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
