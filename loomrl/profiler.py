"""Automatic profiling: measure each component of a flow on the real workers, fit a profile.

For every stage of the chain, in data-flow order, the profiler starts the component's workers on
the smallest and largest device counts it may use, times a warm-up call and calls on two item
counts (one item per device, and up to half the sample but at most a few items per device, so
that profiling does not grow with the batch), times one offload + onload (the switch a time-shared stage pays), and reads peak memory
(CUDA peak on GPU, RSS on CPU). The outputs of one stage are the inputs of the next, so every stage
sees real data. ``loomrl.plan.profile.fit_profile`` turns the samples into the planner's profile;
the fit's error and the profiling time are reported beside it.

Times are wall-clock seconds seen by the driver, so they include what a real iteration pays
(dispatch, transfers). This module never imports torch.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
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


def measure(flow: Flow, sample: list[Any], repeats: int = 1) -> ProfileRun:
    cluster = flow.cluster
    n_max = cluster.num_devices
    samples: list[tuple[str, int, float, float, float]] = []
    switch: dict[str, float] = {}
    t_start = time.perf_counter()
    items = list(sample)
    for stage in flow.stages:
        comp = stage.component
        next_items: list[Any] | None = None
        for n in _device_counts(comp.valid_devices, n_max):
            group = cluster.launch(
                comp.cls,
                comp.workers(n),
                *comp.args,
                devices=list(range(n)),
                name=f"profile:{comp.name}",
                num_cpus=comp.num_cpus,
                **comp.kwargs,
            )
            try:
                # The large call takes half the sample, up to a few items per device: per-item
                # costs vary (long tails) and a handful would misjudge their mean, but the cost
                # of profiling must not grow with the batch (the run refreshes the profile from
                # its own iterations when they disagree).
                small = min(n, len(items))
                few = min(len(items) // 2, FEW_PER_DEVICE * n)
                large = min(len(items), max(2 * n, small + 1, few))
                _timed_call(group, stage.name, items[:small])  # warm-up: first-call costs
                for x in sorted({small, large}):
                    for _ in range(repeats):
                        wall, outs = _timed_call(group, stage.name, items[:x])
                        mem = wait(group._call("_loom_memory"))
                        peak = max(m.get("cuda_peak_gb", m["peak_rss_gb"]) for m in mem)
                        samples.append((comp.name, n, float(x), wall, peak))
                        if next_items is None or len(outs) > len(next_items):
                            next_items = outs
                if comp.name not in switch:
                    switch[comp.name] = max(wait(group.on(0)._call("_loom_switch")))
            finally:
                group.kill()
        items = next_items or items
    return ProfileRun(samples, switch, time.perf_counter() - t_start)


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
    prof_seconds = run.seconds
    log.info("profiled %d component(s) in %.1fs", len(flow.stages), prof_seconds)
    flow.profile_run = run
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
