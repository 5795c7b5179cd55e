"""Shared-memory slots for large host payloads between the processes of one node.

``ray.put`` of a large array costs several times a memcpy here (allocation, sealing, page faults
on fresh object-store pages: ~33 ms for 64 MB against a 6-9 ms copy). A producer process keeps a
pool of POSIX shared-memory segments ("slots") instead: a payload is copied once into a free
slot, the channel carries the slot's name and offsets, and the consumer maps the slot and reads
the arrays in place (zero-copy).

A slot's first byte says who has it: 1 from the moment the producer fills it until every array
the consumer built on it is garbage-collected, then 0 (the consumer's finalizer writes it), and
the producer may fill it again. A slot whose item is never taken (a deleted channel) stays
taken; the pool stops growing at its byte limit and callers then fall back to the object store.
Segments are named after their creator's pid and unlinked when it exits normally; a process
killed outright leaves them behind, so ``loomrl.Cluster`` sweeps slots of dead creators when it
starts and shuts down (``sweep_orphans``). A consumer's own mapping outlives the name. This module
never imports torch.
"""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np

from loomrl.transport._flatten import as_host_array, buffer_nbytes

HEADER = 64  # bytes before the data; byte 0 is the slot's taken flag
ALIGN = 64
MIN_SLOT = 1 << 20
# Keep this much of /dev/shm free for everyone else (Ray's object store lives there too).
_SPARE_BYTES = 1 << 30


def _limit_bytes() -> int:
    env = os.environ.get("LOOMRL_SHM_BYTES")
    if env:
        try:
            return int(env)
        except ValueError:
            from loomrl.errors import ConfigError

            raise ConfigError(
                [f"LOOMRL_SHM_BYTES={env!r}: must be a whole number of bytes (0 turns slots off)"]
            ) from None
    try:
        st = os.statvfs("/dev/shm")
        return min(1 << 30, st.f_bavail * st.f_frsize // 8)
    except OSError:
        return 0


class SlotPool:
    """This process's slots (one segment each), reused once their consumer let go."""

    def __init__(self, limit_bytes: int | None = None):
        self.limit = _limit_bytes() if limit_bytes is None else limit_bytes
        self.slots: list[shared_memory.SharedMemory] = []
        self.total = 0
        self._lock = threading.Lock()

    def acquire(self, nbytes: int) -> shared_memory.SharedMemory | None:
        """A free slot of at least ``nbytes`` data bytes, marked taken; None when the pool is
        at its limit (or /dev/shm is short)."""
        with self._lock:
            free = [s for s in self.slots if s.buf[0] == 0 and s.size - HEADER >= nbytes]
            slot = min(free, key=lambda s: s.size) if free else None
            if slot is None:
                size = HEADER + max(MIN_SLOT, 1 << max(0, nbytes - 1).bit_length())
                if self.total + size > self.limit or not _room_for(size):
                    return None
                name = _own_prefix() + uuid.uuid4().hex[:10]
                slot = shared_memory.SharedMemory(name=name, create=True, size=size)
                self.slots.append(slot)
                self.total += size
            slot.buf[0] = 1
            return slot

    def in_use(self) -> int:
        return sum(1 for s in self.slots if s.buf[0] != 0)

    def close(self) -> None:
        with self._lock:
            for s in self.slots:
                try:
                    s.close()
                    s.unlink()
                except (BufferError, FileNotFoundError):
                    pass
            self.slots, self.total = [], 0


PREFIX = "loomrl_"


def _own_prefix() -> str:
    """How the names of the slots this process creates begin (``sweep_orphans`` reads the pid)."""
    return f"{PREFIX}{os.getpid()}_"


def sweep_orphans(directory: str = "/dev/shm") -> int:
    """Unlink slots whose creating process is gone (killed workers cannot clean up after
    themselves: Ray stops actors with SIGKILL). Slot names carry the creator's pid. A consumer
    that still maps such a slot keeps its memory; only the name goes. Returns how many."""
    from loomrl.checkpoint import pid_alive

    removed = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(PREFIX):
            continue
        try:
            pid = int(name[len(PREFIX) :].split("_", 1)[0])
        except ValueError:
            continue
        if pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(directory, name))
            removed += 1
        except OSError:
            pass
    return removed


def free_bytes() -> int | None:
    """Free bytes in /dev/shm (None where it cannot be read)."""
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _room_for(size: int) -> bool:
    free = free_bytes()
    return free is not None and free >= size + _SPARE_BYTES


_pool: SlotPool | None = None


def _close_pool() -> None:
    if _pool is not None:
        _pool.close()


_pool_lock = threading.Lock()


def pool() -> SlotPool:
    global _pool
    with _pool_lock:
        if _pool is None:
            import atexit

            _pool = SlotPool()
            atexit.register(_close_pool)  # unlink this process's segments on a normal exit
        return _pool


def write_buffers(buffers: list[Any]) -> tuple[str, list[tuple[int, int]]] | None:
    """Copy host buffers into one free slot; (slot name, [(offset, nbytes)]) or None (no slot)."""
    spans, pos = [], HEADER
    for b in buffers:
        n = buffer_nbytes(b)
        spans.append((pos, n))
        pos += -(-n // ALIGN) * ALIGN
    slot = pool().acquire(pos - HEADER)
    if slot is None:
        return None
    dst = np.frombuffer(slot.buf, dtype=np.uint8)
    for b, (off, n) in zip(buffers, spans, strict=True):
        _copy(dst[off : off + n], as_host_array(b))
    return slot.name, spans


_PARALLEL_COPY_BYTES = 16 << 20
_copier: Any = None


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """memcpy; large copies in two halves on two threads (numpy releases the GIL), which one
    core's memory bandwidth would otherwise limit."""
    global _copier
    n = src.nbytes
    if n < _PARALLEL_COPY_BYTES or (os.cpu_count() or 1) < 2:
        dst[:] = src
        return
    if _copier is None:
        from concurrent.futures import ThreadPoolExecutor

        _copier = ThreadPoolExecutor(1, thread_name_prefix="loomrl-shm-copy")
    half = n // 2
    other = _copier.submit(np.copyto, dst[half:], src[half:])
    dst[:half] = src[:half]
    other.result()


_attached: dict[str, shared_memory.SharedMemory] = {}
_attach_lock = threading.Lock()


def attach(name: str) -> shared_memory.SharedMemory:
    """This process's mapping of slot ``name``, kept for its later items. FileNotFoundError when
    the name is gone: its creator was killed and its resource tracker unlinked it."""
    with _attach_lock:
        seg = _attached.get(name)
        if seg is None:
            seg = shared_memory.SharedMemory(name=name)
            # Attaching registers the segment with this process's resource tracker, which would
            # unlink the producer's segment when this process exits: only its creator may. A
            # segment this process made (it takes its own item) stays registered: its pool
            # unlinks it at exit, and the tracker reports a name it no longer knows.
            if not name.startswith(_own_prefix()):
                try:
                    resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
                except Exception:
                    pass
            _attached[name] = seg
        return seg


def _release(seg: shared_memory.SharedMemory) -> None:
    try:
        seg.buf[0] = 0
    except (TypeError, ValueError):  # the mapping was closed at interpreter exit
        pass


def read_buffers(name: str, spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """Views of the slot's buffers (no copy). The slot is released when the last of them (and
    anything built on them) is garbage-collected."""
    seg = attach(name)
    base = np.frombuffer(seg.buf, dtype=np.uint8)
    weakref.finalize(base, _release, seg)
    return [base[off : off + n] for off, n in spans]
