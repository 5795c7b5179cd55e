"""Automatic profiling: measure each component of a flow on the real workers, fit a profile.

For every stage of the chain, in data-flow order, the profiler starts the component's workers on
the largest device count it may use (the run's own workers: a plan that keeps them there runs on
them, already warm), times a warm-up call, then calls on two item counts (one item per device,
and up to half the sample but at most a few items per device, so that profiling does not grow
with the batch) on all those devices and on one of them, times one offload + onload (the switch
a time-shared stage pays), and reads peak memory (CUDA peak on GPU, RSS on CPU). The one-device
share is a single rank of a data-parallel group, or, for a single-process CPU worker, the same
process limited to one thread; a single-process GPU worker, or ranks that shard a model
together, start again on one device. The outputs of one stage are the inputs of the next, so
every stage sees real data.

Profiling calls change worker state (an actor trains): a class with ``save_state`` /
``load_state`` is snapshotted before the calls and restored after, a class that declares
``stateless = True`` needs nothing, and any other class is not reused (its profiling workers
stop; the run starts fresh ones). ``loomrl.plan.profile.fit_profile`` turns the samples into the
planner's profile; the fit's error and where the profiling time went are reported beside it.

Times are wall-clock seconds seen by the driver, so they include what a real iteration pays
(dispatch, transfers). This module never imports torch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrl.worker import Handle, wait

if TYPE_CHECKING:
    from loomrl.flow import Flow

log = logging.getLogger(__name__)

# Items per device of the profiler's large call, at most (and at most half the sample).
FEW_PER_DEVICE = 4


@dataclass
class ProfileRun:
    samples: list[tuple[str, int, float, float, float]]
    switch_s: dict[str, float]
    seconds: float
    # Where the time went: starting workers, their first (warm-up) calls, the timed calls, and
    # snapshots/restores/switch timing. Start + warm-up of reused workers is paid by any run.
    split_s: dict[str, float] = field(default_factory=dict)
    reused: dict[str, list[int]] = field(default_factory=dict)  # component -> devices kept

    def describe(self) -> str:
        """'starting workers 1.2s, warm-up 0.8s, timed calls 0.5s, state 0.1s, ...'."""
        return ", ".join(f"{_SPLIT_NAMES.get(k, k)} {v:.1f}s" for k, v in self.split_s.items())


_SPLIT_NAMES = {
    "launch": "starting workers",
    "warmup": "warm-up",
    "calls": "timed calls",
    "chain": "completing inputs of the next stage",
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


def _timed_call(group: Any, method: str, items: list[Any]) -> tuple[float, list[Any]]:
    """Split ``items`` contiguously over the ranks, run them at once, return (wall s, outputs)."""
    n = group.world_size
    q, rem = divmod(len(items), n)
    bounds = [r * q + min(r, rem) for r in range(n + 1)]
    t = time.perf_counter()
    refs = [
        a._loom_call.remote(method, items[bounds[r] : bounds[r + 1]])
        for r, a in enumerate(group.actors)
    ]
    res = wait(Handle(group, method, list(range(n)), refs))
    wall = time.perf_counter() - t
    outs: list[Any] = []
    for _, o in res:
        outs.extend(o if isinstance(o, list) else [o])
    return wall, outs


def call_sizes(n: int, available: int) -> tuple[int, int]:
    """(small, large) item counts of the timed calls on ``n`` devices.

    small: one item per device. large: half the sample, but at most FEW_PER_DEVICE items per
    device and at least two per device (and small+1): per-item costs vary (long tails) and a
    handful would misjudge their mean, but the calls must not grow with the batch (the run
    refreshes the profile from its own iterations when they disagree).
    """
    small = min(n, available)
    few = min(available // 2, FEW_PER_DEVICE * n)
    return small, min(available, max(2 * n, small + 1, few))


def _reusable(cls: type) -> str:
    """'snapshot' (save_state/load_state), 'stateless' (declared), or '' (start fresh for the run)."""
    if callable(getattr(cls, "save_state", None)) and callable(getattr(cls, "load_state", None)):
        return "snapshot"
    return "stateless" if getattr(cls, "stateless", False) else ""


def measure(flow: Flow, sample: list[Any], repeats: int = 1, reuse: bool = True) -> ProfileRun:
    cluster = flow.cluster
    n_max = cluster.num_devices
    samples: list[tuple[str, int, float, float, float]] = []
    switch: dict[str, float] = {}
    split = {"launch": 0.0, "warmup": 0.0, "calls": 0.0, "state": 0.0}
    reused: dict[str, list[int]] = {}
    t_start = time.perf_counter()
    items = list(sample)

    def launch(comp: Any, n: int) -> Any:
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
        split["launch"] += time.perf_counter() - t
        return g

    def warm(group: Any, method: str) -> None:
        t = time.perf_counter()
        _timed_call(group, method, items[: min(group.world_size, len(items))])
        split["warmup"] += time.perf_counter() - t

    for stage in flow.stages:
        comp = stage.component
        outputs: dict[int, Any] = {}
        counts = _device_counts(comp.valid_devices, n_max)
        if not counts:
            continue
        top = max(counts)
        mode = _reusable(comp.cls) if reuse else ""
        group = launch(comp, top)
        state = None
        try:
            if mode == "snapshot":  # before any call: the warm-up changes state too
                t = time.perf_counter()
                state = wait(group._call("save_state"))  # every rank its own
                split["state"] += time.perf_counter() - t
            warm(group, stage.name)
            on_cuda = any("cuda_peak_gb" in m for m in wait(group._call("_loom_memory")))
            # All devices first: the one-device calls take more items per rank, and peak RSS
            # only grows, so each device count's peak is read after its own calls.
            for n in sorted(counts, reverse=True):
                extra = None
                threads = None
                if n == top:
                    target = group
                elif not comp.single_process:
                    target = group.on(0)  # one rank of a data-parallel group: one device's share
                elif not on_cuda:
                    target = group
                    threads = wait(group._call("_loom_threads", n))[0]
                else:  # one GPU process, or GPU ranks that shard a model (collectives together)
                    target = extra = launch(comp, n)
                    warm(extra, stage.name)
                try:
                    small, large = call_sizes(n, len(items))
                    t_calls = time.perf_counter()
                    for x in sorted({small, large}):
                        for _ in range(repeats):
                            # The same first items at every size and device count: their
                            # costs differ (long tails), and comparing calls on different items
                            # would read that difference as scaling.
                            wall, outs = _timed_call(target, stage.name, items[:x])
                            mem = wait(target._call("_loom_memory"))
                            peak = max(m.get("cuda_peak_gb", m["peak_rss_gb"]) for m in mem)
                            samples.append((comp.name, n, float(x), wall, peak))
                            if len(outs) == x:  # a stage may merge items: keep one per item
                                outputs.update(enumerate(outs))
                    split["calls"] += time.perf_counter() - t_calls
                finally:
                    if threads is not None:
                        wait(group._call("_loom_threads", threads))
                    if extra is not None:
                        extra.kill()
            missing = [i for i in range(len(items)) if i not in outputs]
            if outputs and missing:
                # Untimed: the next stage needs the whole sample (its calls take up to half of
                # it), not just the items this stage's calls happened to cover.
                t = time.perf_counter()
                _, outs = _timed_call(group, stage.name, [items[i] for i in missing])
                if len(outs) == len(missing):
                    outputs.update(zip(missing, outs, strict=True))
                split["chain"] = split.get("chain", 0.0) + time.perf_counter() - t
            t = time.perf_counter()
            # Median of three: a single offload + onload swings with page faults and the allocator.
            sw = sorted(max(wait(group.on(0)._call("_loom_switch"))) for _ in range(3))
            switch[comp.name] = sw[1]
            if state is not None:
                wait(*[group.on(r)._call("load_state", st) for r, st in enumerate(state)])
            split["state"] += time.perf_counter() - t
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
        items = [outputs[i] for i in sorted(outputs)] or items
    return ProfileRun(samples, switch, time.perf_counter() - t_start, split, reused)


def profile_flow(
    flow: Flow,
    sample: list[Any],
    micro_batch: int | None = None,
    memory_gb: float | None = None,
    repeats: int = 1,
) -> Any:
    """Measure, fit and return a WorkloadProfile for ``flow``'s chain on ``len(sample)`` items."""
    from loomrl.plan.profile import fit_profile

    run = measure(flow, sample, repeats=repeats)
    M = len(sample)
    n_max = flow.cluster.num_devices
    gran = [micro_batch] if micro_batch else [d for d in range(1, M + 1) if M % d == 0]
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
    )
    log.info(
        "profiled %d component(s) in %.1fs (%s)", len(flow.stages), run.seconds, run.describe()
    )
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
