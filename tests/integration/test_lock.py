"""DeviceLock: ordered multi-device locking, re-entrancy, release on owner death, time-sharing hooks."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest

from loomrl import Worker, wait
from loomrl.lock import DeviceLock, DeviceLockTimeout


def test_overlapping_sets_never_deadlock(cluster):
    lock = DeviceLock.get()
    rng = random.Random(0)
    rounds = 1000
    plans = [
        [sorted(rng.sample(range(6), rng.randint(1, 4))) for _ in range(rounds // 4)]
        for _ in range(4)
    ]
    inside: dict[int, int] = {}
    guard = threading.Lock()
    errors: list[str] = []

    def run(tid: int):
        for devs in plans[tid]:
            # Ask in a shuffled order: the lock must impose its own global order.
            order = devs[:]
            rng2 = random.Random(tid)
            rng2.shuffle(order)
            with lock.hold(order, owner=f"thread-{tid}", timeout=60):
                with guard:
                    for d in devs:
                        if inside.get(d):
                            errors.append(f"device {d} held twice")
                        inside[d] = 1
                with guard:
                    for d in devs:
                        inside[d] = 0

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "deadlock: threads still waiting"
    assert errors == []
    assert lock.state() == {}
    assert time.monotonic() - t0 < 120


def test_reentrant_and_timeout(cluster):
    lock = DeviceLock.get()
    with lock.hold([0, 1], owner="a"):
        with lock.hold([1], owner="a"):
            assert lock.state()[1] == ("a", 2)
        with pytest.raises(DeviceLockTimeout, match="could not lock devices"):
            lock.acquire([1], owner="b", timeout=0.3)
    assert lock.state() == {}


class Holder(Worker):
    def grab(self, seconds):
        lock = DeviceLock.get()
        lock.acquire(self.devices)
        time.sleep(seconds)
        return True


def test_lock_released_when_owner_dies(cluster):
    import ray

    g = cluster.launch(Holder, 1, devices=[3])
    h = g.grab(60)
    deadline = time.monotonic() + 20
    while 3 not in DeviceLock.get().state() and time.monotonic() < deadline:
        time.sleep(0.1)
    ray.kill(g.actors[0])
    t0 = time.monotonic()
    with DeviceLock.get().hold([3], owner="driver-after", timeout=30):
        pass
    assert time.monotonic() - t0 < 15
    g.kill()
    del h


class Buffered(Worker):
    """Allocates a large buffer when onloaded and frees it when offloaded."""

    def __init__(self, mb: int):
        super().__init__()
        self.mb = mb
        self.buf = None

    def onload(self):
        import numpy as np

        self.buf = np.ones(self.mb * 2**20 // 8)

    def offload(self):
        self.buf = None

    def work(self):
        with self.devices_locked():
            return float(self.buf[:10].sum())

    def loaded(self):
        return self.buf is not None


def test_devices_locked_runs_onload_work_offload(cluster):
    g = cluster.launch(Buffered, 1, 8, devices=[2])
    try:
        assert wait(g.work()) == [10.0]
        assert wait(g.loaded()) == [False]
    finally:
        g.kill()


def test_a_lock_whose_actor_died_is_replaced(cluster):
    """A lock actor that died (killed, or with its node) is replaced: clients attach to a new one
    instead of failing from then on."""
    import ray

    from loomrl.lock import _ACTOR_NAME

    lock = DeviceLock.get()
    old = ray.get_actor(_ACTOR_NAME)
    ray.kill(old, no_restart=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            ray.get(old.state.remote(), timeout=5)
        except ray.exceptions.RayActorError:
            break
        time.sleep(0.1)
    with lock.hold([0]):
        assert lock.state()[0][0].startswith("driver:")
    assert lock.state() == {}
    assert ray.get_actor(_ACTOR_NAME)._actor_id != old._actor_id


def test_a_lock_made_inside_a_placement_group_is_not_bound_to_it(cluster):
    """A task inside a placement group that captures its children (a tuning trial's, say) may be
    the first to need the lock: the actor is made outside the group (no bundle holds the head
    node's resource) and outlives it."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    _kill_lock_actor()  # the task below makes it anew

    @ray.remote(num_cpus=0.1)
    def inside() -> list:
        lock = DeviceLock.get(fresh=True)
        with lock.hold([5]):
            return list(lock.state())

    pg = placement_group([{"CPU": 0.1}])
    ray.get(pg.ready(), timeout=60)
    try:
        how = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        assert ray.get(inside.options(scheduling_strategy=how).remote(), timeout=120) == [5]
    finally:
        remove_placement_group(pg)
    lock = DeviceLock.get(fresh=True)
    with lock.hold([5], timeout=30):  # the actor outlived the group
        assert lock.state()[5][1] == 1


_OTHER_DRIVER = """
import os, sys
import ray
from loomrl.lock import DeviceLock, _ACTOR_NAME
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
DeviceLock.get().acquire([6])  # never released: this driver exits holding it
job = ray.get_runtime_context().get_job_id()
print(ray.get_actor(_ACTOR_NAME)._actor_id.hex(), f"driver:{job}/{os.getpid()}", flush=True)
"""


def test_the_lock_outlives_the_driver_that_made_it_and_drops_a_dead_drivers_holds(
    cluster, tmp_path
):
    """On a shared cluster another driver may create the lock actor and exit: the actor (detached)
    stays, with the locks other drivers hold in it; what the exited driver held is released once
    a waiter finds its job ended."""
    import os

    import ray

    from loomrl.cluster import _NAMESPACE
    from loomrl.lock import _ACTOR_NAME

    _kill_lock_actor()  # the other driver creates it anew
    last = _run_script(
        tmp_path / "other_driver.py",
        _OTHER_DRIVER,
        ray.get_runtime_context().gcs_address,
        _NAMESPACE,
        timeout=120,
    )
    actor_hex, other = last.split()
    lock = DeviceLock.get(fresh=True)
    assert ray.get_actor(_ACTOR_NAME)._actor_id.hex() == actor_hex  # the same actor, alive
    assert lock.state()[6] == (other, 1)  # what the exited driver held, still there
    t0 = time.monotonic()
    with lock.hold([6], timeout=30):  # its job has ended: the hold is dropped
        (me, depth), job = lock.state()[6], ray.get_runtime_context().get_job_id()
        assert (me, depth) == (f"driver:{job}/{os.getpid()}", 1) and me != other
    assert time.monotonic() - t0 < 15


_TWO_NODES = """
import sys
import ray
from ray.cluster_utils import Cluster
from loomrl.lock import DeviceLock
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
worker = c.add_node(num_cpus=4)  # the roomier node: where a free placement could well go
ray.init(address=c.address, log_to_driver=False)
lock = DeviceLock.get()
where = lambda self: ray.get_runtime_context().get_node_id()  # noqa: E731
node = ray.get(lock._actor.__ray_call__.remote(where))
head = [n["NodeID"] for n in ray.nodes() if "node:__internal_head__" in n["Resources"]]
lock.acquire([3])
c.remove_node(worker)  # as an autoscaler's scale-down
print(node == head[0], node != worker.node_id, lock.state()[3][1], flush=True)
ray.shutdown()
c.shutdown()
"""


@pytest.mark.slow
def test_the_lock_lives_on_the_head_node_and_outlasts_a_worker_node(tmp_path):
    """On a cluster of two nodes (a fresh one, in its own process) the lock actor sits on the
    head node, and a hold survives the other node's removal."""
    assert _run_script(tmp_path / "two_nodes.py", _TWO_NODES, timeout=300) == "True True 1"


def _kill_lock_actor() -> None:
    """Kill the lock actor and wait until its name is free, for the next client to make anew."""
    import ray

    from loomrl.lock import _ACTOR_NAME

    ray.kill(ray.get_actor(_ACTOR_NAME), no_restart=True)
    deadline = time.time() + 30
    while True:
        try:
            ray.get_actor(_ACTOR_NAME)
        except ValueError:
            return
        assert time.time() < deadline, "the killed lock actor's name was not freed in 30 s"
        time.sleep(0.1)


def _run_script(path: Path, text: str, *args: str, timeout: float) -> str:
    """Run ``text`` as a Python script at ``path`` in a process of its own (loomrl importable);
    its last line of output, after checking that it exited cleanly."""
    import os
    import subprocess
    import sys

    path.write_text(text)
    root = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
    )
    out = subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": root},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]
