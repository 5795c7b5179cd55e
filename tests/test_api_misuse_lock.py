"""DeviceLock misuse: a release without its acquire (or one too many), devices and timeouts of
the wrong type, and a lock used once Ray has stopped."""

from __future__ import annotations

import pytest

from loomrl import DeviceLock
from loomrl.errors import LoomError
from loomrl.lock import DeviceLockError


def test_a_release_without_its_acquire_is_an_error_and_releases_nothing(cluster):
    """It passed without a word: a worker that releases twice frees devices another holder of
    the same owner name still uses."""
    lock = DeviceLock.get()
    with pytest.raises(
        DeviceLockError, match=r"release\(\[7\]\): .* does not hold device\(s\) \[7\]"
    ):
        lock.release([7])
    lock.acquire([7, 8])
    lock.acquire([7])  # re-entrant: two holds of 7
    lock.release([7])
    with pytest.raises(DeviceLockError, match=r"does not hold device\(s\) \[9\]"):
        lock.release([8, 9])  # refused whole: 8 is still held
    assert {d: n for d, (_, n) in lock.state().items() if d in (7, 8)} == {7: 1, 8: 1}
    lock.release([7, 8])
    with pytest.raises(DeviceLockError, match="released already"):
        lock.release([7])
    with lock.hold([7], owner="a"):
        with pytest.raises(DeviceLockError, match=r"b does not hold"):
            lock.release([7], owner="b")  # another owner's hold is not the caller's to end
    assert 7 not in lock.state()


def test_holds_that_went_with_a_replaced_lock_actor_release_quietly(cluster, monkeypatch):
    """A lock actor that died took its holds along; the releases of holds taken before this
    process attached to its replacement find nothing, and are no mistake. Those after are
    checked again."""
    import ray

    lock = DeviceLock.get()
    owner = "held-before-replacement"
    lock.acquire([7], owner=owner)
    ray.get(lock._actor.release.remote(owner, [7]))  # gone with the old actor, as it were
    monkeypatch.setattr(DeviceLock, "_replacements", DeviceLock._replacements + 1)
    lock.release([7], owner=owner)
    lock.acquire([7], owner=owner)
    lock.release([7], owner=owner)
    with pytest.raises(DeviceLockError, match="does not hold"):
        lock.release([7], owner=owner)


def test_a_hold_nested_inside_one_from_before_a_replacement_leaves_the_outer_quiet(
    cluster, monkeypatch
):
    """An acquire after the replacement re-armed the check for the owner's older hold too: the
    outer release raised, and inside `hold()` that replaced the body's own exception."""
    import ray

    lock = DeviceLock.get()
    owner = "nested-across-replacement"
    lock.acquire([7], owner=owner)
    ray.get(lock._actor.release.remote(owner, [7]))  # gone with the old actor, as it were
    monkeypatch.setattr(DeviceLock, "_replacements", DeviceLock._replacements + 1)
    with lock.hold([8], owner=owner):  # taken from the new actor, inside the outer hold
        pass
    lock.release([7], owner=owner)  # the outer hold: it went with the old actor
    with pytest.raises(DeviceLockError, match="does not hold"):
        lock.release([7], owner=owner)  # one release too many is still one
    assert not {7, 8} & set(lock.state())


def test_devices_and_timeouts_of_the_wrong_type_are_named(cluster):
    with pytest.raises(TypeError, match=r"use DeviceLock.get\(\)"):
        DeviceLock()
    lock = DeviceLock.get()
    for devices in (3, "01", None):  # "01" locked devices '0' and '1'
        with pytest.raises(TypeError, match=r"give a list of device indices"):
            lock.acquire(devices)
    with pytest.raises(TypeError, match=r"device indices are whole numbers, got 'a'"):
        lock.acquire([1, "a"])  # it failed inside the lock actor, in sorted()
    for t in ("1", -1):
        with pytest.raises(ValueError, match=r"timeout=.* must be None \(wait forever\)"):
            lock.acquire([1], timeout=t)
    with pytest.raises(TypeError, match="give a list of device indices"):
        with lock.hold(5):
            pass
    assert 1 not in lock.state()


def test_a_lock_once_ray_has_stopped_says_so_and_starts_no_ray(cluster, monkeypatch):
    import ray

    lock = DeviceLock.get()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("started a new Ray"))
    with pytest.raises(LoomError, match="Ray is not running in this process"):
        lock.acquire([0], timeout=1)
