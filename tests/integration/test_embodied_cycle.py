"""The env <-> policy cycle on Ray workers: pipelined, grouped, spread over env workers, it
produces the same trajectories as the single-process reference ``loomrl.embodied.collect``."""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np
import pytest
import torch

from loomrl import wait
from loomrl.cycle import EnvPolicyCycle, resolve_handoff, ring_groups
from loomrl.embodied import PPOConfig, RewardScaler, RunningMeanStd, collect, ppo_update
from loomrl.envs.vec import EnvConfig, VecEnv
from loomrl.errors import ConfigError
from loomrl.policies import make_policy
from loomrl.workers.env import EnvWorker, worker_env_config
from loomrl.workers.policy import PolicyWorker

# Short episodes so that a few steps cover terminations, time-limit truncations and resets.
ENV = EnvConfig("InvertedPendulum-v5", num_envs=4, seed=4, max_episode_steps=7, cpu_cores=0.5)
PPO = PPOConfig(rollout_steps=48, epochs=2, num_minibatches=4, seed=5)
STEPS = 12


def _spaces() -> tuple:
    """One env's observation and action spaces, as an env worker of ENV reports them."""
    env = VecEnv(ENV)
    try:
        return env.single_observation_space, env.single_action_space
    finally:
        env.close()


def _policy_args() -> tuple:
    return (*_spaces(), ENV.num_envs, PPO, ENV.seed)


# A policy process takes seconds to start (it imports torch). The tests that check how a rollout
# fails, or what it counts, not the values it produces, share their policies through these
# module fixtures; the tests that compare with the reference start a fresh one each. (Env workers
# reserve CPUs, and two groups of them fill the session cluster: none is held by a fixture.)
@pytest.fixture(scope="module")
def spare_policy(cluster):
    """A plain policy worker, whatever rollouts it has served before."""
    policy = cluster.launch(PolicyWorker, 1, *_policy_args(), devices=[2], name="policy_spare")
    yield policy
    policy.kill()


def test_ring_groups_cut_every_worker_or_the_global_order():
    g = ring_groups(2, 4, 2)
    assert [[(p.worker, p.lo, p.hi) for p in parts] for parts in g] == [
        [(0, 0, 2), (1, 0, 2)],
        [(0, 2, 4), (1, 2, 4)],
    ]
    g = ring_groups(2, 2, 4)  # more groups than envs per worker: contiguous global slices
    assert [[(p.worker, p.lo, p.hi) for p in parts] for parts in g] == [
        [(0, 0, 1)],
        [(0, 1, 2)],
        [(1, 0, 1)],
        [(1, 1, 2)],
    ]
    g = ring_groups(2, 4, 2, layout="blocks")  # a group per worker, one call a step each
    assert [[(p.worker, p.lo, p.hi) for p in parts] for parts in g] == [[(0, 0, 4)], [(1, 0, 4)]]
    g = ring_groups(4, 2, 2, layout="blocks")  # a group spans two whole workers
    assert [[(p.worker, p.lo, p.hi) for p in parts] for parts in g] == [
        [(0, 0, 2), (1, 0, 2)],
        [(2, 0, 2), (3, 0, 2)],
    ]
    with pytest.raises(ConfigError, match="layout='rows': must be one of slices, blocks"):
        ring_groups(2, 4, 2, layout="rows")


def _reference(iterations: int):
    """Single process, groups=1: the unpipelined loop, with the recipe's normaliser and update."""
    torch.set_num_threads(1)
    env = VecEnv(ENV)
    policy = make_policy(env.single_observation_space, env.single_action_space, seed=PPO.seed)
    opt = torch.optim.Adam(policy.parameters(), lr=PPO.lr, eps=PPO.adam_eps)
    norm = RunningMeanStd(env.obs_shape)
    scaler = RewardScaler(ENV.num_envs, PPO.gamma, PPO.reward_clip)
    shuffle = torch.Generator().manual_seed(PPO.seed)
    out = []
    for _ in range(iterations):
        buf = collect(env, policy, STEPS, groups=1, normalizer=norm, obs_clip=PPO.obs_clip)
        scaler.update(buf.rewards.numpy(), buf.dones.numpy())
        ppo_update(policy, opt, buf, PPO, rewards=scaler.scale(buf.rewards), generator=shuffle)
        out.append((buf, [p.detach().clone() for p in policy.parameters()]))
    env.close()
    return out


def test_pipelined_cycle_matches_the_unpipelined_reference(cluster):
    ref = _reference(8)
    envs = cluster.launch(
        EnvWorker, 2, worker_env_config(ENV, 2), devices=[0, 1], num_cpus=0.5, name="env_t"
    )
    try:
        sp = wait(envs.on(0).spaces())[0]
        policy = cluster.launch(
            PolicyWorker,
            1,
            sp["observation_space"],
            sp["action_space"],
            ENV.num_envs,
            PPO,
            ENV.seed,
            devices=[2],
            name="policy_t",
        )
        try:
            cycles = [
                EnvPolicyCycle(envs, policy, 2, groups=2, pipelined=True),  # a group per slice
                EnvPolicyCycle(envs, policy, 2, groups=4, pipelined=True),  # one env per group
                EnvPolicyCycle(envs, policy, 2, groups=1, pipelined=False),  # plain alternation
                EnvPolicyCycle(envs, policy, 2, 2, True, layout="blocks"),  # a group per worker
                # each env worker drives its groups and calls the policy itself
                EnvPolicyCycle(envs, policy, 2, 2, True, layout="blocks", handoff="direct"),
                EnvPolicyCycle(envs, policy, 2, 4, True, handoff="auto"),  # two groups a worker
                # replies and actions over sockets: groups across workers, and one per worker
                EnvPolicyCycle(envs, policy, 2, 2, True, handoff="pipe"),
                EnvPolicyCycle(envs, policy, 2, 2, True, layout="blocks", handoff="pipe"),
            ]
            assert [c.handoff for c in cycles[-4:]] == ["direct", "direct", "pipe", "pipe"]
            for cycle, (want, params) in zip(cycles, ref, strict=True):
                res = cycle.collect(STEPS)
                got = wait(policy.rollout())[0]
                for name, x in got.items():
                    y = getattr(want, name)
                    assert x.dtype == y.dtype and x.shape == y.shape, name
                    assert torch.equal(x, y), f"{name} differs (groups={len(cycle.groups)})"
                assert got["truncated"].any() and got["terminated"].any()
                assert sorted(res.returns) == sorted(want.episodes.returns)
                assert res.env_steps == STEPS * ENV.num_envs
                wait(policy.update(1.0))
                w = wait(policy.get_weights())[0]["params"]
                names = [
                    n
                    for n, _ in make_policy(
                        sp["observation_space"], sp["action_space"], seed=0
                    ).named_parameters()
                ]
                for n, p in zip(names, params, strict=True):
                    assert np.array_equal(w[n], p.numpy()), n
            # At learning rate 0 (a trial's updates) an update moves no weight: the policy acts
            # as before.
            (sha,) = wait(policy.param_sha256())
            wait(policy.update(0.0))
            assert wait(policy.param_sha256())[0] == sha
            wait(policy.update(1.0))
            assert wait(policy.param_sha256())[0] != sha
        finally:
            policy.kill()
    finally:
        envs.kill()


class _SlowPolicy(PolicyWorker):
    """Takes ``delay`` s an act, and counts the calls whose parts were at different steps."""

    mixed = 0

    def __init__(self, *args, delay):
        super().__init__(*args)
        self.delay = delay
        self.rows: set[int] = set()
        self.call_rows: list[int] = []  # every call's, in order

    def act_parts(self, ts, parts):
        import time

        time.sleep(self.delay)
        self.mixed += len(set(ts)) > 1
        self.rows.add(sum(len(p["env_ids"]) for p in parts))
        self.call_rows.append(sum(len(p["env_ids"]) for p in parts))
        return super().act_parts(ts, parts)

    def pop_call_rows(self):
        out, self.call_rows = self.call_rows, []
        return out

    def mixed_calls(self):
        return self.mixed

    def row_counts(self):
        """The row counts its calls took, and those serve_pipe announced (for graphs)."""
        return self.rows, self._call_sizes


class _SlowEnv(EnvWorker):
    """Env worker 1 takes 30 ms a step call."""

    def step(self, *args):
        import time

        if self.rank == 1:
            time.sleep(0.03)
        return super().step(*args)


def _pipe_rollout(envs, slow) -> dict:
    """One pipe rollout of a fresh policy (two groups over two env workers), with what the
    policy saw: its buffer, the row counts its calls took and announced, its mixed-step calls."""
    res = EnvPolicyCycle(envs, slow, 2, 2, True, handoff="pipe").collect(STEPS)
    rows, announced = wait(slow.row_counts())[0]
    return {
        "res": res,
        "got": wait(slow.rollout())[0],
        "rows": rows,
        "announced": announced,
        "mixed": wait(slow.mixed_calls())[0],
    }


@contextlib.contextmanager
def _two_envs_and_a_policy(cluster, env_cls, delay: float, tag: str):
    """Two env workers of ``env_cls`` and a ``_SlowPolicy`` taking ``delay`` s an act, killed
    after the block."""
    envs = cluster.launch(
        env_cls, 2, worker_env_config(ENV, 2), devices=[0, 1], num_cpus=0.5, name=f"env_{tag}"
    )
    try:
        pol = cluster.launch(
            _SlowPolicy, 1, *_policy_args(), delay=delay, devices=[2], name=f"policy_{tag}"
        )
        try:
            yield envs, pol
        finally:
            pol.kill()
    finally:
        envs.kill()


@pytest.fixture(scope="module")
def slow_env_pipe(cluster):
    """Env worker 1 sleeping 30 ms a step and a policy 10 ms an act: a pipe rollout of the fresh
    policy, then the cost probe over the pipe and through the driver, on the same workers."""
    from loomrl.cycle import measure_costs

    with _two_envs_and_a_policy(cluster, _SlowEnv, 0.01, "pp") as (envs, slow):
        out = _pipe_rollout(envs, slow)
        out["costs"] = measure_costs(envs, slow, 4, [2, 4, 3], STEPS, reps=2, handoff="pipe")
        out["chains"] = measure_costs(envs, slow, 4, [2, 4], STEPS, reps=2, min_chain_s=0.0)
    return out


def test_a_pipe_rollout_acts_on_the_parts_that_have_replied_with_the_same_result(
    cluster, slow_env_pipe
):
    """Over a pipe the policy acts on whatever parts have replied, together. With a policy
    slower than the envs, parts queue up and go several a call; an env worker slower than the
    other leaves that one ahead, and calls mix parts at different steps. Either way, the
    reference's buffer bit for bit."""
    (want, _), *_ = _reference(1)
    with _two_envs_and_a_policy(cluster, EnvWorker, 0.05, "slow") as (envs, slow):
        slow_policy = _pipe_rollout(envs, slow)
    for env_cls, out in ((EnvWorker, slow_policy), (_SlowEnv, slow_env_pipe)):
        res = out["res"]
        for name, x in out["got"].items():
            assert torch.equal(x, getattr(want, name)), (name, env_cls.__name__)
        assert res.env_calls == 4 * STEPS
        # Every call's row count was announced: the 4 one-row parts, 1 to 4 rows.
        rows, announced = out["rows"], out["announced"]
        assert rows <= announced == {1, 2, 3, 4}, (rows, announced)
        if env_cls is EnvWorker:  # 4 parts a step, several a call
            assert res.policy_calls < 4 * STEPS
        else:
            assert out["mixed"] > 0


@pytest.mark.parametrize("env_cls", [EnvWorker, _SlowEnv], ids=["even", "one_slow_env"])
def test_a_pipe_rollout_gathering_a_groups_rows_makes_fewer_calls_with_the_same_result(
    cluster, env_cls
):
    """batch="group": the policy gathers a ring group's rows (2 of the 4 one-row parts) before
    it acts. With env worker 1 slower than worker 0, "ready" acts on worker 0's lone parts; here
    worker 0 waits for worker 1's, and a call of one row comes only where worker 1 has nothing
    left to send (all it can send is held). Either way, the reference's buffer bit for bit."""
    (want, _), *_ = _reference(1)
    got = {}
    for batch in ("ready", "group"):  # fresh workers each: the reference is a first rollout
        with _two_envs_and_a_policy(cluster, env_cls, 0.0, "g") as (envs, pol):
            cycle = EnvPolicyCycle(envs, pol, 2, 2, True, handoff="pipe", batch=batch)
            res = cycle.collect(STEPS)
            got[batch] = (res, wait(pol.rollout())[0], wait(pol.pop_call_rows())[0])
    for batch, (res, buf, rows) in got.items():
        for name, x in buf.items():
            assert torch.equal(x, getattr(want, name)), (name, batch)
        assert res.policy_calls == len(rows) and sum(rows) == 4 * STEPS, batch
    res, _, rows = got["group"]
    assert rows.count(1) <= 2, rows


def test_the_cost_probe_times_one_group_pipe_rollouts_for_a_pipe_cycle(slow_env_pipe):
    """measure_costs(handoff="pipe") times rollouts over the pipe at every size. Env worker 1
    sleeps 30 ms a step and the policy 10 ms an act, outside the time either counts as busy:
    a pipe step is at least their 40 ms, and that is the pipe's round trip, not work."""
    from loomrl.cycle import PIPE, pipe_hop

    costs, chains = slow_env_pipe["costs"], slow_env_pipe["chains"]
    s = costs["samples"]
    assert costs["handoff"] == "pipe" and chains["handoff"] == "driver"
    for key in PIPE.values():  # three rollouts a size; 3 is not split over 2 workers
        assert sorted(x for x, _ in s[key]) == [2, 2, 2, 4, 4, 4], key
    assert not any(k in chains["samples"] for k in PIPE.values())
    for (_, step), (_, env_busy), (_, pol_busy) in zip(*(s[k] for k in PIPE.values()), strict=True):
        assert env_busy > 0 and pol_busy > 0
        assert step >= 0.04 + pol_busy
    assert pipe_hop(s) >= 0.035


def test_env_worker_offsets_make_workers_one_batch(cluster):
    envs = cluster.launch(
        EnvWorker,
        2,
        worker_env_config(replace(ENV, num_envs=4), 2),
        devices=[0, 1],
        num_cpus=0.5,
        name="env_o",
    )
    try:
        obs = np.concatenate(wait(envs.reset()))
        ids = np.concatenate([r["env_ids"] for r in wait(envs.observe())])
        ref = VecEnv(ENV)
        assert np.array_equal(obs, ref.reset()) and ids.tolist() == [0, 1, 2, 3]
        ref.close()
        wait(envs.offload())
        wait(envs.onload())
        assert all(s["events"] == [] for s in wait(envs.pop_stats()))
    finally:
        envs.kill()


class _ValueColumnPolicy(PolicyWorker):
    """A policy whose act() gives its values as [n, 1] (a user policy's usual slip)."""

    def __init__(self, *args):
        super().__init__(*args)
        act = self.net.act

        def misshapen(obs, **kw):
            a, logp, v = act(obs, **kw)
            return a, logp, v[:, None]

        self.net.act = misshapen


@pytest.fixture(scope="module")
def misshapen_policy(cluster):
    """A _ValueColumnPolicy; each of its rollouts stops at the first act."""
    policy = cluster.launch(_ValueColumnPolicy, 1, *_policy_args(), devices=[1], name="policy_v")
    yield policy
    policy.kill()


@pytest.mark.parametrize("handoff", ["driver", "pipe"])
def test_a_policy_with_misshapen_outputs_stops_collect_with_a_config_error(
    cluster, misshapen_policy, handoff
):
    envs = cluster.launch(
        EnvWorker, 1, worker_env_config(ENV, 1), devices=[0], num_cpus=0.5, name="env_v"
    )
    try:
        cycle = EnvPolicyCycle(envs, misshapen_policy, ENV.num_envs, groups=2, handoff=handoff)
        with pytest.raises(ConfigError, match=r"returned values of shape \[[24], 1\]") as e:
            cycle.collect(3)
        assert "worker 'policy_v' rank 0" in str(e.value)
    finally:
        envs.kill()


@pytest.mark.parametrize("handoff", ["driver", "direct", "pipe"])
def test_a_failing_env_step_surfaces_from_collect(cluster, spare_policy, handoff):
    from loomrl.errors import RemoteError

    envs = cluster.launch(
        EnvWorker, 1, worker_env_config(ENV, 1), devices=[0], num_cpus=0.5, name="env_f"
    )
    try:
        policy = spare_policy
        cycle = EnvPolicyCycle(envs, policy, ENV.num_envs, groups=2, handoff=handoff)
        cycle.collect(3)  # a finished rollout first: the failed one must drop its buffer
        wait(envs.reset())
        wait(envs.offload())  # stepping an offloaded VecEnv raises in the env worker
        (before,) = wait(policy.get_weights())
        with pytest.raises(RemoteError, match="offloaded"):
            cycle.collect(3)
        # The failed rollout is dropped: its zeros never reach the normaliser, and there is
        # no buffer to update on (not even the finished rollout's before it).
        (after,) = wait(policy.get_weights())
        was, now = before["normalizer"], after["normalizer"]
        assert now["count"] == was["count"]
        assert np.array_equal(now["mean"], was["mean"]) and np.array_equal(now["var"], was["var"])
        with pytest.raises(RemoteError, match="before a rollout finished"):
            wait(policy.update())
        wait(envs.onload())
        res = cycle.collect(3)
        # the failed rollout's calls do not count in the next one: 2 groups x 3 steps each
        # (over a pipe the policy acts on the parts that have replied, 1 or 2 a call)
        assert res.env_calls == 6
        assert res.policy_calls == 6 if handoff != "pipe" else 3 <= res.policy_calls <= 6
        assert cycle.handoff == handoff
    finally:
        envs.kill()


def test_handoff_is_direct_only_where_every_group_lies_on_one_env_worker():
    one_each = ring_groups(2, 2, 4)  # groups of one env, each on one worker
    spans = ring_groups(2, 2, 1)  # one group over both workers
    assert resolve_handoff("auto", one_each, pipelined=True) == "direct"
    assert resolve_handoff("auto", spans, pipelined=True) == "driver"
    assert resolve_handoff("auto", one_each, pipelined=False) == "driver"
    assert resolve_handoff("driver", one_each, pipelined=True) == "driver"
    assert resolve_handoff("direct", one_each, pipelined=True) == "direct"
    with pytest.raises(ConfigError, match=r"group 0 spans env workers \[0, 1\].*handoff='auto'"):
        resolve_handoff("direct", spans, pipelined=True)
    with pytest.raises(ConfigError, match="not pipelined"):
        resolve_handoff("direct", one_each, pipelined=False)
    with pytest.raises(ConfigError, match="handoff='ray': must be one of auto, driver, direct"):
        resolve_handoff("ray", one_each, pipelined=True)


class _ActFailsForWorker0(PolicyWorker):
    """Raises in act at step 2 on the rows of env worker 0 only; the other worker's group goes on."""

    def act_parts(self, ts, parts):
        if any(t == 2 and int(p["env_ids"][0]) == 0 for t, p in zip(ts, parts, strict=True)):
            raise ValueError("act refused these rows")
        return super().act_parts(ts, parts)


@pytest.fixture(scope="module")
def act_fails_policy(cluster):
    """An _ActFailsForWorker0 (stateless in how it fails: every rollout raises at step 2)."""
    bad = cluster.launch(_ActFailsForWorker0, 1, *_policy_args(), devices=[2], name="policy_bad")
    yield bad
    bad.kill()


def _act_fails(envs, bad, error, match, **cycle):
    """A policy raising in act at step 2 for env worker 0's group (two groups over ``envs``)
    ends collect() with ``error`` matching ``match``."""
    with pytest.raises(error, match=match):
        EnvPolicyCycle(envs, bad, 2, 2, True, **cycle).collect(STEPS)


def test_a_failing_policy_call_in_a_direct_rollout_is_named_and_leaves_nothing_behind(
    cluster, act_fails_policy, spare_policy
):
    """Direct hand-offs, two env workers: the policy raising for one worker's group is reported
    as the policy's act, and the next rollout starts clean (no call of the failed one leaks
    into its counts), as through the driver."""
    from loomrl.errors import RemoteError

    envs = cluster.launch(
        EnvWorker, 2, worker_env_config(ENV, 2), devices=[0, 1], num_cpus=0.5, name="env_d"
    )
    try:
        match = r"policy\.act at step 2 .*raised.*refused"
        _act_fails(envs, act_fails_policy, RemoteError, match, layout="blocks", handoff="direct")
        cycle = EnvPolicyCycle(envs, spare_policy, 2, 2, True, layout="blocks", handoff="direct")
        res = cycle.collect(STEPS)
        # one act per group and step, one env call per group and step: nothing left over
        assert (res.policy_calls, res.env_calls) == (2 * STEPS, 2 * STEPS)
        assert res.env_steps == STEPS * ENV.num_envs
    finally:
        envs.kill()


class _EnvStops(EnvWorker):
    """Env worker 1 of a pipe rollout misbehaves in its third step call (step 1 of its first
    group, with two groups a worker): ``how`` = "exit" ends its process there, "sleep" stalls
    it for 12 s."""

    def __init__(self, env, how):
        super().__init__(env)
        self.how, self.steps = how, 0

    def step(self, actions, part, lo, hi, *after):
        self.steps += 1
        if self.rank == 1 and self.steps == 3:
            if self.how == "exit":
                import os

                os._exit(1)
            import time

            time.sleep(12.0)
        return super().step(actions, part, lo, hi, *after)


class _PolicyExits(PolicyWorker):
    """Ends its process in act at step 2."""

    def act_parts(self, ts, parts):
        if 2 in ts:
            import os

            os._exit(1)
        return super().act_parts(ts, parts)


def test_a_pipe_rollout_stops_with_a_named_error_on_a_raising_dying_or_silent_worker(
    cluster, act_fails_policy, spare_policy
):
    """Hand-offs over sockets: the policy raising for one group, an env worker's process dying,
    an env worker silent past the cycle's timeout and the policy's process dying each end
    collect() with an error naming the side (and the step), not a hang; a new rollout on
    healthy workers runs clean after."""
    import time

    from loomrl.errors import LoomError

    def launch_envs(cls, name, *extra):
        return cluster.launch(
            cls, 2, worker_env_config(ENV, 2), *extra, devices=[0, 1], num_cpus=0.5, name=name
        )

    envs = launch_envs(EnvWorker, "env_p")
    try:
        match = r"step 2.*refused these rows"
        _act_fails(envs, act_fails_policy, LoomError, match, handoff="pipe")
        good = spare_policy
        cycle = EnvPolicyCycle(envs, good, 2, 2, True, handoff="pipe")
        res = cycle.collect(STEPS)
        # The parts that have replied go together: 1 to 4 parts a call, one step's.
        assert res.env_calls == 4 * STEPS and STEPS <= res.policy_calls <= 4 * STEPS
        assert res.env_steps == STEPS * ENV.num_envs
        for how, match in (
            ("sleep", r"no reply from env worker 1 .* at step 2\) within 1\.5 s"),
            ("exit", r"env worker 1|died"),
        ):
            odd = launch_envs(_EnvStops, f"env_{how}", how)
            try:
                cycle = EnvPolicyCycle(odd, good, 2, 2, True, handoff="pipe", timeout_s=1.5)
                t0 = time.monotonic()
                with pytest.raises(LoomError, match=match):
                    cycle.collect(STEPS)
                assert time.monotonic() - t0 < 30  # stopped, not waiting out a default
            finally:
                odd.kill()
        res = EnvPolicyCycle(envs, good, 2, 2, True, handoff="pipe").collect(STEPS)
        assert res.env_calls == 4 * STEPS and STEPS <= res.policy_calls <= 4 * STEPS
        dies = cluster.launch(_PolicyExits, 1, *_policy_args(), devices=[2], name="policy_pdies")
        try:
            cycle = EnvPolicyCycle(envs, dies, 2, 2, True, handoff="pipe", timeout_s=1.5)
            t0 = time.monotonic()
            with pytest.raises(LoomError, match=r"policy worker closed its connection|died"):
                cycle.collect(STEPS)
            assert time.monotonic() - t0 < 30
        finally:
            dies.kill()
    finally:
        envs.kill()


def test_an_env_that_stalls_while_its_costs_are_measured_stops_the_probe(cluster, spare_policy):
    """The cost probe's chains are bounded by the cycle's timeout as rollouts are: env worker 1
    stalling for 12 s in its third step call ends measure_costs with an error naming the env
    side, after the 1.5 s timeout, not after the stall (or never, for a hang)."""
    from loomrl.cycle import measure_costs
    from loomrl.errors import LoomError

    envs = cluster.launch(
        _EnvStops,
        2,
        worker_env_config(ENV, 2),
        "sleep",
        devices=[0, 1],
        num_cpus=0.5,
        name="env_probe_stall",
    )
    try:
        with pytest.raises(LoomError, match=r"no reply from an env worker's step within 1\.5 s"):
            measure_costs(envs, spare_policy, 4, [2, 4], STEPS, reps=2, timeout_s=1.5)
    finally:
        envs.kill()
