"""Worker, WorkerGroup, Handle and wait: RL components as groups of Ray actors.

A worker is a plain class deriving from ``Worker``. ``Cluster.launch`` starts ``n`` processes of it;
every public method of the class becomes a real attribute of the returned ``WorkerGroup`` whose call
runs on every rank (or on ``group.on(ranks)``) and returns a ``Handle`` at once. ``wait`` is the
explicit barrier: it returns one result per rank, or raises ``RemoteError`` (with the worker's name,
rank, host and remote traceback) or ``WorkerDiedError`` (the process is gone).

How arguments reach the ranks is declared on the method with ``@dispatch``:
``"all"`` (default) sends the same arguments to every rank; ``"split"`` cuts each sequence argument
into ``world_size`` contiguous chunks; ``"scatter"`` sends element ``r`` of each list argument to rank
``r``; ``"rank0"`` runs on rank 0 only.

This module never imports torch.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import socket
import sys
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loomrl.errors import (
    ChannelItemLost,
    ConfigError,
    LoomError,
    PlacementError,
    RemoteError,
    WorkerDiedError,
    check_timeout,
    require_ray,
)

if TYPE_CHECKING:
    from loomrl.cluster import Cluster, Device

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DISPATCH_MODES = ("all", "split", "scatter", "rank0")
# How long a worker about to be killed waits for its channels to hear what it read (an idle one
# answers in about a millisecond; a busy synchronous one cannot answer before its call ends).
_FLUSH_S = 0.15


def dispatch(mode: str) -> Callable[[Callable], Callable]:
    """Declare how a group call hands its arguments to the ranks (see module docstring)."""
    if callable(mode):  # bare @dispatch over a method
        raise TypeError(
            f"@dispatch needs a mode: write @dispatch('split') (one of {_DISPATCH_MODES}) above "
            f"{getattr(mode, '__name__', 'the method')}, not bare @dispatch"
        )
    if mode not in _DISPATCH_MODES:
        raise ValueError(f"dispatch mode {mode!r} is unknown; choose one of {_DISPATCH_MODES}")

    def mark(fn: Callable) -> Callable:
        fn.__loom_dispatch__ = mode  # type: ignore[attr-defined]
        return fn

    return mark


class Worker:
    """Base class of every loomrl worker. Subclasses call ``super().__init__()``.

    Attributes set before the subclass's ``__init__`` body runs: ``rank``, ``world_size``,
    ``local_world_size`` (the group's ranks on this rank's node, itself included), ``devices``
    (global device indices), ``name`` and ``group_name``.
    """

    rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    devices: tuple[int, ...] = ()
    device_kind: str = "cpu"
    name: str = "worker"
    group_name: str = "worker"
    launch_id: str = ""
    # True when calls leave nothing behind that changes later results: the profiler's workers
    # then become the run's. Stateful classes get the same by defining save_state / load_state.
    stateless: bool = False

    def __init__(self) -> None:
        self._loaded = True
        quiet_dead_worker_noise()  # this worker's own calls to others (an env calling the policy)

    # -------------------------------------------------------------- time-sharing hooks
    def onload(self) -> None:
        """Bring weights / state onto the device. Called under the device lock before work."""

    def offload(self) -> None:
        """Return device memory (and what RSS can be returned on CPU). Called after work."""

    @contextlib.contextmanager
    def devices_locked(self, onload: bool = True, offload: bool = True) -> Iterator[None]:
        """Hold this worker's devices exclusively: onload -> work -> offload, in device order."""
        from loomrl.lock import DeviceLock

        lock = DeviceLock.get()
        with lock.hold(self.devices):
            if onload:
                self.onload()
            try:
                yield
            finally:
                if offload:
                    self.offload()

    @property
    def torch_device(self) -> str:
        """Torch device name: "cuda" when this process sees a real GPU, else "cpu"."""
        if self.device_kind != "gpu":
            return "cpu"
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    # -------------------------------------------------------------- built-ins used by the group
    def _loom_info(self) -> dict[str, Any]:
        import ray

        if getattr(self, "_loom_init_error", None) is not None:
            raise self._loom_init_error
        return {
            "name": self.name,
            "rank": self.rank,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "devices": list(self.devices),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def _loom_ping(self) -> bool:
        return True

    def _loom_memory(self, reset: bool = False) -> dict[str, float]:
        """Resident memory now and at peak (GB); CUDA peak when torch uses a GPU here."""
        import resource

        out = {
            "rss_gb": _rss_bytes() / 2**30,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        }
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            out["cuda_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            out["cuda_gb"] = torch.cuda.memory_allocated() / 2**30
            if reset:
                torch.cuda.reset_peak_memory_stats()
        return out

    def _loom_threads(self, n: int) -> int:
        """Compute threads of this process (the profiler times a single-process CPU worker's
        one-device share with one thread); returns the previous count. LOOMRL_THREADS wins."""
        import sys

        torch = sys.modules.get("torch")
        before = torch.get_num_threads() if torch is not None else len(self.devices) or 1
        _set_threads(int(os.environ.get("LOOMRL_THREADS") or n))
        return before

    def _loom_call(self, method: str, items: list[Any]) -> tuple[float, Any]:
        """Time one stage call in the worker (used by the profiler)."""
        t = time.perf_counter()
        out = getattr(self, method)(items)
        return time.perf_counter() - t, out

    def _loom_flush_reads(self) -> None:
        """Tell the channels now what this process has read from them (``kill`` calls it first:
        a channel gives the items of a consumer that died before saying so to the next one)."""
        channel = sys.modules.get("loomrl.channel")
        if channel is not None:  # never imported here: nothing read (importing it took 50 ms)
            channel.flush_reads(timeout=_FLUSH_S)

    def _loom_snapshot(self) -> None:
        """Keep a copy of this rank's ``save_state()`` here (the profiler restores it after its
        calls): no state crosses to the driver. Deep-copied, since a state may share storage
        with the live object."""
        import copy

        self._loom_saved = copy.deepcopy(self.save_state())

    def _loom_restore(self) -> None:
        saved, self._loom_saved = self._loom_saved, None
        self.load_state(saved)

    def _loom_rebuild(self) -> None:
        """Run the constructor again with the launch's arguments, in this process: the state a
        fresh launch on the same devices starts from, without starting a process (throw-away
        probing can then hand its workers to the run). ``close()``, when the class has one,
        releases what the old state held first. A class whose constructor draws from global
        random state (the built-in workers seed their own generators) is not rebuilt equal."""
        close = getattr(self, "close", None)
        if callable(close):
            close()
        cls, args, kwargs = self._loom_init
        cls.__init__(self, *args, **kwargs)

    def _loom_switch(self, repeats: int = 1) -> float:
        """Time offload + onload (what a time-shared stage pays per iteration): the median of
        ``repeats`` (one pair swings with page faults and the allocator)."""
        times = []
        for _ in range(max(repeats, 1)):
            t = time.perf_counter()
            self.offload()
            self.onload()
            times.append(time.perf_counter() - t)
        return sorted(times)[len(times) // 2]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def ranks_on_node(per_rank: Sequence[Sequence[Any]]) -> list[int]:
    """For each rank (its devices, all on one node: ``per_rank[r][0].node``), how many ranks of
    the group share its node, itself included: what a rank may count on sharing with at once
    (a node's memory, its cores)."""
    count = Counter(ds[0].node for ds in per_rank)
    return [count[ds[0].node] for ds in per_rank]


def _setup_worker(obj: Worker, ctx: dict[str, Any]) -> None:
    if ctx["device_kind"] == "gpu" and ctx["visible"] is not None:
        # Set before anything touches CUDA in this process, so torch sees exactly its devices.
        os.environ["CUDA_VISIBLE_DEVICES"] = ctx["visible"]
    for k, v in (ctx.get("env") or {}).items():
        os.environ[k] = v
    if ctx["device_kind"] == "cpu":
        _pin_cpu_slots([int(x) for x in ctx["visible"].split(",")])
    elif ctx.get("cores"):  # on a GPU node: the cores Cluster.launch gave it
        # Thread pools are sized to cores of its own only; shared ones keep Ray's default.
        _pin_cpu_slots(ctx["cores"], order=_core_order(), threads=ctx.get("num_cpus", 0) > 0)
    elif os.environ.get("LOOMRL_THREADS"):
        _set_threads(int(os.environ["LOOMRL_THREADS"]))
    obj.rank = ctx["rank"]
    obj.world_size = ctx["world_size"]
    obj.local_world_size = ctx.get("local_world_size", ctx["world_size"])
    obj.devices = tuple(ctx["devices"])
    obj.device_kind = ctx["device_kind"]
    obj.group_name = ctx["group"]
    obj.launch_id = ctx.get("launch", "")
    obj.name = f"{ctx['group']}[{ctx['rank']}]"


def _ship_module_by_value(cls: type) -> None:
    """Worker classes defined in scripts or test files are not importable in worker processes;
    ship such modules by value (installed packages and loomrl itself travel by reference)."""
    import sys

    from ray import cloudpickle

    mod = sys.modules.get(cls.__module__)
    path = getattr(mod, "__file__", None) or ""
    if mod is None or cls.__module__ == "__main__" or cls.__module__.startswith("loomrl."):
        return
    if "site-packages" in path or "dist-packages" in path:
        return
    cloudpickle.register_pickle_by_value(mod)


def _pin_cpu_slots(local: list[int], order: list[int] | None = None, threads: bool = True) -> None:
    """A CPU device slot is a core: pin the process to its cores and size thread pools to match,
    so that workers on disjoint slots really run side by side and a plan's split means something.
    ``local`` indexes ``order`` (default: the cores this process may use, ascending)."""

    try:
        cores = order or sorted(os.sched_getaffinity(0))
        mine = {cores[i % len(cores)] for i in local}
        os.sched_setaffinity(0, mine)
    except (AttributeError, OSError):  # not Linux: keep the default affinity
        mine = set(local)
    # LOOMRL_THREADS pins the thread count whatever the placement: bit-identical results across
    # plans need the same reduction order in every kernel, hence the same number of threads.
    if threads or os.environ.get("LOOMRL_THREADS"):
        _set_threads(int(os.environ.get("LOOMRL_THREADS") or len(mine)))


def _core_order() -> list[int]:
    """The cores this process may use, hyperthread siblings next to each other (by package and
    core id from sysfs; ascending where sysfs does not say): a worker given two consecutive
    positions from an even one holds a whole physical core. Workers given one position each
    may share a physical core as siblings (on machines with one thread per core they do not)."""

    def key(cpu: int) -> tuple[int, int, int]:
        top = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        try:
            with open(top + "physical_package_id") as f, open(top + "core_id") as g:
                return int(f.read()), int(g.read()), cpu
        except (OSError, ValueError):
            return 0, cpu, cpu

    return sorted(os.sched_getaffinity(0), key=key)


def _set_threads(n: int) -> None:
    import sys

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


def _hosted_class(cls: type[Worker]) -> type:
    """A subclass of the user's class whose constructor first installs rank/devices/env."""
    _ship_module_by_value(cls)

    def __init__(self, _loom_ctx: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        _setup_worker(self, _loom_ctx)
        self._loom_init = (cls, args, kwargs)  # for _loom_rebuild
        try:
            cls.__init__(self, *args, **kwargs)
        except Exception as e:
            # Kept for _loom_info, which the launch calls, so that it reaches the driver as the
            # constructor's error (RemoteError with its traceback; one of loomrl's own, the
            # user's config or a condition loomrl names, in one line). A constructor that
            # raises would kill the actor, and Ray then reports only a dead process, which
            # reads as a crash and which a run's restart (run.max_restarts) would try again,
            # failing the same way each time.
            self._loom_init_error = e

    body: dict[str, Any] = {"__init__": __init__, "__module__": cls.__module__}
    for attr in dir(cls):
        # Plain methods only: a staticmethod or classmethod also reads as a function from the
        # class, but takes no instance.
        fn = inspect.getattr_static(cls, attr, None)
        if not attr.startswith("_") and inspect.isfunction(fn) and not _is_async(fn):
            body[attr] = _returns_values(fn)
    return type(cls.__name__, (cls,), body)


# The wrapper below travels to the workers by value (it is made per class); it reaches the
# check through this module function, which travels by reference.
def _handed_to_dispatch() -> bool:
    """Whether the worker method whose wrapper called this was called by Ray or by loomrl's
    own dispatch (the stage loop, the profiler), which send its value on, rather than by the
    user's code (another method, a thread of its own), which may take a generator."""
    import sys

    ray_dir, tracing_dir = _ray_dirs()
    frame = sys._getframe(2)  # 0: here, 1: the wrapper, 2: its caller
    # Ray wraps every actor method in a tracing shim, so calls from the worker's own methods
    # pass through Ray's code too; look past it.
    while frame is not None and frame.f_code.co_filename.startswith(tracing_dir):
        frame = frame.f_back
    if frame is None:
        return True
    caller = frame.f_code.co_filename
    return caller.startswith(ray_dir) or caller in _DISPATCH_FILES


_DISPATCH_FILES = (__file__, str(Path(__file__).with_name("flow.py")))


@functools.lru_cache(maxsize=1)
def _ray_dirs() -> tuple[str, str]:
    import ray

    root = Path(ray.__file__).parent
    return str(root) + os.sep, str(root / "util" / "tracing") + os.sep


def _wrapped(h: Any) -> bool:
    """Whether ``h``'s method runs inside ``_returns_values``' wrapper on its worker (a plain
    public method; see ``_hosted_class``)."""
    fn = inspect.getattr_static(getattr(h.group, "cls", object), h.method, None)
    return not h.method.startswith("_") and inspect.isfunction(fn) and not _is_async(fn)


def _is_async(fn: Callable) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _returns_values(fn: Callable) -> Callable:
    """``fn`` refusing to hand a generator to Ray, which would send the caller the first item
    only (and log the rest away): data lost without an error. The worker's own code (its other
    methods, threads it starts) may still take generators from it."""

    # Named apart: a remote traceback without this frame failed outside the method (``_get``).
    @functools.wraps(fn)
    def _loom_method(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(self, *args, **kwargs)
        if inspect.isgenerator(out) and _handed_to_dispatch():
            raise TypeError(
                f"{type(self).__name__}.{fn.__name__}() returned a generator: only its first "
                "item would reach the caller; return a list instead (`return list(...)`)"
            )
        return out

    return _loom_method


def check_worker_class(cls: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Refuse, before any process starts, a class that is no Worker, constructor arguments its
    ``__init__`` cannot take, and generator methods (Ray hands back a stream of references
    for those, not their values)."""

    if not (isinstance(cls, type) and issubclass(cls, Worker)):
        raise TypeError(
            f"a worker group needs a subclass of loomrl.Worker, got {cls!r}; "
            "declare it as `class MyWorker(loomrl.Worker): ...`"
        )
    try:
        sig = inspect.signature(cls)
        # Shown without annotations (strings under postponed evaluation): names and defaults.
        sig = sig.replace(
            parameters=[p.replace(annotation=p.empty) for p in sig.parameters.values()],
            return_annotation=sig.empty,
        )
    except (TypeError, ValueError):  # no signature to check (a C-level constructor)
        sig = None
    if sig is not None:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(
                f"{cls.__name__}{sig}: {e}; the arguments given after the worker class are its "
                "constructor's"
            ) from None
    clash = sorted(set(public_methods(cls)) & _GROUP_ATTRS)
    if clash:  # checked here, before its processes start (the group is made after)
        raise TypeError(
            f"{cls.__name__}.{clash[0]} clashes with WorkerGroup.{clash[0]}; rename the method"
        )
    for attr in dir(cls):
        fn = getattr(cls, attr, None)
        if not attr.startswith("_") and (
            inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)
        ):
            raise TypeError(
                f"{cls.__name__}.{attr} is a generator (it yields): a worker method's call "
                "returns one value per rank; return a list instead (`return list(...)`)"
            )


def _unpicklable(args: tuple, kwargs: dict[str, Any]) -> str | None:
    """Which of ``args`` / ``kwargs`` cannot be pickled, and why (None: each can alone)."""
    from ray import cloudpickle

    for label, v in [*((f"#{i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        try:
            cloudpickle.dumps(v)
        except Exception as e:
            return f"argument {label} ({type(v).__name__}) cannot be sent to the worker ({e})"
    return None


def _serialization_error(what: str, cls: type, args: tuple, kwargs: dict, err: Exception) -> str:
    """One paragraph for Ray's "Could not serialize ..." report (a page of its inspector)."""
    from ray import cloudpickle

    bad = _unpicklable(args, kwargs)
    if bad is not None:
        return (
            f"{what}: {bad}; pass what it is built from (a path, a config, plain data) and "
            "build it in the worker"
        )
    try:
        cloudpickle.dumps(cls)
        why = str(err).splitlines()[0]
    except Exception as e:
        why = str(e)
    return (
        f"{what}: the class {cls.__qualname__} cannot be sent to the worker processes ({why}): "
        "a class attribute, or a module-level object its methods use, cannot be pickled; "
        "create such objects in __init__ instead"
    )


class Handle:
    """The pending result of one group call: one Ray object reference per rank."""

    def __init__(self, group: WorkerGroup, method: str, ranks: list[int], refs: list[Any]):
        self.group, self.method, self.ranks, self.refs = group, method, ranks, refs

    def wait(self, timeout: float | None = None) -> list[Any]:
        return wait(self, timeout=timeout)

    def done(self) -> bool:
        import ray

        _require_ray(repr(self))
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def __repr__(self) -> str:
        return f"Handle({self.group.name}.{self.method} on ranks {self.ranks})"


def wait(*handles: Handle, timeout: float | None = None) -> Any:
    """Block until every handle completes. One handle -> list of per-rank results; several -> a list of such lists.

    Raises RemoteError / WorkerDiedError naming the worker (a ConfigError a constructor raised:
    as a ConfigError, the worker named in its source), and TimeoutError after ``timeout`` seconds.
    """
    import ray

    timeout = check_timeout(timeout)
    if not handles:
        return []
    for h in handles:
        if not isinstance(h, Handle):
            several = (
                "; pass them one by one: wait(*handles)"
                if isinstance(h, (list, tuple)) and h and all(isinstance(x, Handle) for x in h)
                else "; call the method on a WorkerGroup first, e.g. wait(group.step())"
            )
            raise TypeError(
                f"wait() takes Handles returned by group method calls, got "
                f"{type(h).__name__}{several}"
            )
    _require_ray(repr(handles[0]))
    deadline = None if timeout is None else time.monotonic() + timeout
    # Once each: a handle given twice (ray.wait refuses a ref listed twice).
    pending = list(dict.fromkeys(r for h in handles for r in h.refs))
    # ray.wait returns as soon as refs finish or fail; a dead actor's refs fail within seconds, so
    # this loop cannot hang on a crashed worker. We surface the first failure as soon as it lands.
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            raise TimeoutError(
                f"wait(): {len(pending)} call(s) still running after {timeout}s: "
                + ", ".join(repr(h) for h in handles if any(r in pending for r in h.refs))
            )
        for ref in ready:
            try:
                _raise_if_failed(handles, ref)
            except (RemoteError, WorkerDiedError, ConfigError):
                # Sibling failures already in are read, so Ray does not report them as unhandled.
                read_done(pending, timeout=0.2)
                raise
    out = [[_get(h, r, ref) for r, ref in zip(h.ranks, h.refs, strict=True)] for h in handles]
    return out[0] if len(handles) == 1 else out


def _require_ray(what: str) -> None:
    require_ray(
        f"{what}: ",
        "the Cluster these workers ran on stopped them; start one with loomrl.Cluster.start() "
        "and launch the group again",
    )


def _require_live(group: WorkerGroup) -> None:
    """A call on a group that was killed (``kill()``, or its cluster's ``shutdown()``) is the
    caller's mistake, not a crash: said as such before Ray reports dead processes."""
    if group._root._killed:
        raise LoomError(
            f"{group.name}: this group was stopped (kill(), or its Cluster's shutdown()); "
            "launch it again with cluster.launch(...) to call it"
        )
    _require_ray(f"{group.name}")


def read_done(refs: list[Any], timeout: float = 0.0) -> list[Any]:
    """The values of those of ``refs`` done within ``timeout`` that did not fail (the failed
    ones are read too: Ray then does not report them as unhandled)."""
    import ray

    if not refs:
        return []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    out = []
    for ref in ready:
        with contextlib.suppress(Exception):
            out.append(ray.get(ref))
    return out


def _raise_if_failed(handles: Sequence[Handle], ref: Any) -> None:
    for h in handles:
        for r, x in zip(h.ranks, h.refs, strict=True):
            if x == ref:
                _get(h, r, ref)
                return


# actor id (hex) -> (its group, rank) of every worker this process launched: a call that failed
# because another worker died is reported as that worker's death.
_WORKER_OF: dict[str, tuple[weakref.ref, int]] = {}


class _DeadWorkerNoise(logging.Filter):
    """Drops Ray's "Unhandled error" lines about dead actors: the calls of a rollout that was
    running when a worker died fail with it, and Ray logs each result no one read (one block
    per call). loomrl reports the death itself, once, naming the worker (WorkerDiedError)."""

    # What the messages of Ray's dead-actor errors say (their text need not name their class).
    SIGNS = (
        "ActorDiedError",
        "RayActorError",
        "ActorUnavailableError",
        "The actor died",
        "The actor experienced an error",
        "is unavailable:",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Unhandled error") and any(k in msg for k in self.SIGNS))


def quiet_dead_worker_noise() -> None:
    """Install ``_DeadWorkerNoise`` on Ray's worker logger in this process (once)."""
    lg = logging.getLogger("ray._private.worker")
    if not any(isinstance(f, _DeadWorkerNoise) for f in lg.filters):
        lg.addFilter(_DeadWorkerNoise())


def _died_upstream(h: Handle, rank: int, cause: Any) -> WorkerDiedError | None:
    """When ``cause`` says another worker of this run died (an argument it was to produce, a
    call it was to answer, or channel items it had put), that worker's death, naming it and the
    call that found it."""
    from ray import exceptions as rex

    if isinstance(cause, rex.RayActorError):
        ids, how = [str(getattr(cause, "actor_id", None) or "")], "needed it"
    elif isinstance(cause, ChannelItemLost):
        ids, how = list(cause.producers), "took items it had put to a channel"
    else:
        return None
    for actor_id in ids:
        group, r = _worker_of(actor_id)
        if group is None or group._killed or (group.name, r) == (h.group.name, rank):
            continue  # unknown, stopped on purpose (a redeploy), or the called worker itself
        text = _ANSI.sub("", str(cause)).strip()
        return WorkerDiedError(
            group.name,
            r,
            group._hosts.get(r, "?"),
            None,
            f"found when {h.group.name} rank {rank}'s {h.method}() {how}. {text[-2000:]}",
        )
    return None


def _worker_of(actor_id: str | None) -> tuple[WorkerGroup | None, int]:
    """The group this process launched that ``actor_id`` is a rank of (None if none), and
    the rank."""
    ref, r = _WORKER_OF.get(actor_id or "", (None, 0))
    return (ref() if ref is not None else None), r


def worker_name(actor_id: str | None) -> str | None:
    """ "group rank r" for a worker this process launched, by its actor id; None otherwise."""
    group, r = _worker_of(actor_id)
    return None if group is None else f"{group.name} rank {r}"


def _get(h: Handle, rank: int, ref: Any) -> Any:
    import ray
    from ray import exceptions as rex

    try:
        return ray.get(ref)
    except rex.RayTaskError as e:
        host = h.group._hosts.get(rank, "?")
        cause = e.cause if getattr(e, "cause", None) is not None else e
        if isinstance(cause, ConfigError):
            # A user's mistake (a config value, a user policy's outputs) found in the worker:
            # said as such, with where, and no traceback. Other errors keep RemoteError and the
            # remote traceback (a bug may be behind those).
            when = "while starting" if h.method == "__init__" else f"in {h.method}()"
            where = f"worker {h.group.name!r} rank {rank}, {when}"
            raise ConfigError(
                cause.problems, source=f"{cause.source} ({where})" if cause.source else where
            ) from None
        died = _died_upstream(h, rank, cause)
        if died is not None:
            raise died from None
        if isinstance(cause, WorkerDiedError):
            # A worker this one called died (the worker's own wait raised it): that death, so
            # that a run restarts on it (run.max_restarts) as on one it saw itself.
            raise WorkerDiedError(
                cause.worker,
                cause.rank,
                cause.host,
                cause.method,
                f"found when {h.group.name} rank {rank}'s {h.method}() called it. {cause.detail}",
            ) from None
        tb = _ANSI.sub("", str(e))
        said = f"{type(cause).__name__}: {cause}"
        if isinstance(cause, RemoteError):  # a worker this one called failed: its headline
            said = f"{type(cause).__name__}: {cause.headline}"
        elif "cloudpickle" in tb and "in _loom_method" not in tb and _wrapped(h):
            # Failed after the method returned: Ray could not pickle its value. (Only for a
            # method the wrapper runs: for others the frame is never there to tell.)
            said = (
                f"its return value cannot be sent to the caller ({said}); return plain data "
                "(numbers, strings, lists, dicts, numpy arrays, tensors) and keep objects such "
                "as locks, files, sockets and clients in the worker"
            )
        err = RemoteError(
            h.group.name,
            rank,
            host,
            h.method,
            said,
            tb,
            expected=cause.expected
            if isinstance(cause, RemoteError)
            else isinstance(cause, LoomError),
        )
        raise err from (cause if isinstance(cause, BaseException) else None)
    except rex.UnserializableException as e:
        # The method raised an exception the driver cannot rebuild (a subclass whose __init__
        # takes other arguments than its message): its text and traceback still say what.
        tb = _ANSI.sub("", getattr(e, "_original_stack_trace", "") or str(e)).strip()
        last = tb.splitlines()[-1] if tb else type(e).__name__
        raise RemoteError(
            h.group.name, rank, h.group._hosts.get(rank, "?"), h.method, last, tb
        ) from None
    except (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError) as e:
        host = h.group._hosts.get(rank, "?")
        # A constructor that raised shows up as a dead actor: keep its traceback in the message.
        text = (_ANSI.sub("", str(e)).strip() or type(e).__name__)[-4000:]
        if h.group._root._killed:
            text = f"its group was stopped (kill(), or its Cluster's shutdown()). {text}"
        raise WorkerDiedError(h.group.name, rank, host, h.method, text) from None


class _GroupMethod:
    def __init__(self, group: WorkerGroup, name: str, mode: str, ranks: list[int]):
        self._group, self._name, self._mode, self._ranks = group, name, mode, ranks
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Handle:
        g = self._group
        _require_live(g)
        ranks = self._ranks
        if self._mode == "rank0":
            ranks = [ranks[0]]
        per_rank = _dispatch_args(self._mode, self._name, len(ranks), args, kwargs)
        refs = []
        try:
            for (a, kw), r in zip(per_rank, ranks, strict=True):
                refs.append(getattr(g._actors[r], self._name).remote(*a, **kw))
        except TypeError as e:
            # Ray's own words name neither the group nor the method (a missing argument), or
            # fill a page (an argument that cannot be pickled).
            what = f"{g.name}.{self._name}()"
            if str(e).startswith("Could not serialize"):
                raise TypeError(_serialization_error(what, g.cls, args, kwargs, e)) from None
            raise TypeError(f"{what}: {e}") from None
        return Handle(g, self._name, ranks, refs)

    def __repr__(self) -> str:
        return f"<group method {self._group.name}.{self._name} dispatch={self._mode!r}>"


def _dispatch_args(
    mode: str, name: str, n: int, args: tuple, kwargs: dict
) -> list[tuple[tuple, dict]]:
    if mode in ("all", "rank0"):
        return [(args, kwargs)] * n

    def cut(label: str, v: Any) -> list[Any]:
        if not isinstance(v, Sequence) or isinstance(v, (str, bytes)):
            raise TypeError(
                f"{name}(): argument {label} must be a list with @dispatch({mode!r}), "
                f"got {type(v).__name__}"
            )
        if mode == "scatter":
            if len(v) != n:
                raise ValueError(
                    f"{name}(): argument {label} has {len(v)} element(s) but @dispatch('scatter') "
                    f"needs one per rank ({n})"
                )
            return list(v)
        q, rem = divmod(len(v), n)
        bounds = [r * q + min(r, rem) for r in range(n + 1)]
        return [v[bounds[r] : bounds[r + 1]] for r in range(n)]

    pa = [cut(f"#{i}", v) for i, v in enumerate(args)]
    pk = {k: cut(repr(k), v) for k, v in kwargs.items()}
    return [(tuple(p[r] for p in pa), {k: p[r] for k, p in pk.items()}) for r in range(n)]


class WorkerGroup:
    """``world_size`` Ray actors running one worker class. Public worker methods are attributes."""

    def __init__(
        self,
        cls: type[Worker],
        name: str,
        actors: list[Any],
        devices: list[list[Device]],
        hosts: dict[int, str],
        ranks: list[int] | None = None,
    ):
        self.cls, self.name = cls, name
        self._actors, self._devices, self._hosts = actors, devices, hosts
        self._ranks = list(range(len(actors))) if ranks is None else ranks
        if ranks is None:  # a launched group (not a view of one): its actors, by id
            for r, a in enumerate(actors):
                with contextlib.suppress(AttributeError):
                    _WORKER_OF[a._actor_id.hex()] = (weakref.ref(self), r)
        self._on_kill: Callable[[], None] | None = None
        self._killed = False
        self._root: WorkerGroup = self  # the launched group a view was made from
        for attr in dir(cls):
            if attr.startswith("_"):
                continue
            fn = getattr(cls, attr, None)
            if callable(fn) and not isinstance(fn, type) and attr not in _RESERVED:
                mode = getattr(fn, "__loom_dispatch__", "all")
                setattr(self, attr, _GroupMethod(self, attr, mode, self._ranks))

    @classmethod
    def _start(
        cls,
        cluster: Cluster,
        worker_cls: type[Worker],
        per_rank: list[list[Device]],
        args: tuple,
        kwargs: dict,
        name: str,
        num_cpus: float,
        env: dict[str, str] | None,
        cores: list[list[int]] | None = None,
    ) -> tuple[WorkerGroup, Handle]:
        """Start the group's processes without waiting for them: the group, and the handle that
        completes when every rank's constructor has returned (give it to ``_ready``)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote_cls = ray.remote(_hosted_class(worker_cls))
        actors = []
        n = len(per_rank)
        launch_id = uuid.uuid4().hex  # tells this launch's ranks from a replaced group's
        # Until each rank reports its host name (``_ready``), errors name its node's address.
        hosts = {r: cluster.nodes[ds[0].node].ip or "?" for r, ds in enumerate(per_rank)}
        local = ranks_on_node(per_rank)
        try:
            for r, ds in enumerate(per_rank):
                node = cluster.nodes[ds[0].node]
                ctx = {
                    "rank": r,
                    "world_size": n,
                    "local_world_size": local[r],
                    "devices": [d.index for d in ds],
                    "device_kind": ds[0].kind,
                    "visible": ",".join(str(d.local) for d in ds),
                    "group": name,
                    "launch": launch_id,
                    "env": env,
                    "cores": cores[r] if cores else [],
                    "num_cpus": num_cpus,
                }
                actor = remote_cls.options(
                    num_cpus=num_cpus,
                    num_gpus=0,
                    name=None,
                    max_concurrency=getattr(worker_cls, "max_concurrency", 1),  # checked at launch
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                ).remote(ctx, *args, **kwargs)
                actors.append(actor)
        except BaseException as e:
            for a in actors:  # the ranks made before the one that failed
                with contextlib.suppress(Exception):
                    ray.kill(a, no_restart=True)
            if isinstance(e, TypeError) and str(e).startswith("Could not serialize"):
                what = f"starting {name}" + (
                    f" ({worker_cls.__name__})" if name != worker_cls.__name__ else ""
                )
                raise TypeError(_serialization_error(what, worker_cls, args, kwargs, e)) from None
            raise
        group = cls(worker_cls, name, actors, per_rank, hosts)
        return group, Handle(
            group, "__init__", list(range(n)), [a._loom_info.remote() for a in actors]
        )

    def _ready(self, infos: list[dict[str, Any]]) -> WorkerGroup:
        """Record what ``_start``'s handle returned (each rank's host)."""
        self._hosts = {i["rank"]: i["host"] for i in infos}
        self.infos = infos
        return self

    def __getattr__(self, attr: str) -> Any:
        # Only reached for names that are not attributes: a misspelt worker method.
        cls = self.__dict__.get("cls")
        if attr.startswith("_") or cls is None:
            raise AttributeError(attr)
        raise AttributeError(
            f"{self.__dict__.get('name', cls.__name__)}: {cls.__name__} has no method {attr!r}"
            + did_you_mean(attr, public_methods(cls))
        )

    # -------------------------------------------------------------- views and control
    @property
    def world_size(self) -> int:
        return len(self._ranks)

    @property
    def devices(self) -> list[list[int]]:
        return [[d.index for d in self._devices[r]] for r in self._ranks]

    @property
    def actors(self) -> list[Any]:
        return [self._actors[r] for r in self._ranks]

    def on(self, ranks: int | Sequence[int]) -> WorkerGroup:
        """A view of this group restricted to some ranks (calls run only there)."""
        ranks = [ranks] if isinstance(ranks, int) else list(ranks)
        if not ranks:
            raise PlacementError(f"{self.name}.on([]): give at least one of ranks {self._ranks}")
        bad = [r for r in ranks if r not in self._ranks]
        if bad:
            raise PlacementError(
                f"{self.name}: rank(s) {bad} do not exist; ranks are {self._ranks}"
            )
        view = WorkerGroup(self.cls, self.name, self._actors, self._devices, self._hosts, ranks)
        view._root = self._root  # kill() on a view kills the whole group, through its owner
        return view

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Handle:
        """Call a (possibly built-in, underscore) method on every rank of this view."""
        _require_live(self)
        refs = [getattr(self._actors[r], method).remote(*args, **kwargs) for r in self._ranks]
        return Handle(self, method, list(self._ranks), refs)

    def alive(self, timeout: float = 5.0) -> list[bool]:
        """Ping every rank; False for a rank whose process is gone. A rank busy past ``timeout``
        counts as alive (its process exists; it is working)."""
        import ray
        from ray import exceptions as rex

        if self._root._killed:
            return [False] * len(self._ranks)
        _require_ray(self.name)
        out = []
        for r in self._ranks:
            try:
                ray.get(self._actors[r]._loom_ping.remote(), timeout=timeout)
                out.append(True)
            except rex.GetTimeoutError:
                out.append(True)
            except (rex.RayActorError, rex.ActorDiedError, rex.ActorUnavailableError):
                out.append(False)
        return out

    def kill(self) -> None:
        """Kill every process of the group (also when called on a view) and give back what the
        cluster reserved for it."""
        import ray

        if self._root is not self:
            self._root.kill()
            return
        if self._killed:
            return
        # Read items are told first; a rank busy (or hung) past the wait is killed all the same.
        with contextlib.suppress(Exception):
            flushes = [a._loom_flush_reads.remote() for a in self._actors]
            ray.wait(flushes, num_returns=len(flushes), timeout=2 * _FLUSH_S)
        for a in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self._killed = True
        if self._on_kill:
            self._on_kill()

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name}, world_size={self.world_size}, devices={self.devices})"

    def __reduce__(self) -> tuple:
        # Handed to another process (a worker that calls this group, e.g. a rollout calling its
        # tool): the actors, devices and hosts travel; giving the cluster's reservations back
        # on kill() stays with the driver that launched the group.
        return (
            WorkerGroup,
            (self.cls, self.name, self._actors, self._devices, self._hosts, self._ranks),
        )


def public_methods(cls: type) -> list[str]:
    """The methods of a worker class that its group exposes."""
    return [
        a
        for a in dir(cls)
        if not a.startswith("_")
        and a not in _RESERVED
        and callable(getattr(cls, a, None))
        and not isinstance(getattr(cls, a, None), type)
    ]


def did_you_mean(name: str, options: Sequence[str]) -> str:
    """ "; did you mean 'x'?" for the option closest to ``name``, or a list of them all."""
    import difflib

    near = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
    if near:
        return f"; did you mean {near[0]!r}?"
    return f"; its methods are {sorted(options)}" if options else ""


_RESERVED = {"devices_locked", "torch_device"}
_GROUP_ATTRS = {k for k in dir(WorkerGroup) if not k.startswith("_")} | {"name", "cls", "infos"}
