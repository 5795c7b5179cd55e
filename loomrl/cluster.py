"""Cluster: the Ray instance loomrl runs on, and its inventory of nodes, devices and cores.

``Cluster.start()`` starts an embedded local Ray unless ``RAY_ADDRESS`` (or ``address=``) names an
existing cluster; the embedded one has the cores this process may use (``taskset``), not all the
machine's. Devices are numbered node-major: node 0's devices first, then node 1's, so that a
plan's contiguous device ranges stay inside a node where they can. A device is either a GPU (real,
or logical as Ray counts them) or, on a machine without GPUs, a CPU "slot".

loomrl places workers itself: each worker actor is pinned to its node (node affinity) and told its
devices through ``CUDA_VISIBLE_DEVICES``; Ray's own GPU accounting is not used, so several workers can
share a device (time-sharing) and one worker can hold several devices.

Cores: a CPU slot is a core, and its worker is pinned to it. On a GPU node (``pin_cores``), a
worker that reserves ``num_cpus`` (a simulator) is pinned to that many cores of its own, taken
from the top of the node's core list (hyperthread siblings next to each other), and a worker that
reserves none (one driving a GPU) to the cores no such worker held when it started (if one held
any). Unpinned, the
OS put GPU-driving processes on cores beside busy simulators in some launches and not in others,
and the same plan ran at a different speed from one launch to the next.

This module never imports torch.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loomrl.errors import PlacementError

if TYPE_CHECKING:
    from loomrl.worker import Worker, WorkerGroup

_NAMESPACE = "loomrl"


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU slot). ``index`` is global (node-major); ``local`` is the index on its node."""

    index: int
    node: int
    local: int
    kind: str  # "gpu" or "cpu"

    def __str__(self) -> str:
        return f"{self.kind}:{self.index} (node {self.node}, local {self.local})"


@dataclass(frozen=True)
class GroupLaunch:
    """One group for ``Cluster.launch_many``: what ``Cluster.launch`` takes, as fields."""

    cls: type[Worker]
    n: int
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    devices: Any = None
    name: str | None = None
    num_cpus: float = 0.0
    env: dict[str, str] | None = None


@dataclass
class _Held:
    """A launch checked and holding its reservation, not started yet."""

    spec: GroupLaunch
    per_rank: list[list[Device]]
    cores: list[list[int]]
    env: dict[str, str] | None
    release: Callable[[], None]


@dataclass(frozen=True)
class Node:
    index: int
    node_id: str
    ip: str
    num_cpus: float
    num_gpus: float
    devices: tuple[Device, ...] = field(default=())
    memory_bytes: float = 0.0  # what Ray lets tasks on this node use (its "memory" resource)


DEFAULT_LAUNCH_TIMEOUT_S = 1800.0


class Cluster:
    """Handle on a running Ray instance plus loomrl's device inventory. Create with ``Cluster.start``."""

    def __init__(
        self,
        nodes: list[Node] | None = None,
        owns_ray: bool = False,
        pin_cores: bool = True,
        **start_kwargs: Any,
    ):
        if (
            start_kwargs
            or not isinstance(nodes, list)
            or not all(isinstance(n, Node) for n in nodes)
        ):
            # Cluster() or Cluster(num_cpus=2): what Cluster.start is for, said with its call.
            given = ", ".join(f"{k}={v!r}" for k, v in start_kwargs.items())
            raise TypeError(
                f"a Cluster is made by loomrl.Cluster.start({given}), which starts (or joins) "
                "Ray and takes its inventory; Cluster(...) only wraps an inventory that start "
                "took"
            )
        self.nodes = nodes
        self.devices: list[Device] = [d for n in nodes for d in n.devices]
        self._owns_ray = owns_ray
        self._groups: list[WorkerGroup] = []
        self._shut = False  # shutdown() was called: no more launches
        self._cpu_reserved: dict[int, float] = {n.index: 0.0 for n in nodes}
        self.pin_cores = pin_cores
        # Seconds a launch waits for its workers' constructors (None: for ever). Generous, as a
        # first model load may download or convert weights; what it catches is a hang.
        self.launch_timeout_s: float | None = DEFAULT_LAUNCH_TIMEOUT_S
        # Positions in a node's core list (a worker maps them onto its affinity mask).
        self._free_cores: dict[int, list[int]] = {
            n.index: list(range(int(n.num_cpus))) for n in nodes
        }

    # ------------------------------------------------------------------ lifecycle
    @classmethod
    def start(
        cls,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        address: str | None = None,
        num_devices: int | None = None,
        log_to_driver: bool = True,
        pin_cores: bool = True,
    ) -> Cluster:
        """Start (or join) Ray and take the inventory.

        Args:
            num_cpus / num_gpus: resources of the embedded Ray (ignored when joining). ``num_gpus`` may
                exceed the real GPU count: Ray then reports logical GPUs, which is how placement is
                tested on CPU-only machines.
            address: an existing cluster's address; defaults to ``$RAY_ADDRESS``; None starts Ray here.
            num_devices: on a cluster without GPUs, how many CPU device slots per node (default: the
                node's CPU count).
        """
        import ray

        _check_start(num_cpus, num_gpus, address, num_devices, log_to_driver, pin_cores)
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        address = address or os.environ.get("RAY_ADDRESS") or None
        owns = False
        if ray.is_initialized():
            _warn_running(num_cpus, num_gpus)
        else:
            if address:
                _check_reachable(address)
                ray.init(address=address, namespace=_NAMESPACE, log_to_driver=log_to_driver)
            else:
                if num_cpus is None:
                    num_cpus = _allowed_cores()
                if num_gpus is None:
                    num_gpus = _count_local_gpus()
                else:
                    _check_logical_gpus(num_gpus, num_cpus)
                ray.init(
                    # "local": a fresh embedded instance even where `ray start` left one
                    # running on this machine (Ray would join that one, whose resources are
                    # not these, and refuse num_cpus); joining is what RAY_ADDRESS is for.
                    address="local",
                    num_cpus=num_cpus,
                    num_gpus=num_gpus,
                    namespace=_NAMESPACE,
                    include_dashboard=False,
                    log_to_driver=log_to_driver,
                    configure_logging=False,
                )
                owns = True
        _sweep_channel_slots()  # slots left by workers of earlier, killed runs
        from loomrl.lock import DeviceLock
        from loomrl.worker import quiet_dead_worker_noise

        quiet_dead_worker_noise()

        # Attached (or created: detached, it outlives its creator) from the driver, before any
        # worker needs it; fresh: not a handle from an earlier Ray instance of this process.
        DeviceLock.get(fresh=True)
        try:
            nodes = _take_inventory(num_devices)
        except PlacementError:
            if owns:  # started here for nothing: not left running in the caller's process
                ray.shutdown()
            raise
        return cls(nodes, owns_ray=owns, pin_cores=pin_cores)

    def shutdown(self) -> None:
        """Kill every worker this cluster launched and, if loomrl started Ray, stop it (no stray processes)."""
        import ray

        for g in self._groups:
            g.kill()
        self._groups.clear()
        self._shut = True
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        _sweep_channel_slots()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ inventory
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_cpus(self) -> float:
        return sum(n.num_cpus for n in self.nodes)

    @property
    def device_kind(self) -> str:
        return self.devices[0].kind if self.devices else "cpu"

    @functools.cached_property
    def has_cuda(self) -> bool:
        """Devices are real CUDA GPUs (not logical ones on a CPU machine, as in placement tests)."""
        if self.device_kind != "gpu":
            return False
        per_node = max(len([d for d in self.devices if d.node == n.index]) for n in self.nodes)
        return _count_local_gpus() >= per_node

    @functools.cached_property
    def device_memory_gb(self) -> float | None:
        """Memory of the smallest device in GB, None when unknown. A real GPU: its total memory
        (nvidia-smi, on this machine). A CPU slot (or a logical device of a CPU machine): its
        share of the host memory Ray lets tasks use, as the slots of a node share it."""
        if self.has_cuda:
            return _local_gpu_memory_gb()
        shares = [n.memory_bytes / len(n.devices) / 1e9 for n in self.nodes if n.devices]
        return min(shares) if shares and min(shares) > 0 else None

    def inventory(self) -> dict[str, Any]:
        return {
            "nodes": [
                {
                    "index": n.index,
                    "node_id": n.node_id,
                    "ip": n.ip,
                    "cpus": n.num_cpus,
                    "gpus": n.num_gpus,
                    "devices": [d.index for d in n.devices],
                }
                for n in self.nodes
            ],
            "devices": len(self.devices),
            "device_kind": self.device_kind,
            "cpus": self.num_cpus,
        }

    def __repr__(self) -> str:
        return (
            f"Cluster({len(self.nodes)} node(s), {len(self.devices)} {self.device_kind} device(s), "
            f"{self.num_cpus:g} CPU core(s))"
        )

    def resolve_devices(self, devices: Any) -> list[Device]:
        """Turn ``None`` (all), an int count, a range or a list of global indices into Device objects."""
        if devices is None:
            return list(self.devices)
        if isinstance(devices, numbers.Integral) and not isinstance(devices, bool):
            devices = int(devices)
            if devices < 1 or devices > len(self.devices):
                raise PlacementError(
                    f"devices={devices}: the cluster has {len(self.devices)} device(s); "
                    f"ask for 1..{len(self.devices)} or pass explicit indices"
                )
            return list(self.devices[:devices])
        if isinstance(devices, (bool, float, str)) or not hasattr(devices, "__iter__"):
            raise PlacementError(
                f"devices={devices!r}: give None (all), a count, or a list of device indices "
                f"(0..{len(self.devices) - 1})"
            )
        idx = [
            int(i) if isinstance(i, numbers.Integral) and not isinstance(i, bool) else i
            for i in devices
        ]
        if not idx:
            raise PlacementError("devices=[]: a worker group needs at least one device")
        bad = [i for i in idx if not isinstance(i, int) or i < 0 or i >= len(self.devices)]
        if bad:
            raise PlacementError(
                f"unknown device id(s) {bad}: this cluster has devices 0..{len(self.devices) - 1} "
                f"({self!r})"
            )
        if len(set(idx)) != len(idx):
            raise PlacementError(f"devices={idx} lists a device twice; give each device once")
        return [self.devices[i] for i in idx]

    # ------------------------------------------------------------------ workers
    def launch(
        self,
        cls: type[Worker],
        n: int,
        *args: Any,
        devices: Any = None,
        name: str | None = None,
        num_cpus: float = 0.0,
        env: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> WorkerGroup:
        """Start ``n`` processes of worker class ``cls`` on ``devices`` and return the group.

        ``n`` workers on ``d`` devices: with ``n >= d`` each device hosts ``n / d`` workers (``n`` must
        be a multiple of ``d``); with ``n < d`` each worker holds ``d / n`` contiguous devices.
        ``num_cpus`` is what each worker reserves from Ray (0 by default: the planner, not Ray, decides
        who computes where; a CPU-bound simulator should reserve its cores).
        """
        spec = GroupLaunch(cls, n, args, kwargs, devices, name, num_cpus, env)
        return self.launch_many([spec])[0]

    def launch_many(self, launches: Sequence[GroupLaunch]) -> list[WorkerGroup]:
        """Start several groups together: every group's processes start before any is waited
        for, so their imports and model loads overlap. All or nothing: when a constructor raises
        or a process cannot start, every group of the call goes and that failure is raised."""
        import ray

        from loomrl.worker import WorkerGroup

        given = launches
        # A list once: a generator would be used up by the check of its elements
        ok = isinstance(launches, Iterable) and not isinstance(launches, GroupLaunch)
        launches = list(launches) if ok else []
        if not ok or not all(isinstance(x, GroupLaunch) for x in launches):
            raise TypeError(
                f"launch_many takes a list of loomrl.cluster.GroupLaunch, got {given!r}; "
                "e.g. launch_many([GroupLaunch(MyWorker, 2, devices=[0, 1])])"
            )
        from loomrl.errors import check_timeout

        check_timeout(self.launch_timeout_s, "Cluster.launch_timeout_s")  # before any starts
        if self._shut:
            # Its groups were killed, and Ray stopped if it started it; where another Cluster
            # keeps Ray running, a launch would still start workers no shutdown will stop.
            raise PlacementError(
                "this Cluster was shut down (shutdown(), or the end of its `with` block); "
                "start a new one with loomrl.Cluster.start()"
            )
        if not ray.is_initialized():
            # Ray would start a new instance of its own here, whose nodes are not this
            # inventory's, and the workers would wait for a node that no longer exists.
            raise PlacementError(
                "this cluster's Ray is not running: a Cluster that started Ray stops it in "
                "shutdown(), also for other Cluster objects of this process; start a new one "
                "with loomrl.Cluster.start()"
            )
        held: list[_Held] = []
        try:
            for spec in launches:
                held.append(self._hold(spec))
        except BaseException:
            for h in held:
                h.release()
            raise
        started: list[tuple[WorkerGroup, Any]] = []
        try:
            for h in held:
                group, ready = WorkerGroup._start(
                    self,
                    h.spec.cls,
                    h.per_rank,
                    h.spec.args,
                    h.spec.kwargs,
                    name=h.spec.name or h.spec.cls.__name__,
                    num_cpus=float(h.spec.num_cpus),  # checked in _hold: a real number
                    env=h.env,
                    cores=h.cores,
                )
                group._on_kill = h.release  # a killed group gives its cores back
                started.append((group, ready))
            infos = self._wait_started(started)
        except BaseException:
            # The ranks that did start go too (the cluster gives their cores to the next launch).
            for group, _ in started:
                group.kill()
            for h in held[len(started) :]:
                h.release()
            raise
        if len(started) == 1:
            infos = [infos]
        groups = [g._ready(i) for (g, _), i in zip(started, infos, strict=True)]
        self._groups.extend(groups)
        return groups

    def _wait_started(self, started: list[tuple[WorkerGroup, Any]]) -> list[Any]:
        """Every started rank's constructor result; ``LaunchTimeout`` naming the ranks still in
        their constructors once ``launch_timeout_s`` has passed (the caller kills the groups)."""
        from loomrl.errors import LaunchTimeout
        from loomrl.worker import wait

        if not started:
            return []
        try:
            return wait(*(r for _, r in started), timeout=self.launch_timeout_s)
        except TimeoutError:
            import ray

            stuck = []
            for group, handle in started:
                _, pending = ray.wait(list(handle.refs), num_returns=len(handle.refs), timeout=0)
                ranks = [
                    r for r, ref in zip(handle.ranks, handle.refs, strict=True) if ref in pending
                ]
                if ranks:
                    stuck.append(f"{group.name} (ranks {ranks})")
            raise LaunchTimeout(
                f"{', '.join(stuck)}: the worker constructor did not return within "
                f"{self.launch_timeout_s:g} s (Cluster.launch_timeout_s); it hangs (a simulator "
                "or model load that never ends) or needs longer: find the hang, or raise "
                "run.launch_timeout_s"
            ) from None

    def _hold(self, spec: GroupLaunch) -> _Held:
        """Check one launch and take what it reserves (cores, CPU counts) before anything starts,
        so the next launch of the same call sees them taken."""
        from loomrl.worker import check_worker_class

        cls, n, num_cpus = spec.cls, spec.n, spec.num_cpus
        check_worker_class(cls, spec.args, spec.kwargs)
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise PlacementError(f"n={n!r}: the number of workers must be a positive integer")
        n = int(n)
        if spec.name is not None and (not isinstance(spec.name, str) or not spec.name):
            raise PlacementError(
                f"name={spec.name!r}: a group's name is a non-empty string (None: the class's "
                f"name, {cls.__name__!r})"
            )
        if spec.env is not None and (
            not isinstance(spec.env, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in spec.env.items())
        ):
            # Found in the worker, it killed the process as it started (os.environ takes str).
            raise PlacementError(
                f"{spec.name or cls.__name__}: env={spec.env!r} must be a dict of str to str "
                "(environment variables for the workers), e.g. {'OMP_NUM_THREADS': '1'}"
            )
        mc = getattr(cls, "max_concurrency", 1)
        if isinstance(mc, bool) or not isinstance(mc, int) or mc < 1:
            raise TypeError(
                f"{cls.__name__}.max_concurrency={mc!r}: must be an int >= 1 (calls a worker "
                "runs at once; 1 by default)"
            )
        if (
            isinstance(num_cpus, bool)
            or not isinstance(num_cpus, numbers.Real)
            or not num_cpus >= 0
            or num_cpus == float("inf")
        ):
            raise PlacementError(
                f"{cls.__name__}: num_cpus={num_cpus!r} must be a number of cores >= 0 (0: reserve "
                "none)"
            )
        devs = self.resolve_devices(spec.devices)
        per_rank = _split_devices(devs, n, cls.__name__)
        if n > 1 and self.has_cuda:
            # Ranks on several GPUs may form a process group (loomrl.distributed): the driver
            # creates the rendezvous actor first so that it owns it (a replaced group cannot
            # take it down).
            from loomrl.weights import ActorRendezvous

            ActorRendezvous()
        cpu_need: dict[int, float] = {}
        ranks_on: dict[int, int] = {}
        for ds in per_rank:
            cpu_need[ds[0].node] = cpu_need.get(ds[0].node, 0.0) + num_cpus
            ranks_on[ds[0].node] = ranks_on.get(ds[0].node, 0) + 1
        for node_idx, k in ranks_on.items():
            cores = max(1, int(self.nodes[node_idx].num_cpus))
            if k > _SLOTS_PER_CORE * cores:
                # Hundreds of processes on a few cores (agent.tool_workers=1000) would not
                # finish starting before launch_timeout_s.
                raise PlacementError(
                    f"{spec.name or cls.__name__}: {n} worker process(es), {k} of them on node "
                    f"{node_idx}, which has {cores} core(s): at most {_SLOTS_PER_CORE * cores} "
                    f"({_SLOTS_PER_CORE} per core) can start there; use fewer workers"
                )
        for node_idx, need in cpu_need.items():
            node = self.nodes[node_idx]
            if self._cpu_reserved[node_idx] + need > node.num_cpus + 1e-9:
                raise PlacementError(
                    f"{cls.__name__}: {n} worker(s) x num_cpus={num_cpus:g} need {need:g} core(s) on "
                    f"node {node_idx}, which has {node.num_cpus:g} with "
                    f"{self._cpu_reserved[node_idx]:g} already reserved; lower num_cpus or spread "
                    "the workers over more nodes (Ray would otherwise wait forever)"
                )
        env = spec.env
        if os.environ.get("LOOMRL_THREADS"):
            # Worker processes may predate this setting (a shared Ray): hand it over explicitly.
            env = {"LOOMRL_THREADS": os.environ["LOOMRL_THREADS"], **(env or {})}
        cores = self._take_cores(per_rank, num_cpus)
        for node_idx, need in cpu_need.items():
            self._cpu_reserved[node_idx] += need
        release = functools.partial(self._release, cpu_need, cores, per_rank, num_cpus)
        return _Held(spec, per_rank, cores, env, release)

    def _take_cores(self, per_rank: list[list[Device]], num_cpus: float) -> list[list[int]]:
        """Core positions per rank on GPU nodes (a position indexes the node's core order).

        ``num_cpus > 0``: each node's ranks take ``ceil(ranks x num_cpus)`` free positions from
        the top, rank ``r`` the ones its share ``[r x num_cpus, (r + 1) x num_cpus)`` covers, so
        workers under one core each share cores among themselves only (fewer positions, down
        to none: unpinned, when earlier reservations in fractions left too few). ``0``: the free
        positions, shared, when some are held (none held: not pinned, as before any simulator)."""
        out: list[list[int]] = [[] for _ in per_rank]
        if not self.pin_cores or not per_rank or per_rank[0][0].kind != "gpu":
            return out
        by_node: dict[int, list[int]] = {}
        for r, ds in enumerate(per_rank):
            by_node.setdefault(ds[0].node, []).append(r)
        for node, ranks in by_node.items():
            free = self._free_cores[node]
            if num_cpus <= 0:
                if len(free) < int(self.nodes[node].num_cpus):
                    for r in ranks:
                        out[r] = list(free)
                continue
            total = int(math.ceil(len(ranks) * num_cpus - 1e-9))
            block = free[max(0, len(free) - total) :]
            del free[len(free) - len(block) :]
            if not block:
                continue
            for j, r in enumerate(ranks):
                lo = int(math.floor(j * num_cpus + 1e-9))
                hi = max(lo + 1, int(math.ceil((j + 1) * num_cpus - 1e-9)))
                out[r] = sorted({block[i % len(block)] for i in range(lo, hi)})
        return out

    def _release(
        self,
        cpu_need: dict[int, float],
        cores: list[list[int]],
        per_rank: list[list[Device]],
        num_cpus: float,
    ) -> None:
        for node_idx, need in cpu_need.items():
            self._cpu_reserved[node_idx] = max(0.0, self._cpu_reserved[node_idx] - need)
        if num_cpus <= 0:  # shared cores were never taken out of the free list
            return
        for ds, mine in zip(per_rank, cores, strict=True):
            node = ds[0].node
            self._free_cores[node] = sorted(set(self._free_cores[node]).union(mine))


def _split_devices(devs: list[Device], n: int, what: str) -> list[list[Device]]:
    d = len(devs)
    if n >= d:
        if n % d:
            raise PlacementError(
                f"{what}: cannot place {n} workers on {d} device(s) evenly; use a multiple of {d} "
                f"workers (several per device) or a divisor of {d} (several devices per worker)"
            )
        k = n // d
        return [[devs[r // k]] for r in range(n)]
    if d % n:
        raise PlacementError(
            f"{what}: cannot give {n} workers an equal share of {d} devices; use a divisor of {d}"
        )
    k = d // n
    per = [devs[r * k : (r + 1) * k] for r in range(n)]
    for ds in per:
        if len({x.node for x in ds}) > 1:
            raise PlacementError(
                f"{what}: a worker would span nodes {sorted({x.node for x in ds})}; one process "
                "can only use devices of its own node — use more workers"
            )
    return per


def _sweep_channel_slots() -> None:
    from loomrl.transport._shm import sweep_orphans

    sweep_orphans()


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse a cluster address nothing answers at, at once: Ray itself retries such an
    address for minutes. ``auto``, ``local`` and addresses without a port are left to Ray."""
    import socket

    from loomrl.errors import PlacementError

    hostport = address.split("://", 1)[-1].rstrip("/")
    if address in ("auto", "local") or ":" not in hostport:
        return
    host, _, port = hostport.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as e:
        raise PlacementError(
            f"no Ray cluster answers at {address!r} (RAY_ADDRESS or address=): {e}. Start one "
            "there (`ray start --head`), fix the address, or unset RAY_ADDRESS to run on an "
            "embedded local Ray"
        ) from None


def _count_local_gpus() -> int:
    """Real GPUs on this machine, without importing torch (nvidia-smi's device files)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip() not in ("", "-1")])
    try:
        return len([e for e in os.listdir("/dev") if e.startswith("nvidia") and e[6:].isdigit()])
    except OSError:
        return 0


def _allowed_cores() -> int | None:
    """Cores this process may run on, where fewer than the machine's (``taskset``, a cpuset):
    Ray counts the machine's, so two jobs given half the cores each would each plan (and pin
    workers) for all of them, two slots to a core. None: all of them, Ray's count stands."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux: no affinity mask to honour
        return None
    return allowed if allowed < (os.cpu_count() or allowed) else None


def _local_gpu_memory_gb() -> float | None:
    """Total memory of the smallest visible GPU here in GB (nvidia-smi; None if it cannot say)."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    keep = None if vis is None else {v.strip() for v in vis.split(",")}
    mib = [
        float(m)
        for i, m in (line.split(",") for line in out.strip().splitlines() if "," in line)
        if keep is None or i.strip() in keep
    ]
    return min(mib) * 1024**2 / 1e9 if mib else None


# CPU device slots a node may be given per core: more than one shares cores (placement tests
# do), many more only starts processes that never get a core.
_SLOTS_PER_CORE = 8


def _check_logical_gpus(num_gpus: int, num_cpus: int | None) -> None:
    """Logical GPUs past the real ones are device slots on cores, as CPU slots are: past
    ``_SLOTS_PER_CORE`` per core, a PlacementError before Ray starts."""
    cores = max(1, int(num_cpus if num_cpus is not None else os.cpu_count() or 1))
    real = _count_local_gpus()
    most = max(real, _SLOTS_PER_CORE * cores)
    if num_gpus > most:
        raise PlacementError(
            f"run.num_gpus={num_gpus} logical GPUs on a machine with {real} GPU(s) and {cores} "
            f"cores: at most {most} ({_SLOTS_PER_CORE} per core) can be started; leave "
            f"run.num_gpus null for the real GPUs, or give at most {max(real, cores)}"
        )


def _check_start(
    num_cpus: Any,
    num_gpus: Any,
    address: Any,
    num_devices: Any,
    log_to_driver: Any = True,
    pin_cores: Any = True,
) -> None:
    """Cluster.start's arguments, all problems at once, before Ray starts (Ray refused some in
    its own words after starting its processes, and num_devices=0 made a cluster of no
    devices)."""

    def whole(v: Any, least: int) -> bool:
        return v is None or (
            isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= least
        )

    problems = []
    if not whole(num_cpus, 0):
        problems.append(
            f"num_cpus={num_cpus!r} must be a whole number >= 0 (cores of the embedded Ray), or "
            "None for this machine's"
        )
    if not whole(num_gpus, 0):
        problems.append(
            f"num_gpus={num_gpus!r} must be a whole number >= 0 (GPUs, logical past the real "
            "ones), or None for this machine's"
        )
    if not whole(num_devices, 1):
        problems.append(
            f"num_devices={num_devices!r} must be a whole number >= 1 (CPU device slots per "
            "node), or None for one per core"
        )
    if address is not None and (not isinstance(address, str) or not address):
        problems.append(
            f"address={address!r} must be a Ray cluster's address such as '10.0.0.1:6379' or "
            "'auto', or None to start Ray here"
        )
    for name, value in (("log_to_driver", log_to_driver), ("pin_cores", pin_cores)):
        if not isinstance(value, bool):  # a string such as "no" reads as True
            problems.append(f"{name}={value!r} must be True or False")
    if problems:
        raise PlacementError("Cluster.start: " + "; ".join(problems))


def _warn_running(num_cpus: int | None, num_gpus: int | None) -> None:
    """Ray already runs in this process (another Cluster started it): this one takes that
    Ray's inventory, and the resources asked for here cannot apply. Said, when they
    differ, rather than dropped without a word."""
    import ray

    have = ray.cluster_resources()
    differ = [
        f"{name}={asked} (it has {have.get(res, 0):g})"
        for name, asked, res in (("num_cpus", num_cpus, "CPU"), ("num_gpus", num_gpus, "GPU"))
        if asked is not None and float(asked) != have.get(res, 0)
    ]
    if differ:
        warnings.warn(
            f"Cluster.start({', '.join(differ)}): Ray is already running in this process (an "
            "earlier Cluster.start), and this Cluster shares it as it is; shut the other "
            "Cluster down first (cluster.shutdown()) to start Ray with these settings",
            stacklevel=3,
        )


def _take_inventory(num_devices: int | None) -> list[Node]:
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    alive.sort(key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]))
    nodes: list[Node] = []
    next_index = 0
    for i, n in enumerate(alive):
        res = n.get("Resources", {})
        cpus = float(res.get("CPU", 0.0))
        gpus = float(res.get("GPU", 0.0))
        if gpus >= 1:
            count, kind = int(gpus), "gpu"
        else:
            count, kind = (num_devices if num_devices is not None else max(1, int(cpus))), "cpu"
            most = _SLOTS_PER_CORE * max(1, int(cpus))
            if count > most:
                # Each slot may get a worker process of its own (the profiler tries every
                # count): hundreds of them on a few cores never finish starting.
                raise PlacementError(
                    f"run.devices={count} CPU device slots on node {i}, which has {cpus:g} "
                    f"cores: at most {most} ({_SLOTS_PER_CORE} per core) can be started; use "
                    f"at most {max(1, int(cpus))} (one per core) for plans that run as predicted"
                )
            if count > max(1, int(cpus)):
                # Allowed (placement tests), but each slot is costed as a core of its own.
                warnings.warn(
                    f"run.devices={count} CPU device slots on node {i}, which has {cpus:g} "
                    "cores: slots share cores, so plans run slower than predicted; use at most "
                    f"{max(1, int(cpus))}",
                    stacklevel=2,
                )
        devs = tuple(Device(next_index + j, i, j, kind) for j in range(count))
        next_index += count
        mem = float(res.get("memory", 0.0))
        nodes.append(Node(i, n["NodeID"], n.get("NodeManagerAddress", "?"), cpus, gpus, devs, mem))
    return nodes
