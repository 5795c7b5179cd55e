"""A driver's channel get/put with no timeout, once every producer/consumer of its key died:
ChannelPeerDied naming them within seconds, not a wait for ever. Waits on live peers, however
late they come, still end as before."""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import threading
import time
import uuid
from types import SimpleNamespace

import pytest

from loomrl import channel as channel_mod
from loomrl.channel import DEAD_PEER_CHECK_S, Channel
from loomrl.errors import ChannelPeerDied, ChannelTimeout, WorkerDiedError
from loomrl.worker import Worker, wait


@pytest.fixture
def make_channel(ray_session):
    made = []

    def make(maxsize=0):
        ch = Channel.create(f"test-dead-peer-{uuid.uuid4().hex[:8]}", maxsize=maxsize)
        made.append(ch)
        return ch

    yield make
    for ch in made:
        ch.delete()


@pytest.fixture
def peer_class(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    class Peer:
        """A producer or consumer actor; ``delay`` keeps it busy first (a ping waits behind)."""

        def actor_id(self):
            return ray.get_runtime_context().get_actor_id()

        def put(self, ch, item, delay=0.0):
            time.sleep(delay)
            ch.put(item, src="rollout")

        def get(self, ch):
            return ch.get(dst="learner")

        def get_many(self, ch, n):
            return ch.get_many(n, dst="learner")

    return Peer


def _wait_for_consumer(ch, name, timeout=10.0):
    """Until a get of component ``name`` has reached the broker (it waits there)."""
    deadline = time.monotonic() + timeout
    while name not in ch.stats()["consumers"]:
        assert time.monotonic() < deadline, f"no get from {name!r} reached channel {ch.name!r}"
        time.sleep(0.05)


def _waiting_consumer(ch, peer_class, ray, method, *args):
    """A consumer actor (started first) whose ``method`` get has reached the broker and waits."""
    consumer = peer_class.remote()
    ray.get(consumer.actor_id.remote())
    pending = getattr(consumer, method).remote(ch, *args)
    _wait_for_consumer(ch, "learner")
    return consumer, pending


@pytest.mark.timeout(60)
def test_driver_get_raises_once_the_only_producer_died(make_channel, peer_class, ray_session):
    ch = make_channel()
    producer = peer_class.remote()
    actor = ray_session.get(producer.actor_id.remote())
    ray_session.get(producer.put.remote(ch, "first"))
    assert ch.get() == "first"
    ray_session.kill(producer)
    t0 = time.monotonic()
    with pytest.raises(
        ChannelPeerDied,
        match=rf"channel '{ch.name}' key None: every producer of this key has died "
        rf"\(actor-{actor[:8]} 'rollout'\); nothing more can arrive\. Pass a timeout to get\(\)",
    ) as info:
        ch.get()
    assert time.monotonic() - t0 < 10
    err = info.value
    assert isinstance(err, WorkerDiedError)  # a run restarts on it (run.max_restarts)
    assert (err.channel, err.key, err.peers, err.worker, err.rank) == (
        ch.name,
        None,
        (actor,),
        "rollout",
        -1,
    )
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ChannelPeerDied and str(back) == str(err) and back.peers == (actor,)


@pytest.mark.timeout(60)
def test_a_get_of_more_items_than_wait_says_how_many_wait(make_channel, peer_class, ray_session):
    ch = make_channel()
    producer = peer_class.remote()
    ray_session.get(producer.put.remote(ch, "only"))
    ray_session.kill(producer)
    with pytest.raises(
        ChannelPeerDied, match=r"nothing more can arrive \(1 item\(s\) wait, fewer than this get"
    ):
        ch.get_many(2)
    assert ch.get() == "only"  # still there for a smaller get


@pytest.mark.timeout(60)
def test_driver_put_raises_once_the_only_consumer_died(make_channel, peer_class, ray_session):
    ch = make_channel(maxsize=1)
    consumer = peer_class.remote()
    actor = ray_session.get(consumer.actor_id.remote())
    ch.put("a")
    assert ray_session.get(consumer.get.remote(ch)) == "a"
    ray_session.kill(consumer)
    t0 = time.monotonic()
    with pytest.raises(
        ChannelPeerDied,
        match=rf"key None: every consumer of this key has died \(actor-{actor[:8]} 'learner'\); "
        r"no room can come \(1 of 2 items put\)\. Pass a timeout to put\(\)",
    ) as info:
        ch.put_many(["b", "c"])  # "b" fills the queue, "c" finds no room
    assert time.monotonic() - t0 < 10
    assert info.value.items_put == 1 and ch.qsize() == 1 and ch.get() == "b"


@pytest.mark.timeout(60)
def test_a_get_waits_past_a_check_for_a_live_producer_and_for_one_not_known_yet(
    make_channel, peer_class, ray_session
):
    ch = make_channel()
    # Nobody has put to this key yet: nothing to check, the get waits as before.
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(item=ch.get(key="later")), daemon=True)
    waiter.start()
    producer = peer_class.remote()
    ray_session.get(producer.put.remote(ch, "first"))
    assert ch.get() == "first"
    # Busy past a check (sleeping in a call): its ping waits, and it counts as alive.
    producer.put.remote(ch, "late", delay=DEAD_PEER_CHECK_S + 1.0)
    t0 = time.monotonic()
    assert ch.get() == "late"
    assert time.monotonic() - t0 > DEAD_PEER_CHECK_S
    assert waiter.is_alive()
    ch.put("now", key="later")
    waiter.join(timeout=10)
    assert box == {"item": "now"}


@pytest.mark.timeout(60)
def test_a_get_waits_while_one_producer_of_the_key_lives(make_channel, peer_class, ray_session):
    ch = make_channel()
    dead, live = peer_class.remote(), peer_class.remote()
    ray_session.get([dead.put.remote(ch, "x"), live.put.remote(ch, "y")])
    assert sorted(ch.get_many(2)) == ["x", "y"]
    ray_session.kill(dead)
    live.put.remote(ch, "z", delay=DEAD_PEER_CHECK_S + 1.0)
    assert ch.get() == "z"


def test_the_error_crosses_processes_with_its_parts():
    err = ChannelPeerDied("channel 'c' key ('k', 1): ...", "c", ("k", 1), ("ab12",), "gen", 3, "h")
    err.items_put = 2
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ChannelPeerDied and isinstance(back, WorkerDiedError)
    assert str(back) == str(err) == back.detail
    assert (back.channel, back.key, back.peers, back.worker, back.rank, back.host) == (
        "c",
        ("k", 1),
        ("ab12",),
        "gen",
        3,
        "h",
    )
    assert back.method is None and back.items_put == 2


def test_a_busy_peer_has_one_ping_out_and_a_died_one_counts_dead(monkeypatch):
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    monkeypatch.setattr(channel_mod, "_PING_S", 0.01)
    pings: list[concurrent.futures.Future] = []

    def ping():
        pings.append(concurrent.futures.Future())
        return SimpleNamespace(future=lambda: pings[-1])

    handle = SimpleNamespace(__ray_ready__=SimpleNamespace(remote=ping))
    peer = channel_mod._Peer(handle)

    async def check(n):
        return [await channel_mod._alive(peer) for _ in range(n)]

    async def scenario():
        assert await check(3) == [True] * 3 and len(pings) == 1  # busy: the one ping waits
        pings[0].set_exception(ActorUnavailableError("restarting", None))
        await asyncio.sleep(0.01)
        assert await check(2) == [True, True] and len(pings) == 2  # may come back: new ping
        pings[1].set_exception(ActorDiedError())
        await asyncio.sleep(0.01)
        assert await check(1) == [False] and len(pings) == 2
        assert await channel_mod._alive(None) is True  # a driver or a task: nothing to ask

    asyncio.run(scenario())


def test_an_actor_tells_a_broker_its_handle_once_and_each_key_once(monkeypatch):
    monkeypatch.setattr(channel_mod, "_told", set())
    monkeypatch.setattr(channel_mod, "_told_handle", set())
    monkeypatch.setattr(channel_mod, "_actor", ["a1"])
    monkeypatch.setattr(channel_mod, "_self_handle", ["own handle"])
    broker, other = object(), object()
    told = [channel_mod._peer("c", broker, k, "put") for k in ("k1", "k2", "k1")]
    assert told == [("a1", "own handle"), ("a1", None), None]
    assert channel_mod._peer("c", broker, "k1", "take") == ("a1", None)
    assert channel_mod._peer("c", other, "k1", "put") == ("a1", "own handle")
    monkeypatch.setattr(channel_mod, "_actor", [None])  # a driver: asked of Ray's tables, no ping
    monkeypatch.setattr(channel_mod, "_process_id", lambda: "driver:01000000")
    assert channel_mod._peer("d", broker, None, "take") == ("driver:01000000", None)


@pytest.mark.timeout(60)
def test_driver_get_raises_once_its_producer_task_s_process_died(make_channel, ray_session):
    import os
    import signal

    ray = ray_session

    @ray.remote(num_cpus=0, max_retries=0)
    def produce(ch):
        ch.put(os.getpid(), src="sampler")
        time.sleep(60)

    ch = make_channel()
    ref = produce.remote(ch)
    os.kill(ch.get(timeout=30), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(
        ChannelPeerDied,
        match=r"every producer of this key has died \(a Ray task in worker [0-9a-f]{8} 'sampler'\)",
    ) as info:
        ch.get()
    assert time.monotonic() - t0 < 4 * DEAD_PEER_CHECK_S + 5
    assert info.value.peers[0].startswith("task:")
    with pytest.raises(ray.exceptions.RayError):
        ray.get(ref, timeout=10)


@pytest.mark.timeout(90)
def test_driver_get_raises_once_its_producer_driver_s_job_ended(make_channel, ray_session):
    import subprocess
    import sys

    ch = make_channel()
    address = ray_session.get_runtime_context().gcs_address
    code = (
        "import ray; from loomrl import Channel; "
        f"ray.init(address={address!r}, namespace='loomrl', log_to_driver=False); "
        f"Channel.connect({ch.name!r}).put('from another driver', src='feeder')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ch.get(timeout=5) == "from another driver"
    with pytest.raises(ChannelPeerDied, match=r"\(the driver of job [0-9a-f]+ 'feeder'\)"):
        ch.get()


@pytest.mark.timeout(60)
def test_items_for_a_consumer_killed_in_its_get_go_to_the_next_consumer(
    make_channel, peer_class, ray_session
):
    ch = make_channel()
    consumer, pending = _waiting_consumer(ch, peer_class, ray_session, "get_many", 2)
    ch.put("first")  # taken into the blocked get's batch, which waits for a second item
    time.sleep(0.2)
    assert ch.qsize() == 0
    ray_session.kill(consumer)
    time.sleep(DEAD_PEER_CHECK_S + 2.0)  # its broker call outlives it; it is found dead
    ch.put("second")
    # Both go to the next consumer, in order; nothing to the dead one.
    assert ch.get_many(2, timeout=5) == ["first", "second"]
    stats = ch.stats()
    assert (stats["put"], stats["got"], stats["qsize"]) == (2, 2, 0)
    assert stats["edges"] == {("driver", "driver"): 2}
    with pytest.raises(ray_session.exceptions.RayActorError):
        ray_session.get(pending, timeout=10)


@pytest.mark.timeout(60)
def test_a_live_consumer_blocked_past_the_check_still_gets_its_item(
    make_channel, peer_class, ray_session
):
    ch = make_channel()
    consumer = peer_class.remote()
    pending = consumer.get.remote(ch)
    _wait_for_consumer(ch, "learner")
    time.sleep(2 * DEAD_PEER_CHECK_S + 0.5)  # its ping waits behind the get: no answer, no death
    ch.put("late")
    assert ray_session.get(pending, timeout=10) == "late"
    assert ch.stats()["edges"] == {("driver", "learner"): 1}


@pytest.mark.timeout(60)
def test_threaded_and_async_consumers_blocked_past_the_check_still_get_their_items(
    make_channel, ray_session
):
    ray = ray_session

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Threaded:
        def get(self, ch):
            return ch.get(key="t", dst="threaded")

    @ray.remote(num_cpus=0)
    class Async:
        async def get(self, ch):
            return await asyncio.to_thread(ch.get, key="a", dst="async")

    ch = make_channel()
    threaded, async_ = Threaded.remote(), Async.remote()
    pending = [threaded.get.remote(ch), async_.get.remote(ch)]
    _wait_for_consumer(ch, "threaded")
    _wait_for_consumer(ch, "async")
    time.sleep(2 * DEAD_PEER_CHECK_S + 0.5)  # both answer their pings while they wait
    ch.put("for threaded", key="t")
    ch.put("for async", key="a")
    assert ray.get(pending, timeout=10) == ["for threaded", "for async"]


@pytest.fixture
def reader(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)
    class Reader:
        """A consumer whose next get dies (or dawdles) between its broker's reply and reading it."""

        def life(self):
            return ray.get_runtime_context().get_worker_id()

        def get(self, ch, timeout=None):
            return ch.get(dst="reader", timeout=timeout)

        def get_then(self, ch, then, seconds=0.0):
            import os

            read = channel_mod._decode_all

            def decode(payloads, name):
                if then == "die":
                    os._exit(1)
                time.sleep(seconds)  # busy: answers no ping
                return read(payloads, name)

            channel_mod._decode_all = decode
            try:
                return ch.get(dst="reader")
            finally:
                channel_mod._decode_all = read

    started = Reader.remote()
    ray.get(started.life.remote())  # running before the test's items are put
    return started


def _settled(ch, **want):
    """ch.stats() once its fields ``want`` hold (a release reaches the broker without a reply)."""
    deadline = time.monotonic() + 10.0
    while True:
        stats = ch.stats()
        if all(stats[k] == v for k, v in want.items()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.mark.timeout(60)
def test_an_item_that_reaches_a_consumer_just_killed_goes_to_the_next_one(
    make_channel, peer_class, ray_session
):
    ch = make_channel()
    consumer, _ = _waiting_consumer(ch, peer_class, ray_session, "get")
    ray_session.kill(consumer)
    ch.put("just after")  # its broker call, not yet found dead, takes it and replies to no one
    # Found dead within a check or two: the item comes back for the next consumer.
    assert ch.get(timeout=4 * DEAD_PEER_CHECK_S + 5) == "just after"
    stats = ch.stats()
    assert (stats["put"], stats["got"], stats["held"], stats["requeued"]) == (1, 1, 0, 1)
    assert stats["edges"] == {("driver", "driver"): 1}


@pytest.mark.timeout(60)
def test_items_a_consumer_died_before_reading_go_back_first_in_order(
    make_channel, reader, ray_session
):
    ch = make_channel()
    ch.put_many(["a", "b"])
    with pytest.raises(ray_session.exceptions.RayActorError):
        ray_session.get(reader.get_then.remote(ch, "die"), timeout=30)
    # Ray restarts it (max_restarts=1); its new process's first get has "a" again, then "b".
    assert ray_session.get(reader.get.remote(ch, 20), timeout=30) == "a"
    assert ch.get(timeout=5) == "b"
    stats = _settled(ch, held=0)
    assert (stats["got"], stats["held"], stats["requeued"]) == (2, 0, 1)


@pytest.mark.timeout(60)
def test_a_killed_reader_s_items_go_to_the_driver(make_channel, reader, ray_session):
    ch = make_channel()
    ch.put("only")
    pending = reader.get_then.remote(ch, "die")
    with pytest.raises(ray_session.exceptions.RayActorError):
        ray_session.get(pending, timeout=30)
    ray_session.kill(reader, no_restart=True)
    assert ch.get(timeout=4 * DEAD_PEER_CHECK_S + 5) == "only"
    assert ch.stats()["requeued"] == 1


@pytest.mark.timeout(60)
def test_a_slow_reader_keeps_its_items_and_releases_them(make_channel, reader, ray_session):
    ch = make_channel()
    ch.put("mine")
    pending = reader.get_then.remote(ch, "dawdle", 2 * DEAD_PEER_CHECK_S + 1.0)
    time.sleep(1.0)
    assert ch.stats()["held"] == 1
    with pytest.raises(ChannelTimeout):  # pinged while busy: no answer, not taken for dead
        ch.get(timeout=2 * DEAD_PEER_CHECK_S)
    assert ray_session.get(pending, timeout=30) == "mine"
    stats = _settled(ch, held=0)
    assert (stats["got"], stats["held"], stats["requeued"], stats["qsize"]) == (1, 0, 0, 0)


class _Reader(Worker):
    def take(self, ch):
        return ch.get(dst="reader")


@pytest.mark.timeout(60)
def test_what_a_worker_read_stays_read_when_its_group_is_killed_at_once(make_channel, cluster):
    ch = make_channel()
    group = cluster.launch(_Reader, 1, devices=[0], name="reader")
    try:
        ch.put("read")
        assert wait(group.take(ch), timeout=30) == ["read"]
    finally:
        group.kill()  # at once: its own word (within _RELEASE_S) would come too late
    time.sleep(2 * DEAD_PEER_CHECK_S + 1.0)  # a requeue of its lease would have come by now
    stats = ch.stats()
    assert (stats["got"], stats["held"], stats["requeued"], stats["qsize"]) == (1, 0, 0, 0)


def test_a_read_lease_rides_on_the_next_get_or_goes_alone_within_a_quarter_second(monkeypatch):
    monkeypatch.setattr(channel_mod, "_unreleased", {})
    sent = []

    class Broker:  # hashable, as Ray's actor handles are
        release = SimpleNamespace(remote=sent.append)

    broker = Broker()
    channel_mod._read("c", broker, 3)
    channel_mod._read("c", broker, 4)
    assert channel_mod._take_read("c", broker) == [3, 4]  # the next get carries them
    assert channel_mod._take_read("c", broker) is None
    channel_mod._read("c", broker, 5)  # no get follows: the thread sends it alone
    deadline = time.monotonic() + 5.0
    while not sent:
        assert time.monotonic() < deadline, "no release was sent"
        time.sleep(0.02)
    assert sent == [[5]] and channel_mod._take_read("c", broker) is None
    channel_mod._read("c", broker, 6)
    channel_mod.flush_reads()  # at once, as a worker does before WorkerGroup.kill kills it
    assert sent == [[5], [6]] and channel_mod._take_read("c", broker) is None
    with pytest.raises(ValueError, match=r"timeout='soon' must be None \(wait forever\) or >= 0"):
        channel_mod.flush_reads(timeout="soon")


def _fake_peer():
    pings: list[concurrent.futures.Future] = []

    def ping():
        pings.append(concurrent.futures.Future())
        return SimpleNamespace(future=lambda: pings[-1])

    handle = SimpleNamespace(__ray_ready__=SimpleNamespace(remote=ping))
    return channel_mod._Peer(handle), pings


def test_a_waiting_take_trusts_only_a_failed_ping_sent_since_it_began():
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    peer, pings = _fake_peer()
    died = channel_mod._caller_died

    async def scenario():
        began = time.monotonic()
        assert not died(peer, began) and len(pings) == 1  # first look: a ping goes out
        assert not died(peer, began) and len(pings) == 1  # still out (blocked in its get)
        assert not died(peer, began, send=False) and len(pings) == 1
        pings[0].set_result(None)
        await asyncio.sleep(0.01)
        assert not died(peer, began, send=False) and len(pings) == 1  # answered: alive
        assert not died(peer, began) and len(pings) == 1  # answered just now: no new one yet
        peer.sent -= DEAD_PEER_CHECK_S
        assert not died(peer, began) and len(pings) == 2  # a period old: a new one
        pings[1].set_exception(ActorUnavailableError("restarting", None))
        await asyncio.sleep(0.01)
        peer.sent -= DEAD_PEER_CHECK_S
        assert not died(peer, began - DEAD_PEER_CHECK_S) and len(pings) == 3  # may come back
        pings[2].set_exception(ActorDiedError())
        await asyncio.sleep(0.01)
        assert died(peer, began) and died(peer, began, send=False) and len(pings) == 3
        # A take that began after that ping went out: it may be from the actor's next life.
        peer.sent -= DEAD_PEER_CHECK_S
        assert not died(peer, time.monotonic()) and len(pings) == 4

    asyncio.run(scenario())


def test_checks_of_one_peer_that_wait_together_both_read_its_answer(monkeypatch):
    monkeypatch.setattr(channel_mod, "_PING_S", 5.0)
    peer, pings = _fake_peer()

    async def scenario():
        checks = [asyncio.ensure_future(channel_mod._alive(peer)) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert len(pings) == 1
        pings[0].set_result(None)
        assert await asyncio.gather(*checks) == [True, True]
        assert peer.ping is None

    asyncio.run(scenario())
