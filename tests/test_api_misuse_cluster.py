"""Cluster misuse: Cluster(...) instead of Cluster.start, start arguments of the wrong type or
value, and a second Cluster.start while Ray runs. Errors come before Ray starts, name every bad
argument and say the fix; no Ray is started for nothing."""

from __future__ import annotations

import pytest

from loomrl import Cluster, Worker
from loomrl.cluster import GroupLaunch
from loomrl.errors import PlacementError


def test_cluster_called_like_start_points_to_start():
    for call in (lambda: Cluster(), lambda: Cluster(num_cpus=2), lambda: Cluster(4, True)):
        with pytest.raises(TypeError, match=r"a Cluster is made by loomrl.Cluster.start\("):
            call()
    with pytest.raises(TypeError, match=r"Cluster.start\(num_cpus=2\)"):
        Cluster(num_cpus=2)


def test_start_arguments_are_all_refused_before_ray_starts(monkeypatch):
    """Ray refused a negative or fractional count in its own words after starting its
    processes, num_devices='4' failed in a comparison with Ray left running, num_devices=0
    made a cluster without devices, and address=123 was an AttributeError."""
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **k: pytest.fail("Ray was started"))
    with pytest.raises(PlacementError) as e:
        Cluster.start(num_cpus=-1, num_gpus=1.5, num_devices=0, address=123)
    for said in (
        "num_cpus=-1 must be a whole number >= 0",
        "num_gpus=1.5 must be a whole number >= 0",
        "num_devices=0 must be a whole number >= 1",
        "address=123 must be a Ray cluster's address",
    ):
        assert said in str(e.value)
    for bad in (
        {"num_cpus": "2"},
        {"num_gpus": True},
        {"num_devices": "4"},
        {"address": ""},
        {"pin_cores": "no"},  # a string read as True
    ):
        with pytest.raises(PlacementError, match=f"{next(iter(bad))}="):
            Cluster.start(**bad)


def test_a_second_start_with_other_resources_says_it_shares_the_running_ray(cluster):
    """The second Cluster took the running Ray's inventory and dropped its own num_cpus and
    num_gpus without a word."""
    import ray

    with pytest.warns(UserWarning, match=r"num_gpus=2 \(it has 4\).*already running"):
        second = Cluster.start(num_gpus=2)
    assert second.num_devices == cluster.num_devices
    second.shutdown()  # it did not start Ray: the session's cluster goes on
    assert ray.is_initialized()
    # Ray still runs, yet this Cluster is done: its launches started workers that no shutdown
    # would stop.
    with pytest.raises(PlacementError, match=r"this Cluster was shut down.*Cluster.start\(\)"):
        second.launch(Worker, 1, devices=[0])


def test_launch_many_takes_a_list_of_group_launches(cluster):
    for wrong in ([(Worker, 1)], GroupLaunch(Worker, 1)):  # a tuple: AttributeError inside
        with pytest.raises(TypeError, match="launch_many takes a list of .*GroupLaunch"):
            cluster.launch_many(wrong)
    with pytest.raises(TypeError, match="launch_many takes a list of .*GroupLaunch, got 5"):
        cluster.launch_many(5)


class Echo(Worker):
    def rank_of(self):
        return self.rank


def test_launch_many_takes_a_generator_of_group_launches(cluster):
    # The check of every element used a generator up: nothing was launched, and no error said so
    groups = cluster.launch_many(GroupLaunch(Echo, 1, devices=[i]) for i in range(2))
    try:
        assert len(groups) == 2
    finally:
        for g in groups:
            g.kill()


def test_a_launch_timeout_that_is_no_timeout_is_named_before_any_process_starts(cluster):
    before = cluster.launch_timeout_s
    try:
        for wrong in (-1, "60"):
            cluster.launch_timeout_s = wrong
            with pytest.raises(ValueError, match=r"Cluster.launch_timeout_s=.* must be None"):
                cluster.launch(Worker, 1, devices=[0])
    finally:
        cluster.launch_timeout_s = before
