"""The device lock actor's bookkeeping of which process to check for each owner (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from loomrl.lock import _LockServer, _on_head_node


def test_an_owner_is_checked_by_the_process_that_holds_and_forgotten_when_it_holds_nothing():
    async def go():
        s = _LockServer()
        await s.acquire("o", [1], ("actor", "first"))
        # The same owner name from another process while it holds: still the first is checked.
        await s.acquire("o", [2], ("actor", "second"))
        assert s.handles == {"o": ("actor", "first")} and s.held == {1: ["o", 1], 2: ["o", 1]}
        await s.release("o", [1])
        assert s.handles == {"o": ("actor", "first")}  # device 2 is still held
        await s.release("o", [2])
        assert s.handles == {} and s.held == {}
        # Holding nothing, the next to take it under that name is the one checked.
        await s.acquire("o", [3], ("job", "02000000"))
        assert s.handles == {"o": ("job", "02000000")}
        # An owner with no process to check (None) is kept, never reaped.
        await s.acquire("p", [4])
        assert "p" not in s.handles and s.held[4] == ["p", 1]

    asyncio.run(go())


def test_the_lock_actor_asks_for_the_head_node_only_where_there_is_one():
    head = {"CPU": 2.0, "node:__internal_head__": 1.0, "node:10.0.0.1": 1.0}
    assert _on_head_node(head) == {"resources": {"node:__internal_head__": 0.001}}
    assert _on_head_node({"CPU": 2.0, "node:10.0.0.1": 1.0}) == {}


def test_the_lock_without_ray_says_what_starts_it(monkeypatch):
    import ray

    from loomrl.errors import LoomError
    from loomrl.lock import DeviceLock

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(DeviceLock, "_instance", None)
    with pytest.raises(LoomError, match=r"Ray is not running.*loomrl.Cluster.start\(\)"):
        DeviceLock.get()
