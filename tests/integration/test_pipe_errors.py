"""A pipe rollout whose env worker's process dies: the error names the env worker, also when the
policy's "connection closed" (HandoffError) reaches the driver first."""

from __future__ import annotations

import os
import time

import pytest

from loomrl import Worker
from loomrl.cycle import pipe_rollout
from loomrl.errors import WorkerDiedError


class FakePolicy(Worker):
    def serve_pipe(self, token, steps, groups, workers, timeout):
        from loomrl.workers.policy import HandoffError

        time.sleep(0.2)  # the env worker's end reaches it first, as a closed connection
        raise HandoffError("env worker 0 (its observations) closed its connection")


class FakeEnv(Worker):
    def run_pipe(self, address, token, w, parts, steps, timeout):
        time.sleep(1.0)  # after the policy's error has reached the driver
        os._exit(7)


def test_the_dead_env_worker_is_named_not_the_policy_that_found_its_connection_closed(cluster):
    policy = cluster.launch(FakePolicy, 1, devices=[0], name="policy")
    env = cluster.launch(FakeEnv, 1, devices=[1], name="env")
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError, match=r"^env rank 0 on \S+ died"):
            pipe_rollout(policy, [env], "127.0.0.1:9", [[(0, 0, 1)]], steps=2, timeout=20.0)
        assert time.monotonic() - t0 < 30
    finally:
        policy.kill()
        env.kill()
