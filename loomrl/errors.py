"""Exception types shared by every layer, and the one check of a timeout argument they share.
Imports nothing heavy."""

from __future__ import annotations

import math
import numbers
from typing import Any


class LoomError(Exception):
    """Base class of loomrl's own errors."""


class ConfigError(LoomError, ValueError):
    """A configuration is invalid. ``problems`` lists every problem found, not just the first."""

    def __init__(self, problems: list[str] | str, source: str | None = None):
        if isinstance(problems, str):
            problems = [problems]
        self.problems, self.source = list(problems), source
        head = f"invalid configuration{f' in {source}' if source else ''}"
        body = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{head} ({len(self.problems)} problem(s)):\n{body}")

    def __reduce__(self) -> tuple:
        # Rebuilt from its parts when it crosses processes (Ray); a subclass keeps this
        # constructor's (problems, source) signature.
        return type(self), (self.problems, self.source)


class PlacementError(LoomError, ValueError):
    """A requested placement cannot be realised on the cluster (too many workers, unknown device...)."""


class PlanError(LoomError, ValueError):
    """No execution plan satisfies the constraints (memory, valid device counts, cores)."""


class RemoteError(LoomError):
    """A worker method raised. Carries the worker's name, rank, host and the remote traceback."""

    def __init__(
        self,
        worker: str,
        rank: int,
        host: str,
        method: str,
        cause: str,
        remote_traceback: str,
        expected: bool = False,
    ):
        self.worker, self.rank, self.host, self.method = worker, rank, host, method
        self.cause, self.remote_traceback = cause, remote_traceback
        self.headline = f"{worker} rank {rank} on {host} failed in {method}(): {cause}"
        # The cause is one of loomrl's own errors (a tool that failed too often, an env that
        # keeps failing): its message says what happened, and its traceback is no news.
        self.expected = expected
        super().__init__(f"{self.headline}\n--- remote traceback ---\n{remote_traceback}")

    def __reduce__(self) -> tuple:
        # Rebuilt from its parts when it crosses processes (a worker that waited on another
        # group raises it to its own caller); Exception's default passes only the message. The
        # state keeps what was set after (add_note's notes, a caller's own attributes).
        return (
            type(self),
            (
                self.worker,
                self.rank,
                self.host,
                self.method,
                self.cause,
                self.remote_traceback,
                self.expected,
            ),
            self.__dict__,
        )


class WorkerDiedError(LoomError):
    """A worker process died (killed, crashed, out of memory) while work was pending on it."""

    def __init__(self, worker: str, rank: int, host: str, method: str | None, detail: str = ""):
        # method None: the worker is known dead from another's call (it needed its result).
        self.worker, self.rank, self.host, self.method = worker, rank, host, method
        self.detail = detail
        super().__init__(
            f"{worker} rank {rank} on {host} died"
            + (f" while running {method}()" if method else "")
            + (f": {detail}" if detail else "")
        )

    def __reduce__(self) -> tuple:
        # As RemoteError: a worker that found another dead raises this to its own caller.
        return (
            type(self),
            (self.worker, self.rank, self.host, self.method, self.detail),
            self.__dict__,
        )


class ChannelPeerDied(WorkerDiedError):
    """A channel get (put) that waits with no timeout, in a process that is no worker (the
    driver, a Ray task), found every producer (consumer) of its key dead: nothing more can arrive
    (no room can come). ``channel``, ``key``; ``peers``: the Ray actor ids of the dead ones;
    ``worker``/``rank``: the first of them (its group and rank where this process launched it,
    else its component name and rank -1), so that a run restarts on it as on any worker's
    death. A put sets ``items_put``, as on ChannelTimeout."""

    def __init__(
        self,
        message: str,
        channel: str,
        key: Any,
        peers: tuple[str, ...] = (),
        worker: str = "unknown",
        rank: int = -1,
        host: str = "unknown",
    ):
        self.channel, self.key, self.peers = channel, key, tuple(peers)
        # method None: known dead from another's call, as WorkerDiedError says it.
        self.worker, self.rank, self.host, self.method = worker, rank, host, None
        self.detail = message
        LoomError.__init__(self, message)  # its own message, not WorkerDiedError's "X died"

    def __reduce__(self) -> tuple:
        return (
            type(self),
            (self.detail, self.channel, self.key, self.peers, self.worker, self.rank, self.host),
            self.__dict__,
        )


class TrainingError(LoomError):
    """Training cannot go on: e.g. every recent update's gradients were not finite."""


class IterationTimeout(LoomError, TimeoutError):
    """An iteration of a flow ran past its time limit: a stage hangs (or is far slower than its
    plan predicted)."""


class LaunchTimeout(LoomError, TimeoutError):
    """Worker constructors did not all return within the cluster's ``launch_timeout_s``: one
    hangs (a simulator or model load that never ends)."""


class ChannelClosed(LoomError):
    """get/put on a channel that was closed (and, for get, drained)."""


class ChannelTimeout(LoomError, TimeoutError):
    """A channel put/get did not complete within its timeout."""


class ChannelItemLost(LoomError):
    """A get took items whose payload is gone: the process that put them ended before they were
    taken (a payload too large to ride inside the broker stays with its producer). The other
    items of that get went back to the front of their queue. ``producers``: the Ray actor ids
    of the processes that put the lost items (a driver has none)."""

    def __init__(self, message: str, producers: tuple[str, ...] = ()):
        self.producers = tuple(producers)
        super().__init__(message)

    def __reduce__(self) -> tuple:
        return type(self), (str(self), self.producers), self.__dict__


def require_ray(what: str, fix: str) -> None:
    """LoomError unless Ray runs in this process: a first remote call without it would start a
    new Ray instance, where nothing of this process's cluster lives, and fail there in Ray's
    words. ``what``: the handle used (a prefix), ``fix``: what to start."""
    import ray  # here, not at import: errors is imported everywhere

    if not ray.is_initialized():
        raise LoomError(
            f"{what}Ray is not running in this process (not started yet, or its Cluster was "
            f"shut down); {fix}"
        )


def check_timeout(timeout: Any, what: str = "timeout") -> float | None:
    """``timeout`` as seconds to wait: None (for ever, as is ``inf``) or a number >= 0. Anything
    else (a string, NaN, a negative number) is a ValueError naming it, not a failure inside a
    comparison or a wait that ends at once."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or not timeout >= 0:
        raise ValueError(f"{what}={timeout!r} must be None (wait forever) or >= 0 seconds")
    return None if math.isinf(timeout) else float(timeout)
