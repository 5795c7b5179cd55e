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
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from loomrl.errors import LoomError
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
    answers: node, pid, gpu (physical id or None), and the source's ``location`` ("cpu"/"cuda")."""
    if force not in PATHS:
        raise ValueError(f"path={force!r}: use one of {list(PATHS)}")
    if force != "auto":
        return Path(force)
    src = Endpoint(source["node"], source["pid"], source["gpu"])
    dst = Endpoint(sink["node"], sink["pid"], sink["gpu"])
    path = select_path(src, dst, source["location"])
    # Two actors never share a process; a same-process pair is a bug upstream, not a fast path.
    return Path.SHARED_MEMORY if path is Path.LOCAL else path


def _endpoint(device: Any, dtype: Any) -> dict:
    import torch

    gpu = None
    if device is not None and device.type == "cuda":
        gpu = str(torch.cuda.get_device_properties(device).uuid)
    here = Endpoint.here(gpu)
    return {
        "node": here.node_id,
        "pid": here.pid,
        "gpu": gpu,
        "device": str(device) if device is not None else "cpu",
        "dtype": _dtype_name(dtype) if dtype is not None else None,
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
                await asyncio.wait_for(
                    self.changed.wait_for(lambda: key in self.values), timeout
                )
            except asyncio.TimeoutError:
                return None
            return self.values[key]


class ActorRendezvous:
    """``transport.Rendezvous`` over one named Ray actor shared by the whole job."""

    NAME = "loomrl_rendezvous"

    def __init__(self) -> None:
        import ray

        self.actor = (
            ray.remote(_KV)
            .options(name=self.NAME, get_if_exists=True, num_cpus=0, max_concurrency=64)
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
class WeightSource:
    """Mixin for the worker that owns the trained weights (rank 0 sends; under FSDP every rank
    takes part in gathering full tensors). Override ``weights_for_sync`` for non-engine models."""

    engine: Any
    _w_shm: Any = None
    _w_keep: list | None = None

    @contextlib.contextmanager
    def weights_for_sync(self) -> Iterator[tuple[Iterable[tuple[str, Any]], int, Any]]:
        """Yield (named full tensors, version, device they are on) for packing."""
        eng = self.engine
        state = getattr(eng, "_offloaded", None)
        if state == "host" and not getattr(eng, "fsdp", False):
            # Offloaded to host memory between phases: pack from there, no onload needed.
            yield eng.named_parameters(), eng.version, None
            return
        with _resident(eng):
            yield eng.named_parameters(), eng.version, eng.device

    def weights_endpoint(self) -> dict:
        eng = self.engine
        off = getattr(eng, "_offloaded", None) is not None
        dev = None if off else getattr(eng, "device", None)
        ep = _endpoint(getattr(eng, "device", None), None)
        ep["location"] = "cuda" if dev is not None and dev.type == "cuda" else "cpu"
        ep["version"] = int(eng.version)
        ep["me"] = _me()
        return ep

    def weights_publish(self, kind: str, dtype: str | None, bucket_mb: float) -> dict | None:
        """Pack for CUDA IPC (handles) or shared memory (one segment); rank 0 returns the
        descriptor receivers load from, other ranks (FSDP) only take part in the gathers."""
        import torch

        rank0 = getattr(self, "rank", 0) == 0
        self.weights_release()
        with self.weights_for_sync() as (named, version, device):
            tensors = {n: _full(p) for n, p in named}
            buckets = _buckets(tensors, dtype, bucket_mb)
            if not rank0:
                return None
            if kind == Path.CUDA_IPC.value:
                if device is None or device.type != "cuda":
                    raise LoomError("weight sync: cuda_ipc needs the trainer's weights on a GPU")
                from loomrl.transport import export_buffers

                flats = []
                for b in buckets:
                    flat = torch.empty(bucket_nbytes(b), dtype=torch.uint8, device=device)
                    pack(tensors, b, flat)
                    flats.append(flat)
                torch.cuda.synchronize(device)
                self._w_keep = flats  # alive until the receivers have copied (weights_release)
                handles = export_buffers(flats, list(range(len(flats))))
                return {"kind": kind, "version": version, "buckets": buckets, "handles": handles}
            total = sum(-(-bucket_nbytes(b) // ALIGN) * ALIGN for b in buckets)
            seg = self._w_segment(total)
            base = torch.frombuffer(seg.buf, dtype=torch.uint8, count=total) if total else None
            offsets, pos = [], 0
            for b in buckets:
                n = bucket_nbytes(b)
                pack(tensors, b, base[pos : pos + n])
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
        self, peers: list[str], backend: str, dtype: str | None, bucket_mb: float, timeout: float
    ) -> int:
        """Send every bucket to every peer over NCCL/Gloo pair groups; returns bytes sent."""
        import torch

        rank0 = getattr(self, "rank", 0) == 0
        sent = 0
        with self.weights_for_sync() as (named, version, device):
            tensors = {n: _full(p) for n, p in named}
            if not rank0:
                return 0
            stage = device if backend == "nccl" else torch.device("cpu")
            if backend == "nccl" and (device is None or device.type != "cuda"):
                raise LoomError("weight sync: nccl needs the trainer's weights on a GPU")
            buckets = _buckets(tensors, dtype, bucket_mb)
            link = _link(str(device) if backend == "nccl" else None, timeout)
            for peer in peers:
                link.send({"version": version, "count": len(buckets)}, peer, backend)
            for b in buckets:
                flat = torch.empty(bucket_nbytes(b), dtype=torch.uint8, device=stage)
                pack(tensors, b, flat)
                for peer in peers:
                    sent += link.send({"bucket": b, "flat": flat}, peer, backend)
        return sent

    def weights_release(self) -> None:
        """Drop the GPU buckets shared by CUDA IPC (the segment is kept for the next sync)."""
        self._w_keep = None

    def _w_segment(self, nbytes: int) -> Any:
        from multiprocessing import shared_memory

        from loomrl.transport._shm import PREFIX

        seg = self._w_shm
        if seg is not None and seg.size >= nbytes:
            return seg
        if seg is not None:
            _close_segment(seg)
        name = f"{PREFIX}{os.getpid()}_w{uuid.uuid4().hex[:8]}"
        seg = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        import atexit

        atexit.register(_close_segment, seg)
        self._w_shm = seg
        return seg


class WeightSink:
    """Mixin for workers that use the trainer's weights. Override ``apply_weights`` for
    non-engine models; ``self.engine.version`` is the weights' version in use."""

    engine: Any

    def apply_weights(self, named: Iterable[tuple[str, Any]]) -> None:
        with _resident(self.engine) as eng:
            eng.set_weights(named)

    def weights_endpoint(self) -> dict:
        eng = self.engine
        # Offloaded parameters keep their dtype (host copies or empty placeholders).
        dtype = next((p.dtype for _, p in eng.named_parameters()), None)
        ep = _endpoint(getattr(eng, "device", None), dtype)
        ep["version"] = int(eng.version)
        ep["me"] = _me()
        return ep

    def weights_load(self, desc: dict) -> int:
        """Apply a CUDA IPC or shared-memory descriptor: every bucket, then the version."""
        import torch

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
                # Only the creator may unlink: do not let this process's tracker do it at exit.
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
        if bucket_mb <= 0:
            raise ValueError(f"bucket_mb={bucket_mb}: must be positive")
        self.source, self.sinks = source, sinks
        self.bucket_mb, self.path, self.timeout = bucket_mb, path, timeout
        self.last: SyncReport | None = None

    def __call__(self) -> int:
        from loomrl.worker import wait

        t0 = time.perf_counter()
        src = _group(self.source)
        sinks = [_group(s) for s in self.sinks]
        src_eps = wait(src.weights_endpoint())
        head = src_eps[0]
        version = head["version"]
        by_route: dict[tuple[Path, str | None], list[tuple[Any, int, dict]]] = {}
        skipped = 0
        for g in sinks:
            for r, ep in zip(g._ranks, wait(g.weights_endpoint()), strict=True):
                if ep["version"] == version and version > 0:
                    skipped += 1
                    continue
                p = route(head, ep, self.path)
                by_route.setdefault((p, ep["dtype"]), []).append((g, r, ep))
        routes: dict[str, list[int]] = {}
        for (p, dtype), targets in by_route.items():
            routes.setdefault(p.value, []).extend(r for _, r, _ in targets)
            if p in (Path.CUDA_IPC, Path.SHARED_MEMORY):
                desc = wait(src.weights_publish(p.value, dtype, self.bucket_mb))[0]
                try:
                    wait(*[g.on([r]).weights_load(desc) for g, r, _ in targets])
                finally:
                    wait(src.weights_release())
            else:
                backend = "nccl" if p is Path.NCCL else "gloo"
                peers = [ep["me"] for _, _, ep in targets]
                send = src.weights_send(peers, backend, dtype, self.bucket_mb, self.timeout)
                recvs = [
                    g.on([r]).weights_recv(head["me"], backend, self.timeout)
                    for g, r, _ in targets
                ]
                wait(send, *recvs)
        self.last = SyncReport(version, time.perf_counter() - t0, routes, skipped)
        return version


# --------------------------------------------------------------------------- helpers
def _group(g: Any) -> Any:
    """A WorkerGroup from a flow group (whose workers change when the flow re-plans) or itself."""
    return g.group if hasattr(g, "_comp") else g


def _buckets(tensors: dict[str, Any], dtype: str | None, bucket_mb: float) -> list[list[Slot]]:
    """The bucket layout of ``tensors`` cast to ``dtype`` (None: keep each tensor's own)."""
    import torch

    specs = []
    for n, t in tensors.items():
        dt = dtype or _dtype_name(t.dtype)
        specs.append((n, tuple(t.shape), dt, t.numel() * getattr(torch, dt).itemsize))
    return plan_buckets(specs, int(bucket_mb * 2**20))


def _full(p: Any) -> Any:
    t = p.detach()
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _as_tensor(x: Any) -> Any:
    import torch

    return x if isinstance(x, torch.Tensor) else torch.from_numpy(x)


@contextlib.contextmanager
def _resident(engine: Any) -> Iterator[Any]:
    """Onload an offloaded engine for the duration of the block, and put it back."""
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
    "pack",
    "plan_buckets",
    "route",
    "unpack",
]
