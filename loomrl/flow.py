"""M2Flow: one logical workflow, executed under whatever plan the planner picks.

A recipe declares its components with ``flow.group(WorkerClass, ...)`` and the data flow with
``flow.chain(a.method, b.method, ...)``; ``flow.plan(placement)`` profiles the components (when the
placement is ``auto`` or a mode), searches, and launches every group on the devices the plan gives
it; ``flow.run(items)`` executes one iteration. The recipe never says who shares which devices, how
big a micro-batch is, or when a worker onloads: the plan does.

How a plan tree executes (PLANNER.md's cost algebra, made real):
- ``temporal`` in phase context: the first side processes the whole batch, then the second. Leaves
  under it are time-shared: each holds the device lock for its devices and runs
  ``onload -> work -> offload``.
- ``spatial``: both sides run at once on disjoint devices; micro-batches of the plan's size stream
  from one to the other through a channel (the consumer starts on the first micro-batch).
- ``temporal`` in stream context (below a spatial node): both sides stay resident and alternate per
  micro-batch under the device lock.

Stage methods take a list of items and return a list of the same length (map semantics); the last
stage of a chain is a sink whose return values are collected. Items travel between workers through
channels (worker to worker, never through the driver); each carries its position in the batch so
that every micro-batch has the same composition whatever the plan (placement invariance).

This module never imports torch.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.errors import ConfigError, PlanError
from loomrl.worker import (
    Handle,
    Worker,
    WorkerGroup,
    check_worker_class,
    did_you_mean,
    public_methods,
    wait,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from loomrl.cluster import Cluster
    from loomrl.plan.plan import Node, Plan

PLACEMENTS = ("auto", "temporal", "spatial", "hybrid")
log = logging.getLogger(__name__)

# Warm iterations that refresh the prediction of a plan searched on a freshly measured profile.
REFRESH_ITERATIONS = 3
# iteration_timeout_s="auto": an iteration may take this many times the longer of its plan's
# prediction and the slowest one so far, and never less than the floor.
AUTO_TIMEOUT_FACTOR = 10.0
AUTO_TIMEOUT_FLOOR_S = 1800.0


# ---------------------------------------------------------------------------------------------
# The stage loop: runs inside worker processes.
# ---------------------------------------------------------------------------------------------
def _rank_counts(m: int, n: int) -> list[int]:
    """Items of one micro-batch of ``m`` that each of ``n`` ranks receives (contiguous split)."""
    return [sum(1 for j in range(m) if j * n // m == r) for r in range(n)]


def _route(index: int, m: int, n: int) -> tuple[int, int]:
    """(consumer rank, micro-batch) of item ``index`` for a consumer with ``n`` ranks and size ``m``."""
    return ((index % m) * n) // m, index // m


@dataclass
class StageSpec:
    """Everything one worker needs to run its part of a stage for one iteration (picklable)."""

    component: str
    method: str
    in_channel: Any  # Channel
    out_channel: Any | None  # None for the sink
    batch: int  # M
    micro: int  # items per micro-batch for this stage (M in phase context)
    world: int  # ranks of this stage
    next_micro: int = 0  # consumer's micro-batch size (for routing outputs)
    next_world: int = 1
    # Micro-batches this stage may run ahead of its consumer (0: unbounded): see Flow.
    ahead: int = 0
    time_shared: bool = False  # onload -> work -> offload under the device lock
    lock_each: bool = False  # co-resident: lock per micro-batch, no offload
    t0: float = 0.0


def run_stage(worker: Worker, spec: StageSpec) -> dict[str, Any]:
    """The micro-flow loop of one rank: pull micro-batches, call the method, push results."""
    from loomrl.channel import component
    from loomrl.lock import DeviceLock

    fn = getattr(worker, spec.method)
    counts = _rank_counts(spec.micro, spec.world)
    share = counts[worker.rank]
    k_total = spec.batch // spec.micro
    last_k = k_total - 1
    lock = DeviceLock.get() if (spec.time_shared or spec.lock_each) else None
    records: list[tuple] = []
    sink_out: list[Any] = []
    # A co-resident stage (lock_each) must not hold the lock across micro-batches: its partner on
    # the same devices alternates with it. It still pays its switch once per iteration.
    hold = spec.time_shared and not spec.lock_each
    # micro-batch -> the consumer keys (rank, micro-batch) its outputs went to, kept while a
    # later micro-batch's start may have to wait for them to be taken.
    sent: dict[int, list[tuple[int, int]]] = {}
    with component(spec.component):
        if spec.time_shared:
            t = time.time()
            lock.acquire(worker.devices)
            worker.onload()
            if not hold:
                lock.release(worker.devices)
            records.append(("onload", -1, t, time.time(), 0))
        try:
            for k in range(k_total):
                if share == 0:
                    continue
                if spec.ahead:
                    # Back-pressure in micro-batches: start k only once every consumer rank fed
                    # from micro-batch k - ahead has taken it. Before taking k's input, so that
                    # the hold reaches this stage's own producer too.
                    for key in sent.pop(k - spec.ahead, ()):
                        spec.out_channel.wait_taken(key)
                got = spec.in_channel.get_many(share, key=(worker.rank, k))
                got.sort(key=lambda e: e[0])
                idx = [e[0] for e in got]
                items = [e[1] for e in got]
                # Stages that act once per iteration (an optimizer step) need to know the last call.
                worker.flow_last_call = k == last_k
                if spec.lock_each:
                    lock.acquire(worker.devices)
                t = time.time()
                try:
                    out = fn(items)
                finally:
                    t_end = time.time()
                    if spec.lock_each:
                        lock.release(worker.devices)
                records.append(("run", k, t, t_end, len(items)))
                if not isinstance(out, list) or len(out) != len(items):
                    raise TypeError(
                        f"{type(worker).__name__}.{spec.method} must return a list with one output "
                        f"per input item ({len(items)}), got "
                        f"{type(out).__name__}{f' of length {len(out)}' if isinstance(out, list) else ''}"
                    )
                if spec.out_channel is None:  # the sink: its outputs are the iteration's result
                    sink_out.append((idx, out))
                    continue
                by_key: dict[tuple[int, int], list[tuple[int, Any]]] = {}
                for i, o in zip(idx, out, strict=True):
                    by_key.setdefault(_route(i, spec.next_micro, spec.next_world), []).append(
                        (i, o)
                    )
                for key, entries in by_key.items():
                    spec.out_channel.put_many(entries, key=key)
                if spec.ahead:
                    sent[k] = list(by_key)
        finally:
            if spec.time_shared:
                t = time.time()
                if not hold:
                    lock.acquire(worker.devices)
                worker.offload()
                lock.release(worker.devices)
                records.append(("offload", -1, t, time.time(), 0))
    return {
        "records": records,
        "sink": sink_out,
        "devices": list(worker.devices),
        "rank": worker.rank,
    }


def _run_stage_method(self: Worker, spec: StageSpec) -> dict[str, Any]:
    return run_stage(self, spec)


# Every worker can run a stage loop; a plain attribute, so user classes need nothing extra.
Worker._loom_run_stage = _run_stage_method  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------
# Driver side.
# ---------------------------------------------------------------------------------------------
@dataclass
class Component:
    name: str
    cls: type[Worker]
    args: tuple
    kwargs: dict
    valid_devices: list[int] | None = None
    num_cpus: float = 0.0
    # True: one worker holding all its devices (a trainer without DDP). "cpu": one worker on CPU
    # devices, one per GPU on real GPUs (a trainer that shards over its ranks, e.g. FSDP2).
    single_process: bool | str = False
    group: WorkerGroup | None = None

    def workers(self, n_devices: int, cuda: bool = False) -> int:
        if self.single_process is True or (self.single_process == "cpu" and not cuda):
            return 1
        return n_devices


class _Method:
    """``flow_group.method``: a stage reference in ``flow.chain``, and a group call after planning."""

    def __init__(self, comp: Component, name: str):
        self.component, self.name = comp, name

    def __call__(self, *args: Any, **kwargs: Any) -> Handle:
        if self.component.group is None:
            raise RuntimeError(
                f"{self.component.name}.{self.name}() called before flow.plan(): the plan decides "
                "where the group runs, so call flow.plan(placement) first"
            )
        return getattr(self.component.group, self.name)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<stage {self.component.name}.{self.name}>"


class FlowGroup:
    """A declared component. Attribute access gives stage references / group calls."""

    def __init__(self, comp: Component):
        self._comp = comp

    @property
    def name(self) -> str:
        return self._comp.name

    @property
    def group(self) -> WorkerGroup:
        if self._comp.group is None:
            raise RuntimeError(f"{self._comp.name} is not launched yet: call flow.plan() first")
        return self._comp.group

    def __getattr__(self, attr: str) -> _Method:
        cls = self._comp.cls
        if attr.startswith("_") or not callable(getattr(cls, attr, None)):
            raise AttributeError(
                f"{cls.__name__} has no method {attr!r}" + did_you_mean(attr, public_methods(cls))
            )
        return _Method(self._comp, attr)


@dataclass
class FlowResult:
    outputs: list[Any]  # sink outputs, in batch order
    measured_s: float
    predicted_s: float
    timeline: list[dict[str, Any]] = field(default_factory=list)
    # Driver-side wall time of each phase-context stage call, (start, end) from the iteration's
    # start: the call's dispatch, channel hand-offs and return around the recorded work.
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)

    def stage_seconds(self) -> dict[str, float]:
        """Wall time each component was busy (its ranks run side by side: spans, not sums)."""
        spans: dict[str, list[tuple[float, float]]] = {}
        for r in self.timeline:
            if r["kind"] == "run":
                spans.setdefault(r["component"], []).append((r["start"], r["end"]))
        out = {}
        for comp, iv in spans.items():
            iv.sort()
            total, (cur_s, cur_e) = 0.0, iv[0]
            for s_, e_ in iv[1:]:
                if s_ > cur_e:
                    total, cur_s = total + cur_e - cur_s, s_
                cur_e = max(cur_e, e_)
            out[comp] = total + cur_e - cur_s
        return out


def _check_micro_batch(micro_batch: int, batch: int) -> None:
    """A pinned micro-batch must divide the batch: every micro-batch holds as many items."""
    if micro_batch < 1 or batch % micro_batch:
        from loomrl.plan.profile import divisors as divisors_of

        divisors = divisors_of(batch)
        raise PlanError(
            f"micro_batch={micro_batch} does not divide the batch of {batch} items (every "
            f"micro-batch holds as many); use one of {divisors}"
        )


def _drop_channels(box: list, wait: bool = True) -> None:
    """Delete the channels in ``box`` (a Flow's reused set) and empty it. ``wait=False`` (a
    collected Flow's: this may run in any thread, during garbage collection) kills their brokers
    without waiting for them."""
    import ray

    while box:
        ch = box.pop()
        try:
            if wait:
                ch.delete()
            else:
                ray.kill(ch._broker, no_restart=True)
        except Exception as e:  # Ray already gone: its actors went with it
            log.debug("channel %s not deleted: %s", ch.name, e)


class Flow:
    """The macro program: components, their data flow, the plan, and one-iteration execution.

    ``channel_capacity`` (0 or None: unbounded) bounds, in micro-batches, how far a producer
    may run ahead of its consumer on a hop whose two stages run at once: a producer rank starts
    micro-batch j only once every consumer rank it sent micro-batch j - capacity to has taken
    it, so at most ``channel_capacity`` of its micro-batches (the one it works on included)
    are in flight to each consumer rank. This is the hold ``loomrl plan --simulate
    --channel-capacity`` replays (``loomrl.plan.simulate``). Hops whose consumer starts only
    after its producer ended stay unbounded (bounded, the producer would wait for ever).

    ``offload``: ``auto`` offloads time-shared stages only when their devices cannot hold them
    all; ``always`` or ``never``. ``iteration_timeout_s``:
    seconds one iteration may take before it raises ``IterationTimeout`` naming the stages
    still running, ``auto`` (10x the longer of the plan's prediction and the slowest iteration
    so far, at least 30 minutes) or ``off``.
    """

    def __init__(
        self,
        cluster: Cluster,
        run_dir: str | Path | None = None,
        channel_capacity: int = 0,
        offload: str = "auto",
        iteration_timeout_s: float | str = "auto",
    ):
        self.cluster = cluster
        self.iteration_timeout_s = iteration_timeout_s
        self.run_dir = Path(run_dir) if run_dir else None
        self.components: dict[str, Component] = {}
        self.stages: list[_Method] = []
        self.plan_: Plan | None = None
        self.profile_: Any = None
        from loomrl.plan.simulate import capacity_problems

        problems = capacity_problems(channel_capacity)
        if problems:
            raise ConfigError(problems)
        self.capacity = int(channel_capacity or 0)
        if offload not in ("auto", "always", "never"):
            raise ValueError(f"offload={offload!r}: use 'auto', 'always' or 'never'")
        # "auto": time-shared stages offload only when their devices cannot hold them all.
        self.offload = offload
        self._id = uuid.uuid4().hex[:8]
        self._iter = 0
        # The hops' channels live across iterations: creating a channel starts a broker actor,
        # a process, which costs more than a whole small iteration. A run that fails deletes
        # them (items may be left inside); the next run, a shutdown or the Flow's collection
        # does too (not at interpreter exit: Ray may be gone, and a driver's actors end with it).
        self._chans: list[Any] = []
        self._chans_made = 0
        weakref.finalize(self, _drop_channels, self._chans, False).atexit = False
        # One iteration at a time: a second run at once would share these channels and keys.
        self._running = threading.Lock()
        self._calibrate = False
        self.observed_edges: set[tuple[str, str]] = set()
        self._group_launch_s = 0.0  # seconds the last launch took (its groups start together)
        self._fresh = False  # groups were (re)started: the next iteration is their warm-up
        self._slowest_s = 0.0  # the slowest iteration so far (the "auto" time limit's yardstick)
        self._limit: float | None = None  # the running iteration's time limit (s)
        self._deadline: float | None = None  # time.monotonic() by which it must end
        self._profiled: dict[str, list[int]] | None = None  # groups the profiler left running
        self.profile_run: Any = None  # the last profiling's record (loomrl.profiler.ProfileRun)
        self._asked: tuple[str, int | None] = ("auto", None)  # flow.plan's placement, micro_batch
        # The chosen plan's relative standard error from profiling only a few items
        # (loomrl.profiler.sampling_se); None when the plan was not searched on a fresh profile.
        self.prediction_se: float | None = None
        self._reset_adaptation()

    def _reset_adaptation(self) -> None:
        """Run-time adaptation state (see adapt()), empty."""
        self.adapt_events: list[dict[str, Any]] = []
        self.replans = 0
        # A plan searched on a freshly measured profile is re-predicted once from its first
        # REFRESH_ITERATIONS warm iterations, which time every item (the profile saw a few): run().
        self._refresh_pending = False
        self._refresh_seen: list[FlowResult] = []
        self._detector: Any = None
        self._measured: dict[str, list[float]] = {}  # plan key -> measured iteration seconds
        # plan key -> how many of its _measured times (the first ones) an earlier attempt of the
        # run measured (restore_measured); the events say when a time they compare is one.
        self._carried: dict[str, int] = {}
        # The last judged window's loomrl.adapt.cost_baseline, against the profile in use: what a
        # plan without earlier times of its own is compared with (costs_moved_across).
        self._baseline: dict[str, Any] | None = None
        self._recent: list[FlowResult] = []  # iterations of the current drift window

    # ------------------------------------------------------------------ declaration
    def group(
        self,
        cls: type[Worker],
        *args: Any,
        name: str | None = None,
        valid_devices: list[int] | None = None,
        num_cpus: float = 0.0,
        single_process: bool | str = False,
        **kwargs: Any,
    ) -> FlowGroup:
        # Now, not when flow.plan starts the group (after minutes of profiling the others).
        check_worker_class(cls, args, kwargs)
        name = name or cls.__name__
        if single_process not in (True, False, "cpu"):
            raise ValueError(
                f"single_process={single_process!r}: use True, False or 'cpu' (one process on "
                "CPU devices, one per GPU on GPUs)"
            )
        if name in self.components:
            raise ValueError(
                f"component name {name!r} is used twice; pass name= to tell them apart"
            )
        comp = Component(name, cls, args, kwargs, valid_devices, num_cpus, single_process)
        self.components[name] = comp
        return FlowGroup(comp)

    def chain(self, *stages: _Method) -> None:
        """Declare the data flow: each stage's outputs feed the next (the last is the sink)."""
        if not stages:
            raise ValueError(
                "chain() needs at least one stage, e.g. flow.chain(rollout.generate, actor.train)"
            )
        for s in stages:
            if not isinstance(s, _Method):
                raise TypeError(f"chain() takes stage methods like rollout.generate, got {s!r}")
        names = [s.component.name for s in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"a component appears twice in the chain {names}; use two components")
        self.stages = list(stages)

    @property
    def edges(self) -> list[tuple[str, str]]:
        n = [s.component.name for s in self.stages]
        return list(zip(n[:-1], n[1:], strict=True))

    # ------------------------------------------------------------------ planning
    def _check_spatial_fits(self) -> None:
        """An all-spatial plan gives every component devices of its own: PlanError when their
        smallest valid counts add up to more devices than the cluster has."""
        comps = {st.component.name: st.component for st in self.stages}
        need = 0
        for comp in comps.values():
            valid = comp.valid_devices or [1]
            if 0 in valid:  # a component that may run on host cores needs no device
                return
            need += min(valid)
        have = self.cluster.num_devices
        if need > have:
            raise PlanError(
                f"placement='spatial' gives each of the {len(comps)} components devices of "
                f"its own, at least {need} devices, but this cluster has {have}: use "
                "placement=hybrid or auto (they may share devices), or run on more devices "
                "(run.num_gpus, or run.devices on a CPU-only machine)"
            )

    def plan(
        self,
        placement: str | Path = "auto",
        *,
        sample: list[Any] | None = None,
        batch: int | None = None,
        profile: Any = None,
        micro_batch: int | None = None,
        memory_gb: float | None = None,
        profile_budget: float | None = None,
        notify: Callable[[str], None] | None = None,
    ) -> Plan:
        """Choose and apply a plan. ``placement``: auto | temporal | spatial | hybrid | a plan file.

        ``sample`` (one iteration's items) is used to profile the components when no ``profile``
        (a WorkloadProfile, a dict or a profile file) is given. ``batch`` defaults to len(sample).
        ``notify`` hears a line per component while profiling (it can take minutes on a GPU).
        """
        from loomrl.plan.plan import Plan as PlanCls
        from loomrl.plan.profile import load_profile

        if not self.stages:
            raise ValueError("declare the data flow with flow.chain(...) before flow.plan()")
        pinned: Plan | None = None
        profiled = False
        want = len(sample) if sample is not None else batch  # the run's items per iteration
        if str(placement) not in PLACEMENTS:
            path = Path(placement)
            if not path.exists():
                raise PlanError(
                    f"placement={str(placement)!r}: not one of {PLACEMENTS} and no such plan file"
                )
            pinned = PlanCls.load(path)
            self._check_pinned(pinned, memory=True, batch=want, micro_batch=micro_batch)
            self._launch(pinned)
            self.plan_ = pinned
            return pinned
        if profile == "calibrate":
            if placement != "temporal":
                raise PlanError(
                    f"profile='calibrate' plans only placement='temporal' (got {placement!r}): "
                    "other modes need measured costs to split devices; drop profile= to measure them"
                )
            chosen = self._default_temporal(int(want or 0))
            self._calibrate, self._calibrate_seen = True, 0
            self._launch(chosen)
            self.plan_ = chosen
            return chosen
        if profile is None:
            if sample is None:
                raise ValueError(
                    f"placement={placement!r} needs sample= (items of one iteration) to profile"
                )
            if placement == "spatial":  # before minutes of profiling, not after
                self._check_spatial_fits()
            if micro_batch is not None:  # before minutes of profiling, not after
                _check_micro_batch(micro_batch, want)
            from loomrl.profiler import DEFAULT_BUDGET, profile_flow

            profile = profile_flow(
                self,
                sample,
                micro_batch=micro_batch,
                memory_gb=memory_gb,
                budget=profile_budget or DEFAULT_BUDGET,
                notify=notify,
            )
            profiled = True
        elif not hasattr(profile, "components"):
            profile = load_profile(profile)
        self._check_profile(profile, want)
        have = self.cluster.num_devices
        if profile.devices > have:
            # A profile measured on a bigger machine still holds each component's costs per
            # device count: plan on the devices this cluster has, not on ids it lacks.
            log.warning(
                "the profile is for %d devices and this cluster has %d: planning on %d",
                profile.devices,
                have,
                have,
            )
            profile = profile.with_devices(have)
        self.profile_ = profile
        # Adaptation re-plans within what was asked: the same mode, the same fixed micro-batch.
        self._asked = (str(placement), micro_batch)
        if micro_batch is not None:
            _check_micro_batch(micro_batch, profile.batch)
        chosen, profile = self._best_as_asked(profile)
        if chosen is None:
            from loomrl.plan.search import search

            chosen = search(profile, mode=str(placement))  # raises PlanError naming the constraint
        self.prediction_se = None
        if profiled and self.profile_run is not None:
            self.profile_run.keep(chosen.assignment())
            self.prediction_se = self.profile_run.prediction_se(self.profile_, chosen)
            log.info(
                "profiling: %s",
                self.profile_run.describe(chosen.predicted_s, self.prediction_se),
            )
        self._launch_planned(chosen)
        self.plan_ = chosen
        self._refresh_pending, self._refresh_seen = profiled, []
        return chosen

    def _check_profile(self, profile: Any, want: int | None) -> None:
        """PlanError when ``profile`` is not of this workflow or not of ``want`` items per
        iteration (None: not checked)."""
        stages = [s.component.name for s in self.stages]
        missing = [name for name in stages if name not in profile.components]
        if missing:  # a profile of another workflow (another recipe's run)
            raise PlanError(
                f"the profile has no costs for component(s) {missing} of this workflow (it "
                f"covers {sorted(profile.components)}): profile this workflow (loomrl profile "
                "CONFIG), or drop run.profile to measure it"
            )
        # A profile of a bigger workflow (PPO's for GRPO, one with a reference for a run
        # without): its plans would place components this flow never declared.
        extra = sorted(set(profile.components) - set(stages))
        if extra:
            raise PlanError(
                f"the profile has costs for component(s) {extra} that this workflow does not "
                f"have (its components: {stages}): it is the profile of another workflow; "
                "profile this one (loomrl profile CONFIG), or drop run.profile to measure it"
            )
        if want and profile.batch != want:
            raise PlanError(
                f"the profile is for batch={profile.batch} items per iteration but this run has "
                f"{want}: set the run's batch to {profile.batch}, or profile this batch size "
                "(loomrl profile CONFIG)"
            )

    def resume_plan(
        self,
        plan: Plan,
        profile: Any,
        placement: str | Path = "auto",
        *,
        batch: int | None = None,
        micro_batch: int | None = None,
    ) -> Plan:
        """Start on ``plan`` with ``profile``, the plan and refreshed profile adaptation settled
        on in an earlier attempt of the run (``loomrl.adapt.read_adapted``), and adapt on from
        there within ``placement`` and ``micro_batch``, as ``plan`` would. PlanError, before
        any worker starts, when they are not of this workflow, its ``batch`` or this cluster.

        The profile was refreshed from whole iterations already: the plan's prediction is not
        refreshed again from its first warm iterations, as a plan searched on a profile that
        timed a few items is."""
        if not self.stages:
            raise ValueError("declare the data flow with flow.chain(...) before flow.resume_plan()")
        self._check_profile(profile, batch)
        self._check_pinned(plan, batch=batch, micro_batch=micro_batch)
        self.profile_ = profile
        self._asked = (str(placement), micro_batch)
        self.prediction_se = None
        self._launch_planned(plan)
        self.plan_ = plan
        self._refresh_pending, self._refresh_seen = False, []
        return plan

    def adopt_profiled(self, assignment: dict[str, list[int]]) -> None:
        """The profiler left these groups running, warm and in their initial state: the next plan
        keeps each one that it places on the same devices instead of starting it again."""
        self._profiled = dict(assignment)

    def _launch_planned(self, plan: Plan) -> None:
        keep, self._profiled = self._profiled, None
        self._launch(plan, keep=keep, carry_state=False)

    def apply(self, plan: Plan) -> None:
        """Run ``plan`` from now on, on fresh workers, with adaptation starting over."""
        self._check_pinned(plan)
        self._launch(plan)
        self.plan_ = plan
        self._reset_adaptation()

    def _all_fit(self, plan: Plan) -> bool:
        """True when every device can hold all the components placed on it at once (by the
        profile's memory): then time-shared stages still take turns, but nobody offloads."""
        if self.offload != "auto":
            return self.offload == "never"
        if self.profile_ is None or plan.method in ("calibrate", "calibrated"):
            return False  # memory was never measured: keep offloading, as calibrated
        prof = self.profile_
        use: dict[int, float] = {}
        for comp, devs in plan.assignment().items():
            c = prof.components.get(comp)
            if c is None:
                return False
            per_dev = c.memory_gb.get(len(devs), max(c.memory_gb.values(), default=0.0))
            for d in devs:
                use[d] = use.get(d, 0.0) + per_dev
        return max(use.values(), default=0.0) <= prof.device_memory_gb

    def _default_temporal(self, batch: int) -> Plan:
        """Every component on all the devices it may use, one after the other, whole batch at once.

        Needs no costs; its prediction is calibrated from the second iteration's measured
        timeline (the first is warm-up).
        """
        from loomrl.plan.plan import leaf, temporal
        from loomrl.plan.profile import load_profile
        from loomrl.plan.search import fixed_plan

        if batch < 1:
            raise ValueError(
                "profile='calibrate' needs sample= (one iteration's items) or batch= (their "
                f"number, >= 1) to know the batch size; got {batch}"
            )
        n = self.cluster.num_devices
        names = [s.component.name for s in self.stages]
        used = {}
        for c in names:
            fits = [v for v in (self.components[c].valid_devices or [n]) if v <= n]
            if not fits:
                raise PlanError(
                    f"component {c!r}: valid_devices={list(self.components[c].valid_devices)} "
                    f"has no count the cluster's {n} device(s) can give; allow a count <= {n}"
                )
            used[c] = max(fits)
        tree = leaf(names[-1], n, used[names[-1]])
        for c in reversed(names[:-1]):
            tree = temporal(leaf(c, n, used[c]), tree)
        stub = {
            c: {
                "valid_devices": [used[c]],
                "time": {"alpha": 0.0, "per_item": {used[c]: 0.0}},
                "memory_gb": {used[c]: 0.0},
                "switch_s": 0.0,
            }
            for c in names
        }
        prof = load_profile(
            {
                "devices": n,
                "device_memory_gb": 1e9,
                "batch": batch,
                "granularities": [batch],
                "components": stub,
                "edges": self.edges,
            }
        )
        return fixed_plan(prof, tree, batch, method="calibrate")

    def _calibrated(self, plan: Plan, result: FlowResult) -> Plan:
        """Costs of each component (and its switch) from one measured phase-by-phase iteration."""
        from loomrl.plan.profile import load_profile
        from loomrl.plan.search import fixed_plan

        M = plan.batch
        comps: dict[str, Any] = {}
        for name, devs in plan.assignment().items():
            runs = [r for r in result.timeline if r["component"] == name and r["kind"] == "run"]
            sw = [
                r
                for r in result.timeline
                if r["component"] == name and r["kind"] in ("onload", "offload")
            ]
            span = (max(r["end"] for r in runs) - min(r["start"] for r in runs)) if runs else 0.0
            by_rank: dict[int, float] = {}
            for r in sw:
                by_rank[r["rank"]] = by_rank.get(r["rank"], 0.0) + r["end"] - r["start"]
            n = len(devs)
            comps[name] = {
                "valid_devices": [n],
                "time": {"alpha": 0.0, "per_item": {n: span / M}},
                "memory_gb": {n: 0.0},
                "switch_s": max(by_rank.values(), default=0.0),
            }
        prof = load_profile(
            {
                "devices": plan.devices,
                "device_memory_gb": 1e9,
                "batch": M,
                "granularities": [M],
                "components": comps,
                "edges": self.edges,
            }
        )
        self.profile_ = prof
        return fixed_plan(prof, plan.tree, M, method="calibrated")

    def _check_pinned(
        self,
        plan: Plan,
        memory: bool = False,
        batch: int | None = None,
        micro_batch: int | None = None,
    ) -> None:
        """Refuse a plan that does not fit this workflow and cluster, naming every problem;
        ``memory``: also its peak memory per device against the devices' (a plan file may come
        from another machine; plans searched here were searched for the profile's memory);
        ``batch``: the run's items per iteration, which the plan must be for; ``micro_batch``:
        the run's pinned micro-batch, which a plan file must have."""
        problems = []
        if batch and plan.batch != batch:
            problems.append(
                f"the plan is for batch={plan.batch} items per iteration but this run has {batch}: "
                f"pin a plan made for batch {batch}, or run {plan.batch} items"
            )
        if micro_batch is not None and plan.micro_batch != micro_batch:
            problems.append(
                f"the plan's micro_batch is {plan.micro_batch} but the run pins {micro_batch}: "
                "drop run.micro_batch, or pin a plan made with it"
            )
        comps = set(plan.assignment())
        known = set(self.components)
        for c in sorted(comps - known):
            problems.append(
                f"the plan names component {c!r}, which this workflow does not have ({sorted(known)})"
            )
        for c in sorted({s.component.name for s in self.stages} - comps):
            problems.append(f"the plan does not place component {c!r}")
        problems += plan.device_problems(self.cluster.num_devices)
        if plan.micro_batch < 1 or plan.batch % plan.micro_batch:
            problems.append(
                f"the plan's micro_batch={plan.micro_batch} does not divide its batch of "
                f"{plan.batch} items (every micro-batch holds as many)"
            )
        have = self.cluster.device_memory_gb if memory else None
        if have is not None and plan.memory_gb > have:
            problems.append(
                f"the plan's peak memory is {plan.memory_gb:.1f} GB per device but a "
                f"{self.cluster.device_kind} device here has {have:.1f} GB; pin a plan searched "
                f"with device_memory_gb <= {have:.1f} (loomrl plan PROFILE --devices N), or let "
                "placement=auto plan for this cluster"
            )
        if problems:
            raise PlanError(
                "pinned plan does not match the workflow:\n  - " + "\n  - ".join(problems)
            )

    def _launch(
        self, plan: Plan, keep: dict[str, list[int]] | None = None, carry_state: bool = True
    ) -> None:
        """Start every component's group on the devices the plan gives it (replacing older groups).

        ``keep``: the running assignment; a group already on the devices it gets keeps running,
        and (``carry_state``) a replaced group's state moves to the new one through its
        ``save_state`` / ``load_state`` methods when the class has both (saved by every rank,
        since a sharded trainer gathers it collectively; rank 0's copy is loaded on every rank).
        """
        from loomrl.cluster import GroupLaunch

        t = time.time()
        names: list[str] = []
        launches: list[GroupLaunch] = []
        states: dict[str, Any] = {}
        # Moving state between groups happens between iterations, outside any iteration's time
        # limit: it gets one of its own, as long, so that a worker hung in save_state or
        # load_state stops the run with the component named instead of holding it for ever.
        limit = self.iteration_limit_s(self.plan_ or plan)
        for name, devs in plan.assignment().items():
            comp = self.components[name]
            if keep is not None and comp.group is not None and keep.get(name) == devs:
                continue
            if comp.group is not None:
                if keep is not None and carry_state and hasattr(comp.cls, "save_state"):
                    states[name] = _wait_moving(comp.group._call("save_state"), name, limit)[0]
                comp.group.kill()
                comp.group = None
            names.append(name)
            launches.append(
                GroupLaunch(
                    comp.cls,
                    comp.workers(len(devs), self.cluster.has_cuda),
                    comp.args,
                    comp.kwargs,
                    devices=devs,
                    name=name,
                    num_cpus=comp.num_cpus,
                )
            )
        # Every group starts at once (the old ones are gone): imports and loads overlap.
        for name, group in zip(names, self.cluster.launch_many(launches), strict=True):
            self.components[name].group = group
        for name, state in states.items():
            if hasattr(self.components[name].cls, "load_state"):
                _wait_moving(self.components[name].group.load_state(state), name, limit)
        if names:
            self._fresh = True  # new workers: their first iteration pays first-call costs
            # adapt() prices a redeploy with it: groups start together, so moving one group
            # stalls about as long as the last launch, whatever its count.
            self._group_launch_s = time.time() - t

    # ------------------------------------------------------------------ adaptation
    def adapt(
        self,
        result: FlowResult,
        iterations_left: int,
        config: Any = None,
        replans_before: int = 0,
    ) -> dict[str, Any] | None:
        """Between iterations: on persistent drift from the prediction, refresh the profile from
        ``result``'s records, re-plan, and redeploy when it pays (``loomrl.adapt``).

        ``replans_before``: redeploys earlier attempts of the run made (a restart starts a new
        Flow), counted against ``max_replans``, which is per run. Returns the event (also
        appended to ``adapt_events``), or None when nothing drifted. The event says why the plan
        was kept (``kept_because``) or changed (``changed_because``).
        """
        from loomrl.adapt import (
            AdaptConfig,
            DriftDetector,
            cost_baseline,
            costs_moved,
            costs_moved_across,
            plan_key,
            refresh_from_runs,
            worth_switching,
        )
        from loomrl.plan.search import fixed_plan

        cfg = config or AdaptConfig()
        plan = self.plan_
        if plan is None or self.profile_ is None or self._calibrate or not result.predicted_s:
            return None
        key = plan_key(plan)
        if self._fresh:  # a warm-up iteration says nothing about the plan's steady state
            self._fresh = False
            return None
        self._measured.setdefault(key, []).append(result.measured_s)
        self._recent = [*self._recent, result][-cfg.window :]
        if self._detector is None or (self._detector.threshold, self._detector.window) != (
            cfg.threshold,
            cfg.window,
        ):
            self._detector = DriftDetector(cfg.threshold, cfg.window)
        if not self._detector.observe(result.predicted_s, result.measured_s):
            return None
        t0 = time.time()
        errors = list(self._detector.errors)
        # The plan did not change within the window: its last len(_recent) times are the window.
        mine = self._measured[key]
        n_recent = len(self._recent)
        timelines = [r.timeline for r in self._recent]
        if mine[:-n_recent]:
            drifted = costs_moved(mine[:-n_recent], mine[-n_recent:], cfg.threshold)
            judged_by: str | None = "own_times"
        else:
            # Nothing of its own to compare with (just re-planned to, or restarted on): the
            # components it runs as the last judged window did, call for call (why these and
            # not its prediction: loomrl.adapt, above cost_baseline). None: it cannot tell.
            moved = costs_moved_across(
                self._baseline, self.profile_, plan.assignment(), timelines, cfg.threshold
            )
            drifted = bool(moved)
            judged_by = None if moved is None else "components"
        set_aside = set(self._measured) if drifted else set()
        if drifted:
            # The machine's costs changed, not only the prediction. Times measured before (of
            # any plan, in any attempt) describe the old costs: a plan that ran slower then may
            # be faster now, and the reverse. Only the window's times still count.
            self._measured = {key: mine[-n_recent:]}
            self._carried = {}
        # The window's iterations together: one iteration's items may be unusually light or heavy.
        factors, prof = refresh_from_runs(self.profile_, plan.assignment(), self._recent)
        # A calibrated profile knows one device count per component: recalibrate, never move.
        calibrated = plan.method in ("calibrate", "calibrated")
        method = "calibrated" if calibrated else "refreshed"
        current = fixed_plan(prof, plan.tree, plan.micro_batch, method=method)
        best = current if calibrated else self._best_as_asked(prof)[0] or current
        bkey = plan_key(best)
        tried = self._measured.get(bkey)
        ran_s = min(self._measured[key])
        slower_before = bool(tried) and min(tried) >= ran_s
        event: dict[str, Any] = {
            "errors": errors,
            "factors": factors,
            "predicted_s": plan.predicted_s,
            "refreshed_s": current.predicted_s,
            "best_s": best.predicted_s,
            "best_mode": best.mode,
            "action": "recalibrate",
            # Whether this plan's own measured times moved (then times measured before, of every
            # plan, were set aside), and the measured times the "never return to a slower plan"
            # rule compared: the fastest of each plan since the costs last moved (None: the best
            # plan has not run since).
            "costs_drifted": drifted,
            "plan_ran_s": ran_s,
            "best_ran_s": min(tried) if tried and bkey != key else None,
            # What costs_drifted was judged on: the plan's own earlier times ("own_times"), the
            # components it runs as the last judged window did ("components"), or nothing
            # (None: no earlier window to compare with, or no component alike).
            "costs_judged_by": judged_by,
            # Whether those fastest times were measured by an earlier attempt of the run (kept
            # in loomrl.adapt.ADAPTED_FILE), not by this one.
            "plan_ran_in_earlier_attempt": self._ran_earlier(key),
            "best_ran_in_earlier_attempt": self._ran_earlier(bkey)
            if tried and bkey != key
            else None,
        }
        old_assign, new_assign = plan.assignment(), best.assignment()
        moving = sum(old_assign.get(c) != d for c, d in new_assign.items())
        event["stall_estimate_s"] = self._group_launch_s if moving else 0.0
        worth = worth_switching(
            current.predicted_s,
            best.predicted_s,
            event["stall_estimate_s"],
            iterations_left,
            cfg.min_gain,
        )
        replans = replans_before + self.replans
        if bkey == key:
            event["kept_because"] = "the current plan is still the best"
        elif replans >= cfg.max_replans:
            event["kept_because"] = f"max_replans ({cfg.max_replans}) reached" + (
                f" ({replans_before} in earlier attempts of the run)" if replans_before else ""
            )
        elif slower_before:
            event["kept_because"] = (
                f"the best plan ran slower than this one before ({min(tried):.3f}s against "
                f"{ran_s:.3f}s measured, since the costs last moved"
                + ("; it ran in an earlier attempt of the run" if self._ran_earlier(bkey) else "")
                + ")"
            )
        elif not worth:
            event["kept_because"] = (
                f"the gain does not pay for the redeploy over {iterations_left} iteration(s) "
                f"left (or is under min_gain {cfg.min_gain:g})"
            )
        if "kept_because" not in event:
            why = (
                f"predicted {best.predicted_s:.3f}s against {current.predicted_s:.3f}s for the "
                f"current plan (refreshed), which pays for the redeploy over {iterations_left} "
                "iteration(s) left"
            )
            if tried:
                why += f"; it ran {min(tried):.3f}s against this plan's {ran_s:.3f}s measured"
            elif bkey in set_aside:
                why += "; the times it ran before the costs moved no longer count"
            event["changed_because"] = why
            t = time.time()
            self._launch(best, keep=old_assign)
            self.replans += 1
            event.update(
                action="replan",
                stall_s=time.time() - t,
                mode=best.mode,
                assignment=best.assignment(),
                micro_batch=best.micro_batch,
            )
            self.plan_ = best
        else:
            self.plan_ = current
        self.profile_ = prof
        # The next window (of whichever plan runs next) is judged against prof: this window's
        # factors against it too, so that both see prof's curves and overheads alike.
        self._baseline = cost_baseline(prof, old_assign, timelines)
        self._detector.reset()
        self._recent = []
        event["decide_s"] = time.time() - t0 - event.get("stall_s", 0.0)
        self.adapt_events.append(event)
        return event

    def _ran_earlier(self, key: str) -> bool:
        """Whether the fastest of plan ``key``'s measured times is one an earlier attempt of the
        run measured (restore_measured)."""
        times = self._measured.get(key) or []
        return bool(times) and times.index(min(times)) < self._carried.get(key, 0)

    def measured_state(self) -> dict[str, Any]:
        """What adaptation measured that a later attempt of the run needs (kept in
        ``loomrl.adapt.ADAPTED_FILE``): ``measured``, each plan's iteration seconds (by
        ``plan_key``) since the costs last moved, and ``baseline``, the last judged window's
        ``cost_baseline`` (None before the first adapt event)."""
        return {
            "measured": {k: list(v) for k, v in self._measured.items()},
            "baseline": self._baseline,
        }

    def restore_measured(
        self, measured: dict[str, list[float]], baseline: dict[str, Any] | None
    ) -> None:
        """Start adaptation with what an earlier attempt of the run measured (``measured_state``,
        read back by ``loomrl.adapt.read_adapted``), after the plan is applied: a plan measured
        slower then is not returned to, and the first window of a plan with no times of its own
        is judged against ``baseline``. Only on the cluster they were measured on
        (``loomrl.adapt.carries_measured``): the caller checks."""
        self._measured = {k: [float(t) for t in v] for k, v in measured.items() if v}
        self._carried = {k: len(v) for k, v in self._measured.items()}
        self._baseline = baseline

    def _best_as_asked(self, profile: Any) -> tuple[Plan | None, Any]:
        """The best plan for ``profile`` in the mode and micro-batch ``plan`` was asked for
        (None: none in that mode fits), and the profile searched (its granularities cut to
        that micro-batch)."""
        from loomrl.plan.search import search_all

        placement, micro_batch = self._asked
        if micro_batch is not None:
            profile = _with_granularities(profile, [micro_batch])
        return search_all(profile)["best" if placement == "auto" else placement], profile

    def shutdown(self) -> None:
        _drop_channels(self._chans)
        for comp in self.components.values():
            if comp.group is not None:
                comp.group.kill()
                comp.group = None

    # ------------------------------------------------------------------ execution
    def run(self, items: list[Any], plan: Plan | None = None) -> FlowResult:
        """Execute one iteration of the chain on ``items`` under the plan."""
        plan = plan or self.plan_
        if plan is None:
            raise RuntimeError("flow.run() before flow.plan(): choose a placement first")
        M = len(items)
        if M != plan.batch:
            raise PlanError(
                f"flow.run got {M} items but the plan is for batch={plan.batch}: plan again for "
                f"{M} items (flow.plan), or pass {plan.batch}"
            )
        names = [s.component.name for s in self.stages]
        idle = [c for c in names if self.components[c].group is None]
        if idle:
            raise RuntimeError(
                f"flow.run(): component(s) {idle} have no running workers (their last launch "
                "failed, or the flow was shut down); plan again with flow.plan() or flow.apply()"
            )
        if not self._running.acquire(blocking=False):
            raise RuntimeError(
                "flow.run() while another iteration of this flow is running: a Flow runs one "
                "iteration at a time (its hops' channels are shared between iterations)"
            )
        try:
            self._iter += 1
            return self._run(items, plan, names)
        finally:
            self._running.release()

    @property
    def iteration_timeout_s(self) -> float | str:
        """The time limit of an iteration: seconds, "auto" or "off" (``iteration_limit``)."""
        return self._iteration_timeout_s

    @iteration_timeout_s.setter
    def iteration_timeout_s(self, value: Any) -> None:
        self._iteration_timeout_s = check_iteration_timeout(value)

    def iteration_limit_s(self, plan: Plan) -> float | None:
        """Seconds an iteration under ``plan`` may take before ``run`` gives up on it (None: no
        limit); see ``iteration_limit``."""
        return iteration_limit(self.iteration_timeout_s, plan.predicted_s, self._slowest_s)

    def _wait_stage(self, h: Any, spec: StageSpec) -> list[dict]:
        """A stage's results, or ``IterationTimeout`` naming it when the iteration's time is up."""
        left = None if self._deadline is None else max(0.0, self._deadline - time.monotonic())
        try:
            return wait(h, timeout=left)
        except TimeoutError:
            from loomrl.errors import IterationTimeout

            t = self.iteration_timeout_s
            how = f"{t:g} s" if t != "auto" else f"'auto': {self._limit:.0f} s"
            # Under a spatial plan a producer waiting on a hung consumer's full channel times
            # out too: every stage still running is named, the one that found it first.
            running = [f"{spec.component}.{spec.method}()"] + [
                f"{c}.{m}()"
                for c, (other, m) in list(self._inflight.items())
                if c != spec.component and not other.done()
            ]
            raise IterationTimeout(
                f"flow.run(): iteration {self._iter} ran past its time limit (iteration_timeout_s="
                f"{how}) with {', '.join(running)} still running: one hangs, or is far slower "
                "than planned (a stuck tool call or simulator, a deadlock in the stage). If "
                "iterations really take this long, raise run.iteration_timeout_s or set it to "
                "'off'"
            ) from None

    def _close_channels(self) -> None:
        """Close the hop channels (no more puts; gets drain, then raise ChannelClosed). The
        failed run then drops them (``_run``)."""
        for ch in list(self._chans):
            try:
                ch.close()
            except Exception as e:  # its broker already gone
                log.debug("channel %s not closed: %s", ch.name, e)

    def _hop_channels(self, names: list[str]) -> list[Any]:
        """The channels of the chain's hops, made on the first run (or when the chain's length
        changed) and kept while runs succeed. Their items are unbounded: the stages themselves
        hold a producer to ``channel_capacity`` micro-batches ahead (``_hop_capacities``)."""
        from loomrl.channel import Channel

        if len(self._chans) != len(names):
            _drop_channels(self._chans)
            self._chans_made += 1
            tag = f"flow-{self._id}-{self._chans_made}"
            # All or nothing: a failed create deletes the channels it made.
            made = Channel.create_many([f"{tag}-{i}" for i in range(len(names))], [0] * len(names))
            self._chans.extend(made)
        return list(self._chans)

    def _run(self, items: list[Any], plan: Plan, names: list[str]) -> FlowResult:
        ctx = _contexts(plan.tree)
        M = len(items)
        micro = {c: (plan.micro_batch if ctx[c][0] == "stream" else M) for c in names}
        world = {c: self.components[c].group.world_size for c in names}
        chans = self._hop_channels(names)
        ahead = _hop_capacities(plan.tree, names, self.capacity)
        self._limit = self.iteration_limit_s(plan)
        self._deadline = None if self._limit is None else time.monotonic() + self._limit
        self._inflight: dict[str, tuple[Handle, str]] = {}  # stages called, not yet answered
        t0 = time.time()
        try:
            # The driver feeds the first stage; every later hop is worker -> worker.
            first = names[0]
            by_key: dict[tuple[int, int], list[tuple[int, Any]]] = {}
            for i, it in enumerate(items):
                by_key.setdefault(_route(i, micro[first], world[first]), []).append((i, it))
            for key, entries in by_key.items():
                chans[0].put_many(entries, key=key, src="driver")
            specs = {}
            for j, c in enumerate(names):
                nxt = names[j + 1] if j + 1 < len(names) else None
                specs[c] = StageSpec(
                    component=c,
                    method=self.stages[j].name,
                    in_channel=chans[j],
                    out_channel=chans[j + 1] if nxt else None,
                    batch=M,
                    micro=micro[c],
                    world=world[c],
                    next_micro=micro[nxt] if nxt else 0,
                    next_world=world[nxt] if nxt else 1,
                    ahead=ahead[j],
                    time_shared=ctx[c][1] and not self._all_fit(plan),
                    lock_each=ctx[c][2],
                    t0=t0,
                )
            results: dict[str, list[dict]] = {}
            phases: dict[str, tuple[float, float]] = {}
            self._execute(plan.tree, "phase", specs, results, phases)
            measured = time.time() - t0
            self._slowest_s = max(self._slowest_s, measured)
            # The data-flow graph as the channels saw it (producer -> consumer components).
            for ch in chans:
                self.observed_edges |= {e for e in ch.edges() if "driver" not in e}
        except BaseException:
            _drop_channels(self._chans)
            raise
        sink = [x for r in results[names[-1]] for x in r["sink"]]
        pairs = sorted((i, o) for idx, outs in sink for i, o in zip(idx, outs, strict=True))
        timeline = [
            {
                "component": c,
                "rank": r["rank"],
                "devices": r["devices"],
                "kind": kind,
                "micro_batch": k,
                "start": s - t0,
                "end": e - t0,
                "items": n,
            }
            for c, rs in results.items()
            for r in rs
            for (kind, k, s, e, n) in r["records"]
        ]
        result = FlowResult([o for _, o in pairs], measured, plan.predicted_s, timeline, phases)
        if self._calibrate and plan is self.plan_:
            # The second iteration (the first is warm-up: lazy initialisation, first-call costs)
            # measured every phase: from now on the plan predicts.
            self._calibrate_seen += 1
            if self._calibrate_seen >= 2:
                self.plan_ = self._calibrated(plan, result)
                self._calibrate = False
        elif self._refresh_pending and plan is self.plan_ and self.profile_ is not None:
            # The profile timed a few items per component (within its budget); the first
            # REFRESH_ITERATIONS warm iterations (the one before pays first-call costs) time every
            # item of their batches, so the plan predicts from them from now on. The plan itself
            # stays: moving is adapt()'s decision, on persistent drift.
            self._refresh_seen.append(result)
            if len(self._refresh_seen) >= 1 + REFRESH_ITERATIONS:
                from loomrl.adapt import refresh_from_runs
                from loomrl.plan.search import fixed_plan

                self._refresh_pending = False
                _, prof = refresh_from_runs(
                    self.profile_, plan.assignment(), self._refresh_seen[1:]
                )
                self._refresh_seen = []
                try:
                    self.plan_ = fixed_plan(prof, plan.tree, plan.micro_batch, method="refreshed")
                    self.profile_ = prof
                except PlanError as e:  # the measured costs break a constraint: keep the plan
                    log.warning("prediction not refreshed: %s", e)
        return result

    def _execute(
        self,
        node: Node,
        context: str,
        specs: dict[str, StageSpec],
        results: dict,
        phases: dict[str, tuple[float, float]],
    ) -> None:
        if node.op == "leaf":
            comp = self.components[node.component]
            spec = specs.get(node.component)
            if spec is None:
                return
            t = time.time()
            h = comp.group._call("_loom_run_stage", spec)
            h.method = spec.method  # an error names the user's stage method, not its runner
            self._inflight[node.component] = (h, spec.method)
            results[node.component] = self._wait_stage(h, spec)
            self._inflight.pop(node.component, None)
            if context == "phase":
                phases[node.component] = (t - spec.t0, time.time() - spec.t0)
            return
        if node.op == "cycle":
            raise PlanError("cycle nodes run through the embodied cycle runner, not flow.run()")
        a, b = node.children
        if node.op == "temporal" and context == "phase":
            self._execute(a, "phase", specs, results, phases)
            self._execute(b, "phase", specs, results, phases)
            return
        # spatial (either context) or co-resident temporal: both sides at once.
        sub = "stream"
        errors: list[BaseException] = []

        def side(n: Node) -> None:
            try:
                self._execute(n, sub, specs, results, phases)
            except BaseException as e:  # surfaced below, in the driver thread
                errors.append(e)
                # The other side may be waiting on a channel this one will never fill (or
                # drain): closed, its get (or put) raises instead of waiting for ever.
                self._close_channels()

        th = threading.Thread(target=side, args=(b,), daemon=True)
        th.start()
        side(a)
        th.join()
        if errors:
            raise errors[0]


def _wait_moving(h: Any, component: str, limit: float | None) -> list[Any]:
    """``wait`` on a ``save_state`` / ``load_state`` call of a group that a redeploy moves;
    ``IterationTimeout`` naming it after ``limit`` seconds (None: no limit)."""
    try:
        return wait(h, timeout=limit)
    except TimeoutError:
        from loomrl.errors import IterationTimeout

        raise IterationTimeout(
            f"redeploy: {component}.{h.method}() still running after {limit:g} s (the state "
            "moves to the group that replaces it; the limit is an iteration's, "
            "iteration_timeout_s): it hangs, or its state is far slower to move than an "
            "iteration. Raise run.iteration_timeout_s, set it to 'off', or run.adapt=false "
            "to keep the plan"
        ) from None


def check_iteration_timeout(value: Any, key: str = "iteration_timeout_s") -> float | str:
    """``value`` as a time limit per iteration: seconds > 0, ``"auto"`` or ``"off"``."""
    if value in ("auto", "off"):
        return value
    if isinstance(value, str):  # "90" or "1e3" from a YAML file or an override
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    raise ConfigError(
        [
            f"{key}={value!r}: use seconds > 0, 'auto' (at least {AUTO_TIMEOUT_FLOOR_S:.0f} s, "
            f"and {AUTO_TIMEOUT_FACTOR:.0f}x the predicted or slowest iteration) or 'off'"
        ]
    )


def iteration_limit(
    setting: float | str, predicted_s: float | None, slowest_s: float
) -> float | None:
    """The time limit of one iteration (None: none) for ``iteration_timeout_s=setting``, given
    the plan's prediction and the slowest iteration so far. "auto" is generous, so that only a
    hang reaches it: 10x the longer of the two, and at least 30 minutes (a first iteration may
    compile kernels or load models that no profile timed)."""
    if setting == "off":
        return None
    if setting == "auto":
        known = max(predicted_s or 0.0, slowest_s)
        return max(AUTO_TIMEOUT_FLOOR_S, AUTO_TIMEOUT_FACTOR * known)
    return float(setting)


def _contexts(tree: Node) -> dict[str, tuple[str, bool, bool]]:
    """component -> (context, time_shared, lock_each) from its position in the plan tree."""
    out: dict[str, tuple[str, bool, bool]] = {}

    def walk(n: Node, context: str, shared: bool, co: bool) -> None:
        if n.op in ("leaf", "cycle"):
            for c in n.components():
                out[c] = (context, shared, co)
            return
        if n.op == "temporal" and context == "phase":
            for ch in n.children:
                walk(ch, "phase", True, co)
        elif n.op == "temporal":
            for ch in n.children:
                walk(ch, "stream", shared, True)
        else:
            for ch in n.children:
                walk(ch, "stream", shared, co)

    walk(tree, "phase", False, False)
    return out


def _streaming_hops(tree: Node, names: list[str]) -> list[bool]:
    """For each hop of the chain ``names`` (stage j -> j + 1): True when its two stages run at
    the same time under ``tree`` (their closest common node is spatial, or temporal below a
    spatial node, whose sides alternate per micro-batch); False when the consumer starts only
    after the producer has ended (a temporal node in phase context)."""

    def common(n: Node, a: str, b: str, context: str) -> tuple[Node, str]:
        for ch in n.children:
            comps = ch.components()
            if a in comps and b in comps:
                sub = "phase" if n.op == "temporal" and context == "phase" else "stream"
                return common(ch, a, b, sub)
        return n, context

    out = []
    for a, b in zip(names[:-1], names[1:], strict=True):
        node, context = common(tree, a, b, "phase")
        out.append(node.op == "spatial" or (node.op == "temporal" and context == "stream"))
    return out


def _hop_capacities(tree: Node, names: list[str], capacity: int) -> list[int]:
    """For each stage of the chain ``names``, the micro-batches it may run ahead of the next
    stage (0: unbounded): ``capacity`` on a hop whose two stages run at once, 0 on the others
    (the consumer starts only once its producer has ended: held, the producer would wait for
    ever, holding its devices' lock) and for the sink."""
    return [capacity if s else 0 for s in _streaming_hops(tree, names)] + [0]


def _with_granularities(profile: Any, gran: list[int]) -> Any:
    import dataclasses

    return dataclasses.replace(profile, granularities=list(gran))
