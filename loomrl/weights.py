"""Versioned, bucketed weight sync from a trainer to the workers that use its weights.

The driver calls ``WeightSync(actor, rollout, ...)()`` between iterations. Per receiving rank,
``transport.select_path`` picks the route from where the two processes run and where the
trainer's weights are at that moment:

- CUDA IPC (same GPU, another process): the trainer packs the weights into flat bucket tensors on
  its GPU and shares them by handle; the receiver copies from the mapped memory into its params.
- shared memory (same node, weights in host memory, e.g. a trainer offloaded between phases or a
  CPU-only run): the trainer packs into one POSIX shared-memory segment it keeps for the next
  sync; every receiver on the node copies from it. One write, one read per receiver.
- NCCL (different GPUs) / Gloo (host memory across nodes): the trainer sends each bucket over a
  cached two-rank process group (``transport.Link``) while the receiver waits for it.

Packing casts to the receiver's parameter dtype (bf16 rollout weights from an fp32 trainer move
half the bytes). A receiver applies every bucket before it takes the new version, so it never
generates with half an update; a receiver already at the trainer's version is skipped.

Workers opt in with the ``WeightSource`` / ``WeightSink`` mixins (both default to
``self.engine``). This module imports neither torch nor Ray at import time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from loomrl.errors import ConfigError, LoomError, WorkerDiedError
from loomrl.transport._path import Endpoint, Path, select_path

ALIGN = 64  # bucket offsets: any dtype's view of the flat bytes is aligned
PATHS = ("auto", "shared_memory", "cuda_ipc", "nccl", "gloo")


# --------------------------------------------------------------------------- bucket layout
@dataclass(frozen=True)
class Slot:
    """Where one tensor sits in a flat bucket."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torch dtype name without "torch."
    offset: int
    nbytes: int


def plan_buckets(
    specs: Iterable[tuple[str, tuple[int, ...], str, int]], bucket_bytes: int
) -> list[list[Slot]]:
    """Group (name, shape, dtype, nbytes) tensors into buckets of at most ``bucket_bytes``,
    in order; a tensor larger than the limit forms its own bucket. Offsets are ALIGN-aligned."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be positive")
    buckets: list[list[Slot]] = []
    cur: list[Slot] = []
    pos = 0
    for name, shape, dtype, nbytes in specs:
        if cur and pos + nbytes > bucket_bytes:
            buckets.append(cur)
            cur, pos = [], 0
        cur.append(Slot(name, tuple(shape), dtype, pos, nbytes))
        pos += -(-nbytes // ALIGN) * ALIGN
    if cur:
        buckets.append(cur)
    return buckets


def bucket_nbytes(bucket: list[Slot]) -> int:
    return max((s.offset + s.nbytes for s in bucket), default=0)


def pack(tensors: dict[str, Any], bucket: list[Slot], flat: Any) -> None:
    """Copy (and cast) each tensor of ``bucket`` into the uint8 tensor ``flat``."""
    import torch

    for s in bucket:
        if s.nbytes == 0:
            continue
        dst = flat[s.offset : s.offset + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)
        dst.copy_(tensors[s.name])


def unpack(flat: Any, bucket: list[Slot]) -> list[tuple[str, Any]]:
    """(name, tensor) views of ``flat`` (no copy); they live as long as ``flat``'s memory."""
    import torch

    out = []
    for s in bucket:
        dt = getattr(torch, s.dtype)
        if s.nbytes == 0:
            out.append((s.name, torch.empty(s.shape, dtype=dt, device=flat.device)))
        else:
            out.append((s.name, flat[s.offset : s.offset + s.nbytes].view(dt).view(s.shape)))
    return out


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- routes (pure)
def route(source: dict, sink: dict, force: str = "auto") -> Path:
    """The transport for one receiving rank. ``source``/``sink`` are ``weights_endpoint()``
    answers: node, pid, gpu (physical id or None), and the source's ``location`` ("cpu"/"cuda").
    A forced route that cannot work between the two is refused here, before anything moves."""
    if force not in PATHS:
        raise ValueError(f"path={force!r}: use one of {list(PATHS)}")
    same_node = source["node"] == sink["node"]
    if force == "auto":
        src = Endpoint(source["node"], source["pid"], source["gpu"])
        dst = Endpoint(sink["node"], sink["pid"], sink["gpu"])
        path = select_path(src, dst, source["location"])
        # Two actors never share a process; a same-process pair is a bug upstream.
        return Path.SHARED_MEMORY if path is Path.LOCAL else path
    why = None
    if force == "shared_memory" and not same_node:
        why = "the receiver runs on another node (use 'gloo' or 'nccl')"
    elif force in ("cuda_ipc", "nccl") and source["location"] != "cuda":
        why = "the trainer's weights are not on a GPU now (offloaded, or a CPU trainer)"
    elif force == "cuda_ipc" and (not same_node or sink["gpu"] != source["gpu"]):
        why = "the receiver is not on the trainer's GPU (use 'nccl' between GPUs)"
    elif force == "nccl" and sink["gpu"] is None:
        why = "the receiver has no GPU (use 'shared_memory' or 'gloo')"
    if why:  # ConfigError (a ValueError): the user's run.weight_path, said without a traceback
        raise ConfigError(
            [
                f"run.weight_path: weight sync path={force!r} cannot reach this receiver: {why}; "
                "or run.weight_path=auto to pick a route per receiver"
            ]
        )
    return Path(force)


def cluster_problem(path: str, has_cuda: bool) -> str | None:
    """Why the forced route ``path`` cannot carry any push on a cluster without CUDA GPUs
    (None when it may): said as the run starts, not at its first push, after the model loads
    and the profiling that can take minutes."""
    if path in ("nccl", "cuda_ipc") and not has_cuda:
        return (
            f"run.weight_path: {path!r} moves weights between CUDA GPUs, and this cluster has "
            "none; set run.weight_path=auto (or 'shared_memory' / 'gloo')"
        )
    return None


def _engine_endpoint(engine: Any) -> dict:
    """Where this worker's engine is: node, pid, physical GPU, whether its weights sit on the GPU
    now, their version, and their dtypes (what a receiver wants to be sent)."""
    import torch

    device = getattr(engine, "device", None)
    gpu = None
    if device is not None and device.type == "cuda":
        gpu = str(torch.cuda.get_device_properties(device).uuid)
    here = Endpoint.here(gpu)
    offloaded = getattr(engine, "_offloaded", None) is not None
    # Offloaded parameters keep their dtype (host copies or empty placeholders).
    dtypes = {n: _dtype_name(p.dtype) for n, p in engine.named_parameters()}
    kinds = sorted(set(dtypes.values()))
    return {
        "node": here.node_id,
        "pid": here.pid,
        "gpu": gpu,
        "location": "cuda" if gpu is not None and not offloaded else "cpu",
        "version": int(engine.version),
        "me": _me(),
        # One dtype for every tensor (the usual case), else the per-tensor map.
        "dtype": kinds[0] if len(kinds) == 1 else "mixed",
        "dtypes": None if len(kinds) == 1 else dtypes,
    }


# --------------------------------------------------------------------------- rendezvous
class _KV:
    """Named async actor: peers publish/look up their process-group addresses."""

    def __init__(self) -> None:
        import asyncio

        self.values: dict[str, str] = {}
        self.changed = asyncio.Condition()

    async def publish(self, key: str, value: str) -> None:
        async with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    async def lookup(self, key: str, timeout: float) -> str | None:
        import asyncio

        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: key in self.values), timeout)
            except asyncio.TimeoutError:
                return None
            return self.values[key]


class ActorRendezvous:
    """``transport.Rendezvous`` over one named Ray actor shared by the whole job. ``WeightSync``
    creates it from the driver first, so that the driver owns it: a worker that dies or is
    replaced when the flow re-plans does not take it down."""

    NAME = "loomrl_rendezvous"

    def __init__(self) -> None:
        import ray

        self.actor = (
            ray.remote(_KV)
            .options(name=self.NAME, get_if_exists=True, num_cpus=0, max_concurrency=10_000)
            .remote()
        )

    def publish(self, key: str, value: str) -> None:
        import ray

        ray.get(self.actor.publish.remote(key, value))

    def lookup(self, key: str, timeout: float) -> str:
        import ray

        value = ray.get(self.actor.lookup.remote(key, timeout))
        if value is None:
            raise LoomError(
                f"weight sync: peer {key!r} did not publish its address within {timeout:.0f}s "
                "(did the other side of the transfer die?)"
            )
        return value


_links: dict[tuple[str, str | None], Any] = {}


def _link(device: str | None, timeout: float) -> Any:
    from loomrl.transport import Link

    me = _me()
    key = (me, device)
    if key not in _links:
        _links[key] = Link(me, ActorRendezvous(), device=device, timeout=timeout)
    return _links[key]


def _me() -> str:
    here = Endpoint.here()
    return f"{here.node_id[:16]}:{here.pid}"


# --------------------------------------------------------------------------- worker mixins
class _WeightPeer:
    engine: Any

    def weights_endpoint(self) -> dict:
        return _engine_endpoint(self.engine)

    def weights_drop_links(self) -> int:
        """Forget this process's cached pair groups (after a failed transfer: a group whose
        peer died or whose stream holds an unfinished send must not be reused)."""
        dropped = 0
        for key in [k for k in _links if k[0] == _me()]:
            link = _links.pop(key)
            for pg, _rank, _store in link.groups._groups.values():
                with contextlib.suppress(Exception):
                    pg.abort()
            dropped += 1
        return dropped


class WeightSource(_WeightPeer):
    """Mixin for the worker that owns the trained weights (rank 0 sends; under FSDP every rank
    takes part in gathering each full tensor, one bucket at a time). Override
    ``weights_for_sync`` for models that are not an engine."""

    _w_shm: Any = None
    _w_keep: list | None = None

    @contextlib.contextmanager
    def weights_for_sync(self) -> Iterator[tuple[dict[str, Any], int, Any]]:
        """Yield ({name: parameter}, version, device they are on) for packing."""
        eng = self.engine
        if getattr(eng, "_offloaded", None) == "host" and not getattr(eng, "fsdp", False):
            # Offloaded to host memory between phases: pack from there, no onload needed.
            yield dict(eng.named_parameters()), eng.version, None
            return
        with resident(eng):
            yield dict(eng.named_parameters()), eng.version, eng.device

    def weights_publish(self, kind: str, want: Any, bucket_mb: float) -> dict | None:
        """Pack for CUDA IPC (handles) or shared memory (one segment); rank 0 returns the
        descriptor receivers load from, other ranks (FSDP) only take part in the gathers."""
        import torch

        self.weights_release()
        with self.weights_for_sync() as (params, version, device):
            buckets = _layout(params, want, bucket_mb)
            if getattr(self, "rank", 0) != 0:
                _gather_only(params, buckets)
                return None
            if kind == Path.CUDA_IPC.value:
                if device is None or device.type != "cuda":
                    raise LoomError("weight sync: cuda_ipc needs the trainer's weights on a GPU")
                from loomrl.transport import export_buffers

                flats = []
                for b in buckets:
                    flat = torch.empty(bucket_nbytes(b), dtype=torch.uint8, device=device)
                    _pack_params(params, b, flat)
                    flats.append(flat)
                torch.cuda.synchronize(device)
                # One packed copy stays on the GPU until the receivers have copied from it.
                self._w_keep = flats
                handles = export_buffers(flats, list(range(len(flats))))
                return {"kind": kind, "version": version, "buckets": buckets, "handles": handles}
            total = sum(-(-bucket_nbytes(b) // ALIGN) * ALIGN for b in buckets)
            seg = self._w_segment(total)
            base = torch.frombuffer(seg.buf, dtype=torch.uint8, count=total) if total else None
            offsets, pos = [], 0
            for b in buckets:
                n = bucket_nbytes(b)
                _pack_params(params, b, base[pos : pos + n])
                offsets.append(pos)
                pos += -(-n // ALIGN) * ALIGN
            if device is not None and device.type == "cuda":
                torch.cuda.synchronize(device)
            del base
            return {
                "kind": kind,
                "version": version,
                "buckets": buckets,
                "segment": seg.name,
                "offsets": offsets,
            }

    def weights_send(
        self, peers: list[str], backend: str, want: Any, bucket_mb: float, timeout: float
    ) -> int:
        """Send every bucket to every peer over NCCL/Gloo pair groups; returns bytes sent."""
        import torch

        sent = 0
        with self.weights_for_sync() as (params, version, device):
            buckets = _layout(params, want, bucket_mb)
            if getattr(self, "rank", 0) != 0:
                _gather_only(params, buckets)
                return 0
            if backend == "nccl" and (device is None or device.type != "cuda"):
                raise LoomError("weight sync: nccl needs the trainer's weights on a GPU")
            stage = device if backend == "nccl" else torch.device("cpu")
            link = _link(str(device) if backend == "nccl" else None, timeout)
            for peer in peers:
                link.send({"version": version, "count": len(buckets)}, peer, backend)
            for b in buckets:
                flat = torch.empty(bucket_nbytes(b), dtype=torch.uint8, device=stage)
                _pack_params(params, b, flat)
                for peer in peers:
                    sent += link.send({"bucket": b, "flat": flat}, peer, backend)
        return sent

    def weights_release(self) -> None:
        """Drop the GPU buckets shared by CUDA IPC (the segment is kept for the next sync)."""
        held, self._w_keep = self._w_keep, None
        if held:
            import torch

            del held
            torch.cuda.empty_cache()  # hand the packed copy back to the GPU, not the cache

    def _w_segment(self, nbytes: int) -> Any:
        from multiprocessing import shared_memory

        from loomrl.transport._shm import PREFIX

        seg = self._w_shm
        if seg is not None and seg.size >= nbytes:
            return seg
        if seg is not None:
            _close_segment(seg)
            self._w_shm = None
        from loomrl.transport._shm import free_bytes

        free = free_bytes()
        if free is not None and free < nbytes + _SHM_SPARE:
            raise LoomError(
                f"weight sync: the weights take {nbytes / 2**20:.0f} MB but /dev/shm has "
                f"{free / 2**20:.0f} MB free; give the machine/container more shared memory "
                "(e.g. docker --shm-size) or set run.weight_path=gloo"
            )
        name = f"{PREFIX}{os.getpid()}_w{uuid.uuid4().hex[:8]}"
        seg = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        import atexit

        atexit.register(_close_segment, seg)
        self._w_shm = seg
        return seg


class WeightSink(_WeightPeer):
    """Mixin for workers that use the trainer's weights. Override ``apply_weights`` for
    non-engine models; ``self.engine.version`` is the weights' version in use."""

    def apply_weights(self, named: Iterable[tuple[str, Any]]) -> None:
        with resident(self.engine) as eng:
            eng.set_weights(named)

    def weights_load(self, desc: dict) -> int:
        """Apply a CUDA IPC or shared-memory descriptor: every bucket, then the version."""
        import torch

        # An offloaded receiver comes on once for the whole push, not once per bucket.
        with resident(self.engine):
            if desc["kind"] == Path.CUDA_IPC.value:
                from loomrl.transport import import_buffers

                flats = import_buffers(desc["handles"])
                for flat, b in zip(flats, desc["buckets"], strict=True):
                    self.apply_weights(unpack(flat, b))
                torch.cuda.synchronize()
                del flats
            else:
                from multiprocessing import resource_tracker, shared_memory

                seg = shared_memory.SharedMemory(name=desc["segment"])
                with contextlib.suppress(Exception):
                    # Only the creator may unlink: keep this process's tracker from doing it.
                    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
                try:
                    base = torch.frombuffer(seg.buf, dtype=torch.uint8)
                    for off, b in zip(desc["offsets"], desc["buckets"], strict=True):
                        self.apply_weights(unpack(base[off : off + bucket_nbytes(b)], b))
                    if torch.cuda.is_available():
                        torch.cuda.synchronize()
                    del base
                finally:
                    _close_segment(seg, unlink=False)
        self.engine.version = int(desc["version"])
        return self.engine.version

    def weights_recv(self, peer: str, backend: str, timeout: float) -> int:
        """Receive the buckets ``weights_send`` sends, apply them, then take the version."""
        device = None
        if backend == "nccl":
            device = str(getattr(self.engine, "device", "cuda"))
        link = _link(device, timeout)
        with resident(self.engine):
            head = link.recv(peer, backend)
            for _ in range(int(head["count"])):
                msg = link.recv(peer, backend)
                self.apply_weights(unpack(_as_tensor(msg["flat"]), msg["bucket"]))
        self.engine.version = int(head["version"])
        return self.engine.version


# --------------------------------------------------------------------------- driver side
@dataclass
class SyncReport:
    version: int
    seconds: float
    routes: dict[str, list[int]]  # path -> receiving ranks (of all sinks, in order)
    skipped: int  # receivers already at the version


class WeightSync:
    """Push the source group's weights to every rank of the sink groups, by the best route.

    ``source``/``sinks``: worker groups (or flow groups) whose classes mix in ``WeightSource`` /
    ``WeightSink``. ``path`` forces one route for every receiver ("auto" chooses per rank).
    """

    def __init__(
        self,
        source: Any,
        *sinks: Any,
        bucket_mb: float = 256,
        path: str = "auto",
        timeout: float = 300.0,
    ):
        if path not in PATHS:
            raise ValueError(f"path={path!r}: use one of {list(PATHS)}")
        if not bucket_mb > 0:  # NaN too
            raise ValueError(f"bucket_mb={bucket_mb}: must be positive")
        self.source, self.sinks = source, sinks
        self.bucket_mb, self.path, self.timeout = bucket_mb, path, timeout
        self.last: SyncReport | None = None
        self._rendezvous: ActorRendezvous | None = None

    def __call__(self) -> int:
        from loomrl.worker import wait

        t0 = time.perf_counter()
        src = _group(self.source)
        sinks = [_group(s) for s in self.sinks]
        head = wait(src.weights_endpoint())[0]
        version = head["version"]
        by_route: dict[tuple, tuple[Any, list[tuple[Any, int, dict]]]] = {}
        skipped = 0
        for g in sinks:
            for r, ep in zip(g._ranks, wait(g.weights_endpoint()), strict=True):
                if ep["version"] == version and version > 0:
                    skipped += 1
                    continue
                p = route(head, ep, self.path)
                # Receivers wanting the same dtypes share one packing; mixed ones get their own.
                want = ep["dtype"] if ep["dtypes"] is None else ep["dtypes"]
                key = (p, want if isinstance(want, str) else (g.name, r))
                by_route.setdefault(key, (want, []))[1].append((g, r, ep))
        routes: dict[str, list[int]] = {}
        for (p, _), (want, targets) in by_route.items():
            routes.setdefault(p.value, []).extend(r for _, r, _ in targets)
            if p in (Path.CUDA_IPC, Path.SHARED_MEMORY):
                desc = wait(src.weights_publish(p.value, want, self.bucket_mb))[0]
                try:
                    wait(*[g.on([r]).weights_load(desc) for g, r, _ in targets])
                finally:
                    wait(src.weights_release())
                continue
            if self._rendezvous is None:
                self._rendezvous = ActorRendezvous()  # owned by the driver: outlives workers
            backend = "nccl" if p is Path.NCCL else "gloo"
            peers = [ep["me"] for _, _, ep in targets]
            send = src.weights_send(peers, backend, want, self.bucket_mb, self.timeout)
            recvs = [
                g.on([r]).weights_recv(head["me"], backend, self.timeout) for g, r, _ in targets
            ]
            try:
                wait(send, *recvs)
            except BaseException as err:
                _forget_links([src, *(g.on([r]) for g, r, _ in targets)])
                # A dead receiver also breaks the sender's connection, and either failure may
                # arrive first: name the dead receiver, the cause, whichever it was.
                dead = _dead_receiver(targets)
                if dead is not None and not isinstance(err, WorkerDiedError):
                    raise dead from err
                raise
        self.last = SyncReport(version, time.perf_counter() - t0, routes, skipped)
        return version


def _dead_receiver(targets: list[tuple[Any, int, dict]]) -> WorkerDiedError | None:
    for g, r, _ in targets:
        with contextlib.suppress(Exception):
            if not g.on([r]).alive(timeout=5)[0]:
                return WorkerDiedError(
                    g.name, r, g._hosts.get(r, "?"), "weights_recv", "during a weight push"
                )
    return None


def _forget_links(groups: list[Any]) -> None:
    """Best effort, after a failed collective push: live peers drop their pair groups so the
    next push builds fresh ones (dead peers need nothing)."""
    import ray

    refs = []
    for g in groups:
        for a in g.actors:
            with contextlib.suppress(Exception):
                refs.append(a.weights_drop_links.remote())
    with contextlib.suppress(Exception):
        ray.wait(refs, num_returns=len(refs), timeout=10)


# --------------------------------------------------------------------------- helpers
def _group(g: Any) -> Any:
    """A WorkerGroup from a flow group (whose workers change when the flow re-plans) or itself."""
    return g.group if hasattr(g, "_comp") else g


def _layout(params: dict[str, Any], want: Any, bucket_mb: float) -> list[list[Slot]]:
    """Buckets for ``params`` cast to ``want`` (a dtype name, a {name: dtype} map, or None to
    keep each tensor's own). Shapes are the full ones (a sharded parameter's global shape), so
    nothing is gathered to plan."""
    import torch

    specs = []
    for n, p in params.items():
        dt = want.get(n) if isinstance(want, dict) else want
        dt = dt or _dtype_name(p.dtype)
        specs.append((n, tuple(p.shape), dt, p.numel() * getattr(torch, dt).itemsize))
    return plan_buckets(specs, _bucket_bytes(bucket_mb))


def _bucket_bytes(bucket_mb: float) -> int:
    """``bucket_mb`` in bytes. Any size > 0 is a valid setting: one under a byte leaves each
    tensor a bucket of its own, an infinite one puts them all in one bucket."""
    if bucket_mb * 2**20 >= sys.maxsize:
        return sys.maxsize
    return max(1, int(bucket_mb * 2**20))


def _pack_params(params: dict[str, Any], bucket: list[Slot], flat: Any) -> None:
    """Gather (when sharded) and pack one bucket: at most one bucket's full tensors at a time."""
    pack({s.name: _full(params[s.name]) for s in bucket}, bucket, flat)


def _gather_only(params: dict[str, Any], buckets: list[list[Slot]]) -> None:
    """Non-zero FSDP ranks: take part in every gather, in rank 0's order, and keep nothing."""
    for b in buckets:
        for s in b:
            _full(params[s.name])


_SHM_SPARE = 64 << 20  # left free in /dev/shm beside the weights segment


def _full(p: Any) -> Any:
    t = p.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _as_tensor(x: Any) -> Any:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)


@contextlib.contextmanager
def resident(engine: Any) -> Iterator[Any]:
    """Onload an offloaded engine for the duration of a call made between phases (weight sync,
    evaluation, checkpoint), and put it back the way it was."""
    was_off = bool(getattr(engine, "offloaded", False))
    if was_off:
        engine.onload()
    try:
        yield engine
    finally:
        if was_off:
            engine.offload()


def _close_segment(seg: Any, unlink: bool = True) -> None:
    with contextlib.suppress(BufferError, FileNotFoundError, OSError):
        seg.close()
    if unlink:
        with contextlib.suppress(FileNotFoundError, OSError):
            seg.unlink()


__all__ = [
    "ActorRendezvous",
    "Slot",
    "SyncReport",
    "WeightSink",
    "WeightSource",
    "WeightSync",
    "bucket_nbytes",
    "cluster_problem",
    "pack",
    "plan_buckets",
    "route",
    "unpack",
]
