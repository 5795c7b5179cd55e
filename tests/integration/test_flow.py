"""M2Flow: one program under temporal, spatial and hybrid plans; time-sharing; pinned plans."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import pytest
from _capacity_cases import BAD_CAPACITIES

from loomrl import Worker, wait
from loomrl.errors import PlanError
from loomrl.flow import Flow, _contexts, _hop_capacities, _rank_counts, _route
from loomrl.plan import load_profile
from loomrl.recipes.demo import DemoConfig, build, make_items

ROOT = Path(__file__).resolve().parents[2]
SMALL = DemoConfig(
    size=64, encode_reps=2, transform_reps=3, transform_sigma=0.8, reduce_reps=1, resident_mb=8
)


def test_the_auto_iteration_limit_is_generous_and_follows_the_slowest_iteration():
    from loomrl.flow import AUTO_TIMEOUT_FLOOR_S, iteration_limit

    assert iteration_limit("auto", 0.5, 0.0) == AUTO_TIMEOUT_FLOOR_S  # never below the floor
    assert iteration_limit("auto", 300.0, 100.0) == 3000.0  # 10x the prediction
    assert iteration_limit("auto", 300.0, 400.0) == 4000.0  # or the slowest iteration
    assert iteration_limit("auto", None, 0.0) == AUTO_TIMEOUT_FLOOR_S  # calibrate: no prediction
    assert iteration_limit("off", 300.0, 400.0) is None
    assert iteration_limit(5.0, 300.0, 400.0) == 5.0


def test_routing_covers_every_item_once():
    for m in (1, 2, 3, 4, 8):
        for n in (1, 2, 3, 4):
            counts = _rank_counts(m, n)
            assert sum(counts) == m
            seen = [_route(i, m, n) for i in range(4 * m)]
            for r in range(n):
                for k in range(4):
                    assert sum(1 for x in seen if x == (r, k)) == counts[r]


@pytest.fixture(scope="module")
def demo_profile():
    return load_profile(ROOT / "examples/profiles/demo_matmul.yaml")


def _run_mode(cluster, profile, mode, steps=2):
    flow = Flow(cluster, offload="always")
    build(flow, SMALL)
    plan = flow.plan(mode, profile=profile)
    try:
        outs = [flow.run(make_items(s, 8)) for s in range(steps)]
    finally:
        flow.shutdown()
    # The data-flow graph captured from the channels is the declared chain.
    assert flow.observed_edges == set(flow.edges)
    return plan, outs


def test_outputs_identical_across_plans(cluster, demo_profile):
    results = {}
    for mode in ("temporal", "spatial", "hybrid"):
        plan, outs = _run_mode(cluster, demo_profile, mode)
        assert plan.mode == mode
        results[mode] = [o.outputs for o in outs]
        last = outs[-1]
        assert len(last.outputs) == 8
        kinds = {r["kind"] for r in last.timeline}
        ctx = _contexts(plan.tree)
        if any(shared and not co for _, shared, co in ctx.values()):
            assert {"onload", "offload"} <= kinds  # time-shared stages switch once per iteration
        if mode == "spatial":
            # Streaming: the sink starts before the first stage has finished its last micro-batch.
            runs = [r for r in last.timeline if r["kind"] == "run"]
            first_end = max(r["end"] for r in runs if r["component"] == "encode")
            sink_start = min(r["start"] for r in runs if r["component"] == "reduce")
            assert plan.num_micro_batches > 1
            assert sink_start < first_end
    assert results["temporal"] == results["spatial"] == results["hybrid"]


class Hog(Worker):
    """Holds a large buffer while onloaded."""

    def __init__(self, mb: int):
        super().__init__()
        self.mb, self.buf = mb, None
        self.onload()

    def onload(self):
        import numpy as np

        self.buf = np.ones(self.mb * 2**20 // 8)

    def offload(self):
        self.buf = None

    def step(self, items):
        return [x + 1 for x in items]

    def sink(self, items):
        return items


def _build_light(flow: Flow) -> None:
    """The demo's chain (encode -> transform -> reduce, the names its profile prices) on Hogs:
    for tests of what the flow does around the work (plans, offloads, devices), without each
    worker importing torch for the demo's matrix products."""
    stages = [flow.group(Hog, 8, name=n) for n in ("encode", "transform", "reduce")]
    flow.chain(*(g.step for g in stages))


def test_time_sharing_frees_memory(cluster):
    from loomrl.plan.plan import leaf, temporal
    from loomrl.plan.search import fixed_plan

    prof = load_profile(
        {
            "devices": 1,
            "device_memory_gb": 8,
            "batch": 2,
            "granularities": [2],
            "components": {
                "a": {
                    "valid_devices": [1],
                    "time": {"alpha": 0, "per_item": {1: 0.1}},
                    "memory_gb": {1: 1},
                },
                "b": {
                    "valid_devices": [1],
                    "time": {"alpha": 0, "per_item": {1: 0.1}},
                    "memory_gb": {1: 1},
                },
            },
            "edges": [["a", "b"]],
        }
    )
    flow = Flow(cluster)
    a = flow.group(Hog, 400, name="a")
    b = flow.group(Hog, 10, name="b")
    flow.chain(a.step, b.sink)
    plan = fixed_plan(prof, temporal(leaf("a", 1), leaf("b", 1)), 2)
    flow.plan(plan_path := _save(plan))
    try:
        before = wait(a.group._call("_loom_memory"))[0]["rss_gb"]
        res = flow.run([1, 2])
        assert res.outputs == [2, 3]
        after = wait(a.group._call("_loom_memory"))[0]["rss_gb"]
        # 400 MB buffer released by offload() after a's phase.
        assert before - after > 0.3, (before, after)
    finally:
        flow.shutdown()
        Path(plan_path).unlink()


def _save(plan) -> str:
    import tempfile

    path = tempfile.mktemp(suffix=".json")
    plan.save(path)
    return path


class Flaky(Worker):
    """Adds one, or raises while told to."""

    def __init__(self):
        super().__init__()
        self.fail, self.stall_s = False, 0.0

    def set_fail(self, fail: bool) -> None:
        self.fail = fail

    def set_stall(self, seconds: float) -> None:
        self.stall_s = seconds

    def step(self, items):
        import time

        time.sleep(self.stall_s)
        if self.fail:
            raise RuntimeError("flaky stage failed")
        return [x + 1 for x in items]


def _flaky_chain(
    cluster,
    devices: int,
    batch: int,
    granularities: list[int],
    fails: str = "a",
    capacity: int = 0,
):
    """A flow a -> b of two Flaky stages, with a profile for it; returns the flow, the group of
    stage ``fails`` (to make it raise) and the profile."""
    spec = {"valid_devices": [1], "time": {"alpha": 0, "per_item": {1: 0.1}}, "memory_gb": {1: 0}}
    prof = load_profile(
        {
            "devices": devices,
            "device_memory_gb": 8,
            "batch": batch,
            "granularities": granularities,
            "components": {"a": spec, "b": spec},
            "edges": [["a", "b"]],
        }
    )
    flow = Flow(cluster, channel_capacity=capacity)
    groups = {"a": flow.group(Flaky, name="a"), "b": flow.group(Flaky, name="b")}
    flow.chain(groups["a"].step, groups["b"].step)
    return flow, groups[fails], prof


@pytest.mark.timeout(120)
def test_a_failing_producer_under_a_spatial_plan_ends_the_run_not_a_hang(cluster):
    """Spatial: the consumer waits on the producer's channel; when the producer raises, the
    channels are closed, the consumer's wait ends, and the producer's error is the one raised."""
    from loomrl.errors import RemoteError
    from loomrl.plan.plan import leaf, spatial
    from loomrl.plan.search import fixed_plan

    flow, a, prof = _flaky_chain(cluster, devices=2, batch=4, granularities=[1, 2, 4])
    tree = spatial(leaf("a", 1), leaf("b", 1))
    flow.plan(plan_path := _save(fixed_plan(prof, tree, 1)))
    try:
        assert flow.run([1, 2, 3, 4]).outputs == [3, 4, 5, 6]
        wait(a.group.set_fail(True))
        with pytest.raises(RemoteError, match="flaky stage failed"):
            flow.run([1, 2, 3, 4])
        assert flow._chans == []
        wait(a.group.set_fail(False))
        assert flow.run([1, 2, 3, 4]).outputs == [3, 4, 5, 6]  # and the flow goes on
    finally:
        flow.shutdown()
        Path(plan_path).unlink()


@pytest.mark.timeout(120)
def test_a_stage_that_hangs_ends_the_iteration_at_its_time_limit(cluster):
    """A consumer stage that blocks far past the iteration's limit: run() raises, naming the
    stage, once the limit is up, not when (or if) the stage returns."""
    import time

    from loomrl.errors import ConfigError, IterationTimeout
    from loomrl.flow import AUTO_TIMEOUT_FLOOR_S
    from loomrl.plan.plan import leaf, spatial
    from loomrl.plan.search import fixed_plan

    flow, b, prof = _flaky_chain(cluster, devices=2, batch=4, granularities=[1, 2, 4], fails="b")
    plan = flow.plan(plan_path := _save(fixed_plan(prof, spatial(leaf("a", 1), leaf("b", 1)), 1)))
    try:
        assert flow.iteration_limit_s(plan) == AUTO_TIMEOUT_FLOOR_S  # "auto": 0.8 s predicted
        assert flow.run([1, 2, 3, 4]).outputs == [3, 4, 5, 6]
        flow.iteration_timeout_s = 2.0
        wait(b.group.set_stall(600.0))
        t0 = time.monotonic()
        with pytest.raises(
            IterationTimeout,
            match=r"iteration 2 ran past its time limit "
            r"\(iteration_timeout_s=2 s\) with b.step\(\) still running",
        ):
            flow.run([1, 2, 3, 4])
        assert time.monotonic() - t0 < 30
        assert flow._chans == []  # its channels went with it, as after any failed iteration
    finally:
        flow.shutdown()
        Path(plan_path).unlink()
    with pytest.raises(ConfigError, match="iteration_timeout_s=0"):
        Flow(cluster, iteration_timeout_s=0)


def test_a_spatial_placement_with_more_components_than_devices_is_refused_before_profiling(
    cluster,
):
    """Each component needs devices of its own under placement='spatial': with five on the
    session's four devices that is said at once, not after minutes of profiling."""
    flow = Flow(cluster)
    groups = [flow.group(Hog, 1, name=f"c{i}") for i in range(4)]
    last = flow.group(Hog, 1, name="c4", valid_devices=[1, 2])
    flow.chain(*(g.step for g in groups), last.sink)
    try:
        with pytest.raises(PlanError) as e:
            flow.plan("spatial", sample=[1, 2])
        msg = str(e.value)
        assert "each of the 5 components devices of its own, at least 5 devices" in msg
        assert "this cluster has 4: use placement=hybrid or auto" in msg
        assert all(c.group is None for c in flow.components.values())  # no worker started
    finally:
        flow.shutdown()


def test_a_micro_batch_or_a_pinned_plan_that_does_not_fit_the_batch_is_refused(
    cluster, demo_profile
):
    flow = Flow(cluster)
    build(flow, SMALL)
    try:
        with pytest.raises(PlanError, match=r"micro_batch=3 does not divide the batch of 8 items"):
            flow.plan("auto", profile=demo_profile, micro_batch=3)
        plan = flow.plan("temporal", profile=demo_profile)
        with pytest.raises(PlanError, match=r"flow.run got 6 items but the plan is for batch=8"):
            flow.run(make_items(0, 6))
        path = _save(plan)
        try:
            with pytest.raises(PlanError) as e:
                flow.plan(path, sample=make_items(0, 16), micro_batch=2)
            assert "the plan is for batch=8 items per iteration but this run has 16" in str(e.value)
            assert f"the plan's micro_batch is {plan.micro_batch} but the run pins 2" in str(
                e.value
            )
        finally:
            Path(path).unlink()
    finally:
        flow.shutdown()


def test_a_group_that_cannot_start_is_refused_when_declared_and_a_misspelt_stage_is_named(
    cluster,
):
    """flow.group checks the class and its constructor's arguments at once, not when flow.plan
    starts the group (after profiling the others); a misspelt stage suggests the near name."""
    flow = Flow(cluster)
    with pytest.raises(TypeError, match="needs a subclass of loomrl.Worker, got <class 'dict'>"):
        flow.group(dict)
    with pytest.raises(TypeError, match=r"^Hog\(mb\): missing a required argument: 'mb'"):
        flow.group(Hog)
    hog = flow.group(Hog, 8)
    assert list(flow.components) == ["Hog"]  # the refused ones were not declared
    with pytest.raises(AttributeError, match=r"Hog has no method 'stpe'; did you mean 'step'\?"):
        flow.chain(hog.stpe)


def test_only_hops_whose_stages_run_at_once_stream():
    from loomrl.flow import _streaming_hops
    from loomrl.plan.plan import leaf, spatial, temporal

    a, b, c, d = (leaf(x, 1) for x in "abcd")
    assert _streaming_hops(temporal(a, b), ["a", "b"]) == [False]
    assert _streaming_hops(spatial(a, b), ["a", "b"]) == [True]
    # Below a spatial node, a temporal node's sides alternate per micro-batch: both run.
    assert _streaming_hops(spatial(temporal(a, b), c), list("abc")) == [True, True]
    # Two pipelines one after the other: the hop between them waits for the first to end.
    tree = temporal(spatial(a, b), spatial(c, d))
    assert _streaming_hops(tree, list("abcd")) == [True, False, True]


@pytest.mark.timeout(180)
def test_a_bounded_flow_under_a_temporal_plan_does_not_wait_for_room_for_ever(cluster):
    """channel_capacity bounds the hops whose stages run at once. Under a temporal plan the
    consumer starts once its producer has ended, so that hop must take the whole batch: bounded,
    the producer waited for room (holding its devices' lock) until the iteration's time limit."""
    from loomrl.plan.plan import leaf, spatial, temporal
    from loomrl.plan.search import fixed_plan

    flow, _, prof = _flaky_chain(cluster, devices=2, batch=4, granularities=[1, 4], capacity=1)
    flow.iteration_timeout_s = 60.0
    paths = []
    try:
        for tree, ahead in (
            (temporal(leaf("a", 1), leaf("b", 1)), [0, 0]),
            (spatial(leaf("a", 1), leaf("b", 1)), [1, 0]),
        ):
            flow.plan(path := _save(fixed_plan(prof, tree, 1)))
            paths.append(path)
            assert flow.run([1, 2, 3, 4]).outputs == [3, 4, 5, 6]
            assert _hop_capacities(tree, ["a", "b"], flow.capacity) == ahead
    finally:
        flow.shutdown()
        for path in paths:
            Path(path).unlink()


class Ahead(Worker):
    """A fast producer that reports each micro-batch it starts on a progress channel."""

    def __init__(self, progress, m: int):
        super().__init__()
        self.progress, self.m = progress, m

    def step(self, items):
        self.progress.put(items[0] // self.m)
        return [x * 10 for x in items]


class Behind(Worker):
    """A slow consumer. In its micro-batch j it waits until the producer has started micro-batch
    ``j + expect`` (the furthest a hold of ``expect`` allows), then lingers and records the
    furthest micro-batch the producer has started: more than ``j + expect`` means the producer
    was not held, and less could not return (it would wait until the run's limit). With
    ``expect=None`` it only adds one (several ranks would take each other's reports)."""

    def __init__(self, progress, m: int, expect: int | None, k_total: int):
        super().__init__()
        self.progress, self.m, self.expect, self.k_total = progress, m, expect, k_total
        self.seen, self.furthest = -1, []

    def _drain(self):
        """Every report the producer made so far."""
        from loomrl.errors import ChannelTimeout

        with contextlib.suppress(ChannelTimeout):
            while True:
                self.seen = max(self.seen, self.progress.get(timeout=0))

    def step(self, items):
        import time

        if self.expect is None:
            return [x + 1 for x in items]
        j = items[0] // 10 // self.m  # the producer multiplied each item by 10
        want = min(j + self.expect, self.k_total - 1)
        while self.seen < want:
            self.seen = max(self.seen, self.progress.get(timeout=60.0))
        time.sleep(0.3)  # room for a producer that is not held to run further
        self._drain()
        self.furthest.append(self.seen)
        return [x + 1 for x in items]

    def observed(self):
        return self.furthest


@contextlib.contextmanager
def _ahead_chain(cluster, capacity: int, batch: int, m: int, consumer_ranks: int = 1):
    """A flow a -> b (Ahead -> Behind) on a spatial plan, planned; yields the flow, the consumer
    group and the profile (a: 1 ms an item, b: 1 s). With several consumer ranks, b observes
    nothing."""
    from loomrl.channel import Channel
    from loomrl.plan.plan import leaf, spatial
    from loomrl.plan.search import fixed_plan

    def spec(per_item, n):
        return {
            "valid_devices": [n],
            "time": {"alpha": 0, "per_item": {n: per_item}},
            "memory_gb": {n: 0},
        }

    prof = load_profile(
        {
            "devices": 1 + consumer_ranks,
            "device_memory_gb": 8,
            "batch": batch,
            "granularities": [m],
            "components": {"a": spec(0.001, 1), "b": spec(1.0, consumer_ranks)},
            "edges": [["a", "b"]],
        }
    )
    progress = Channel.create(f"progress-{uuid.uuid4().hex[:8]}")
    expect = capacity if consumer_ranks == 1 else None
    flow = Flow(cluster, channel_capacity=capacity, iteration_timeout_s=90.0)
    a = flow.group(Ahead, progress, m, name="a")
    b = flow.group(Behind, progress, m, expect, batch // m, name="b")
    flow.chain(a.step, b.step)
    path = _save(fixed_plan(prof, spatial(leaf("a", 1), leaf("b", consumer_ranks)), m))
    try:
        flow.plan(path)
        yield flow, b, prof
    finally:
        flow.shutdown()
        progress.delete()
        Path(path).unlink()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("capacity, m", [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_a_bounded_hop_holds_its_producer_capacity_micro_batches_ahead_as_simulated(
    cluster, capacity, m
):
    """channel_capacity=N: the producer starts micro-batch j only once its consumer has taken
    j - N. While a slow consumer works on micro-batch j the fast producer has started exactly
    j + N (or the last one), the furthest that ``simulate(channel_capacity=N)`` has it start
    before the consumer ends j. The hold is counted in micro-batches, whatever a micro-batch's
    size: items per micro-batch (m) equal to, above and below the capacity. (A bound on items
    per micro-batch key held the producer the same way only where m exceeded it: (1, 2).)"""
    from loomrl.plan.simulate import simulate

    k_total = 6
    batch = k_total * m
    with _ahead_chain(cluster, capacity, batch, m) as (flow, b, prof):
        res = flow.run(list(range(batch)))
        assert res.outputs == [x * 10 + 1 for x in range(batch)]
        observed = wait(b.group.observed())[0]
        plan = flow.plan_
    assert observed == [min(j + capacity, k_total - 1) for j in range(k_total)]
    sim = simulate(plan, prof, channel_capacity=capacity)
    starts_a = {i.micro_batch: i.start for i in sim.intervals if i.component == "a"}
    ends_b = {i.micro_batch: i.end for i in sim.intervals if i.component == "b"}
    simulated = [max(k for k, s in starts_a.items() if s < ends_b[j]) for j in range(k_total)]
    assert observed == simulated


@pytest.mark.timeout(180)
def test_a_bounded_run_gives_the_unbounded_results_with_several_consumer_ranks(cluster):
    """A producer feeding two consumer ranks waits, per micro-batch, for each rank it fed; the
    run completes with the outputs of an unbounded one, over two iterations on kept channels."""
    outputs = {}
    for capacity in (0, 1):
        with _ahead_chain(cluster, capacity, batch=8, m=2, consumer_ranks=2) as (flow, _, _):
            outputs[capacity] = [flow.run(list(range(8))).outputs for _ in range(2)]
    assert outputs[1] == outputs[0] == [[x * 10 + 1 for x in range(8)]] * 2


@pytest.mark.parametrize("value, says", BAD_CAPACITIES)
def test_a_channel_capacity_that_is_not_a_count_of_micro_batches_is_refused(cluster, value, says):
    from loomrl.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"channel_capacity={value!r}: .*{says}") as e:
        Flow(cluster, channel_capacity=value)
    assert "use an integer >= 1" in str(e.value) and "or 0 for unbounded" in str(e.value)
    assert Flow(cluster, channel_capacity=None).capacity == 0  # None: unbounded, as 0


def test_hop_channels_are_kept_while_runs_succeed_and_remade_after_a_failure(cluster):
    from loomrl.errors import RemoteError
    from loomrl.plan.plan import leaf, temporal
    from loomrl.plan.search import fixed_plan

    flow, b, prof = _flaky_chain(cluster, devices=1, batch=2, granularities=[2], fails="b")
    flow.plan(plan_path := _save(fixed_plan(prof, temporal(leaf("a", 1), leaf("b", 1)), 2)))
    try:
        assert flow.run([1, 2]).outputs == [3, 4]
        first = [ch.name for ch in flow._chans]
        assert len(first) == 2
        assert flow.run([5, 6]).outputs == [7, 8]
        assert [ch.name for ch in flow._chans] == first  # kept: no broker started per iteration
        wait(b.group.set_fail(True))
        with pytest.raises(RemoteError, match="flaky stage failed"):
            flow.run([1, 2])
        assert flow._chans == []  # a failed run may leave items inside: its channels go
        wait(b.group.set_fail(False))
        assert flow.run([1, 2]).outputs == [3, 4]
        assert len(flow._chans) == 2 and not {ch.name for ch in flow._chans} & set(first)
    finally:
        flow.shutdown()
        Path(plan_path).unlink()
    assert flow._chans == []
    with pytest.raises(RuntimeError, match=r"\['a', 'b'\] have no running workers"):
        flow.run([1, 2])


def test_pinned_plan_that_does_not_match_is_refused(cluster, demo_profile):
    from loomrl.plan.search import search

    plan = search(demo_profile, mode="temporal")
    flow = Flow(cluster)
    flow.group(Hog, 1, name="other")
    g = flow.group(Hog, 1, name="encode")
    flow.chain(g.step)
    with pytest.raises(PlanError, match="names component 'transform'"):
        flow.plan(_save(plan))
    assert all(c.group is None for c in flow.components.values())  # nothing was started
    with pytest.raises(PlanError, match="not one of"):
        flow.plan("sideways")


def test_pinned_plan_whose_memory_cannot_fit_is_refused(cluster, demo_profile):
    from dataclasses import replace

    from loomrl.plan.search import search

    have = cluster.device_memory_gb
    assert have is not None and have > 0  # a slot's share of the host memory Ray lets tasks use
    fits = search(demo_profile, mode="temporal")
    flow = Flow(cluster)
    stages = [flow.group(Hog, 1, name=n) for n in ("encode", "transform", "reduce")]
    flow.chain(*(g.step for g in stages))
    with pytest.raises(
        PlanError, match=r"peak memory is .* GB per device but a \w+ device here has"
    ):
        flow.plan(_save(replace(fits, memory_gb=have * 2)))
    assert all(c.group is None for c in flow.components.values())  # nothing was started


def test_stage_seconds_counts_overlapping_ranks_once():
    from loomrl.flow import FlowResult

    runs = [(0, 2), (1, 3), (5, 6)]
    tl = [{"kind": "run", "component": "a", "start": s, "end": e} for s, e in runs]
    tl.append({"kind": "onload", "component": "a", "start": 3, "end": 5})
    assert FlowResult([], 1.0, 1.0, tl).stage_seconds() == {"a": 4.0}


def test_offload_skipped_when_everything_fits(cluster, demo_profile):
    flow = Flow(cluster)  # offload="auto": the demo's 3 x 0.4 GB fit in 6 GB per device
    _build_light(flow)
    flow.plan("temporal", profile=demo_profile)
    try:
        res = flow.run(list(range(8)))
    finally:
        flow.shutdown()
    assert {r["kind"] for r in res.timeline} == {"run"}


def test_calibrated_plan_offloads_unless_told_never(cluster):
    # A calibrated plan never measured memory: "auto" keeps time-sharing with offloads,
    # "never" (run.offload) keeps every component resident. One flow, planned once, both ways.
    flow = Flow(cluster, offload="auto")
    _build_light(flow)
    flow.plan("temporal", profile="calibrate", batch=8)
    try:
        kinds = {}
        for offload in ("never", "auto"):  # resident first: "auto" then onloads and offloads
            flow.offload = offload
            kinds[offload] = {r["kind"] for r in flow.run(list(range(8))).timeline}
    finally:
        flow.shutdown()
    assert {"onload", "offload", "run"} <= kinds["auto"]
    assert kinds["never"] == {"run"}


def test_pinned_plan_on_devices_the_cluster_lacks_or_with_a_wrong_micro_batch_is_refused(
    cluster, demo_profile
):
    import json

    from loomrl.plan.search import search

    plan = search(demo_profile, mode="temporal")
    flow = Flow(cluster)
    stages = [flow.group(Hog, 1, name=n) for n in ("encode", "transform", "reduce")]
    flow.chain(*(g.step for g in stages))
    from pathlib import Path

    def leaf_of(node, name):
        if node.get("component") == name:
            return node
        return next((x for c in node["children"] if (x := leaf_of(c, name)) is not None), None)

    far = plan.to_dict()
    n = cluster.num_devices
    leaf_of(far["tree"], "encode").update(devices=[n, n + 1], n=2, used=2)
    path = Path(_save(plan))
    path.write_text(json.dumps(far))
    with pytest.raises(
        PlanError, match=r"places 'encode' on devices \[\d+, \d+\], but the cluster"
    ):
        flow.plan(path)
    odd = plan.to_dict() | {"micro_batch": plan.batch + 1}
    path.write_text(json.dumps(odd))
    with pytest.raises(PlanError, match="does not divide its batch"):
        flow.plan(path)
    assert all(c.group is None for c in flow.components.values())  # nothing was started


class _Miscounts(Worker):
    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def step(self, items):
        return [x + 1 for x in items]

    def sink(self, items):
        return items[:-1] if self.how == "short" else 42


@pytest.mark.parametrize("how, got", [("short", r"list of length \d+"), ("scalar", "int")])
def test_a_stage_that_miscounts_its_outputs_is_named_middle_or_sink(cluster, how, got):
    """One output per input item, from every stage: a sink returning fewer, or one value, would
    leave items of the iteration's result empty."""
    from loomrl.errors import RemoteError

    for sink_last in (True, False):
        flow = Flow(cluster)
        # One rank each (the count is checked in the stage's process, call by call, whatever
        # the ranks): two processes a flow, not one per device.
        bad = flow.group(_Miscounts, how, name="bad", valid_devices=[1])
        ok = flow.group(_Miscounts, how, name="ok", valid_devices=[1])
        flow.chain(ok.step, bad.sink) if sink_last else flow.chain(bad.sink, ok.step)
        flow.plan("temporal", profile="calibrate", batch=4)
        try:
            with pytest.raises(
                (TypeError, RemoteError), match=rf"_Miscounts.sink must return a list .*got {got}"
            ) as e:
                flow.run([1, 2, 3, 4])
            assert "failed in sink()" in str(e.value)  # the stage's method, not the runner's
        finally:
            flow.shutdown()


def test_a_calibrated_plan_names_a_component_no_device_count_fits(cluster):
    flow = Flow(cluster)
    g = flow.group(Hog, 1, name="wide", valid_devices=[cluster.num_devices * 2])
    flow.chain(g.step)
    with pytest.raises(PlanError, match=r"component 'wide': valid_devices=\[\d+\] has no count"):
        flow.plan("temporal", profile="calibrate", batch=4)


def test_a_profile_of_another_workflow_is_refused_naming_what_it_lacks(cluster, demo_profile):
    flow = Flow(cluster)
    g = flow.group(Hog, 1, name="critic")
    flow.chain(g.step)
    with pytest.raises(PlanError, match=r"no costs for component\(s\) \['critic'\]"):
        flow.plan("auto", profile=demo_profile)
    assert all(c.group is None for c in flow.components.values())  # nothing was started


def test_a_profile_for_more_devices_than_the_cluster_plans_on_the_cluster(cluster, demo_profile):
    # A profile measured on a bigger machine still holds each component's costs per count: the
    # plan uses this cluster's devices, not ids it does not have.
    flow = Flow(cluster, offload="always")
    _build_light(flow)
    try:
        plan = flow.plan("auto", profile=demo_profile.with_devices(2 * cluster.num_devices))
        assert not plan.device_problems(cluster.num_devices)
        assert flow.profile_.devices == cluster.num_devices
        assert flow.run(list(range(8)))
    finally:
        flow.shutdown()
