"""Channel on a local Ray: FIFO per key, back-pressure, weighted batches, many producers/consumers,
close semantics, naming, error messages and use from Ray actors."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest

from loomrl.channel import Channel, ChannelExistsError, ChannelNotFoundError, component
from loomrl.errors import ChannelClosed, ChannelTimeout


@pytest.fixture
def make_channel(ray_session):
    made = []

    def make(maxsize=0, offload=False, name=None, shared_memory=None):
        ch = Channel.create(
            name or f"test-{uuid.uuid4().hex[:8]}",
            maxsize=maxsize,
            offload=offload,
            shared_memory=shared_memory,
        )
        made.append(ch)
        return ch

    yield make
    for ch in made:
        ch.delete()


def _in_thread(fn):
    """Run fn in a thread; returns (thread, box) where box holds the result or the exception."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except Exception as err:  # noqa: BLE001 - handed back to the test
            box["error"] = err

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_fifo_per_key(make_channel):
    ch = make_channel()
    for i in range(20):
        ch.put(("a", i), key="a")
        ch.put(("b", i), key="b")
    ch.put("default")
    assert ch.qsize("a") == 20 and ch.qsize("b") == 20 and ch.qsize() == 1
    assert [ch.get(key="b") for _ in range(20)] == [("b", i) for i in range(20)]
    assert ch.get_many(20, key="a") == [("a", i) for i in range(20)]
    assert ch.get() == "default"


def test_back_pressure_blocks_then_times_out(make_channel):
    ch = make_channel(maxsize=2)
    ch.put(1)
    ch.put(2)
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeout, match="no room after 0.3s"):
        ch.put(3, timeout=0.3)
    assert time.monotonic() - t0 >= 0.29
    assert ch.qsize() == 2  # the timed-out item was not silently added or dropped

    thread, box = _in_thread(lambda: ch.put(3))  # blocks: the channel is full
    time.sleep(0.3)
    assert thread.is_alive() and ch.qsize() == 2
    assert ch.get() == 1  # makes room; the blocked producer proceeds
    thread.join(timeout=10)
    assert not thread.is_alive() and "error" not in box
    assert ch.get_many(2) == [2, 3]


def test_put_many_respects_maxsize_and_reports_progress(make_channel):
    ch = make_channel(maxsize=3)
    with pytest.raises(ChannelTimeout) as info:
        ch.put_many(range(5), timeout=0.2)
    assert info.value.items_put == 3
    assert ch.get_many(3) == [0, 1, 2]


def test_get_times_out_without_losing_items(make_channel):
    ch = make_channel()
    with pytest.raises(ChannelTimeout, match="nothing to get after 0.2s"):
        ch.get(timeout=0.2)
    ch.put_many([1, 2])
    with pytest.raises(ChannelTimeout, match="fewer than 3 items to get .*nothing was taken"):
        ch.get_many(3, timeout=0.2)  # only 2 there: both go back, in order
    assert ch.qsize() == 2 and ch.get_many(2) == [1, 2]
    for call in (lambda: ch.put(1, key=[1, 2]), lambda: ch.get(key={"a": 1}, timeout=0.1)):
        with pytest.raises(TypeError, match="is not hashable .*use a str, an int or a tuple"):
            call()


def test_get_batch_sums_weights_in_fifo_order(make_channel):
    ch = make_channel()
    weights = [3, 1, 2, 5, 1, 1]
    ch.put_many([f"i{k}" for k in range(6)], weights=weights)
    assert ch.get_batch(4) == ["i0", "i1"]  # 3 + 1 = 4
    assert ch.get_batch(4) == ["i2", "i3"]  # 2 + 5 >= 4
    with pytest.raises(ChannelTimeout):
        ch.get_batch(4, timeout=0.2)  # 1 + 1 < 4: nothing taken
    assert ch.qsize() == 2
    ch.close()
    assert ch.get_batch(4) == ["i4", "i5"]  # closed: the lighter remainder
    with pytest.raises(ChannelClosed):
        ch.get_batch(4)


def test_get_batch_balances_consumers(make_channel, ray_session):
    ray = ray_session
    ch = make_channel()
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 100, size=400).tolist()
    ch.put_many(lengths, weights=lengths)
    ch.close()

    @ray.remote(num_cpus=0)
    def consume(ch):
        sums = []
        while True:
            try:
                sums.append(sum(ch.get_batch(500)))
            except ChannelClosed:
                return sums

    sums = [s for r in ray.get([consume.remote(ch) for _ in range(2)]) for s in r]
    assert sum(sums) == sum(lengths)
    full = sorted(sums)[1:]  # all but (at most) the last, lighter batch
    assert all(500 <= s < 600 for s in full)


def test_many_producers_and_consumers_no_loss_no_duplicate(make_channel, ray_session):
    ray = ray_session
    n_prod, n_cons, per_producer, chunk = 4, 4, 20_000, 500
    ch = make_channel(maxsize=4_000)

    @ray.remote(num_cpus=0)
    def produce(ch, p):
        for start in range(0, per_producer, chunk):
            ch.put_many([(p, i) for i in range(start, start + chunk)], src=f"producer{p}")
        return p

    @ray.remote(num_cpus=0)
    def consume(ch, c):
        got = []
        while True:
            try:
                got.extend(ch.get_many(chunk, dst=f"consumer{c}"))
            except ChannelClosed:
                return got

    t0 = time.monotonic()
    consumers = [consume.remote(ch, c) for c in range(n_cons)]
    ray.get([produce.remote(ch, p) for p in range(n_prod)])
    ch.close()
    results = ray.get(consumers)
    elapsed = time.monotonic() - t0

    everything = [x for r in results for x in r]
    assert len(everything) == n_prod * per_producer
    assert len(set(everything)) == len(everything)  # no duplicate, and with the count: no loss
    for got in results:  # each consumer sees each producer's items in the order they were put
        for p in range(n_prod):
            seq = [i for q, i in got if q == p]
            assert seq == sorted(seq)
    stats = ch.stats()
    assert stats["put"] == stats["got"] == n_prod * per_producer and stats["qsize"] == 0
    assert {
        (f"producer{p}", f"consumer{c}") for p in range(n_prod) for c in range(n_cons)
    } >= ch.edges()
    assert elapsed < 30, f"took {elapsed:.1f}s"


def test_close_semantics(make_channel):
    ch = make_channel()
    ch.put_many([1, 2, 3])
    ch.close()
    with pytest.raises(ChannelClosed, match="is closed; cannot put"):
        ch.put(4)
    assert [ch.get(), ch.get(), ch.get()] == [1, 2, 3]  # consumers drain what is left
    with pytest.raises(ChannelClosed, match="closed and key None is drained"):
        ch.get()
    with pytest.raises(ChannelClosed):
        ch.get(key="never-used")


def test_close_wakes_blocked_consumers_and_producers(make_channel):
    ch = make_channel(maxsize=1)
    consumer, cbox = _in_thread(lambda: ch.get(key="empty"))
    ch.put("x")
    producer, pbox = _in_thread(lambda: ch.put("y"))
    time.sleep(0.3)
    assert consumer.is_alive() and producer.is_alive()
    ch.close()
    consumer.join(timeout=10)
    producer.join(timeout=10)
    assert isinstance(cbox.get("error"), ChannelClosed)
    assert isinstance(pbox.get("error"), ChannelClosed)
    assert ch.get() == "x"


def test_wait_taken_holds_a_producer_until_a_get_has_returned_everything_put_before(
    make_channel,
):
    ch = make_channel()
    ch.wait_taken(key=0, timeout=0)  # nothing put: nothing to wait for
    ch.put_many([1, 2], key=0)
    ch.put(9, key=1)  # another key's items do not hold key 0's waiter
    with pytest.raises(ChannelTimeout, match=r"key 0: items put are not all taken after 0.2s"):
        ch.wait_taken(key=0, timeout=0.2)
    waiter, box = _in_thread(lambda: ch.wait_taken(key=0))
    consumer, _ = _in_thread(lambda: ch.get_many(3, key=0))  # takes 1 and 2, waits for a third
    time.sleep(0.3)
    assert waiter.is_alive()  # a get counts only once it returns, not while its batch fills
    ch.put(3, key=0)  # put after the waiter's call: it does not wait for this one too
    consumer.join(timeout=10)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and box == {"value": None}
    ch.wait_taken(key=0, timeout=0)
    with pytest.raises(TypeError, match="is not hashable"):
        ch.wait_taken(key=[0])


def test_close_ends_a_producer_waiting_for_its_items_to_be_taken(make_channel):
    ch = make_channel()
    ch.put("x")
    waiter, box = _in_thread(lambda: ch.wait_taken())
    time.sleep(0.3)
    assert waiter.is_alive()
    ch.close()  # a failed flow closes its channels: no get may come
    waiter.join(timeout=10)
    assert isinstance(box.get("error"), ChannelClosed)
    assert "closed with items of key None not yet taken" in str(box["error"])


def test_name_collision_and_connect(make_channel):
    ch = make_channel(maxsize=5)
    with pytest.raises(ChannelExistsError) as info:
        Channel.create(ch.name)
    assert str(info.value) == (
        f"channel '{ch.name}' already exists; use Channel.connect('{ch.name}') to attach to it "
        "or choose another name"
    )
    other = Channel.connect(ch.name)
    assert other.maxsize == 5
    other.put("via connect")
    assert ch.get() == "via connect"
    same = Channel.get_or_create(ch.name)
    assert same.maxsize == 5  # settings left out take the existing channel's
    assert Channel.get_or_create(ch.name, maxsize=5).maxsize == 5
    with pytest.raises(ValueError) as info:
        Channel.get_or_create(ch.name, maxsize=99)
    assert str(info.value) == (
        f"channel '{ch.name}' already exists with maxsize=5, not 99; pass maxsize=5 "
        "(or leave it out) to attach, or choose another name"
    )
    with pytest.raises(ValueError, match="maxsize=-1 must be an int >= 0"):
        Channel.get_or_create(f"neg-{uuid.uuid4().hex[:6]}", maxsize=-1)
    with pytest.raises(ChannelNotFoundError, match="no channel named 'nope-.*Channel.create"):
        Channel.connect(f"nope-{uuid.uuid4().hex[:6]}")


def test_create_many_makes_each_channel_or_none(make_channel, ray_session):
    """The brokers start together; a taken name fails the whole call and the channels it had
    made are gone (their names free again)."""
    tag = uuid.uuid4().hex[:8]
    made = Channel.create_many([f"many-{tag}-0", f"many-{tag}-1"], [0, 3])
    try:
        assert [(c.name, c.maxsize) for c in made] == [(f"many-{tag}-0", 0), (f"many-{tag}-1", 3)]
        for i, c in enumerate(made):
            c.put(i)
            assert Channel.connect(c.name).get() == i
    finally:
        for c in made:
            c.delete()
    taken = make_channel()
    first = f"many-{tag}-first"
    with pytest.raises(ChannelExistsError, match=f"channel '{taken.name}' already exists"):
        Channel.create_many([first, taken.name], [0, 0])
    deadline = time.monotonic() + 10
    while True:  # Ray frees a killed actor's name asynchronously
        try:
            Channel.connect(first)
        except ChannelNotFoundError:
            break
        assert time.monotonic() < deadline, f"{first} outlived the failed create_many"
        time.sleep(0.05)
    with pytest.raises(ValueError, match="2 names but 1 maxsizes"):
        Channel.create_many(["a", "b"], [0])


def test_connect_waits_for_creation(make_channel):
    name = f"late-{uuid.uuid4().hex[:8]}"
    thread, box = _in_thread(lambda: Channel.connect(name, timeout=20))
    time.sleep(0.2)
    ch = make_channel(name=name)
    thread.join(timeout=20)
    assert box["value"].name == name
    box["value"].put(7)
    assert ch.get() == 7


def test_non_picklable_payload_names_the_type(make_channel):
    ch = make_channel()
    with pytest.raises(
        TypeError,
        match=r"channel '.*': cannot send an object of type builtins\.dict.*_thread\.lock",
    ):
        ch.put({"ok": 1, "lock": threading.Lock()})
    assert ch.qsize() == 0
    ch.put({"fine": lambda x: x * 2})  # cloudpickle handles functions
    assert ch.get()["fine"](3) == 6


def test_invalid_arguments(ray_session):
    with pytest.raises(ValueError, match="maxsize=-1"):
        Channel.create("bad", maxsize=-1)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        Channel.create("")


def test_bad_weights_and_timeouts_are_refused_and_nothing_is_put(make_channel):
    """A negative weight let a get_batch take more items than its target; a NaN one never
    reached it (the batch waited for ever); a timeout of another type failed inside a
    comparison."""
    ch = make_channel()
    for w in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"item weights must be finite and >= 0.*got"):
            ch.put_many(["a", "b"], weights=[1.0, w])
    assert ch.qsize() == 0
    for t in ("1", float("nan"), -1):
        with pytest.raises(ValueError, match=r"timeout=.* must be None \(wait forever\) or >= 0"):
            ch.get(timeout=t)
    ch.put("x", weight=0.0)  # an item that weighs nothing is fine
    assert ch.get(timeout=5) == "x"


def test_a_process_that_takes_its_own_large_item_exits_cleanly(tmp_path):
    """The driver (or a worker) takes an item it put through a shared-memory slot: at exit the
    resource tracker printed a KeyError traceback for the slot its pool unlinked."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from loomrl.transport._shm import read_buffers, write_buffers\n"
        "name, spans = write_buffers([np.arange(1 << 18, dtype=np.float64)])\n"
        "(back,) = read_buffers(name, spans)\n"
        "assert back.view(np.float64)[-1] == (1 << 18) - 1\n"
        "del back\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


def test_large_payloads_via_object_store(make_channel):
    import torch

    ch = make_channel(shared_memory=False)
    big = np.random.default_rng(0).random(1 << 18)  # 2 MB
    tens = torch.randn(512, 512).to(torch.bfloat16)  # 512 KB
    ch.put({"a": big, "t": tens, "meta": {"step": 3}}, weight=2.0)
    out = ch.get()
    np.testing.assert_array_equal(out["a"], big)
    assert out["t"].dtype == torch.bfloat16 and torch.equal(out["t"], tens)
    assert not out["a"].flags.writeable  # read in place from shared memory, not copied
    stats = ch.stats()
    assert stats["bytes_put"] == stats["bytes_got"] > big.nbytes + tens.numel() * 2


def test_large_payloads_via_shared_memory_slots(make_channel, ray_session):
    """A worker puts large arrays; the driver reads them in place from a shared-memory slot; the
    slot is reused once the driver drops the item, and a held item is never overwritten."""
    import torch

    from loomrl.transport import _shm

    ch = make_channel(maxsize=0)
    assert ch._shm  # one-node cluster: on by default

    @ray_session.remote(num_cpus=0)
    class Producer:
        def put(self, ch, n, seed):
            rng = np.random.default_rng(seed)
            items = [{"a": rng.random(1 << 17), "t": torch.arange(70_000) * i} for i in range(n)]
            for it in items:
                ch.put(it)
            return [float(it["a"].sum()) for it in items]

        def pool(self):
            return len(_shm.pool().slots), _shm.pool().in_use()

    p = Producer.remote()
    sums = ray_session.get(p.put.remote(ch, 1, 0))
    held = ch.get()  # the driver keeps this one
    first = held["a"].copy()
    assert held["a"].flags.writeable and float(held["a"].sum()) == sums[0]
    sums = ray_session.get(p.put.remote(ch, 3, 1))
    for i, want in enumerate(sums):
        got = ch.get()
        assert float(got["a"].sum()) == want and torch.equal(got["t"], torch.arange(70_000) * i)
        del got
    slots, in_use = ray_session.get(p.pool.remote())
    assert in_use == 1  # only the held item's slot
    np.testing.assert_array_equal(held["a"], first)  # not overwritten by later puts
    del held
    ray_session.get(p.put.remote(ch, 1, 2))
    ch.get()
    assert ray_session.get(p.pool.remote())[0] == slots  # reused, not grown
    ray_session.kill(p)


def test_shared_memory_pool_limit_falls_back_to_the_object_store(make_channel):
    from loomrl import channel as channel_mod
    from loomrl.transport import _shm

    pool = _shm.SlotPool(limit_bytes=0)
    assert pool.acquire(1 << 20) is None  # at its limit: callers use the object store
    ch = make_channel()
    old, _shm._pool = _shm._pool, pool
    try:
        big = np.ones(1 << 18)
        _, payload = channel_mod._encode(big, False, ch.name, ch._inline_bytes, True)
        assert payload[0] == channel_mod._REF
        ch.put(big)
        np.testing.assert_array_equal(ch.get(), big)
    finally:
        _shm._pool = old


def test_channel_passed_to_ray_actor_and_edges(make_channel, ray_session):
    ray = ray_session
    ch = make_channel(maxsize=8)

    @ray.remote(num_cpus=0)
    class Producer:
        def __init__(self, ch):
            self.ch = ch

        def run(self, n):
            with component("rollout"):
                for i in range(n):
                    self.ch.put({"i": i, "obs": np.full(3, i)}, key="train")
            return n

        def by_name(self, name):
            Channel.connect(name).put("hello", src="named-producer")

    @ray.remote(num_cpus=0)
    class Consumer:
        def take(self, ch, n):
            return [ch.get(key="train", dst="trainer")["i"] for _ in range(n)]

    producer, consumer = Producer.remote(ch), Consumer.remote()
    done = producer.run.remote(30)  # 30 items through maxsize=8: back-pressure on the way
    assert ray.get(consumer.take.remote(ch, 30)) == list(range(30))
    assert ray.get(done) == 30
    ray.get(producer.by_name.remote(ch.name))
    with component("evaluator"):
        assert ch.get() == "hello"
    assert ch.edges() == {("rollout", "trainer"), ("named-producer", "evaluator")}
    ray.kill(producer)
    ray.kill(consumer)


def test_delete_frees_the_name(make_channel, ray_session):
    name = f"del-{uuid.uuid4().hex[:8]}"
    ch = Channel.create(name)
    ch.put(1)
    ch.delete()
    with pytest.raises(ChannelClosed, match="was deleted"):
        ch.put(2)
    with pytest.raises(ChannelClosed, match="was deleted"):
        ch.get(timeout=5)  # the queued item was dropped, not handed out
    deadline = time.monotonic() + 10
    while True:  # Ray frees a killed actor's name asynchronously
        try:
            again = make_channel(name=name)
            break
        except ChannelExistsError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert again.qsize() == 0


def test_handle_pickles_and_offload_setting_is_shared(make_channel):
    import pickle

    import torch

    ch = make_channel(offload=True)
    copy = pickle.loads(pickle.dumps(ch))
    assert copy.offload and Channel.connect(ch.name).offload
    copy.put({"t": torch.arange(4, dtype=torch.bfloat16)})
    assert ch.get()["t"].tolist() == [0, 1, 2, 3]
