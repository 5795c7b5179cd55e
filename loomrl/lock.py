"""DeviceLock: a cluster-wide lock over sets of devices, used to time-share them.

Workers that share devices run ``onload -> work -> offload`` while holding the lock on their device
set. Sets are acquired one device at a time in ascending global index, so two holders of
overlapping multi-device sets can never deadlock (the classic resource ordering argument). The lock
is re-entrant for its owner and a device held by a worker whose process died, or by a driver whose
job ended, is released as soon as a waiter notices (holders are checked while others wait).
Each acquire takes one release; a release of devices the owner does not hold is an error.

The lock state lives in one named, detached async Ray actor: it outlives the driver that created
it, so on a cluster shared by several drivers the locks the others hold do not go with the first
one to exit. This module never imports torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import numbers
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from loomrl.errors import LoomError, check_timeout, require_ray

# The version names the protocol between clients and the lock actor, which, detached, can outlive
# the loomrl that started it on a long-lived cluster: another version is another lock.
# v3: on the head node (an existing v2 is not moved); v4: release says what was not held.
_ACTOR_NAME = "loomrl_device_lock_v4"
_LIVENESS_PERIOD_S = 1.0


# Ray gives its head node this resource; other nodes never have it.
_HEAD_RESOURCE = "node:__internal_head__"


def _on_head_node(cluster_resources: dict[str, float]) -> dict[str, Any]:
    """Options that place the lock actor on the head node, where it can only go with the
    cluster's control store itself: on a worker node an autoscaler's scale-down would take it,
    and the holds in it, along. No options where the cluster names no head node (an actor
    waiting for a resource no node has would never start). Pure."""
    if cluster_resources.get(_HEAD_RESOURCE, 0) > 0:
        return {"resources": {_HEAD_RESOURCE: 0.001}}
    return {}


class DeviceLockTimeout(LoomError, TimeoutError):
    pass


class DeviceLockError(LoomError, RuntimeError):
    """A release of devices the releasing owner does not hold (as releasing an unlocked
    ``threading.Lock`` is a RuntimeError)."""


def _check_devices(devices: Any) -> list[int]:
    """Global device indices, as a list: a bare int or a string (whose characters would be
    locked one by one) is refused, as is anything but whole numbers."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, Iterable):
        raise TypeError(
            f"devices={devices!r}: give a list of device indices, e.g. [0, 1] (or [3] for one)"
        )
    devices = list(devices)
    bad = [d for d in devices if isinstance(d, bool) or not isinstance(d, numbers.Integral)]
    if bad:
        raise TypeError(f"devices={devices!r}: device indices are whole numbers, got {bad[0]!r}")
    return [int(d) for d in devices]


class _LockServer:
    """Async actor holding ``device -> (owner, depth)``; waiters block on one condition."""

    def __init__(self) -> None:
        self.held: dict[int, list[Any]] = {}  # device -> [owner, depth]
        # owner -> ("actor", Ray actor id) or ("job", Ray job id): what the liveness check asks
        self.handles: dict[str, tuple[str, str]] = {}
        self.cond = asyncio.Condition()
        self.grants = 0

    async def acquire(
        self,
        owner: str,
        devices: list[int],
        process: tuple[str, str] | None = None,
        timeout: float | None = None,
    ) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: list[int] = []
        try:
            for d in sorted(set(devices)):
                while True:
                    async with self.cond:
                        if d not in self.held or self.held[d][0] == owner:
                            if process is not None and not self._holds(owner):
                                # The process that holds is the one to check: not one that
                                # only waited under the same owner name.
                                self.handles[owner] = (str(process[0]), str(process[1]))
                            if d in self.held:
                                self.held[d][1] += 1
                            else:
                                self.held[d] = [owner, 1]
                            taken.append(d)
                            break
                        holder = self.held[d][0]
                        left = None if deadline is None else deadline - time.monotonic()
                        if left is not None and left <= 0:
                            raise TimeoutError(
                                f"device {d} still held by {holder} after {timeout}s"
                            )
                        period = (
                            _LIVENESS_PERIOD_S if left is None else min(left, _LIVENESS_PERIOD_S)
                        )
                        try:
                            await asyncio.wait_for(self.cond.wait(), timeout=period)
                            continue
                        except asyncio.TimeoutError:
                            pass
                    # Checked without holding the condition, so holders can release meanwhile.
                    if not await self._alive(holder):
                        await self._drop(holder)
        except BaseException:
            await self._release(owner, taken)
            raise
        self.grants += 1
        return self.grants

    async def release(self, owner: str, devices: list[int], strict: bool = False) -> list[int]:
        """Release ``devices`` once for ``owner``; the ones it does not hold, which ``strict``
        refuses whole (nothing released)."""
        unheld = sorted({d for d in devices if d not in self.held or self.held[d][0] != owner})
        if not (strict and unheld):
            await self._release(owner, sorted(set(devices)))
        return unheld

    async def _release(self, owner: str, devices: Iterable[int]) -> None:
        async with self.cond:
            for d in devices:
                entry = self.held.get(d)
                if entry is None or entry[0] != owner:
                    continue
                entry[1] -= 1
                if entry[1] <= 0:
                    del self.held[d]
            if not self._holds(owner):  # a cluster-long actor keeps no entry per past owner
                self.handles.pop(owner, None)
            self.cond.notify_all()

    def _holds(self, owner: str) -> bool:
        return any(o == owner for o, _ in self.held.values())

    async def _alive(self, owner: str) -> bool:
        """Ask Ray's control store (not the owner, which may be busy) whether its process lives:
        an actor's state, or a driver's job."""
        handle = self.handles.get(owner)
        if handle is None:
            return True  # an owner we cannot check: never reaped
        import ray._private.state as ray_state

        def dead() -> bool:
            kind, ident = handle
            if kind == "actor":
                # An actor registers before it can call; the store forgets long-dead ones ({}).
                return (ray_state.actors(actor_id=ident) or {}).get("State", "DEAD") == "DEAD"
            return any(j.get("JobID") == ident and j.get("IsDead") for j in ray_state.jobs())

        loop = asyncio.get_running_loop()
        try:
            return not await loop.run_in_executor(None, dead)
        except Exception:
            return True

    async def _drop(self, owner: str) -> None:
        async with self.cond:
            for d in [d for d, (o, _) in self.held.items() if o == owner]:
                del self.held[d]
            self.handles.pop(owner, None)
            self.cond.notify_all()

    async def state(self) -> dict[int, tuple[str, int]]:
        return {d: (o, n) for d, (o, n) in self.held.items()}


def _require_ray() -> None:
    require_ray(
        "", "the device lock lives on the Ray cluster: start one with loomrl.Cluster.start()"
    )


class DeviceLock:
    """Client of the cluster-wide lock. ``DeviceLock.get()`` attaches to (or creates) the lock actor."""

    _instance: DeviceLock | None = None
    # Times this process found the lock actor dead and attached to a new one, and for each
    # owner and device the count as it was at each of its holds taken here (a stack: holds
    # nest): holds taken before a replacement went with the old actor, and releasing them finds
    # nothing, which is then no mistake, while a hold nested inside one of them and taken after
    # the replacement is checked.
    _replacements = 0
    _acquired_at: dict[str, dict[int, list[int]]] = {}

    def __init__(self, actor: Any = None):
        if actor is None:  # DeviceLock(): what get() is for
            raise TypeError(
                "DeviceLock() only wraps the lock actor; use DeviceLock.get(), which attaches "
                "to (or creates) the cluster's lock"
            )
        self._actor = actor

    @classmethod
    def get(cls, fresh: bool = False) -> DeviceLock:
        """The process's client; ``fresh``: attach anew (by name) instead of reusing the last."""
        import ray

        _require_ray()
        if cls._instance is None or fresh:
            from loomrl.cluster import _NAMESPACE  # not the caller's: all drivers share it

            actor = (
                ray.remote(_LockServer)
                .options(
                    name=_ACTOR_NAME,
                    namespace=_NAMESPACE,
                    get_if_exists=True,
                    lifetime="detached",
                    num_cpus=0,
                    max_concurrency=10_000,
                    # Not in the caller's placement group (a driver inside one, a tuning
                    # trial's, say): no bundle holds the head node's resource, and the lock
                    # would go when the group does.
                    scheduling_strategy="DEFAULT",
                    **_on_head_node(ray.cluster_resources()),
                )
                .remote()
            )
            cls._instance = cls(actor)
        return cls._instance

    def _call(self, method: str, *args: Any) -> Any:
        """Call the lock actor; if it has died (it is detached, so only when killed, or with its
        node), attach to a new one and call once more. Locks held in the dead one went with it;
        their releases find nothing to release."""
        import ray

        _require_ray()
        try:
            return ray.get(getattr(self._actor, method).remote(*args))
        except Exception as e:
            # Dead, or a handle from a Ray instance of this process that has stopped.
            if not isinstance(e, ray.exceptions.RayActorError) and "Can't find actor" not in str(e):
                raise
            self._actor = DeviceLock.get(fresh=True)._actor
            DeviceLock._replacements += 1
            return ray.get(getattr(self._actor, method).remote(*args))

    @staticmethod
    def _owner() -> tuple[str, tuple[str, str]]:
        """This process's owner name, and what the lock checks to know it lives."""
        import ray

        _require_ray()
        ctx = ray.get_runtime_context()
        actor_id = ctx.get_actor_id()
        if actor_id:
            return f"actor:{actor_id}", ("actor", actor_id)
        # By job, not pid alone: drivers on other hosts or containers can share a pid, and one
        # that reconnects is a new job.
        job = ctx.get_job_id()
        return f"driver:{job}/{os.getpid()}", ("job", job)

    def acquire(
        self, devices: Iterable[int], owner: str | None = None, timeout: float | None = None
    ) -> None:
        """Hold ``devices`` for ``owner`` (default: this process), waiting up to ``timeout``
        seconds (None: for ever). Re-entrant: an owner may acquire what it holds again, and
        each acquire needs its release."""
        import ray

        devices = _check_devices(devices)
        timeout = check_timeout(timeout)
        auto_owner, process = self._owner()
        owner = owner or auto_owner
        try:
            self._call("acquire", owner, devices, process, timeout)
            held = DeviceLock._acquired_at.setdefault(owner, {})
            for d in devices:  # the count after the call: it may have replaced the actor
                held.setdefault(d, []).append(DeviceLock._replacements)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, TimeoutError):
                raise DeviceLockTimeout(
                    f"could not lock devices {sorted(devices)}: {e.cause}"
                ) from None
            raise

    def release(self, devices: Iterable[int], owner: str | None = None) -> None:
        """Release ``devices`` once (an acquire's worth). DeviceLockError, with nothing
        released, when the owner does not hold them all: a release without its acquire (or one
        too many) would otherwise pass unseen and take another holder's turn."""
        devices = _check_devices(devices)
        owner = owner or self._owner()[0]
        now = DeviceLock._replacements
        held = DeviceLock._acquired_at.get(owner, {})
        # Strict unless a device's latest hold here predates a replacement (holds this process
        # did not take, another process's under a shared owner name, are checked).
        strict = all(held[d][-1] == now for d in devices if held.get(d))
        unheld = self._call("release", owner, devices, strict)
        if unheld and strict and DeviceLock._replacements == now:  # (not replaced meanwhile)
            raise DeviceLockError(
                f"release({devices}): {owner} does not hold device(s) {unheld} (never acquired, "
                "released already, or held by another owner); release what acquire() took, "
                "once per acquire, or use `with lock.hold(devices):`"
            )
        for d in devices:  # released: that hold's record goes
            if held.get(d):
                held[d].pop()
                if not held[d]:
                    del held[d]
        if not held:
            DeviceLock._acquired_at.pop(owner, None)

    @contextlib.contextmanager
    def hold(
        self, devices: Iterable[int], owner: str | None = None, timeout: float | None = None
    ) -> Iterator[None]:
        devices = _check_devices(devices)
        # By default the owner is the process (actor id): re-entrancy is per process.
        owner = owner or self._owner()[0]
        self.acquire(devices, owner, timeout)
        try:
            yield
        finally:
            self.release(devices, owner)

    def state(self) -> dict[int, tuple[str, int]]:
        return self._call("state")
