"""How ``Cluster.start`` asks Ray for an embedded instance (no Ray started here)."""

from __future__ import annotations

import pytest


class _Stop(Exception):
    pass


def _init_kwargs(monkeypatch, **start_kwargs) -> dict:
    import ray

    from loomrl.cluster import Cluster

    seen: dict = {}

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(_Stop):
        Cluster.start(**start_kwargs)
    return seen


def test_embedded_start_never_joins_a_cluster_already_running_on_the_machine(monkeypatch):
    # Without an address Ray joins a cluster that `ray start` left running on this machine,
    # then refuses num_cpus / num_gpus (or, without them, runs on that cluster's resources).
    kw = _init_kwargs(monkeypatch, num_cpus=2, num_gpus=0)
    assert kw["address"] == "local"
    assert (kw["num_cpus"], kw["num_gpus"]) == (2, 0)


def test_embedded_start_takes_only_the_cores_this_process_may_use(monkeypatch):
    # Two jobs split a machine with `taskset -c 0 ...` / `taskset -c 1 ...`: Ray counts the
    # machine's cores, so each would plan for (and pin its slots onto) cores it cannot use.
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    assert _init_kwargs(monkeypatch, num_gpus=0)["num_cpus"] == 3
    assert _init_kwargs(monkeypatch, num_cpus=2, num_gpus=0)["num_cpus"] == 2  # asked for
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert _init_kwargs(monkeypatch, num_gpus=0)["num_cpus"] is None  # all of them: Ray's count


def test_an_address_joins_that_cluster(monkeypatch):
    import loomrl.cluster

    monkeypatch.setattr(loomrl.cluster, "_check_reachable", lambda address: None)
    kw = _init_kwargs(monkeypatch, address="ray://head:10001")
    assert kw["address"] == "ray://head:10001"
    assert "num_cpus" not in kw


def test_an_address_nothing_answers_at_is_refused_at_once(monkeypatch):
    import socket

    from loomrl.errors import PlacementError

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PlacementError, match=f"no Ray cluster answers at '127.0.0.1:{port}'"):
        # Refused before ray.init (which retries such an address for minutes) is called.
        _init_kwargs(monkeypatch, address=f"127.0.0.1:{port}")


def test_more_cpu_slots_than_cores_warns(monkeypatch):
    import ray

    from loomrl.cluster import _take_inventory

    node = {"Alive": True, "NodeID": "n0", "Resources": {"CPU": 2.0, "memory": 1e9}}
    monkeypatch.setattr(ray, "nodes", lambda: [node])
    with pytest.warns(UserWarning, match="run.devices=8 CPU device slots on node 0, which has 2"):
        (n,) = _take_inventory(8)
    assert len(n.devices) == 8
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_take_inventory(2)[0].devices) == 2


def test_cpu_slots_far_past_the_cores_are_refused_not_started(monkeypatch):
    """run.devices=1000 on 2 cores: the profiler started a worker per slot, for minutes."""
    import ray

    from loomrl.cluster import _take_inventory
    from loomrl.errors import PlacementError

    node = {"Alive": True, "NodeID": "n0", "Resources": {"CPU": 2.0, "memory": 1e9}}
    monkeypatch.setattr(ray, "nodes", lambda: [node])
    with pytest.raises(
        PlacementError, match=r"run.devices=1000 CPU device slots .* at most 16 \(8 per core\)"
    ):
        _take_inventory(1000)
    with pytest.warns(UserWarning, match="run.devices=16 CPU device slots"):
        assert len(_take_inventory(16)[0].devices) == 16  # the most, still allowed


def test_logical_gpus_far_past_the_cores_are_refused_before_ray_starts(monkeypatch):
    from loomrl.errors import PlacementError

    monkeypatch.setattr("loomrl.cluster._count_local_gpus", lambda: 0)
    with pytest.raises(PlacementError, match=r"run.num_gpus=1000 logical GPUs .* at most 16"):
        _init_kwargs(monkeypatch, num_cpus=2, num_gpus=1000)  # ray.init is never reached
    assert _init_kwargs(monkeypatch, num_cpus=2, num_gpus=16)["num_gpus"] == 16


def test_a_launch_once_ray_has_stopped_says_so_and_starts_no_ray(monkeypatch):
    """A Cluster whose Ray was stopped (by another Cluster's shutdown in this process): Ray would
    start an instance of its own, and the workers wait for a node that no longer exists."""
    import ray

    from loomrl import Worker
    from loomrl.cluster import Cluster, Device, Node
    from loomrl.errors import PlacementError

    def no_init(**kwargs):
        raise AssertionError("Ray was started")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_init)
    node = Node(0, "n0", "127.0.0.1", 2.0, 0.0, (Device(0, 0, 0, "cpu"),))
    cluster = Cluster([node], owns_ray=False)
    with pytest.raises(PlacementError, match=r"Ray is not running.*loomrl.Cluster.start\(\)"):
        cluster.launch(Worker, 1)
    assert cluster._cpu_reserved == {0: 0.0} and cluster._free_cores == {0: [0, 1]}
