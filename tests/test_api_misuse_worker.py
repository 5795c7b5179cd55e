"""Worker groups, handles and wait() misused: wrong launch arguments, bad timeouts, a handle
given twice, a method whose value cannot be sent back, a worker whose callee died, and calls on
a group that was stopped or whose Ray has stopped. Each is an error naming what and how to fix
it, never Ray's own words or a new Ray instance."""

from __future__ import annotations

import os
import pickle
import threading

import numpy as np
import pytest

from loomrl import Worker, dispatch, wait
from loomrl.errors import LoomError, PlacementError, RemoteError, WorkerDiedError


class W(Worker):
    def f(self, x=1):
        return x

    def lock(self):
        return threading.Lock()

    def pickles_badly(self):
        return pickle.dumps(threading.Lock())  # fails inside the method: an ordinary error

    def die(self):
        os._exit(1)


class Caller(Worker):
    def call(self, group, method):
        return wait(getattr(group, method)())


def test_launch_arguments_are_checked_before_any_process_starts(cluster):
    for n in (True, 0, "2"):
        with pytest.raises(PlacementError, match=rf"n={n!r}: the number of workers must be"):
            cluster.launch(W, n, devices=[0])
    with pytest.raises(PlacementError, match=r"name=5: a group's name is a non-empty string"):
        cluster.launch(W, 1, devices=[0], name=5)
    # Found in the worker, these killed the process as it started (os.environ takes str).
    for env in ({"A": 1}, ["A"]):
        with pytest.raises(PlacementError, match=r"env=.* must be a dict of str to str"):
            cluster.launch(W, 1, devices=[0], env=env)
    g = cluster.launch(W, np.int64(1), devices=[0])  # a numpy count is a count
    try:
        assert wait(g.f(2)) == [2]
    finally:
        g.kill()


class Clash(Worker):
    def kill(self):  # a group's own kill()
        return 1


def test_a_method_named_like_a_group_attribute_is_refused_before_its_processes_start(
    cluster, monkeypatch
):
    from loomrl.worker import WorkerGroup

    monkeypatch.setattr(WorkerGroup, "_start", lambda *a, **k: pytest.fail("a process started"))
    with pytest.raises(TypeError, match=r"Clash.kill clashes with WorkerGroup.kill; rename"):
        cluster.launch(Clash, 1, devices=[0])


def test_wait_checks_its_timeout_and_takes_a_handle_twice(cluster):
    g = cluster.launch(W, 1, devices=[0])
    try:
        h = g.f(3)
        for t in ("5", -1, float("nan")):
            with pytest.raises(ValueError, match=r"timeout=.* must be None \(wait forever\)"):
                wait(h, timeout=t)
        assert wait(h, timeout=float("inf")) == [3]  # inf: for ever (Ray's OverflowError)
        assert wait(h, h) == [[3], [3]]  # ray.wait refused a ref listed twice
        with pytest.raises(TypeError, match=r"got list; pass them one by one: wait\(\*handles\)"):
            wait([h])
        with pytest.raises(PlacementError, match=r"on\(\[\]\): give at least one of ranks"):
            g.on([])
        with pytest.raises(TypeError, match=r"@dispatch needs a mode: write @dispatch\('split'\)"):
            dispatch(W.f)
    finally:
        g.kill()


def test_a_value_that_cannot_be_sent_back_is_named_as_such(cluster):
    g = cluster.launch(W, 1, devices=[0])
    try:
        with pytest.raises(RemoteError, match=r"in lock\(\): its return value cannot be sent"):
            wait(g.lock())
        with pytest.raises(RemoteError) as e:  # raised inside the method: said as it was
            wait(g.pickles_badly())
        assert "return value" not in e.value.headline
        assert "cannot pickle" in e.value.headline
    finally:
        g.kill()


def test_errors_of_a_worker_another_worker_called_cross_as_themselves(cluster):
    """RemoteError and WorkerDiedError could not be pickled (their constructors take more than
    a message): a worker that waited on a dead one reported Ray's text as a RemoteError, which
    a run does not restart on."""
    for err in (RemoteError("w", 1, "h", "m", "c", "tb", True), WorkerDiedError("w", 1, "h", "m")):
        err.add_note("seen in step 3")  # what was set after construction crosses too
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
        assert again.__notes__ == ["seen in step 3"]
    callee = cluster.launch(W, 1, devices=[0], name="callee")
    caller = cluster.launch(Caller, 1, devices=[1], name="caller")
    try:
        with pytest.raises(RemoteError, match=r"caller rank 0 .* RemoteError: callee rank 0"):
            wait(caller.call(callee, "lock"))
        with pytest.raises(WorkerDiedError, match=r"^callee rank 0 .*found when caller rank 0"):
            wait(caller.call(callee, "die"), timeout=60)
    finally:
        callee.kill()
        caller.kill()


def test_a_stopped_group_says_so(cluster):
    g = cluster.launch(W, 2, devices=[0, 1])
    h = g.f(1)
    wait(h)
    g.kill()
    with pytest.raises(LoomError, match=r"W: this group was stopped \(kill\(\)"):
        g.f(1)
    with pytest.raises(LoomError, match="this group was stopped"):
        g.on(1).f(1)
    assert g.alive() == [False, False]


def test_calls_once_ray_has_stopped_say_so_and_start_no_ray(cluster, monkeypatch):
    """A group method called after its cluster's Ray stopped started a new Ray instance (Ray
    does on a first remote call) and failed there with "Can't find actor"; wait() on a handle
    raised Ray's ValueError about an unknown owner."""
    import ray

    g = cluster.launch(W, 1, devices=[0])
    try:
        h = g.f(1)
        wait(h)
        monkeypatch.setattr(ray, "is_initialized", lambda: False)
        monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("started a new Ray"))
        for call in (lambda: g.f(1), lambda: wait(h), h.done, g.alive):
            with pytest.raises(LoomError, match="Ray is not running in this process"):
                call()
    finally:
        monkeypatch.undo()
        g.kill()


def test_only_methods_the_wrapper_runs_are_read_for_a_return_value_that_cannot_be_sent():
    """The wrapper's frame tells a failure inside the method from one after it; async and
    underscore methods run without it, so a cloudpickle frame in their traceback (arguments
    that could not be unpickled, say) said nothing about their return value."""
    from types import SimpleNamespace

    from loomrl.worker import _wrapped

    class K(Worker):
        def plain(self):
            return 1

        async def later(self):
            return 1

        def _inner(self):
            return 1

    def handle(method):
        return SimpleNamespace(group=SimpleNamespace(cls=K), method=method)

    assert _wrapped(handle("plain"))
    assert not _wrapped(handle("later")) and not _wrapped(handle("_inner"))
