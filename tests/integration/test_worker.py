"""Cluster / WorkerGroup / Handle / wait on the session's embedded Ray (2 CPUs, 4 logical GPUs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

import loomrl
from loomrl import Worker, dispatch, wait
from loomrl.errors import PlacementError, RemoteError, WorkerDiedError


class Echo(Worker):
    def __init__(self, scale: int = 1):
        super().__init__()
        self.scale = scale
        self.seen_rank_in_init = self.rank

    def mul(self, x):
        return (self.rank, x * self.scale)

    @dispatch("split")
    def add_rank(self, xs):
        return [x + 100 * self.rank for x in xs]

    @dispatch("scatter")
    def pick(self, x):
        return x

    @dispatch("rank0")
    def only_first(self):
        return self.rank

    def where(self):
        import ray

        return {
            "devices": self.devices,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "init_rank": self.seen_rank_in_init,
            "node": ray.get_runtime_context().get_node_id(),
            "affinity": sorted(os.sched_getaffinity(0)),
        }

    def fail(self):
        raise KeyError("no such prompt")

    def sleep(self, s):
        time.sleep(s)
        return os.getpid()


def test_inventory(cluster):
    inv = cluster.inventory()
    assert inv["devices"] == 4 and inv["device_kind"] == "gpu"
    assert [d.index for d in cluster.devices] == [0, 1, 2, 3]
    assert cluster.num_cpus == 2


def test_handles_dispatch_and_placement(cluster):
    g = cluster.launch(Echo, 4, 3, devices=[0, 1, 2, 3])
    try:
        h = g.mul(2)
        assert isinstance(h, loomrl.Handle)
        assert wait(h) == [(0, 6), (1, 6), (2, 6), (3, 6)]
        assert wait(g.add_rank(list(range(6)))) == [[0, 1], [102, 103], [204], [305]]
        assert wait(g.pick(["a", "b", "c", "d"])) == ["a", "b", "c", "d"]
        assert wait(g.only_first()) == [0]
        assert wait(g.on([1, 3]).mul(1)) == [(1, 3), (3, 3)]
        where = wait(g.where())
        assert [w["devices"] for w in where] == [(0,), (1,), (2,), (3,)]
        assert [w["visible"] for w in where] == ["0", "1", "2", "3"]
        assert all(w["world_size"] == 4 and w["init_rank"] == i for i, w in enumerate(where))
        assert [w["local_world_size"] for w in where] == [4, 4, 4, 4]  # one node
        a, b = wait(g.mul(1), g.on(0).mul(5))
        assert a[0] == (0, 3) and b == [(0, 15)]
    finally:
        g.kill()


def test_several_workers_per_device_and_several_devices_per_worker(cluster):
    shared = cluster.launch(Echo, 4, devices=[2, 3])
    wide = cluster.launch(Echo, 2, devices=[0, 1, 2, 3])
    try:
        assert [w["devices"] for w in wait(shared.where())] == [(2,), (2,), (3,), (3,)]
        assert [w["visible"] for w in wait(wide.where())] == ["0,1", "2,3"]
    finally:
        shared.kill()
        wide.kill()


def test_remote_error_has_context(cluster):
    g = cluster.launch(Echo, 2, devices=[0, 1], name="scorer")
    try:
        with pytest.raises(
            RemoteError, match=r"scorer rank \d on .+ failed in fail\(\): KeyError"
        ) as ei:
            wait(g.fail())
        assert "no such prompt" in ei.value.remote_traceback
        assert ei.value.method == "fail"
    finally:
        g.kill()


class _CodedError(Exception):
    """An exception the driver cannot rebuild: its __init__ takes other arguments than the
    message it passes on (Ray then raised its own UnserializableException, naming no worker)."""

    def __init__(self, code, why):
        super().__init__(f"code {code}: {why}")


class Picky(Worker):
    def coded(self):
        raise _CodedError(7, "quota exceeded")

    def scale(self, x, factor=2):
        return x * factor


def test_an_exception_the_driver_cannot_rebuild_still_names_the_worker(cluster):
    g = cluster.launch(Picky, 1, devices=[0], name="quota")
    try:
        with pytest.raises(
            RemoteError, match=r"quota rank 0 on .+ failed in coded\(\): .*code 7: quota exceeded"
        ) as ei:
            wait(g.coded(), timeout=60)
        assert "raise _CodedError" in ei.value.remote_traceback
    finally:
        g.kill()


def test_a_misspelt_or_misused_method_is_named_with_the_fix(cluster):
    import threading

    g = cluster.launch(Picky, 1, devices=[0], name="calc")
    try:
        with pytest.raises(
            AttributeError, match=r"calc: Picky has no method 'scal'; did you mean 'scale'\?"
        ):
            g.scal(3)
        with pytest.raises(AttributeError, match="did you mean 'scale'"):
            g.on(0).sclae(3)
        with pytest.raises(TypeError, match=r"^calc.scale\(\): missing a required argument: 'x'"):
            g.scale()
        with pytest.raises(
            TypeError,
            match=r"^calc.scale\(\): argument factor \(lock\) cannot be sent to the worker",
        ):
            g.scale(1, factor=threading.Lock())
        assert wait(g.scale(3), timeout=60) == [6]  # the group works on
        assert not hasattr(g, "scal") and not hasattr(g, "_private")
    finally:
        g.kill()


_MODULE_LOCK = __import__("threading").Lock()


class _HoldsALock(Worker):
    def locked(self):
        return _MODULE_LOCK.locked()


class _Yields(Worker):
    def items(self):
        yield 1


class _HandsBackGenerators(Worker):
    def lazy(self, n):
        return (i for i in range(n))

    def eager(self, n):
        return list(self.lazy(n))  # generators may pass between a worker's own methods

    @staticmethod
    def double(x):
        return 2 * x

    def in_thread(self, n):
        # The worker's own thread may take a generator from a public method.
        box = []
        t = __import__("threading").Thread(target=lambda: box.append(list(self.lazy(n))))
        t.start()
        t.join()
        return box


def test_a_method_returning_a_generator_is_an_error_not_its_first_item(cluster):
    g = cluster.launch(_HandsBackGenerators, 1, devices=[0], name="gens")
    try:
        with pytest.raises(
            RemoteError,
            match=r"_HandsBackGenerators\.lazy\(\) returned a generator: only its first item",
        ):
            wait(g.lazy(3))
        assert wait(g.eager(3)) == [[0, 1, 2]]
        assert wait(g.double(4)) == [8]
        assert wait(g.in_thread(2)) == [[[0, 1]]]
    finally:
        g.kill()


def test_a_worker_class_or_arguments_that_cannot_work_are_refused_before_any_process_starts(
    cluster,
):
    import threading

    free = {node: list(cores) for node, cores in cluster._free_cores.items()}
    reserved = dict(cluster._cpu_reserved)
    with pytest.raises(TypeError, match=r"^Echo\(scale=1\): too many positional arguments"):
        cluster.launch(Echo, 1, 3, 4, devices=[0], num_cpus=1.0)
    with pytest.raises(
        TypeError, match=r"Echo\(scale=1\): got an unexpected keyword argument 'scael'"
    ):
        cluster.launch(Echo, 1, devices=[0], scael=2)
    with pytest.raises(TypeError, match=r"_Yields.items is a generator .*return a list instead"):
        cluster.launch(_Yields, 1, devices=[0])
    with pytest.raises(
        TypeError, match=r"^starting Echo: argument #0 \(lock\) cannot be sent to the worker"
    ):
        cluster.launch(Echo, 1, threading.Lock(), devices=[0], num_cpus=1.0)
    with pytest.raises(
        TypeError,
        match=r"^starting held \(_HoldsALock\): the class _HoldsALock cannot be sent .*create "
        "such objects in __init__",
    ):
        cluster.launch(_HoldsALock, 1, devices=[0], name="held")
    assert {node: list(cores) for node, cores in cluster._free_cores.items()} == free
    assert cluster._cpu_reserved == reserved


def test_killed_worker_is_reported_quickly(cluster):
    import ray

    g = cluster.launch(Echo, 2, devices=[0, 1], name="victim")
    try:
        h = g.sleep(30)
        time.sleep(0.5)
        ray.kill(g.actors[1])
        t0 = time.monotonic()
        with pytest.raises(
            WorkerDiedError, match=r"victim rank 1 on .+ died while running sleep\(\)"
        ):
            wait(h)
        assert time.monotonic() - t0 < 10
        assert g.alive(timeout=2) == [True, False]
    finally:
        g.kill()


def test_a_worker_that_dies_is_named_when_another_workers_call_needed_its_result(cluster):
    """b.mul waits on a's sleep; a's process dies: the error names a (the dead worker), not b's
    call that found it, and is a WorkerDiedError (what run.max_restarts restarts on)."""
    import ray

    a = cluster.launch(Echo, 1, devices=[0], name="producer")
    b = cluster.launch(Echo, 1, devices=[1], name="consumer")
    try:
        (pending,) = a.sleep(30).refs
        h = b.mul(pending)  # Ray resolves the argument before b's call runs
        time.sleep(0.5)
        ray.kill(a.actors[0])
        with pytest.raises(
            WorkerDiedError,
            match=r"^producer rank 0 on \S+ died: found when consumer rank 0's mul\(\) needed it",
        ):
            wait(h)
    finally:
        a.kill()
        b.kill()


def test_wait_timeout(cluster):
    g = cluster.launch(Echo, 1, devices=[0])
    try:
        with pytest.raises(TimeoutError, match="still running"):
            wait(g.sleep(3), timeout=0.3)
    finally:
        g.kill()


def test_bad_placements_are_clear_errors(cluster):
    with pytest.raises(PlacementError, match=r"unknown device id\(s\) \[7\]"):
        cluster.launch(Echo, 1, devices=[7])
    with pytest.raises(PlacementError, match="cannot place 3 workers on 2 device"):
        cluster.launch(Echo, 3, devices=[0, 1])
    with pytest.raises(PlacementError, match="need 3 core"):
        cluster.launch(Echo, 3, devices=[0], num_cpus=1.0)
    with pytest.raises(PlacementError, match="lists a device twice"):
        cluster.launch(Echo, 2, devices=[1, 1])
    with pytest.raises(TypeError, match="subclass of loomrl.Worker"):
        cluster.launch(dict, 1)
    with pytest.raises(PlacementError, match=r"devices=\[\]: a worker group needs"):
        cluster.launch(Echo, 1, devices=[])
    for odd in (True, 2.0, "0"):
        with pytest.raises(PlacementError, match="give None .all., a count, or a list"):
            cluster.launch(Echo, 1, devices=odd)
    for cpus in ("1", float("nan"), -1):
        with pytest.raises(PlacementError, match="must be a number of cores >= 0"):
            cluster.launch(Echo, 1, devices=[0], num_cpus=cpus)

    class Twice(Echo):
        max_concurrency = "two"

    with pytest.raises(TypeError, match=r"Twice.max_concurrency='two': must be an int >= 1"):
        cluster.launch(Twice, 1, devices=[0])
    import numpy as np

    assert [d.index for d in cluster.resolve_devices([np.int64(1)])] == [1]  # numpy ints work
    assert len(cluster.resolve_devices(np.int64(2))) == 2


def test_workers_on_a_gpu_node_get_cores_apart_from_each_other(cluster):
    from loomrl.worker import _core_order

    order, every = _core_order(), sorted(os.sched_getaffinity(0))  # the session's node: 2 cores
    g = cluster.launch(Echo, 2, devices=[0], num_cpus=1.0)
    try:  # one core each, not the same one
        assert [w["affinity"] for w in wait(g.where())] == [[order[0]], [order[1]]]
    finally:
        g.kill()
    gpu = cluster.launch(Echo, 1, devices=[0])  # reserving none, nothing held: not pinned
    sim = cluster.launch(Echo, 1, devices=[1], num_cpus=1.0)  # the killed group gave them back
    late = cluster.launch(Echo, 1, devices=[0])  # reserving none: the cores nobody holds
    try:
        assert wait(gpu.where())[0]["affinity"] == every
        assert wait(sim.where())[0]["affinity"] == [order[1]]
        assert wait(late.where())[0]["affinity"] == [order[0]]
    finally:
        for x in (gpu, sim, late):
            x.kill()
    half = cluster.launch(Echo, 4, devices=[0], num_cpus=0.5)  # under a core each: two share one
    try:
        seen = [w["affinity"] for w in wait(half.where())]
        assert seen == [[order[0]], [order[0]], [order[1]], [order[1]]]
    finally:
        half.on(0).kill()  # a view's kill is the group's, and gives the cores back
    assert cluster._free_cores[0] == [0, 1]
    unpinned = loomrl.Cluster(cluster.nodes, owns_ray=False, pin_cores=False)
    g = unpinned.launch(Echo, 1, devices=[0], num_cpus=1.0)
    try:
        assert wait(g.where())[0]["affinity"] == every
    finally:
        g.kill()


def test_a_launch_of_more_processes_than_a_node_can_start_is_refused_before_any_starts(cluster):
    """More than 8 processes per core on one node (agent.tool_workers=1000 on 2 cores) would
    not finish starting before the launch timeout: refused at once, naming the group and the
    node's cores; the group's launch reserves nothing, so the next launch still starts."""
    cores = max(1, int(cluster.nodes[0].num_cpus))
    with pytest.raises(
        PlacementError,
        match=rf"search: {8 * cores + 1} worker process\(es\).*"
        rf"node 0, which has {cores} core\(s\): at most {8 * cores}",
    ):
        cluster.launch(Echo, 8 * cores + 1, devices=[0], name="search")
    g = cluster.launch(Echo, 1, devices=[0])
    try:
        assert wait(g.mul(2)) == [(0, 2)]
    finally:
        g.kill()


def test_constructor_error_surfaces_at_launch(cluster):
    class Broken(Worker):
        def __init__(self):
            super().__init__()
            raise RuntimeError("cannot load model")

    # The constructor's own error and traceback, not a dead process: a run's restart would
    # only fail the same way again (run_with_restarts restarts on WorkerDiedError).
    with pytest.raises(RemoteError) as err:
        cluster.launch(Broken, 1, devices=[0])
    assert err.value.method == "__init__" and not err.value.expected
    assert err.value.cause == "RuntimeError: cannot load model"
    assert 'raise RuntimeError("cannot load model")' in err.value.remote_traceback


def test_a_loomrl_error_in_a_constructor_is_one_expected_error_naming_the_node(cluster):
    """loomrl's own errors raised while a worker starts (no renderer on the host, say) reach the
    driver as themselves, marked expected (the CLI prints one line), with the rank's node; any
    other exception still shows as the worker that could not start."""
    from loomrl.errors import LoomError

    class NoScreen(Worker):
        def __init__(self):
            super().__init__()
            raise LoomError("no renderer on this host: install EGL")

    with pytest.raises(RemoteError) as err:
        cluster.launch(NoScreen, 1, devices=[0])
    assert err.value.expected and err.value.method == "__init__"
    assert "no renderer on this host" in err.value.headline
    assert err.value.host == cluster.nodes[0].ip != "?"


class Slow(Worker):
    """Takes ``seconds`` to start and records when its constructor began and ended. Writes its
    pid to ``pid_file``; with ``fail``, raises once ``wait_for`` exists."""

    def __init__(self, seconds: float, fail: bool = False, pid_file: str = "", wait_for: str = ""):
        super().__init__()
        self.entered = time.time()
        if pid_file:
            with open(pid_file, "w") as f:
                f.write(str(os.getpid()))
        time.sleep(seconds)
        deadline = time.time() + 60
        while wait_for and not os.path.exists(wait_for) and time.time() < deadline:
            time.sleep(0.05)
        if fail:
            raise RuntimeError("slow worker could not start")
        self.left = time.time()

    def span(self):
        return self.entered, self.left


def _alive(pid: int) -> bool:
    """The process runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_launch_many_starts_groups_together_and_fails_whole(cluster, tmp_path):
    from loomrl.cluster import GroupLaunch

    free = {node: list(cores) for node, cores in cluster._free_cores.items()}
    reserved = dict(cluster._cpu_reserved)
    a, b = cluster.launch_many(
        [
            GroupLaunch(Slow, 1, (4.0,), devices=[0], name="a"),
            GroupLaunch(Slow, 2, (4.0,), devices=[1, 2], name="b", num_cpus=0.5),
        ]
    )
    try:
        assert (a.name, b.name, b.world_size) == ("a", "b", 2)
        spans = [sp for per_group in wait(a.span(), b.span()) for sp in per_group]
        # Started together: every constructor began before any ended (one group after another,
        # the second group's would have begun after the first's ended).
        assert max(e for e, _ in spans) < min(x for _, x in spans), spans
    finally:
        a.kill()
        b.kill()
    # One constructor fails: the call raises it, and no group of the call is left running or
    # holding cores.
    pid_file = tmp_path / "fine.pid"
    with pytest.raises((RemoteError, WorkerDiedError), match="could not start"):
        cluster.launch_many(
            [
                GroupLaunch(Slow, 1, (0.0, False, str(pid_file)), devices=[0], num_cpus=1.0),
                GroupLaunch(
                    Slow,
                    1,
                    (0.0, True, "", str(pid_file)),
                    devices=[1],
                    name="broken",
                    num_cpus=1.0,
                ),
            ]
        )
    pid = int(pid_file.read_text())
    deadline = time.time() + 10
    while time.time() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the group that started fine was left running"
    # Reservations are checked across the call, before anything starts: 2 + 1 cores of 2.
    with pytest.raises(PlacementError, match=r"Slow: 1 worker.*2 already reserved"):
        cluster.launch_many(
            [
                GroupLaunch(Slow, 2, (0.0,), devices=[0], num_cpus=1.0),
                GroupLaunch(Slow, 1, (0.0,), devices=[1], num_cpus=1.0),
            ]
        )
    assert {node: list(cores) for node, cores in cluster._free_cores.items()} == free
    assert cluster._cpu_reserved == reserved


def test_a_constructor_that_hangs_is_a_launch_timeout_naming_it_not_a_hang(cluster, tmp_path):
    from loomrl.cluster import GroupLaunch
    from loomrl.errors import LaunchTimeout

    free = {node: list(cores) for node, cores in cluster._free_cores.items()}
    pid_file = tmp_path / "hung.pid"
    before, cluster.launch_timeout_s = cluster.launch_timeout_s, 4.0
    try:
        with pytest.raises(LaunchTimeout) as e:
            cluster.launch_many(
                [
                    GroupLaunch(Slow, 1, (0.0,), devices=[0], name="quick"),
                    GroupLaunch(Slow, 2, (600.0, False, str(pid_file)), devices=[1], name="hung"),
                ]
            )
    finally:
        cluster.launch_timeout_s = before
    assert str(e.value).startswith(
        "hung (ranks [0, 1]): the worker constructor did not return within 4 s "
        "(Cluster.launch_timeout_s)"
    )
    assert "raise run.launch_timeout_s" in str(e.value)
    pid = int(pid_file.read_text())
    deadline = time.time() + 10
    while time.time() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the hung worker was left running"
    assert {node: list(cores) for node, cores in cluster._free_cores.items()} == free


def test_a_config_error_in_a_constructor_reaches_the_driver_as_itself(cluster):
    """A user's mistake found while a worker starts is a ConfigError at launch, not a dead
    process (which the CLI's restarts would try again); the cores it took are given back."""
    from loomrl.errors import ConfigError

    class Picky(Worker):
        def __init__(self, width):
            super().__init__()
            if width < 1:
                raise ConfigError([f"width={width}: must be >= 1"], source="picky.yaml")

    free = {node: list(cores) for node, cores in cluster._free_cores.items()}
    with pytest.raises(ConfigError) as err:
        cluster.launch(Picky, 2, 0, devices=[0, 1], num_cpus=1.0)
    assert err.value.problems == ["width=0: must be >= 1"]
    assert err.value.source.startswith("picky.yaml (worker 'Picky' rank ")
    assert {node: list(cores) for node, cores in cluster._free_cores.items()} == free
    g = cluster.launch(Picky, 1, 3, devices=[0])
    g.kill()


def test_two_fake_nodes_placement(tmp_path):
    """Two Ray nodes with 2 logical GPUs each: device 3 lands on node 1, local GPU 1."""
    script = textwrap.dedent(
        """
        import os, json
        os.environ["RAY_AUTH_MODE"] = "disabled"
        from ray.cluster_utils import Cluster as RayCluster
        from loomrl import Cluster, Worker, wait

        class W(Worker):
            def where(self):
                import ray
                return [ray.get_runtime_context().get_node_id(), os.environ["CUDA_VISIBLE_DEVICES"], list(self.devices)]

        rc = RayCluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
        rc.add_node(num_cpus=1, num_gpus=2)
        rc.wait_for_nodes()
        c = Cluster.start(address=rc.address)
        g = c.launch(W, 4, devices=[0, 1, 2, 3])
        out = wait(g.where())
        ids = [n.node_id for n in c.nodes]
        print(json.dumps({"nodes": ids, "where": out, "devs": [[d.node, d.local] for d in c.devices]}))
        c.shutdown()
        import ray; ray.shutdown(); rc.shutdown()
        """
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res["devs"] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    nodes = res["nodes"]
    assert [w[0] for w in res["where"]] == [nodes[0], nodes[0], nodes[1], nodes[1]]
    assert [w[1] for w in res["where"]] == ["0", "1", "0", "1"]
