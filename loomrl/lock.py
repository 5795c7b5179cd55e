"""DeviceLock: a cluster-wide lock over sets of devices, used to time-share them.

Workers that share devices run ``onload -> work -> offload`` while holding the lock on their device
set. Sets are acquired one device at a time in ascending global index, so two holders of
overlapping multi-device sets can never deadlock (the classic resource ordering argument). The lock
is re-entrant for its owner and a device held by a worker whose process died is released as soon as
a waiter notices (holders are pinged while others wait).

The lock state lives in one named async Ray actor; this module never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from loomrl.errors import LoomError

_ACTOR_NAME = "loomrl_device_lock"
_LIVENESS_PERIOD_S = 1.0


class DeviceLockTimeout(LoomError, TimeoutError):
    pass


class _LockServer:
    """Async actor holding ``device -> (owner, depth)``; waiters block on one condition."""

    def __init__(self) -> None:
        self.held: dict[int, list[Any]] = {}  # device -> [owner, depth]
        self.handles: dict[str, Any] = {}  # owner -> actor handle (for liveness checks)
        self.cond = asyncio.Condition()
        self.grants = 0

    async def acquire(
        self, owner: str, devices: list[int], handle: Any = None, timeout: float | None = None
    ) -> int:
        if handle is not None:
            self.handles[owner] = handle
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: list[int] = []
        try:
            for d in sorted(set(devices)):
                async with self.cond:
                    while d in self.held and self.held[d][0] != owner:
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise TimeoutError(
                                f"device {d} still held by {self.held[d][0]} after {timeout}s"
                            )
                        period = _LIVENESS_PERIOD_S if left is None else min(left, _LIVENESS_PERIOD_S)
                        try:
                            await asyncio.wait_for(self.cond.wait(), timeout=period)
                        except asyncio.TimeoutError:
                            await self._reap(self.held[d][0])
                    if d in self.held:
                        self.held[d][1] += 1
                    else:
                        self.held[d] = [owner, 1]
                    taken.append(d)
        except BaseException:
            await self._release(owner, taken)
            raise
        self.grants += 1
        return self.grants

    async def release(self, owner: str, devices: list[int]) -> None:
        await self._release(owner, sorted(set(devices)))

    async def _release(self, owner: str, devices: Iterable[int]) -> None:
        async with self.cond:
            for d in devices:
                entry = self.held.get(d)
                if entry is None or entry[0] != owner:
                    continue
                entry[1] -= 1
                if entry[1] <= 0:
                    del self.held[d]
            self.cond.notify_all()

    async def _reap(self, owner: str) -> None:
        """Free every device of ``owner`` if its process is gone (the condition is held by the caller)."""
        handle = self.handles.get(owner)
        if handle is None:
            return
        try:
            await asyncio.wait_for(handle._loom_ping.remote(), timeout=5.0)
        except asyncio.TimeoutError:
            return  # busy, not dead
        except Exception:
            for d in [d for d, (o, _) in self.held.items() if o == owner]:
                del self.held[d]
            self.handles.pop(owner, None)
            self.cond.notify_all()

    async def state(self) -> dict[int, tuple[str, int]]:
        return {d: (o, n) for d, (o, n) in self.held.items()}


class DeviceLock:
    """Client of the cluster-wide lock. ``DeviceLock.get()`` attaches to (or creates) the lock actor."""

    _instance: DeviceLock | None = None

    def __init__(self, actor: Any):
        self._actor = actor

    @classmethod
    def get(cls) -> DeviceLock:
        import ray

        if cls._instance is None:
            actor = (
                ray.remote(_LockServer)
                .options(name=_ACTOR_NAME, get_if_exists=True, num_cpus=0, max_concurrency=10_000)
                .remote()
            )
            cls._instance = cls(actor)
        return cls._instance

    @staticmethod
    def _owner() -> tuple[str, Any]:
        import ray

        ctx = ray.get_runtime_context()
        actor_id = ctx.get_actor_id()
        if actor_id:
            return f"actor:{actor_id}", ctx.current_actor
        return f"driver:{os.getpid()}", None

    def acquire(self, devices: Iterable[int], owner: str | None = None, timeout: float | None = None) -> None:
        import ray

        auto_owner, handle = self._owner()
        try:
            ray.get(self._actor.acquire.remote(owner or auto_owner, list(devices), handle, timeout))
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, TimeoutError):
                raise DeviceLockTimeout(f"could not lock devices {sorted(devices)}: {e.cause}") from None
            raise

    def release(self, devices: Iterable[int], owner: str | None = None) -> None:
        import ray

        ray.get(self._actor.release.remote(owner or self._owner()[0], list(devices)))

    @contextlib.contextmanager
    def hold(
        self, devices: Iterable[int], owner: str | None = None, timeout: float | None = None
    ) -> Iterator[None]:
        devices = list(devices)
        # By default the owner is the process (actor id): re-entrancy is per process.
        owner = owner or self._owner()[0]
        self.acquire(devices, owner, timeout)
        try:
            yield
        finally:
            self.release(devices, owner)

    def state(self) -> dict[int, tuple[str, int]]:
        import ray

        return ray.get(self._actor.state.remote())
