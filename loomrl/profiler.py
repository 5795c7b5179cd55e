"""Automatic profiling: measure each component of a flow on the real workers, fit a profile.

For every stage of the chain, in data-flow order, the profiler starts the component's workers on
the largest device count it may use (the run's own workers: a plan that keeps them there runs on
them, already warm), times a warm-up call, then two calls on all those devices: one item per
device, then a few items per device, as many as the budget allows (default: the timed calls may
cost 10% of what the component's share of one iteration is estimated to cost from the first
call, but at least two items per device, so that the fixed cost per call can be told from the
cost per item). Each rank of a data-parallel group times its own share, which is a one-device
sample for free; a single-process CPU worker is timed with one thread, and a single-process GPU
worker, or ranks that shard a model together, start again on one device. One offload + onload
is timed (the switch a time-shared stage pays) and peak memory is read (CUDA peak on GPU, RSS on
CPU). The outputs of one stage are the inputs of the next, so every stage sees real data.

Profiling calls change worker state (an actor trains): a class with ``save_state`` /
``load_state`` is snapshotted in the worker before the calls and restored after, a class that
declares ``stateless = True`` needs nothing, and any other class is not reused (its profiling
workers stop; the run starts fresh ones). ``loomrl.plan.profile.fit_profile`` turns the samples
into the planner's profile; the fit's error and where the profiling time went are reported
beside it, with the overhead (what the run does not reuse) as a share of the chosen plan's
predicted iteration.

Times are wall-clock seconds seen by the driver, so they include what a real iteration pays
(dispatch, transfers). This module never imports torch.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from loomrl.errors import PlanError
from loomrl.worker import Handle, wait

if TYPE_CHECKING:
    from collections.abc import Callable

    from loomrl.flow import Flow
    from loomrl.plan.profile import Sample

log = logging.getLogger(__name__)

# Items per device of the profiler's second call, at most.
FEW_PER_DEVICE = 4
# The timed calls of a component may cost this share of its estimated part of one iteration.
DEFAULT_BUDGET = 0.10


@dataclass
class ProfileRun:
    samples: list[Sample]
    switch_s: dict[str, float]
    seconds: float
    # Where the time went: starting workers, their first (warm-up) calls, the timed calls,
    # snapshots/restores/switch timing, completing the next stage's inputs, and workers the run
    # does not keep. Start + warm-up of kept workers is paid by any run.
    split_s: dict[str, float] = field(default_factory=dict)
    reused: dict[str, list[int]] = field(default_factory=dict)  # component -> devices kept
    budget: float = DEFAULT_BUDGET
    start_s: dict[str, list[float]] = field(default_factory=dict)  # [launch, warm-up] s
    # Long tails of data-parallel components: spread of one item's cost over its mean.
    item_cv: dict[str, float] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)  # distinct items timed per component

    def prediction_se(self, profile: Any, plan: Any) -> float:
        """Relative standard error of ``plan``'s predicted iteration from the items sampled
        (``sampling_se``); 0 when no component's items were seen to vary."""
        return sampling_se(profile, plan, self.item_cv, self.items)

    def keep(self, assignment: dict[str, list[int]]) -> None:
        """The plan keeps a profiled group only where it places the component on the same
        devices; the others' start and warm-up count as profiling overhead."""
        for name in list(self.reused):
            if assignment.get(name) != self.reused[name]:
                del self.reused[name]
                if name in self.start_s:
                    _discard(self.split_s, self.start_s.pop(name))

    @property
    def overhead_s(self) -> float:
        """Seconds a run that did not profile would not have spent (its own workers still start
        and take their first call): timed calls, state, inputs of the next stage, workers
        thrown away."""
        return sum(v for k, v in self.split_s.items() if k not in ("launch", "warmup"))

    def describe(self, iteration_s: float | None = None, prediction_se: float = 0.0) -> str:
        """'starting workers 1.2s, warm-up 0.8s, timed calls 0.5s, ...; overhead 0.6s = 5% of
        one iteration (0.60 / 12.0s predicted)[; prediction +-16% (1 s.e.) ...]'."""
        # a part that took no time comes out a hair below 0 (a difference of clock readings)
        text = ", ".join(
            f"{_SPLIT_NAMES.get(k, k)} {max(v, 0.0):.1f}s" for k, v in self.split_s.items()
        )
        if iteration_s:
            text += (
                f"; overhead {self.overhead_s:.1f}s = {100 * self.overhead_s / iteration_s:.0f}%"
                f" of one iteration ({iteration_s:.2f}s predicted; budget"
                f" {100 * self.budget:.0f}% per component)"
            )
        if prediction_se >= 0.02:
            varied = ", ".join(
                f"{c} {self.items.get(c, 0)} items, cv {cv:.2f}"
                for c, cv in self.item_cv.items()
                if cv > 0
            )
            text += (
                f"; prediction +-{100 * prediction_se:.0f}% (1 s.e.) from the items sampled"
                f" ({varied}): item costs vary, and the first iterations will tell"
            )
        return text

    def summary(
        self, iteration_s: float | None, prediction_se: float | None = None
    ) -> dict[str, Any]:
        """The profiling record of ``run_summary.json``."""
        return {
            "prediction_se": prediction_se,
            "items": dict(self.items),
            "item_cv": dict(self.item_cv),
            "seconds": self.seconds,
            "overhead_s": self.overhead_s,
            "overhead_fraction": self.overhead_s / iteration_s if iteration_s else None,
            "budget": self.budget,
            "split_s": dict(self.split_s),
            "samples": len(self.samples),
        }


_SPLIT_NAMES = {
    "launch": "starting workers",
    "warmup": "warm-up",
    "calls": "timed calls",
    "chain": "completing inputs of the next stage",
    "discarded": "workers not kept",
}


def _device_counts(valid: list[int] | None, n_max: int) -> list[int]:
    if valid:
        ok = [n for n in valid if n <= n_max]
        return sorted({min(ok), max(ok)}) if ok else []
    return sorted({1, n_max})


def _valid(valid: list[int] | None, n_max: int) -> list[int]:
    if valid:
        return [n for n in valid if n <= n_max]
    return list(range(1, n_max + 1))


@dataclass
class _Call:
    wall: float
    outputs: list[Any]
    rank_s: list[float]  # each rank's own time in the method
    rank_items: list[int]  # items each rank got
    peaks: list[float]  # each rank's peak memory after the call (GB)


def _timed_call(group: Any, method: str, items: list[Any]) -> _Call:
    """Deal ``items`` to the ranks in turn (rank r gets items r, r + n, ...), run them at once,
    time the whole and each rank; outputs come back in item order.

    Dealt, not cut in blocks: a rank's share on x items then holds its share on fewer, so two
    calls of one rank differ by the items added, not by different items (long tails).
    """
    n = group.world_size
    shares = [items[r::n] for r in range(n)]
    t = time.perf_counter()
    refs = [a._loom_call.remote(method, shares[r]) for r, a in enumerate(group.actors)]
    res = wait(Handle(group, method, list(range(n)), refs))
    wall = time.perf_counter() - t
    per_rank = [o if isinstance(o, list) else [o] for _, o in res]
    outs: list[Any] = []
    if all(len(o) == len(sh) for o, sh in zip(per_rank, shares, strict=True)):
        for j in range(len(items)):
            outs.append(per_rank[j % n][j // n])
    else:  # a merging stage: one output per rank, or any number
        for o in per_rank:
            outs.extend(o)
    mem = wait(group._call("_loom_memory"))
    return _Call(
        wall,
        outs,
        [float(s) for s, _ in res],
        [len(sh) for sh in shares],
        [m.get("cuda_peak_gb", m["peak_rss_gb"]) for m in mem],
    )


@dataclass
class _Recorder:
    """The samples of one profiling, and each data-parallel call's per-rank times."""

    component: str = ""
    repeats: int = 1
    samples: list[Sample] = field(default_factory=list)
    spread: dict[str, list[tuple[list[float], list[int]]]] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)  # distinct items timed per component

    def timed(
        self,
        target: Any,
        method: str,
        items: list[Any],
        n: int,
        lo: int,
        hi: int,
        ranks_too: bool,
        outputs: dict[int, Any],
    ) -> float:
        """Time ``target`` on ``items[lo:hi]``, record the samples (and, ``ranks_too``, each
        rank's share as a one-device sample), keep the outputs; the best wall s."""
        name, walls, x = self.component, [], hi - lo
        self.items[name] = max(self.items.get(name, 0), hi)
        for _ in range(self.repeats):
            # The same first items at every size and device count: their costs differ (long
            # tails), and calls on different items would read that difference as scaling.
            c = _timed_call(target, method, items[lo:hi])
            walls.append(c.wall)
            wall = c.wall
            if ranks_too:
                dispatch = max(c.wall - max(c.rank_s), 0.0)
                # A run's call gives each rank many items, whose sums vary far less than those of
                # a profiling call's few: the slowest rank of a few-item call would read that
                # variation (long tails) as cost. The ranks' mean; item_cv models the rest.
                busy = [s for s, k in zip(c.rank_s, c.rank_items, strict=True) if k]
                wall = sum(busy) / len(busy) + dispatch
            self.samples.append((name, n, float(x), wall, max(c.peaks)))
            if ranks_too:
                self.spread.setdefault(name, []).append((c.rank_s, c.rank_items))
                for s, k, pk in zip(c.rank_s, c.rank_items, c.peaks, strict=True):
                    if k:
                        self.samples.append((name, 1, float(k), s + dispatch, pk))
            if len(c.outputs) == x:  # a stage may merge items: keep one per item
                outputs.update(zip(range(lo, hi), c.outputs, strict=True))
        return min(walls)


def second_call_items(n: int, available: int, per_item_s: float, budget_s: float) -> int:
    """Items of the second timed call on ``n`` devices (the first has one item per device).

    At least two items per device (a second size separates the fixed cost of a call from the
    cost per item; items vary, so more of them give a better mean), at most FEW_PER_DEVICE, and
    no more than the budget left affords at ``per_item_s`` per item and device. Fewer than two
    items per device available: the whole sample.
    """
    most = min(FEW_PER_DEVICE, available // max(n, 1))
    if most < 2:
        return available
    afford = int(budget_s / per_item_s) if per_item_s > 0 else most
    return n * max(2, min(most, afford))


def item_cv(calls: list[tuple[list[float], list[int]]]) -> float:
    """Spread of one item's cost relative to its mean, from calls' per-rank (seconds, items).

    A rank's time on ``k`` items varies across ranks like a sum of ``k`` item costs (variance
    ``k * sigma^2``); calls where the busy ranks got the same count are pooled (degrees of
    freedom weighted) and divided by the mean cost per item. 0 when nothing varies or fewer than
    two ranks ever worked at once.
    """
    num = den = total_s = total_items = 0.0
    for secs, items in calls:
        busy = [(s, k) for s, k in zip(secs, items, strict=True) if k]
        if len(busy) < 2 or len({k for _, k in busy}) != 1:
            continue
        k = busy[0][1]
        ts = [s for s, _ in busy]
        mean = sum(ts) / len(ts)
        num += sum((t - mean) ** 2 for t in ts) / k  # (R - 1) * sample variance / k
        den += len(ts) - 1
        total_s += sum(ts)
        total_items += k * len(ts)
    if not den or not total_s:
        return 0.0
    return (num / den) ** 0.5 / (total_s / total_items)


def sampling_se(profile: Any, plan: Any, item_cv: dict[str, float], items: dict[str, int]) -> float:
    """Relative standard error of ``plan``'s predicted iteration time that comes from profiling
    only a few of the items.

    A component's cost per item is the mean over the ``items[c]`` items it was timed on, whose
    costs spread by ``item_cv[c]`` (long tails): that mean is off by about ``cv / sqrt(n)``
    (one standard error). Each component's cost per item is moved by its error through the
    planner's own cost model (the plan's tree and micro-batch kept), and the moves of the
    components add in quadrature. Pure; the planner is imported here, not at module import.
    """
    from loomrl.plan.search import fixed_plan

    base = fixed_plan(profile, plan.tree, plan.micro_batch).predicted_s
    if not base:
        return 0.0
    var = 0.0
    for name, cv in item_cv.items():
        n = items.get(name, 0)
        comp = profile.components.get(name)
        if cv <= 0 or n < 1 or comp is None:
            continue
        f = 1.0 + cv / math.sqrt(n)
        moved = replace(comp, per_item={d: v * f for d, v in comp.per_item.items()})
        comps = {**profile.components, name: moved}
        try:
            t = fixed_plan(replace(profile, components=comps), plan.tree, plan.micro_batch)
        except PlanError:
            continue
        var += (t.predicted_s - base) ** 2
    return math.sqrt(var) / base


def _reusable(cls: type) -> str:
    """'snapshot' (save_state/load_state), 'stateless' (declared), or '' (start fresh for the run)."""
    if callable(getattr(cls, "save_state", None)) and callable(getattr(cls, "load_state", None)):
        return "snapshot"
    return "stateless" if getattr(cls, "stateless", False) else ""


def measure(
    flow: Flow,
    sample: list[Any],
    repeats: int = 1,
    reuse: bool = True,
    budget: float = DEFAULT_BUDGET,
    notify: Callable[[str], None] | None = None,
) -> ProfileRun:
    """Time each stage's component on its device counts; ``notify`` hears a line per component
    (profiling starts workers and runs first calls, which can compile: minutes on a GPU)."""
    cluster = flow.cluster
    n_max = cluster.num_devices
    rec = _Recorder(repeats=repeats)
    switch: dict[str, float] = {}
    split = {"launch": 0.0, "warmup": 0.0, "calls": 0.0, "state": 0.0}
    reused: dict[str, list[int]] = {}
    start_s: dict[str, list[float]] = {}  # component -> [launch s, warm-up s] of its group
    t_start = time.perf_counter()
    M = len(sample)
    items = list(sample)

    def add(key: str, t: float) -> None:
        split[key] = split.get(key, 0.0) + time.perf_counter() - t

    def launch(comp: Any, n: int, key: str = "launch") -> Any:
        t = time.perf_counter()
        g = cluster.launch(
            comp.cls,
            comp.workers(n, cluster.has_cuda),
            *comp.args,
            devices=list(range(n)),
            name=comp.name,
            num_cpus=comp.num_cpus,
            **comp.kwargs,
        )
        wait(g._call("_loom_ping"))
        add(key, t)
        if key == "launch":
            start_s[comp.name] = [time.perf_counter() - t, 0.0]
        return g

    def warm(group: Any, method: str, key: str = "warmup") -> None:
        t = time.perf_counter()
        _timed_call(group, method, items[: min(group.world_size, len(items))])
        add(key, t)
        if key == "warmup":
            start_s[group.name][1] = time.perf_counter() - t

    for i, stage in enumerate(flow.stages):
        comp = stage.component
        rec.component = comp.name
        outputs: dict[int, Any] = {}
        counts = _device_counts(comp.valid_devices, n_max)
        if not counts:
            continue
        top = max(counts)
        if notify:
            notify(
                f"profiling {comp.name} ({i + 1}/{len(flow.stages)}) on {counts} device(s), "
                f"{time.perf_counter() - t_start:.0f}s so far"
            )
        mode = _reusable(comp.cls) if reuse else ""
        group = launch(comp, top)
        saved = False
        try:
            if mode == "snapshot":  # before any call: the warm-up changes state too
                t = time.perf_counter()
                wait(group._call("_loom_snapshot"))  # every rank its own, kept in the worker
                saved = True
                add("state", t)
            warm(group, stage.name)
            on_cuda = any("cuda_peak_gb" in m for m in wait(group._call("_loom_memory")))
            # One rank per device, each on its own items: a rank's time is a one-device sample.
            per_rank = (
                not comp.single_process
                and group.world_size == top
                and top > 1
                and 1 in _valid(comp.valid_devices, n_max)
            )

            t_calls = time.perf_counter()
            x1 = min(top, len(items))
            first = rec.timed(group, stage.name, items, top, 0, x1, per_rank, outputs)
            # The component's share of one iteration on all its devices, from the first call
            # (one item per device): the budget of its timed calls is a fraction of it.
            allowed = budget * first * max(M / max(x1, 1), 1.0)
            separate = [n for n in counts if n < top and not (n == 1 and per_rank)]
            # Each separate device count takes two calls too (about 1 + 2 first-call times).
            left = allowed - first * (1 + 3 * len(separate))
            # The added items are timed twice (alone, then with the first): two item-times each.
            x2 = second_call_items(top, len(items), 2 * first, left)
            if x2 > x1:
                # The added items alone, then all together: two calls that split a set of items
                # and one call on all of them differ by one fixed cost per call exactly, whatever
                # the items cost; otherwise a long tail among few items reads as fixed cost.
                # Items are dealt to ranks, so each rank's shares split the same way.
                rec.timed(group, stage.name, items, top, x1, x2, per_rank, outputs)
                rec.timed(group, stage.name, items, top, 0, x2, per_rank, outputs)
            add("calls", t_calls)
            for n in separate:
                extra = threads = None
                if not comp.single_process:
                    target = group.on(list(range(n)))  # n ranks of a data-parallel group
                elif not on_cuda:
                    target = group
                    threads = wait(group._call("_loom_threads", n))[0]
                else:  # one GPU process, or GPU ranks that shard a model (collectives together)
                    target = extra = launch(comp, n, key="discarded")
                    warm(extra, stage.name, key="discarded")
                try:
                    t = time.perf_counter()
                    # Two sizes here as well: a fixed cost per call that depends on the device
                    # count (an optimizer step on fewer threads) would otherwise be read as
                    # cost per item.
                    y1 = min(n, len(items))
                    one = rec.timed(target, stage.name, items, n, 0, y1, False, outputs)
                    y2 = second_call_items(n, len(items), one, left)
                    if y2 > y1:
                        rec.timed(target, stage.name, items, n, 0, y2, False, outputs)
                    add("calls", t)
                finally:
                    if threads is not None:
                        wait(group._call("_loom_threads", threads))
                    if extra is not None:
                        extra.kill()
            covered = 0
            while covered in outputs:
                covered += 1
            if outputs and i + 1 < len(flow.stages):
                nxt = flow.stages[i + 1].component
                top_next = max(_device_counts(nxt.valid_devices, n_max) or [1])
                # Two items per device: the next stage's smallest second call.
                need = min(len(items), 2 * top_next)
                if covered < need:
                    # Untimed: the next stage's calls need this many of its inputs.
                    t = time.perf_counter()
                    c = _timed_call(group, stage.name, items[covered:need])
                    if len(c.outputs) == need - covered:
                        outputs.update(zip(range(covered, need), c.outputs, strict=True))
                        covered = need
                    add("chain", t)
            t = time.perf_counter()
            # Median of three: a single offload + onload swings with page faults and the allocator.
            switch[comp.name] = wait(group.on(0)._call("_loom_switch", 3))[0]
            if saved:
                wait(group._call("_loom_restore"))
            add("state", t)
        except BaseException:
            group.kill()
            raise
        if mode:
            if comp.group is not None:
                comp.group.kill()
            comp.group = group
            reused[comp.name] = list(range(top))
        else:
            group.kill()
            _discard(split, start_s.pop(comp.name))
        items = [outputs[j] for j in range(covered)] or items
    return ProfileRun(
        rec.samples,
        switch,
        time.perf_counter() - t_start,
        split,
        reused,
        budget,
        start_s,
        {name: item_cv(calls) for name, calls in rec.spread.items()},
        dict(rec.items),
    )


def _discard(split: dict[str, float], start: list[float]) -> None:
    """A profiled group the run does not keep: its start and warm-up were profiling overhead."""
    launch, warmup = start
    split["launch"] -= launch
    split["warmup"] -= warmup
    split["discarded"] = split.get("discarded", 0.0) + launch + warmup


def profile_flow(
    flow: Flow,
    sample: list[Any],
    micro_batch: int | None = None,
    memory_gb: float | None = None,
    repeats: int = 1,
    budget: float = DEFAULT_BUDGET,
    notify: Callable[[str], None] | None = None,
) -> Any:
    """Measure, fit and return a WorkloadProfile for ``flow``'s chain on ``len(sample)`` items.

    ``budget``: the timed calls of each component may cost this share of its estimated part of
    one iteration (at least two calls on all its devices are made whatever the budget).
    ``notify``: told, one line per component, where profiling is.
    """
    from loomrl.plan.profile import divisors, fit_profile

    M = len(sample)
    if micro_batch and M % micro_batch:
        # before the minutes of measuring; the fit would refuse it as a "granularity" then
        raise PlanError(
            f"micro_batch={micro_batch} does not divide the {M} items profiled (every "
            f"micro-batch holds as many); use one of {divisors(M)}, or none to let the planner "
            "choose"
        )
    run = measure(flow, sample, repeats=repeats, budget=budget, notify=notify)
    n_max = flow.cluster.num_devices
    gran = [micro_batch] if micro_batch else divisors(M)
    prof = fit_profile(
        run.samples,
        devices=n_max,
        device_memory_gb=memory_gb or _device_memory_gb(flow.cluster),
        batch=M,
        granularities=gran,
        edges=flow.edges,
        valid_devices={
            s.component.name: _valid(s.component.valid_devices, n_max) for s in flow.stages
        },
        switch_s=run.switch_s,
        item_cv=run.item_cv,
    )
    log.info("profiled %d component(s) in %.1fs", len(flow.stages), run.seconds)
    flow.profile_run = run
    flow.adopt_profiled(run.reused)
    return prof


def _device_memory_gb(cluster: Any) -> float:
    """Per-device memory: the GPU's when devices are real GPUs, else the node's RAM per device."""
    import os

    try:
        import sys

        torch = sys.modules.get("torch")
        if cluster.device_kind == "gpu" and torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 2**30
    except Exception:
        pass
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        ram = 16.0
    per_node = max(1, len(cluster.nodes[0].devices)) if cluster.nodes else 1
    return ram / per_node
