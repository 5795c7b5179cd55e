"""Channel misuse: wrong argument types and values, a producer that died with items queued, and
a channel handle used once its Ray has stopped. Each is an error naming the argument or what
happened; no item a living process put is lost."""

from __future__ import annotations

import glob
import os
import time
import uuid

import numpy as np
import pytest
import torch

from loomrl import Channel, Worker, wait
from loomrl.errors import ChannelClosed, ChannelItemLost, LoomError, WorkerDiedError


@pytest.fixture
def ch(ray_session):
    c = Channel.create(f"misuse-{uuid.uuid4().hex[:8]}")
    yield c
    c.delete()


def test_a_channel_made_like_a_queue_points_to_create():
    with pytest.raises(TypeError, match=r"make one with Channel.create\('rollouts', maxsize"):
        Channel("rollouts", maxsize=4)


def test_arguments_of_the_wrong_type_are_refused_naming_them(ch):
    with pytest.raises(TypeError, match="put_many takes a list of items, got str; .*use put"):
        ch.put_many("ab")  # it went as two items, 'a' and 'b'
    with pytest.raises(TypeError, match="put_many takes a list of items, got int"):
        ch.put_many(5)
    for w, kind in (("2", "str"), (None, "NoneType"), (True, "bool"), (torch.ones(2), "Tensor")):
        with pytest.raises(ValueError, match=rf"weight=.* \({kind}\) is not a number; give"):
            ch.put(1, weight=w)
    with pytest.raises(ValueError, match=r"target_weight='5' must be a number > 0"):
        ch.get_batch("5")
    with pytest.raises(ValueError, match=r"get_many: n=True must be a whole number >= 1"):
        ch.get_many(True)
    with pytest.raises(TypeError, match=r"key \[1\] is not hashable"):
        ch.qsize([1])
    # The broker's copy of these never equals the caller's: each put made a new FIFO.
    for key in (object(), float("nan"), ("a", float("nan"))):
        with pytest.raises(TypeError, match="is not equal to its copy in the channel's broker"):
            ch.put(1, key=key)
    ch.put("x", key=("a", 1.5, frozenset({2})))  # equal once copied: fine
    assert ch.get(key=("a", 1.5, frozenset({2})), timeout=5) == "x"
    with pytest.raises(ValueError, match=r"timeout='x' must be None \(wait forever\) or >= 0"):
        Channel.connect(ch.name, timeout="x")
    for flag, value in (("offload", "no"), ("shared_memory", "yes")):
        with pytest.raises(ValueError, match=rf"{flag}='.*' must be True or False"):
            Channel.create("never-made", **{flag: value})
    with pytest.raises(ValueError, match="offload='x' must be True or False"):
        Channel.get_or_create("never-made", offload="x")
    assert ch.qsize() == 0  # nothing was put by the refused calls
    assert Channel.connect(ch.name, timeout=None).name == ch.name  # None: wait for ever
    ch.put_many([1, 2], weights=[np.float32(1.5), np.int64(2)])  # numpy numbers are numbers
    # and so are 0-d arrays and one-element tensors (a mask's sum is a natural token count)
    ch.put_many([3, 4], weights=[np.array(3.0), torch.tensor(2)])
    with pytest.raises(
        ValueError, match=r"item weights must be finite and >= 0.*got weight=tensor"
    ):
        ch.put(5, weight=torch.tensor(-1.0))
    assert ch.get_many(np.int64(2), timeout=5) == [1, 2]


class Producer(Worker):
    def produce(self, ch, nbytes):
        for n in nbytes:
            ch.put(np.full(n // 8, float(n)))
        return os.getpid()

    def die(self):
        os._exit(1)


def test_items_of_a_producer_that_died_are_an_error_and_the_others_stay(cluster, ch):
    """A payload above the inline size stays with its producer: in a shared-memory slot, which
    its resource tracker unlinks when it dies. A get that took such an item raised
    FileNotFoundError, and the items of living producers taken in the same get were lost."""
    dead = cluster.launch(Producer, 1, devices=[0], name="dead")
    alive = cluster.launch(Producer, 1, devices=[1], name="alive")
    try:
        wait(alive.produce(ch, [1024]))
        [pid] = wait(dead.produce(ch, [2048, 1 << 20]))  # inline (survives), shared memory
        wait(alive.produce(ch, [4096, 1 << 20]))
        with pytest.raises(WorkerDiedError):
            wait(dead.die(), timeout=60)
        deadline = time.monotonic() + 30  # its tracker unlinks its slots soon after
        while glob.glob(f"/dev/shm/loomrl_{pid}_*") and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(
            ChannelItemLost, match=r"1 item\(s\) put by dead rank 0 are lost.*the 4 other"
        ):
            ch.get_many(5, timeout=30)
        # The rest, in their order, for the next get; nothing else was lost.
        assert [float(x[0]) for x in ch.get_many(4, timeout=30)] == [1024, 2048, 4096, 1 << 20]
        assert ch.qsize() == 0 and ch.stats()["got"] == 5
    finally:
        dead.kill()
        alive.kill()


class Consumer(Worker):
    def take(self, ch, n):
        return [float(x[0]) for x in ch.get_many(n, timeout=30)]


def test_a_worker_that_takes_a_dead_producers_items_reports_that_death(cluster, ch):
    """The consumer's ChannelItemLost reaches the driver as the producer's WorkerDiedError, the
    death a run restarts on (run.max_restarts), as when it waits on a dead worker's result."""
    dead = cluster.launch(Producer, 1, devices=[0], name="producer")
    consumer = cluster.launch(Consumer, 1, devices=[1], name="consumer")
    try:
        [pid] = wait(dead.produce(ch, [1 << 20]))
        with pytest.raises(WorkerDiedError):
            wait(dead.die(), timeout=60)
        deadline = time.monotonic() + 30
        while glob.glob(f"/dev/shm/loomrl_{pid}_*") and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(
            WorkerDiedError, match=r"^producer rank 0 .*found when consumer rank 0's take\(\) took"
        ):
            wait(consumer.take(ch, 1), timeout=60)
    finally:
        dead.kill()
        consumer.kill()


@pytest.mark.parametrize(
    "error, said",
    # Another ObjectLostError (the node that held it went) is not said to be the owner's death
    [("OwnerDiedError", "put them ended before"), ("ObjectLostError", "or its node ended before")],
)
def test_an_item_whose_owner_died_in_the_object_store_is_an_error_and_the_others_stay(
    ray_session, monkeypatch, error, said
):
    """The same through Ray's object store, where Ray frees what a dead process put (when, is
    Ray's to say: its OwnerDiedError is played here)."""
    import ray
    from ray import exceptions as rex

    ch = Channel.create(f"misuse-{uuid.uuid4().hex[:8]}", shared_memory=False)
    try:
        ch.put_many([np.full(16 * 1024, 1.0), np.full(16 * 1024, 2.0), "small"])
        [entry] = ray.get(ch._broker.take.remote(None, 1, None, 1, "probe"))[1]
        ray.get(ch._broker.untake.remote(None, [entry], "probe"))
        lost = entry[3][1][0]
        real_get = ray.get

        def get(refs, *a, **k):
            if lost in (refs if isinstance(refs, list) else [refs]):
                raise getattr(rex, error)(lost.hex(), None, "")
            return real_get(refs, *a, **k)

        monkeypatch.setattr(ray, "get", get)
        with pytest.raises(
            ChannelItemLost, match=rf"1 item\(s\) .* \({error}\): .*{said}.*the 2 other"
        ):
            ch.get_many(3, timeout=5)
        rest = ch.get_many(2, timeout=5)
        assert float(rest[0][0]) == 2.0 and rest[1] == "small"
        assert ch.stats()["got"] == 3 and ch.edges() == {("driver", "driver")}
    finally:
        monkeypatch.undo()
        ch.delete()


def test_a_channel_of_a_stopped_ray_says_so_and_starts_no_ray(ch, monkeypatch):
    """put/get on a channel after its Cluster was shut down started a new Ray instance (Ray
    does on a first remote call) and failed there with "Can't find actor"."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    started = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append(1))
    for call in (lambda: ch.put(1), lambda: ch.get(timeout=1), ch.qsize, ch.close):
        with pytest.raises(LoomError, match="Ray is not running in this process"):
            call()
    ch.delete()  # nothing to delete: it went with its Ray
    assert started == []


def test_a_channel_handle_from_an_earlier_ray_instance_is_closed(ch, monkeypatch):
    def gone(*a, **k):
        raise Exception("Failed to submit task to actor: Can't find actor 12ab")

    monkeypatch.setattr(ch, "_broker", type("Old", (), {"put": type("M", (), {"remote": gone})}))
    with pytest.raises(ChannelClosed, match="made on a Ray instance that has stopped"):
        ch.put(1)
