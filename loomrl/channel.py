"""Channel: a named, keyed, weighted, bounded FIFO between Ray processes.

A small broker actor holds only metadata (order, weights, keys, stats) and, for
each item, either the item's few bytes (small items, inlined to save a round
trip), the name of a shared-memory slot the producer copied it into (large host
payloads on a one-node cluster: ``loomrl.transport._shm``), or an ObjectRef
(Ray's object store). The broker never fetches payloads, and numpy arrays /
torch tensors are read on the consumer side without a copy.

    ch = Channel.create("rollouts", maxsize=64)      # driver
    worker.run(ch)                                   # the Channel object pickles; pass it to actors
    ch.put({"tokens": t}, weight=len(t))             # producer, blocks while the key is full
    batch = ch.get_batch(target_weight=4096)         # consumer, FIFO until the weights reach 4096
    ch.close()                                       # consumers drain, then get raises ChannelClosed

Keys split one channel into independent FIFOs (``key=None`` is the default
one); ``maxsize`` bounds each key separately. ``wait_taken(key)`` holds a producer
until consumers have taken everything put to ``key`` so far: a flow bounds its hops
in micro-batches with it (one key per micro-batch), not in items. Each put/get may name the calling
component (``src=``/``dst=``, or ``component(...)``/``set_component(...)``); the
broker records which producer fed which consumer (``edges()``), the data-flow
graph the planner uses.

A payload kept by its producer (a shared-memory slot, or the object store) goes when that
process dies: a get that takes such an item raises ChannelItemLost naming the producer, and the
other items of that get go back to the front of their queue, in order. Until they are back they
count as taken: a ``wait_taken`` may return meanwhile, and a bounded queue may hold up to that
many items past its maxsize for a while (producers that waited for room were let in).

A get (put) with no timeout in a process that is no Ray actor (the driver, a Ray task) does not
wait for ever on producers (consumers) that died: it waits in slices of ``DEAD_PEER_CHECK_S``, and
after each empty (full) one the broker checks the processes that have put to (taken from) the
key: Ray actors by a ping, drivers and Ray tasks in Ray's control store (a driver is gone once its
job ended, a task once its worker process is). Once every one of them has died it raises
ChannelPeerDied (a WorkerDiedError) naming them. It keeps waiting while no producer (consumer)
of the key is known yet, or while one of them lives (a task's worker process outlives the task
while Ray keeps it for the next one). Inside actors nothing
changes: a worker's death reaches the driver through ``loomrl.worker.wait``, and a flow's stages
wait on each other on purpose.

A get's call to the broker outlives a consumer actor killed while it waits: Ray does not cancel it,
and the items it took would go to a process that is gone. So the broker pings a consumer actor
whose get has waited ``DEAD_PEER_CHECK_S`` (and again each ``DEAD_PEER_CHECK_S`` after), and once a
ping has failed because the actor died, that get takes nothing more and its items stay first in
their queue for the next consumer. Gets that wait less ping nothing. The items a get of a consumer
actor returns are held by the broker (a lease) until that actor has read them and said so: with its
next get to that channel, or within ``_RELEASE_S`` (0.25 s) in a call of its own that waits for no
answer (``flush_reads``: at once; ``WorkerGroup.kill`` has its workers call it before they are
killed, a flow's redeploys and shutdowns included). When the actor dies first (items that arrived
just after its death, or a reply it never read), the broker finds it dead within about
``DEAD_PEER_CHECK_S`` to twice that, plus the time Ray takes to see the death, and puts the items
back at the front of their queue, in order, for the next consumer; when Ray restarts the actor,
they come back at its new process's first get. Delivery to actors is therefore at least once: an
actor that dies after reading its items but before its word reaches the broker (within about
``_RELEASE_S`` of reading them) has them delivered again. ``stats()`` counts the items ``held`` and
``requeued``. A driver's or a Ray task's get is not held (nothing can ask whether it lives).

This module never imports torch at import time; GPU tensors inside items are
moved to host memory when the channel was created with ``offload=True`` and
shared by CUDA IPC (same node) otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import math
import numbers
import threading
import time
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import Any

from loomrl.errors import (
    ChannelClosed,
    ChannelItemLost,
    ChannelPeerDied,
    ChannelTimeout,
    LoomError,
    check_timeout,
    require_ray,
)
from loomrl.transport import as_host_array, buffer_nbytes, flatten, unflatten

__all__ = [
    "Channel",
    "ChannelExistsError",
    "ChannelNotFoundError",
    "component",
    "current_component",
    "flush_reads",
    "set_component",
]

_NAMESPACE = "loomrl"
_ACTOR_PREFIX = "loomrl.channel."
# Payloads below this size ride inside the broker call: one RPC instead of an
# object-store write, a ref-count registration and a fetch.
INLINE_BYTES = 64 * 1024
_BROKER_CONCURRENCY = 4096
# A driver's get/put without a timeout waits this long at a time, then asks whether the key's
# producers/consumers are all dead (a dead peer is found within about this much).
DEAD_PEER_CHECK_S = 2.0
# How long one liveness check waits for an actor's ping before counting it alive (or busy).
_PING_S = 1.0


class ChannelExistsError(LoomError, ValueError):
    """Channel.create was given a name that is already in use."""


class ChannelNotFoundError(LoomError, LookupError):
    """Channel.connect was given a name no channel has."""


# ----------------------------------------------------------------- component names (data-flow edges)
_component: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "loomrl_component", default=None
)
_process_component: str | None = None


def set_component(name: str | None) -> None:
    """Name this process's component (e.g. a worker group's name) for every put/get it makes."""
    global _process_component
    _process_component = name


@contextlib.contextmanager
def component(name: str) -> Iterator[None]:
    """Within the block, puts and gets are attributed to ``name`` (overrides ``set_component``)."""
    token = _component.set(name)
    try:
        yield
    finally:
        _component.reset(token)


def current_component() -> str:
    """The name puts/gets are attributed to: context, then process, then Ray actor name, then 'driver'."""
    name = _component.get() or _process_component
    if name:
        return name
    import ray

    ctx = ray.get_runtime_context()
    if ctx.worker.mode == ray.WORKER_MODE:
        actor_name = ctx.get_actor_name()
        if actor_name:
            return actor_name
        actor_id = ctx.get_actor_id()
        return f"actor-{actor_id[:8]}" if actor_id else "task"
    return "driver"


# ----------------------------------------------------------------- payload encoding
# Entry layout kept by the broker: (weight, src, nbytes, payload, producer), producer the Ray
# actor id of the process that put a payload living with it (None: inline, or a driver's).
# Payload kinds:
#   ("i", skeleton, [bytearray, ...])        inline, small
#   ("r", [ObjectRef])                        object store; the ref holds (skeleton, [uint8 arrays])
#   ("c", [ObjectRef], node_id)               as "r" but with CUDA IPC handles for device buffers
#   ("s", skeleton, slot name, [(offset, nbytes)], node_id)   a shared-memory slot (one node)
_INLINE, _REF, _IPC, _SHM = "i", "r", "c", "s"
# Host payloads from this size on go through a shared-memory slot when the channel allows it.
SHM_BYTES = 256 * 1024


def _encode(
    item: Any, offload: bool, channel: str, inline_bytes: int, shm: bool = False
) -> tuple[int, tuple]:
    import ray

    try:
        skeleton, buffers = flatten(item, keep_device=not offload)
    except TypeError as err:
        raise TypeError(f"channel {channel!r}: {err}") from None
    nbytes = len(skeleton) + sum(buffer_nbytes(b) for b in buffers)
    device = _device_indices(buffers)
    if device:
        from loomrl.transport import export_buffers

        exported = export_buffers(
            [b if i in device else as_host_array(b) for i, b in enumerate(buffers)], device
        )
        return nbytes, (_IPC, [ray.put((skeleton, exported))], _node_id())
    if nbytes <= inline_bytes:
        # bytearray: the consumer gets writable memory of its own.
        return nbytes, (_INLINE, skeleton, [bytearray(memoryview(b)) for b in buffers])
    if shm and nbytes >= SHM_BYTES:
        from loomrl.transport._shm import write_buffers

        slot = write_buffers(buffers)
        if slot is not None:
            return nbytes, (_SHM, skeleton, slot[0], slot[1], _node_id())
    return nbytes, (_REF, [ray.put((skeleton, [as_host_array(b) for b in buffers]))])


_node: str | None = None


def _node_id() -> str:
    global _node
    if _node is None:
        import ray

        _node = ray.get_runtime_context().get_node_id()
    return _node


_actor: list[str | None] = []


def _actor_id() -> str | None:
    """This process's Ray actor id (None in a driver): who holds a payload it puts."""
    if not _actor:
        import ray

        _actor.append(ray.get_runtime_context().get_actor_id())
    return _actor[0]


_worker: list[str] = []


def _worker_id() -> str:
    """This process's Ray worker id: tells the processes of one actor apart when Ray restarts it
    (the actor id stays)."""
    if not _worker:
        import ray

        _worker.append(ray.get_runtime_context().get_worker_id())
    return _worker[0]


# Peer ids of processes that are no actors (``_process_id``).
_DRIVER, _TASK = "driver:", "task:"

_self_handle: list[Any] = []


def _actor_handle() -> Any:
    """This actor's own handle (only in an actor process): how the broker pings it."""
    if not _self_handle:
        import ray

        _self_handle.append(ray.get_runtime_context().current_actor)
    return _self_handle[0]


# (channel name, broker handle hash, key, "put"/"take") this process has told its broker of.
# Cleared when large (a flow uses a key per micro-batch): telling again is harmless.
_told: set[tuple] = set()
_TOLD_MAX = 65536
# (channel name, broker handle hash) whose broker has this actor's handle: sent once per broker,
# not per key (a handle costs a registration on each side; a flow makes keys by the thousand).
_told_handle: set[tuple[str, int]] = set()


def _process_id() -> str:
    """Who a driver or Ray task is, for a broker that may be asked whether it still runs:
    "driver:<job id>" (a driver's job ends with it) or "task:<worker id>" (the worker process)."""
    import ray

    ctx = ray.get_runtime_context()
    if ctx.worker.mode == ray.SCRIPT_MODE:
        return f"{_DRIVER}{ctx.get_job_id()}"
    return f"{_TASK}{_worker_id()}"


def _peer(name: str, broker: Any, key: Hashable, side: str) -> tuple[str | None, Any] | None:
    """What the broker records of this process as a producer (side "put") or consumer ("take")
    of ``key``, the first time it touches it: (actor id, own handle, or None once the broker has
    it), or (``_process_id()``, None) in a driver or task. None once told."""
    mark = (name, hash(broker), key, side)
    if mark in _told:
        return None
    if len(_told) >= _TOLD_MAX:
        _told.clear()
    _told.add(mark)
    actor = _actor_id()
    if actor is None:
        return _process_id(), None
    if mark[:2] in _told_handle:
        return actor, None
    _told_handle.add(mark[:2])
    return actor, _actor_handle()


# Leases this actor has read and not yet told its brokers of, by broker: (handle, lease numbers).
# A get tells its broker of them with its own call; what no get tells within ``_RELEASE_S`` a
# thread sends alone. A release per get cost a quarter of a one-item get's speed on 2 cores.
_unreleased: dict[tuple[str, int], tuple[Any, list[int]]] = {}
_unreleased_lock = threading.Lock()
_release_thread: list[threading.Thread] = []
_RELEASE_S = 0.25


def _read(name: str, broker: Any, lease: int) -> None:
    """Note that this actor has read the items of ``lease``: its broker hears of it with the next
    get from here, or within ``_RELEASE_S``."""
    with _unreleased_lock:
        _unreleased.setdefault((name, hash(broker)), (broker, []))[1].append(lease)
        if not _release_thread:
            thread = threading.Thread(
                target=_release_loop, name="loomrl-channel-release", daemon=True
            )
            _release_thread.append(thread)
            thread.start()


def _take_read(name: str, broker: Any) -> list[int] | None:
    """The leases read here that a get to ``broker`` now carries (None when there are none)."""
    with _unreleased_lock:
        held = _unreleased.pop((name, hash(broker)), None)
    return held[1] if held else None


def flush_reads(timeout: float | None = None) -> None:
    """Tell every broker now of the leases this process has read and not yet told; with
    ``timeout``, wait up to that many seconds for them to arrive. A worker calls it before it
    is killed on purpose (``WorkerGroup.kill``): what it read then never comes back."""
    timeout = check_timeout(timeout)
    with _unreleased_lock:
        due = list(_unreleased.values())
        _unreleased.clear()
    refs = []
    for broker, leases in due:
        try:
            refs.append(broker.release.remote(leases))
        except Exception:  # a deleted channel: nothing is held for it any more
            pass
    if timeout and refs:
        import ray

        ray.wait(refs, num_returns=len(refs), timeout=timeout)


def _release_loop() -> None:
    while True:
        time.sleep(_RELEASE_S)
        flush_reads()


def _device_indices(buffers: list[Any]) -> tuple[int, ...]:
    if not buffers:
        return ()
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    return tuple(i for i, b in enumerate(buffers) if isinstance(b, torch.Tensor))


class _NotHere(Exception):
    """Some payloads of a batch cannot be read here: ``lost`` (index -> why; gone with their
    producer) and ``elsewhere`` (a message: they live on another node). Raised before any item is
    read, so that the others can go back to the broker untouched."""

    def __init__(self, lost: dict[int, str], elsewhere: str | None):
        self.lost, self.elsewhere = lost, elsewhere


_SLOT_GONE = "its shared-memory slot is gone"  # why a shared-memory payload was lost


def _decode_all(payloads: list[tuple], channel: str) -> list[Any]:
    """The items of ``payloads``, in order. Everything is fetched or attached first and only then
    read: a payload that cannot be read here raises ``_NotHere`` while the others are untouched
    (a shared-memory slot is let go once the views read from it die, and its producer then fills
    it again: a payload read and given back would be overwritten)."""
    import ray

    lost: dict[int, str] = {}
    elsewhere: str | None = None
    ref_at = [i for i, p in enumerate(payloads) if p[0] in (_REF, _IPC)]
    fetched: dict[int, Any] = {}
    if ref_at:
        refs = [payloads[i][1][0] for i in ref_at]
        try:
            fetched = dict(zip(ref_at, ray.get(refs), strict=True))
        except ray.exceptions.ObjectLostError:
            for i, ref in zip(ref_at, refs, strict=True):  # which ones, and keep the rest
                try:
                    fetched[i] = ray.get(ref)
                except ray.exceptions.ObjectLostError as err:
                    lost[i] = type(err).__name__
    here = _node_id() if any(p[0] in (_SHM, _IPC) for p in payloads) else None
    for i, p in enumerate(payloads):
        if p[0] == _SHM:
            if here != p[4]:
                elsewhere = (
                    f"channel {channel!r}: an item sits in shared memory of node {p[4][:12]}, but "
                    f"this consumer runs on node {here[:12]}; create the channel with "
                    "shared_memory=False when consumers may run on other nodes"
                )
                continue
            from loomrl.transport._shm import attach

            try:
                attach(p[2])
            except FileNotFoundError:
                lost[i] = _SLOT_GONE
        elif p[0] == _IPC and i in fetched and here != p[2]:
            elsewhere = (
                f"channel {channel!r}: an item holds GPU tensors shared by CUDA IPC from node "
                f"{p[2][:12]}, but this consumer runs on node {here[:12]}; create the channel "
                "with offload=True to move GPU tensors through host memory across nodes"
            )
    if lost or elsewhere:
        raise _NotHere(lost, elsewhere)
    out = []
    for i, p in enumerate(payloads):
        if p[0] == _INLINE:
            out.append(unflatten(p[1], p[2]))
        elif p[0] == _SHM:
            from loomrl.transport._shm import read_buffers

            out.append(unflatten(p[1], read_buffers(p[2], p[3])))
        else:
            skeleton, buffers = fetched[i]
            if p[0] == _IPC:
                from loomrl.transport import import_buffers

                buffers = import_buffers(buffers)
            out.append(unflatten(skeleton, buffers))
    return out


# ----------------------------------------------------------------- broker actor
class _Peer:
    """An actor process that put to or took from the channel: its Ray actor handle, and the one
    ping to it in flight (kept until it lands, so that a busy actor is not sent a ping per
    check, whichever keys are checked) with the time it was sent."""

    __slots__ = ("handle", "ping", "sent")

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.ping: tuple[Any, asyncio.Future] | None = None
        self.sent = 0.0

    def send(self) -> None:
        """Send a ping (in the broker's event loop); the ref is kept: it owns the ping's object."""
        ref = self.handle.__ray_ready__.remote()
        self.ping, self.sent = (ref, asyncio.wrap_future(ref.future())), time.monotonic()


def _died(err: BaseException | None) -> bool:
    """Whether a ping's outcome says its actor died. ActorUnavailableError: restarting, or not
    reachable for now; it may come back."""
    from ray import exceptions as rex

    return isinstance(err, rex.RayActorError) and not isinstance(err, rex.ActorUnavailableError)


def _caller_died(peer: _Peer, since: float, send: bool = True) -> bool:
    """Whether a ping sent to ``peer`` at or after ``since`` failed because its actor died; with
    ``send``, sends a ping when none is out. Never waits: a synchronous actor blocked in the get
    this checks for answers no ping until that get returns, so a ping still out says nothing. A
    ping sent before ``since`` is not trusted: an actor Ray restarted may have died in an earlier
    life. A ping that landed is sent again only once it is ``DEAD_PEER_CHECK_S`` old: one ping a
    period per actor, however many of its gets wait (an async or threaded actor's may be many)."""
    ping = peer.ping
    if ping is not None and ping[1].done():
        if peer.sent >= since and _died(ping[1].exception()):
            return True  # left in place: other waits on this peer read it too
        if send and time.monotonic() - peer.sent >= DEAD_PEER_CHECK_S:
            peer.ping = None
    if send and peer.ping is None:
        peer.send()
    return False


class _Lease:
    """Items a get of a consumer actor took and returned, held until that consumer says it has
    read them (``release``): if its process dies first they go back to the front of their queue.
    ``since``: when the get began (a ping sent before then may be of an earlier life)."""

    __slots__ = ("key", "caller", "entries", "dst", "since")

    def __init__(self, key, caller, entries, dst, since) -> None:
        self.key, self.caller, self.entries, self.dst, self.since = key, caller, entries, dst, since


class _KeyQueue:
    __slots__ = ("items", "weight", "lock", "not_empty", "not_full", "taken", "stats", "peers")

    def __init__(self) -> None:
        self.items: deque = deque()
        self.weight = 0.0
        self.lock = asyncio.Lock()
        # Two conditions on one lock: producers wait for room, consumers for items; neither polls.
        self.not_empty = asyncio.Condition(self.lock)
        self.not_full = asyncio.Condition(self.lock)
        # Producers in wait_taken wait for a get to complete (stats["got"] to grow).
        self.taken = asyncio.Condition(self.lock)
        self.stats = {"put": 0, "got": 0, "bytes_put": 0, "bytes_got": 0}
        # Producers ("put") and consumers ("take"): Ray actor id (``_process_id`` for drivers and
        # tasks) -> the component name of its first call.
        self.peers: dict[str, dict[str, str]] = {"put": {}, "take": {}}


async def _wait(cond: asyncio.Condition, deadline: float | None) -> bool:
    """Wait on ``cond`` (lock held) until notified or the deadline passes. False on timeout."""
    if deadline is None:
        await cond.wait()
        return True
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    try:
        await asyncio.wait_for(cond.wait(), remaining)
    except asyncio.TimeoutError:
        return False
    return True


async def _wait_until(cond: asyncio.Condition, when: float) -> bool:
    """``_wait`` for a wait on the hot path: a timer, where ``asyncio.wait_for`` makes a task
    (Python 3.11 on; 3.10 has only ``wait_for``)."""
    if not hasattr(asyncio, "timeout_at"):
        return await _wait(cond, when)
    try:
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + when - time.monotonic()):
            await cond.wait()
    except TimeoutError:
        return False
    return True


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + max(0.0, timeout)


class _Broker:
    """Async actor: per-key FIFOs of entries (metadata + inline bytes or a wrapped ObjectRef)."""

    def __init__(
        self, name: str, maxsize: int, offload: bool, shared_memory: bool | None = None
    ) -> None:
        import ray

        self.name, self.maxsize, self.offload = name, maxsize, offload
        # Shared-memory slots are node-local: by default only while the cluster has one node.
        if shared_memory is None:
            shared_memory = sum(1 for n in ray.nodes() if n.get("Alive")) == 1
        self.shm = bool(shared_memory)
        self.queues: dict[Hashable, _KeyQueue] = {}
        self.closed = False
        self.deleted = False  # set by Channel.delete before the actor is killed (kill is async)
        self.edges: dict[tuple[str, str], int] = {}
        self.producers: set[str] = set()
        self.consumers: set[str] = set()
        self.peers: dict[str, _Peer] = {}  # actor processes that put or took, by Ray actor id
        # Items returned to consumer actors and not yet read there, by lease number; the task
        # that looks for their consumers' deaths runs while there are any.
        self.leases: dict[int, _Lease] = {}
        self.last_lease = 0
        self.lease_watch: asyncio.Task | None = None
        self.lives: dict[str, str] = {}  # consumer actor id -> the Ray worker id of its process
        self.requeued = 0  # items put back from leases whose consumer died

    def _add_peer(self, q: _KeyQueue, side: str, peer: tuple, name: str) -> None:
        actor, handle = peer
        if handle is not None and actor not in self.peers:
            self.peers[actor] = _Peer(handle)
        q.peers[side].setdefault(actor, name)

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "maxsize": self.maxsize,
            "offload": self.offload,
            "shm": self.shm,
        }

    def _queue(self, key: Hashable) -> _KeyQueue:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = _KeyQueue()
        return q

    async def put(
        self,
        key: Hashable,
        entries: list[tuple],
        timeout: float | None,
        src: str,
        peer: tuple[str | None, Any] | None = None,
    ):
        """Append entries in order, waiting for room. Returns (status, number appended).
        ``peer``: the calling process, on its first put to ``key`` (``_peer``)."""
        if self.closed:
            return self._closed(), 0
        q = self._queue(key)
        self.producers.add(src)
        if peer is not None:
            self._add_peer(q, "put", peer, src)
        deadline = _deadline(timeout)
        done = 0
        # A producer that died while this call waits for room is not checked for, unlike a
        # consumer in take: its items are still appended. An inline item's bytes are here and
        # as valid as those of a put that returned before the death; a payload that lived with
        # the producer is then reported lost, naming it, by the get that takes it (as for any
        # item its producer outlived). Dropping them would lose data a consumer could read.
        async with q.lock:
            for entry in entries:
                while self.maxsize and len(q.items) >= self.maxsize and not self.closed:
                    if not await _wait(q.not_full, deadline):
                        if len(q.items) < self.maxsize:
                            q.not_full.notify()  # a notify may have raced with the timeout
                        return "timeout", done
                if self.closed:
                    return self._closed(), done
                q.items.append(entry)
                q.weight += entry[0]
                q.stats["put"] += 1
                q.stats["bytes_put"] += entry[2]
                done += 1
                q.not_empty.notify()
            if not self.maxsize or len(q.items) < self.maxsize:
                q.not_full.notify()  # pass on room a woken producer did not use
        return "ok", done

    async def take(
        self,
        key: Hashable,
        count: int | None,
        weight: float | None,
        timeout: float | None,
        dst: str,
        peer: tuple[str | None, Any] | None = None,
        caller: str | None = None,
        worker: str | None = None,
        released: list[int] | None = None,
    ):
        """Pop items FIFO until ``count`` items or ``weight`` summed weight are taken.

        Takes incrementally (room frees for producers while the batch fills). On
        timeout the taken items go back to the front, in order: nothing is lost.
        ``caller``: the calling actor's Ray actor id (None in a driver or task); ``worker``: the
        Ray worker id of its process. Returns (status, entries, lease); status "ok", "closed",
        "timeout" or "caller_dead"; ``lease`` (a number, or None) is to be released by the
        caller once it has read the entries (``release``): an actor caller's entries are held
        until then, and go back to the front of the queue if it dies first (``_watch_leases``).
        ``released``: leases the caller has read since it last said so.

        A call outlives the process that made it: Ray does not cancel it when its caller dies,
        and items it took would go nowhere. So a wait of an actor whose handle this broker holds
        wakes every ``DEAD_PEER_CHECK_S``; from the first wake on, the caller is pinged, and once
        a ping has failed because it died (seen at a wake, or when items come) the items taken go
        back as on timeout and the call returns "caller_dead". A wait that ends before the first
        wake pings nothing.
        """
        called = time.monotonic()
        if released:
            self.release(released)
        if caller is not None and worker is not None and self.lives.get(caller, worker) != worker:
            # Ray restarted this actor: what its earlier process was handed and never read
            # comes back first (pings reach the new process and would never say it died).
            for number in [n for n, ls in self.leases.items() if ls.caller == caller]:
                await self._requeue(number)
        if caller is not None and worker is not None:
            self.lives[caller] = worker
        q = self._queue(key)
        self.consumers.add(dst)
        if peer is not None:
            self._add_peer(q, "take", peer, dst)
        deadline = _deadline(timeout)
        watch = self.peers.get(caller) if caller is not None else None
        began: float | None = None  # when this take began to wait, if it waits on a watched actor
        wake = 0.0  # its next look at the caller
        pinged = False
        taken: list[tuple] = []
        got_weight = 0.0
        async with q.lock:
            while True:
                if (count is not None and len(taken) >= count) or (
                    weight is not None and taken and got_weight >= weight
                ):
                    break
                if q.items:
                    entry = q.items.popleft()
                    q.weight -= entry[0]
                    taken.append(entry)
                    got_weight += entry[0]
                    q.not_full.notify()
                    continue
                if self.closed:
                    if taken:
                        break
                    return self._closed(), [], None
                if watch is None:
                    if not await _wait(q.not_empty, deadline):
                        return self._give_back(q, taken, got_weight, "timeout")
                    continue
                if began is None:
                    began = time.monotonic()
                    wake = began + DEAD_PEER_CHECK_S
                if deadline is not None and deadline <= wake:
                    if not await _wait(q.not_empty, deadline):
                        return self._give_back(q, taken, got_weight, "timeout")
                    continue
                if await _wait_until(q.not_empty, wake):
                    continue
                if _caller_died(watch, began):
                    return self._give_back(q, taken, got_weight, "caller_dead")
                pinged = True
                wake = time.monotonic() + DEAD_PEER_CHECK_S
            if pinged and _caller_died(watch, began, send=False):
                return self._give_back(q, taken, got_weight, "caller_dead")
            if q.items:
                q.not_empty.notify()  # pass on items a woken consumer did not take
            for entry in taken:
                q.stats["got"] += 1
                q.stats["bytes_got"] += entry[2]
                edge = (entry[1], dst)
                self.edges[edge] = self.edges.get(edge, 0) + 1
            if taken:
                q.taken.notify_all()
            lease = None
            if taken and watch is not None:
                lease = self._lease(_Lease(key, caller, taken, dst, called))
        return "ok", taken, lease

    @staticmethod
    def _give_back(q: _KeyQueue, taken: list[tuple], got_weight: float, status: str):
        """End a take that will not return its items (lock held): they go back to the front of
        the queue, in order, uncounted (stats and edges count a take only once it returns)."""
        q.items.extendleft(reversed(taken))
        q.weight += got_weight
        if q.items:
            q.not_empty.notify()
        return status, [], None

    def _put_back(self, q: _KeyQueue, entries: list[tuple], dst: str) -> None:
        """Entries a returned take counted go back to the front of ``q``, in order, as if it had
        not taken them (lock held)."""
        q.items.extendleft(reversed(entries))
        for entry in entries:
            q.weight += entry[0]
            q.stats["got"] -= 1
            q.stats["bytes_got"] -= entry[2]
            edge = (entry[1], dst)
            self.edges[edge] -= 1
            if not self.edges[edge]:
                del self.edges[edge]
        q.not_empty.notify()

    async def untake(
        self, key: Hashable, entries: list[tuple], dst: str, lease: int | None = None
    ) -> None:
        """Put back, at the front of ``key``'s FIFO and in order, entries a get took but did not
        read (others of its batch could not be read there): as if that get had not taken them.
        Releases the get's ``lease``: the rest of its batch is reported lost to its caller."""
        self.leases.pop(lease, None)
        q = self._queue(key)
        async with q.lock:
            self._put_back(q, entries, dst)

    # ------------------------------------------------------------------ leases
    def _lease(self, lease: _Lease) -> int:
        self.last_lease += 1
        self.leases[self.last_lease] = lease
        if self.lease_watch is None or self.lease_watch.done():
            self.lease_watch = asyncio.get_running_loop().create_task(self._watch_leases())
        return self.last_lease

    def release(self, leases: list[int]) -> None:
        """The consumer has read the items of ``leases`` (sent without waiting for an answer)."""
        for number in leases:
            self.leases.pop(number, None)

    async def _requeue(self, number: int) -> None:
        """The items of a lease whose consumer died unread go back to the front of their queue."""
        lease = self.leases.pop(number, None)
        if lease is None or self.deleted:
            return
        q = self._queue(lease.key)
        async with q.lock:
            self._put_back(q, lease.entries, lease.dst)
        self.requeued += len(lease.entries)

    async def _watch_leases(self) -> None:
        """While leases are held: every ``DEAD_PEER_CHECK_S``, ping the consumer of each lease
        held that long (one ping a period per actor, shared with waiting takes) and requeue the
        leases of those a ping found dead. A live consumer releases its lease within about
        ``_RELEASE_S`` of its get's return, so most leases are never pinged for; a busy one
        answers no ping and so is never taken for dead."""
        while self.leases:
            await asyncio.sleep(DEAD_PEER_CHECK_S)
            now = time.monotonic()
            for number, lease in list(self.leases.items()):
                peer = self.peers.get(lease.caller)
                if peer is None or now - lease.since < DEAD_PEER_CHECK_S:
                    continue
                if _caller_died(peer, lease.since):
                    await self._requeue(number)

    async def wait_taken(self, key: Hashable, timeout: float | None) -> str:
        """Wait until gets have taken every item put to ``key`` before this call. Items count as
        taken when the get that took them returns (``stats["got"]``), not while its batch fills.
        Returns "ok", "closed" or "timeout"."""
        q = self._queue(key)
        deadline = _deadline(timeout)
        async with q.lock:
            target = q.stats["put"]
            while q.stats["got"] < target:
                # Closed: no get may come (a failed flow closes its channels to end its stages).
                if self.closed:
                    return self._closed()
                if not await _wait(q.taken, deadline):
                    return "timeout"
        return "ok"

    async def dead_peers(
        self,
        key: Hashable,
        side: str,
        count: int | None = None,
        weight: float | None = None,
    ) -> list[tuple[str, str]] | None:
        """For a caller whose ``side`` ("put"/"take") of ``key`` found no room (too few items
        for a take of ``count`` items or ``weight``): the peers of the other side, as (actor id,
        component name), when there is at least one, all are dead, and the queue still has no
        room (too few items). None otherwise: the wait goes on.

        Checked here rather than by the caller: the queue's state is read in the same place, the
        handles stay in the broker, and every waiting caller shares one ping per peer. A ping is
        awaited, never waited for with a blocking call: this event loop serves every put/get.
        """
        q = self.queues.get(key)
        if q is None:
            return None
        known = q.peers["take" if side == "put" else "put"]
        others = list(known.items())

        def stuck() -> bool:
            if self.closed:
                return False  # the caller's next call says so
            if side == "take":
                if count is not None:
                    return len(q.items) < count
                return not q.items or q.weight < (weight or 0.0)
            return bool(self.maxsize) and len(q.items) >= self.maxsize

        if not others or not stuck():
            return None
        alive = await asyncio.gather(*(_alive(self.peers.get(actor), actor) for actor, _ in others))
        # The key may have moved while the pings were out: an item, room, or a new peer came.
        if any(alive) or not stuck() or len(known) != len(others):
            return None
        return others

    def qsize(self, key: Hashable) -> int:
        q = self.queues.get(key)
        return len(q.items) if q else 0

    def _closed(self) -> str:
        return "deleted" if self.deleted else "closed"

    async def close(self, deleted: bool = False) -> None:
        self.closed = True
        self.deleted = self.deleted or deleted
        if deleted:
            self.leases.clear()
        for q in self.queues.values():
            async with q.lock:
                if deleted:
                    q.items.clear()
                    q.weight = 0.0
                q.not_empty.notify_all()
                q.not_full.notify_all()
                q.taken.notify_all()

    def stats(self) -> dict[str, Any]:
        keys = {
            k: {"qsize": len(q.items), "weight": q.weight, **q.stats}
            for k, q in self.queues.items()
        }
        totals = {
            f: sum(s[f] for s in keys.values()) for f in ("put", "got", "bytes_put", "bytes_got")
        }
        return {
            "name": self.name,
            "maxsize": self.maxsize,
            "closed": self.closed,
            "qsize": sum(s["qsize"] for s in keys.values()),
            **totals,
            "keys": keys,
            "producers": sorted(self.producers),
            "consumers": sorted(self.consumers),
            "edges": dict(self.edges),
            # Items handed to consumer actors and not yet read there; items put back because
            # their consumer died before reading them.
            "held": sum(len(lease.entries) for lease in self.leases.values()),
            "requeued": self.requeued,
        }

    def edge_set(self) -> set[tuple[str, str]]:
        return set(self.edges)


async def _alive(peer: _Peer | None, who: str = "") -> bool:
    """False only when Ray says the peer's actor died; a ping still out after ``_PING_S`` means
    alive or busy (a threaded actor runs it after its current call). A driver or a task (no
    handle; ``who`` its ``_process_id``) is asked of Ray's control store: dead once its job ended
    (a driver) or its worker process is gone (a task). Each check after a landed ping sends a new
    one: an actor Ray restarts (its max_restarts) comes back under the same handle."""
    if peer is None:
        return await asyncio.to_thread(_process_alive, who)
    if peer.ping is None:
        peer.send()
    # Held here: another check of this peer may drop or replace peer.ping while this one waits.
    future = peer.ping[1]
    done, _ = await asyncio.wait({future}, timeout=_PING_S)
    if not done:
        return True
    if peer.ping is not None and peer.ping[1] is future:
        peer.ping = None
    return not _died(future.exception())


def _process_alive(who: str) -> bool:
    """Whether the driver or task ``who`` (``_process_id``) still runs, as Ray's control store
    says; True when it cannot say (an unknown id, or its tables cannot be read)."""
    from ray._private import state

    try:
        if who.startswith(_DRIVER):
            job = who[len(_DRIVER) :]
            return not any(
                j.get("JobID") == job and j.get("IsDead") for j in state.state.job_table()
            )
        if who.startswith(_TASK):
            return who[len(_TASK) :] in state.state.workers()  # it lists live workers only
    except Exception:  # a private table whose form may change: never take a peer for dead on it
        return True
    return True


_remote_broker = None


def _broker_class():
    global _remote_broker
    if _remote_broker is None:
        import ray

        _remote_broker = ray.remote(num_cpus=0, max_concurrency=_BROKER_CONCURRENCY)(_Broker)
    return _remote_broker


def _require_ray(what: str = "") -> None:
    require_ray(what, "channels live on a Ray cluster: start one with loomrl.Cluster.start()")


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not name:
        raise ValueError(f"channel name must be a non-empty string, got {name!r}")


def _check_maxsize(maxsize: Any) -> int:
    if not isinstance(maxsize, numbers.Integral) or isinstance(maxsize, bool) or maxsize < 0:
        raise ValueError(f"maxsize={maxsize!r} must be an int >= 0 (0 means unbounded)")
    return int(maxsize)


def _check_flag(value: Any, what: str, none: str | None = None) -> None:
    """A bool setting; a string such as "no" would read as True."""
    if isinstance(value, bool) or (none is not None and value is None):
        return
    allowed = "True or False" + (f" (or None: {none})" if none else "")
    raise ValueError(f"{what}={value!r} must be {allowed}")


_PLAIN_KEYS = (str, int, type(None))


def _check_key(key: Any, channel: str) -> None:
    """A key names one FIFO of the broker's dict: it must be hashable (a tuple, not a list),
    and the broker's copy must equal the caller's: an object equal only to itself, or NaN,
    named a new FIFO on every call, and what was put under it could never be got."""
    if type(key) in _PLAIN_KEYS or (
        type(key) is tuple and all(type(k) in _PLAIN_KEYS for k in key)
    ):
        return  # the usual keys, without a pickle per put
    try:
        hash(key)
    except TypeError:
        raise TypeError(
            f"channel {channel!r}: key {key!r} is not hashable ({type(key).__name__}); use a "
            "str, an int or a tuple"
        ) from None
    from ray import cloudpickle

    try:
        copy = cloudpickle.loads(cloudpickle.dumps(key))
        same = bool(copy == key) and hash(copy) == hash(key)
    except Exception:
        same = False
    if not same:
        raise TypeError(
            f"channel {channel!r}: key {key!r} ({type(key).__name__}) is not equal to its copy "
            "in the channel's broker (an object equal only to itself, or NaN): nothing put "
            "under it could be got; use a str, an int or a tuple of those"
        )


def _as_number(value: Any) -> float | None:
    """``value`` as a float when it is a real number: Python's, numpy's or a one-element
    tensor's (``mask.sum()`` is a natural token count); None for anything else, bools and
    text included (``"2"`` would read as a number only by accident)."""
    if isinstance(value, (bool, str, bytes)):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of several elements
        return None
    return out


def _check_weights(weights: list[Any], channel: str) -> list[float]:
    """A weight is an item's share of a get_batch target: a negative one would let a batch
    take more items than its target allows, and a NaN one would never reach it."""
    out = []
    for w in weights:
        f = _as_number(w)
        if f is None:
            raise ValueError(
                f"channel {channel!r}: weight={w!r} ({type(w).__name__}) is not a number; give "
                "each item's weight as a number >= 0 (e.g. its token count)"
            )
        if not (math.isfinite(f) and f >= 0):
            raise ValueError(
                f"channel {channel!r}: item weights must be finite and >= 0 (e.g. token "
                f"counts), got weight={w!r}"
            )
        out.append(f)
    return out


# ----------------------------------------------------------------- public handle
class Channel:
    """Handle on a named channel. Cheap to pickle: pass it to Ray actors and tasks as an argument."""

    def __init__(
        self,
        name: str,
        broker: Any = None,
        offload: bool = False,
        maxsize: int = 0,
        inline_bytes: int = INLINE_BYTES,
        shm: bool = False,
    ):
        # Use Channel.create / connect / get_or_create; this only wraps an existing broker.
        if broker is None:  # Channel("rollouts", maxsize=4): what create is for
            raise TypeError(
                f"Channel({name!r}) only wraps a channel that exists: make one with "
                f"Channel.create({name!r}, maxsize=...), or attach to one with "
                f"Channel.connect({name!r}) or Channel.get_or_create({name!r})"
            )
        self.name = name
        self.maxsize = maxsize
        self.offload = offload
        self._broker = broker
        self._inline_bytes = inline_bytes
        self._shm = shm

    def __reduce__(self):
        return Channel, (
            self.name,
            self._broker,
            self.offload,
            self.maxsize,
            self._inline_bytes,
            self._shm,
        )

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, maxsize={self.maxsize}, offload={self.offload})"

    # ------------------------------------------------------------- lifecycle
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        offload: bool = False,
        shared_memory: bool | None = None,
    ) -> Channel:
        """Create channel ``name``. ``maxsize`` bounds each key's queue (0 = unbounded).

        ``offload=True`` moves GPU tensors inside items to host memory before they are put.
        ``shared_memory``: large host payloads travel through shared-memory slots (one copy,
        read in place) instead of the object store; node-local, so the default (None) uses them
        only when the Ray cluster has a single node. Raises ChannelExistsError when the name is
        taken.
        """
        return cls.create_many([name], [maxsize], offload, shared_memory)[0]

    @classmethod
    def create_many(
        cls,
        names: list[str],
        maxsizes: list[int],
        offload: bool = False,
        shared_memory: bool | None = None,
    ) -> list[Channel]:
        """Create a channel per name, ``maxsizes[i]`` bounding channel ``names[i]`` (as
        ``create``). Every broker process starts before any is waited for: each is a Ray actor
        whose start takes most of a second, and a flow makes one per hop. All or nothing: when
        a name is taken, the channels this call made are deleted and ChannelExistsError raised.
        """
        import ray

        if len(names) != len(maxsizes):
            raise ValueError(f"{len(names)} names but {len(maxsizes)} maxsizes: give one each")
        for name in names:
            _check_name(name)
        maxsizes = [_check_maxsize(m) for m in maxsizes]
        _check_flag(offload, "offload")
        _check_flag(shared_memory, "shared_memory", none="only while the cluster has one node")
        _require_ray()
        brokers: list[Any] = []
        try:
            for name, maxsize in zip(names, maxsizes, strict=True):
                if _lookup(name) is not None:
                    raise _exists(name)
                try:
                    brokers.append(
                        _broker_class()
                        .options(name=_ACTOR_PREFIX + name, namespace=_NAMESPACE, lifetime=None)
                        .remote(name, maxsize, offload, shared_memory)
                    )
                except ValueError as err:  # lost a race with another creator
                    raise _exists(name) from err
            infos = ray.get([b.info.remote() for b in brokers])
        except BaseException:
            for b in brokers:
                with contextlib.suppress(Exception):
                    ray.kill(b, no_restart=True)
            raise
        return [
            cls(name, b, info["offload"], info["maxsize"], shm=info["shm"])
            for name, b, info in zip(names, brokers, infos, strict=True)
        ]

    @classmethod
    def connect(cls, name: str, timeout: float | None = 0.0) -> Channel:
        """Attach to an existing channel, waiting up to ``timeout`` seconds (None: for ever) for
        it to be created."""
        import ray

        _check_name(name)
        timeout = check_timeout(timeout)
        _require_ray()
        deadline = _deadline(timeout)
        delay = 0.01
        while (broker := _lookup(name)) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise ChannelNotFoundError(
                    f"no channel named {name!r}; create it with Channel.create({name!r}) "
                    "(or use Channel.get_or_create)"
                )
            time.sleep(delay)  # one-off setup wait, not the data path
            delay = min(delay * 2, 0.2)
        info = ray.get(broker.info.remote())
        return cls(name, broker, info["offload"], info["maxsize"], shm=info["shm"])

    @classmethod
    def get_or_create(
        cls, name: str, maxsize: int | None = None, offload: bool | None = None
    ) -> Channel:
        """Attach to channel ``name``, creating it with these settings if it does not exist yet.

        Settings left as None take the existing channel's values (or the defaults, 0 and False,
        when this call creates it). A setting given explicitly that differs from the existing
        channel's raises ValueError: two parts of a program that disagree on a queue bound would
        otherwise find out only as a deadlock or an unbounded queue.
        """
        import ray

        _check_name(name)
        if maxsize is not None:
            maxsize = _check_maxsize(maxsize)
        _check_flag(offload, "offload", none="the existing channel's, or False")
        _require_ray()
        broker = (
            _broker_class()
            .options(name=_ACTOR_PREFIX + name, namespace=_NAMESPACE, get_if_exists=True)
            .remote(name, maxsize or 0, bool(offload))
        )
        info = ray.get(broker.info.remote())
        for key, asked in (("maxsize", maxsize), ("offload", offload)):
            if asked is not None and asked != info[key]:
                raise ValueError(
                    f"channel {name!r} already exists with {key}={info[key]!r}, not {asked!r}; "
                    f"pass {key}={info[key]!r} (or leave it out) to attach, or choose another name"
                )
        return cls(name, broker, info["offload"], info["maxsize"], shm=info["shm"])

    def close(self) -> None:
        """No more puts; consumers drain what is left, then get raises ChannelClosed."""
        self._call("close")

    def delete(self) -> None:
        """Close and destroy the channel; the name becomes free. Items still queued are dropped.
        Deleting a deleted channel, or one whose Ray has stopped (it went with it), does nothing."""
        import ray

        if not ray.is_initialized():
            return
        with contextlib.suppress(Exception):
            ray.get(self._broker.close.remote(deleted=True))
        with contextlib.suppress(Exception):  # a handle from a Ray instance that has stopped
            ray.kill(self._broker, no_restart=True)

    # ------------------------------------------------------------- producing
    def put(
        self,
        item: Any,
        weight: float = 1.0,
        key: Hashable = None,
        timeout: float | None = None,
        src: str | None = None,
    ) -> None:
        """Append ``item`` to ``key``'s FIFO. Blocks while the key holds ``maxsize`` items.

        Raises ChannelTimeout after ``timeout`` seconds without room, ChannelClosed if closed,
        TypeError naming the type if the item cannot be pickled.
        """
        self.put_many([item], [weight], key=key, timeout=timeout, src=src)

    def put_many(
        self,
        items: Sequence[Any],
        weights: Iterable[float] | None = None,
        key: Hashable = None,
        timeout: float | None = None,
        src: str | None = None,
    ) -> None:
        """Append several items in order with one broker call (much faster than a put per item).

        On ChannelTimeout/ChannelClosed, the first ``err.items_put`` items were put.
        """
        timeout = check_timeout(timeout)
        _check_key(key, self.name)
        # Before anything asks Ray (the component name, ray.put): that would start a new Ray.
        _require_ray(f"channel {self.name!r}: ")
        if isinstance(items, (str, bytes, dict)) or not isinstance(items, Iterable):
            # A string would go as one item per character, a dict as its keys.
            raise TypeError(
                f"channel {self.name!r}: put_many takes a list of items, got "
                f"{type(items).__name__}; to send this one object, use put(item)"
            )
        items = list(items)
        weights = [1.0] * len(items) if weights is None else list(weights)
        if len(weights) != len(items):
            raise ValueError(f"put_many got {len(items)} items but {len(weights)} weights")
        weights = _check_weights(weights, self.name)
        src = src or current_component()
        entries = []
        for item, w in zip(items, weights, strict=True):
            nbytes, payload = _encode(item, self.offload, self.name, self._inline_bytes, self._shm)
            holder = None if payload[0] == _INLINE else _actor_id()
            entries.append((w, src, nbytes, payload, holder))
        if not entries:
            return
        peer = _peer(self.name, self._broker, key, "put")
        sliced = timeout is None and _actor_id() is None
        done = 0
        while True:
            status, n = self._call(
                "put",
                key,
                entries[done:] if done else entries,
                DEAD_PEER_CHECK_S if sliced else timeout,
                src,
                peer,
            )
            done, peer = done + n, None
            if status != "timeout" or not sliced:
                break
            dead = self._call("dead_peers", key, "put")
            if dead:
                err: Exception = self._peer_died(key, "put", dead, done, len(entries))
                err.items_put = done  # type: ignore[attr-defined]
                raise err
        if status == "ok":
            return
        if status == "timeout":
            err = ChannelTimeout(
                f"channel {self.name!r} key {key!r}: no room after {timeout}s "
                f"(maxsize={self.maxsize}, {done} of {len(entries)} items put); "
                "consumers are slower than producers, or none is running"
            )
        elif status == "deleted":
            err = self._deleted_error()
        else:
            err = ChannelClosed(
                f"channel {self.name!r} is closed; cannot put ({done} of {len(entries)} items put)"
            )
        err.items_put = done  # type: ignore[attr-defined]
        raise err

    # ------------------------------------------------------------- consuming
    def get(
        self, key: Hashable = None, timeout: float | None = None, dst: str | None = None
    ) -> Any:
        """Remove and return the oldest item of ``key``, waiting for one.

        Raises ChannelTimeout after ``timeout`` seconds, ChannelClosed once closed and drained.
        """
        return self._take(key, 1, None, timeout, dst)[0]

    def get_many(
        self, n: int, key: Hashable = None, timeout: float | None = None, dst: str | None = None
    ) -> list[Any]:
        """Remove and return the next ``n`` items (fewer only when the channel closes first)."""
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(
                f"get_many: n={n!r} must be a whole number >= 1 (how many items to take)"
            )
        n = int(n)
        return self._take(key, n, None, timeout, dst)

    def get_batch(
        self,
        target_weight: float,
        key: Hashable = None,
        timeout: float | None = None,
        dst: str | None = None,
    ) -> list[Any]:
        """Take items FIFO until their summed weight reaches ``target_weight``.

        Consumers asking for the same target get batches of about the same weight
        (e.g. token counts) whatever the item sizes. On timeout nothing is taken.
        When the channel closes, the last batch may be lighter.
        """
        target = _as_number(target_weight)
        if target is None or not target > 0:
            raise ValueError(f"target_weight={target_weight!r} must be a number > 0")
        return self._take(key, None, target, timeout, dst)

    def _take(self, key, count, weight, timeout, dst) -> list[Any]:
        timeout = check_timeout(timeout)
        _check_key(key, self.name)
        _require_ray(f"channel {self.name!r}: ")  # before current_component, as in put_many
        dst = dst or current_component()
        peer = _peer(self.name, self._broker, key, "take")
        caller = _actor_id()
        worker = None if caller is None else _worker_id()
        released = None if caller is None else _take_read(self.name, self._broker)
        sliced = timeout is None and caller is None
        while True:
            status, got, lease = self._call(
                "take",
                key,
                count,
                weight,
                DEAD_PEER_CHECK_S if sliced else timeout,
                dst,
                peer,
                caller,
                worker,
                released,
            )
            peer = released = None
            if status == "caller_dead":
                # Meant for a caller that died; a live one (Ray was wrong) took nothing: without
                # a timeout it asks again, with one it reports a timeout.
                if timeout is None:
                    continue
                status = "timeout"
            if status != "timeout" or not sliced:
                break
            dead = self._call("dead_peers", key, "take", count, weight)
            if dead:
                raise self._peer_died(key, "take", dead)
        if status == "deleted":
            raise self._deleted_error()
        if status == "closed":
            raise ChannelClosed(f"channel {self.name!r} is closed and key {key!r} is drained")
        if status == "timeout":
            what = "nothing to get" if count in (None, 1) else f"fewer than {count} items to get"
            raise ChannelTimeout(
                f"channel {self.name!r} key {key!r}: {what} after {timeout}s (nothing was taken)"
            )
        try:
            items = _decode_all([entry[3] for entry in got], self.name)
        except _NotHere as e:
            # The items that can be read stay in the channel, first in their queue as before.
            keep = [entry for i, entry in enumerate(got) if i not in e.lost]
            if keep:
                self._call("untake", key, keep, dst, lease)
                lease = None
            if e.elsewhere is not None:
                raise LoomError(e.elsewhere) from None
            from loomrl.worker import worker_name

            producers = sorted({got[i][4] for i in e.lost if got[i][4]})
            # By worker where this process launched it (a driver's get), else by component.
            who = sorted({worker_name(got[i][4]) or got[i][1] for i in e.lost})
            back = f"; the {len(keep)} other item(s) of this get are back, first in the queue"
            back = back if keep else ""
            why = sorted(set(e.lost.values()))
            # Ray loses an object with its owner (OwnerDiedError) or with the node that held it
            ended = "ended" if set(why) <= {"OwnerDiedError", _SLOT_GONE} else "or its node ended"
            raise ChannelItemLost(
                f"channel {self.name!r} key {key!r}: {len(e.lost)} item(s) put by "
                f"{', '.join(who)} are lost ({'; '.join(why)}): the process that put them "
                f"{ended} before they were taken, and an item too large to "
                f"ride inside the channel (over {self._inline_bytes} bytes) stays with the "
                f"process that put it until taken{back}. Put the lost items again (a run "
                "restarts from its last checkpoint: run.max_restarts)",
                producers=tuple(producers),
            ) from None
        finally:
            if lease is not None:  # read (or unreadable anywhere): no one else may take them
                _read(self.name, self._broker, lease)
        return items

    def wait_taken(self, key: Hashable = None, timeout: float | None = None) -> None:
        """Block until consumers have taken every item put to ``key`` before this call (an item
        counts once the get that took it has returned). A producer that calls it before making
        its next item for a key it fed runs at most that far ahead of the key's consumer.

        Raises ChannelTimeout after ``timeout`` seconds, ChannelClosed once the channel is
        closed with items of ``key`` still untaken.
        """
        timeout = check_timeout(timeout)
        _check_key(key, self.name)
        status = self._call("wait_taken", key, timeout)
        if status == "deleted":
            raise self._deleted_error()
        if status == "closed":
            raise ChannelClosed(
                f"channel {self.name!r} is closed with items of key {key!r} not yet taken"
            )
        if status == "timeout":
            raise ChannelTimeout(
                f"channel {self.name!r} key {key!r}: items put are not all taken after "
                f"{timeout}s; the consumer is slower than planned, or none is running"
            )

    # ------------------------------------------------------------- inspection
    def qsize(self, key: Hashable = None) -> int:
        """Items waiting in ``key``'s FIFO."""
        _check_key(key, self.name)
        return self._call("qsize", key)

    def stats(self) -> dict[str, Any]:
        """Counts and bytes put/got, per key and in total, producers, consumers and edge counts."""
        return self._call("stats")

    def edges(self) -> set[tuple[str, str]]:
        """(producer, consumer) component pairs that actually exchanged items through this channel."""
        return self._call("edge_set")

    def _peer_died(
        self, key: Hashable, side: str, dead: list[tuple[str, str]], done: int = 0, of: int = 0
    ) -> ChannelPeerDied:
        """ChannelPeerDied for a wait on ``side`` of ``key`` whose other side (``dead``: actor
        id, component name) has all died; named by worker where this process launched it."""
        from loomrl.worker import _worker_of, worker_name

        who = [worker_name(actor) or _peer_label(actor, name) for actor, name in dead]
        group, rank = _worker_of(dead[0][0])
        worker, host = (
            (group.name, group._hosts.get(rank, "unknown")) if group else (dead[0][1], "unknown")
        )
        if side == "take":
            # Items may wait that are too few (or too light) for a get_many / get_batch: say so,
            # they are still there for a smaller get.
            waiting = self.qsize(key)
            head = (
                f"every producer of this key has died ({', '.join(who)}); nothing more can arrive"
                + (f" ({waiting} item(s) wait, fewer than this get asks for)" if waiting else "")
            )
            fix = "Pass a timeout to get() or restart the producers"
        else:
            head = (
                f"every consumer of this key has died ({', '.join(who)}); no room can come "
                f"({done} of {of} items put)"
            )
            fix = "Pass a timeout to put() or restart the consumers"
        return ChannelPeerDied(
            f"channel {self.name!r} key {key!r}: {head}. {fix}",
            self.name,
            key,
            tuple(actor for actor, _ in dead),
            worker,
            rank if group else -1,
            host,
        )

    def _deleted_error(self) -> ChannelClosed:
        return ChannelClosed(f"channel {self.name!r} was deleted (its broker is gone)")

    def _call(self, method: str, *args: Any) -> Any:
        """Call the broker. Checked first: a call without Ray would start a new Ray instance
        (Ray does on a first remote call), where no broker of this channel lives."""
        import ray

        _require_ray(f"channel {self.name!r}: ")
        try:
            return ray.get(getattr(self._broker, method).remote(*args))
        except ray.exceptions.RayActorError as err:
            raise self._deleted_error() from err
        except Exception as err:
            if "Can't find actor" not in str(err):
                raise
            raise ChannelClosed(
                f"channel {self.name!r} was made on a Ray instance that has stopped (its "
                "Cluster was shut down); create it again on this one"
            ) from None


def _peer_label(peer: str, name: str) -> str:
    """How a message names a peer this process did not launch: by kind and id, then component."""
    if peer.startswith(_DRIVER):
        return f"the driver of job {peer[len(_DRIVER) :]} {name!r}"
    if peer.startswith(_TASK):
        return f"a Ray task in worker {peer[len(_TASK) : len(_TASK) + 8]} {name!r}"
    return f"actor-{peer[:8]} {name!r}"


def _lookup(name: str) -> Any:
    import ray

    try:
        return ray.get_actor(_ACTOR_PREFIX + name, namespace=_NAMESPACE)
    except ValueError:
        return None


def _exists(name: str) -> ChannelExistsError:
    return ChannelExistsError(
        f"channel {name!r} already exists; use Channel.connect({name!r}) to attach to it "
        "or choose another name"
    )
