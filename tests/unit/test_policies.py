"""Built-in actor-critic policies: seeded init, shapes, per-row sampling, batch invariance."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from loomrl.policies import CNNActorCritic, MLPActorCritic, make_policy, row_generators

BOX = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DISC = gym.spaces.Discrete(4)


def assert_close(actual, expected, rtol=1.3e-6, atol=1e-5):
    # torch.testing.assert_close imports torch.distributed on first use (seconds); this is enough.
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), (actual, expected)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    # Tiny networks: intra-op threads only add synchronisation (badly so on a loaded 2-core box).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_same_seed_same_weights_regardless_of_global_rng():
    torch.manual_seed(1)
    a = MLPActorCritic(5, BOX, seed=7)
    torch.manual_seed(2)
    b = MLPActorCritic(5, BOX, seed=7)
    c = MLPActorCritic(5, BOX, seed=8)
    for (n, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), n
    assert not torch.equal(a.actor[0].weight, c.actor[0].weight)


def test_gaussian_act_and_evaluate_agree():
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(6, 5)
    a, logp, v = p.act(obs)
    assert a.shape == (6, 3) and logp.shape == v.shape == (6,)
    logp2, ent, v2 = p.evaluate(obs, a)
    assert_close(logp, logp2, rtol=1e-5, atol=1e-5)
    assert_close(v, v2, rtol=1e-5, atol=1e-5)
    # state-independent log-std initialised at 0: entropy of a unit Gaussian per dim
    assert_close(ent, torch.full((6,), 3 * 0.5 * np.log(2 * np.pi * np.e), dtype=torch.float32))


def test_act_draws_the_same_noise_first_and_leaves_checks_to_training():
    # act draws each row's noise before the forward (so its copy to a GPU waits for nothing):
    # the same draws as sampling after it.
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(4, 5)
    a, logp, _ = p.act(obs, generators=row_generators(0, range(4), [2] * 4))
    out, _ = p._rows(obs)  # act's forward: in blocks, or row by row where blocks fail the check
    late = p.heads.sample(out, row_generators(0, range(4), [2] * 4), deterministic=False)
    assert torch.equal(a, late)
    assert_close(logp, p.evaluate(obs, a)[0])
    # act skips torch.distributions' argument checks (each would wait for a GPU); a broken
    # network's NaN actions are refused where they are used, and training still checks.
    with torch.no_grad():
        p.actor[0].weight.fill_(float("nan"))
    a, logp, _ = p.act(obs, generators=row_generators(0, range(4), [3] * 4))
    assert torch.isnan(a).all() and torch.isnan(logp).all()
    with pytest.raises(ValueError, match="loc"):
        p.evaluate(obs, torch.zeros(4, 3))


def test_categorical_policy_and_discrete_start():
    space = gym.spaces.Discrete(4, start=1)
    p = MLPActorCritic(5, space, seed=0)
    a, logp, _ = p.act(torch.randn(64, 5))
    assert a.shape == (64,) and a.min() >= 1 and a.max() <= 4
    logp2, ent, _ = p.evaluate(torch.randn(64, 5) * 0, a)  # valid on any obs
    assert ent.shape == (64,) and torch.isfinite(logp2).all()


@pytest.mark.parametrize("space", [BOX, DISC])
def test_per_row_generators_make_actions_independent_of_batching(space):
    p = MLPActorCritic(5, space, seed=0)
    obs = torch.randn(8, 5)
    gens = lambda: row_generators(3, range(8), [11] * 8)  # noqa: E731
    whole = p.act(obs, generators=gens())
    g = gens()
    parts = [p.act(obs[i : i + 3], generators=g[i : i + 3]) for i in (0, 3, 6)]
    for k in range(3):
        assert torch.equal(whole[k], torch.cat([x[k] for x in parts]))
    assert torch.equal(whole[0], p.act(obs, generators=gens())[0])  # reproducible
    other = p.act(obs, generators=row_generators(3, range(8), [12] * 8))[0]
    assert not torch.equal(whole[0], other)  # the step count moves the stream


def _blocked_nets():
    img = (3, 36, 36)
    return [
        ("mlp", MLPActorCritic(17, BOX, seed=0), (17,)),
        ("mlp256", MLPActorCritic(17, BOX, hidden=(256, 256), seed=0), (17,)),
        ("cnn", CNNActorCritic(img, BOX, seed=0), img),
    ]


def _rows_of(shape, n, seed):
    g = torch.Generator().manual_seed(seed)
    if len(shape) == 3:
        return torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    return torch.randn(n, *shape, generator=g)


@pytest.mark.parametrize("block", [1, 8, 5])
def test_blocked_forward_gives_a_row_the_same_bits_in_any_group_and_position(block):
    """A row's action, log-prob and value depend on that row alone: not on how many rows came
    with it nor on its position or its neighbours in a block. (On this machine's CPU BLAS
    picks other kernels for fewer than 8 rows, so at 8 this fails without the padding; at 5
    the block check fails and the rows go one by one.)"""
    for name, net, shape in _blocked_nets():
        net.row_block = block
        obs = _rows_of(shape, 13, 1)
        ids = list(range(13))
        whole = net.act(obs, generators=row_generators(2, ids, [4] * 13))
        for cuts in ((3, 10), (1, 12), (7, 6), (2, 2, 9)):
            parts, at = [], 0
            for c in cuts:
                sl = slice(at, at + c)
                parts.append(net.act(obs[sl], generators=row_generators(2, ids[sl], [4] * c)))
                at += c
            for k in range(3):
                assert torch.equal(whole[k], torch.cat([p[k] for p in parts])), (name, cuts, k)
        perm = torch.randperm(13, generator=torch.Generator().manual_seed(3))
        moved = net.act(obs[perm], generators=row_generators(2, perm.tolist(), [4] * 13))
        others = torch.cat([obs[:1], _rows_of(shape, 12, 9)])  # row 0 among new neighbours
        alone = net.act(others, generators=row_generators(2, [0] * 13, [4] * 13))
        for k in range(3):
            assert torch.equal(moved[k], whole[k][perm]), (name, "moved", k)
            assert torch.equal(alone[k][0], whole[k][0]), (name, "neighbours", k)
        assert torch.equal(net.value(obs), whole[2]), name
        assert torch.equal(net.value(obs[5:6]), whole[2][5:6]), name


def test_a_block_whose_rows_depend_on_position_falls_back_to_rows_one_by_one():
    class Positional(MLPActorCritic):
        """Adds a tiny amount per position in the batch: what a kernel with a tail does."""

        def _forward(self, obs):
            out, value = super()._forward(obs)
            return out + 1e-3 * torch.arange(len(obs))[:, None], value

    net = Positional(5, BOX, seed=0)
    obs = torch.randn(6, 5)
    with pytest.warns(UserWarning, match="depends on its position in a block of row_block=8"):
        whole = net.act(obs, deterministic=True)[0]
    assert torch.equal(whole[4], net.act(obs[4:5], deterministic=True)[0][0])
    assert list(net._blocks_checked.values()) == [False]
    ok = MLPActorCritic(5, BOX, seed=0)
    ok.act(obs)
    assert len(ok._blocks_checked) == 1  # checked once; whether 8 rows pass is the CPU's


def test_blocks_run_every_forward_on_exactly_row_block_rows():
    """With kernels that pass the check (an elementwise forward: rows independent by
    construction) every forward of act and value sees exactly row_block fresh rows, the
    padding zeros, and only the real rows come back; empty batches pass through."""

    class Elementwise(MLPActorCritic):
        def _forward(self, obs):
            seen.append(obs.clone())
            return obs[:, :3] * 2.0, obs.sum(1)

    seen = []
    net = Elementwise(5, BOX, seed=0, row_block=4)
    obs = torch.randn(6, 5)
    out = net.act(obs, deterministic=True)[0]
    assert torch.equal(out, obs[:, :3] * 2.0)
    assert all(x.shape == (4, 5) for x in seen)
    assert torch.equal(seen[-1][2:], torch.zeros(2, 5))  # rows 4, 5 then two rows of padding
    assert list(net._blocks_checked.values()) == [True]
    seen.clear()
    assert torch.equal(net.value(obs[:4].t().contiguous().t()), obs[:4].sum(1))
    assert [x.shape for x in seen] == [(4, 5)] and seen[0].is_contiguous()
    assert net.act(torch.zeros(0, 5))[0].shape == (0, 3)
    assert net.value(torch.zeros(0, 5)).shape == (0,)


def test_block_checks_do_not_travel_with_copies_and_a_new_block_drops_graphs():
    import copy
    import pickle

    net = MLPActorCritic(5, BOX, seed=0)
    net.act(torch.randn(3, 5))
    assert net._blocks_checked
    for twin in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert twin._blocks_checked == {} and twin.row_block == 8
    net.use_cuda_graphs()
    net._graphs.entries[("recorded",)] = object()
    net.row_block = np.int64(16)
    assert net.row_block == 16 and not net._graphs.entries


def test_row_block_must_be_a_positive_count():
    for bad in (0, -2, 2.0, "8", True, 1025):
        with pytest.raises(ValueError, match="row_block must be a positive number of rows"):
            MLPActorCritic(5, BOX, row_block=bad)
    with pytest.raises(ValueError, match=r"CNNActorCritic: row_block .* got 0"):
        CNNActorCritic((3, 16, 16), BOX, row_block=0)


def test_deterministic_act_is_the_mean():
    p = MLPActorCritic(5, BOX, seed=0)
    obs = torch.randn(4, 5)
    a, _, _ = p.act(obs, deterministic=True)
    assert_close(a, p.actor(obs))


def test_cnn_policy_on_uint8_images():
    space = gym.spaces.Box(0, 255, (3, 48, 48), np.uint8)
    p = make_policy(space, BOX, seed=0)
    assert isinstance(p, CNNActorCritic)
    obs = torch.randint(0, 256, (5, 3, 48, 48), dtype=torch.uint8)
    a, logp, v = p.act(obs, generators=row_generators(0, range(5), [0] * 5))
    assert a.shape == (5, 3) and logp.shape == v.shape == (5,)
    logp2, _, _ = p.evaluate(obs, a)
    assert_close(logp, logp2, rtol=1e-4, atol=1e-4)
    small = make_policy(gym.spaces.Box(0, 255, (3, 24, 24), np.uint8), DISC, seed=0)
    assert small.act(obs[:, :, :24, :24])[0].shape == (5,)


def test_unsupported_spaces_are_explained():
    with pytest.raises(TypeError, match="Box and Discrete"):
        MLPActorCritic(5, gym.spaces.MultiBinary(3))
    with pytest.raises(ValueError, match="no built-in policy"):
        make_policy(gym.spaces.Box(0, 1, (2, 2), np.float32), BOX)
    with pytest.raises(ValueError, match="one per row"):
        MLPActorCritic(5, BOX).act(torch.zeros(3, 5), generators=row_generators(0, [0], [0]))


class _ReplayOnCPU:
    """Stands in for a recorded CUDA graph: replay recomputes into the recorded outputs."""

    def __init__(self, fn, static_in, outs):
        self.fn, self.static_in, self.outs = fn, static_in, outs

    def replay(self):
        for o, n in zip(self.outs, self.fn(*self.static_in), strict=True):
            o.copy_(n)


def _fake_capture(fn, statics):
    outs = tuple(torch.zeros_like(o) for o in fn(*statics))  # capture computes nothing
    return statics, _ReplayOnCPU(fn, statics, outs), outs


@pytest.fixture
def cpu_graphs(monkeypatch):
    import loomrl.policies as pol

    def warm_up(fn, xs, device=None):  # as the real one: runs fn, returns inputs to record on
        fn(*xs)
        return tuple(x.clone() for x in xs)

    monkeypatch.setattr(pol, "_warm_up", warm_up)
    monkeypatch.setattr(pol, "_capture", _fake_capture)
    return pol


def test_graph_cache_records_once_per_layout_and_forgets_moved_weights(cpu_graphs):
    net = MLPActorCritic(5, BOX, seed=0)
    cache = cpu_graphs._GraphCache(max_shapes=2)
    x3, x4, x5 = (torch.randn(n, 5, generator=torch.Generator().manual_seed(n)) for n in (3, 4, 5))
    with torch.no_grad():
        for x in (x3, x3 * 2, x4, x3 - 1):  # new inputs of a recorded shape replay its graph
            out = cache.run(net, net._rows, x)
            for got, want in zip(out, net._rows(x), strict=True):
                assert torch.equal(got, want)
        assert cache.captures == 2  # 3 rows, then 4
        first = cache.run(net, net._rows, x3)[0]
        cache.run(net, net._rows, x3 * 3)  # the next replay must not change what was returned
        assert torch.equal(first, net._rows(x3)[0])
        cache.run(net, net._rows, x5)  # a third shape evicts the least recently used (4 rows)
        assert cache.captures == 3 and len(cache.entries) == 2
        cache.run(net, net._rows, x4)
        assert cache.captures == 4
        cache.run(net, net._rows, torch.randn(5, 4).t())  # same shape as x4, other strides
        assert cache.captures == 5
        net.actor[0].weight.add_(1.0)  # in place, as an optimizer step: the graph sees it
        assert torch.equal(cache.run(net, net._rows, x4)[0], net._rows(x4)[0])
        assert cache.captures == 5
        net.double().float()  # new storage for every parameter: all graphs are stale
        assert torch.equal(cache.run(net, net._rows, x4)[0], net._rows(x4)[0])
        assert cache.captures == 6 and len(cache.entries) == 1
    with pytest.raises(ValueError, match="max_shapes"):
        cpu_graphs._GraphCache(max_shapes=0)


def test_graph_cache_keeps_the_shapes_its_caller_reserves(cpu_graphs):
    """A caller cycling through more row counts than the cache holds records a graph on every
    call; reserving room for them records each once. The limit never goes down and stops at
    MAX_GRAPH_SHAPES."""
    net = MLPActorCritic(5, BOX, seed=0)
    xs = [torch.zeros(n, 5) for n in range(1, 13)]  # 12 row counts, as 12 parts merged
    small, roomy = cpu_graphs._GraphCache(), cpu_graphs._GraphCache()
    roomy.reserve(12)
    with torch.no_grad():
        for _ in range(2):
            for x in xs:
                small.run(net, net._rows, x)
                roomy.run(net, net._rows, x)
    assert small.captures == 24 and roomy.captures == 12
    roomy.reserve(4)
    assert roomy.max_shapes == 12
    roomy.reserve(10**6)
    assert roomy.max_shapes == cpu_graphs.MAX_GRAPH_SHAPES
    net.use_cuda_graphs()
    net.reserve_graph_shapes(20)
    assert net._graphs.max_shapes == 20
    net.use_cuda_graphs(False)
    net.reserve_graph_shapes(20)  # no graphs: nothing to keep, no error


def test_call_sizes_are_the_sums_of_the_parts_that_can_reply_together():
    from loomrl.workers.policy import call_sizes

    assert call_sizes([12] * 8) == {12 * i for i in range(1, 9)}
    assert call_sizes([3, 3, 2]) == {2, 3, 5, 6, 8}
    assert call_sizes([4, 0]) == {4} and call_sizes([]) == set()


def test_the_policy_worker_keeps_a_graph_for_every_call_its_layouts_can_make(monkeypatch):
    """serve_pipe announces the row counts of the rollout's calls before it waits for the env
    workers: every merge of the parts that replied (pipelined, rows independent), or each
    ring group (lockstep); the layouts add up until the graphs are released."""
    from types import SimpleNamespace

    from loomrl.workers.policy import GRAPH_ROOM, PolicyWorker

    reserved = []
    pol = PolicyWorker.__new__(PolicyWorker)
    pol.graphs, pol.per_row, pol.train_step, pol._call_sizes = True, True, None, set()
    pol._to_record = set()
    pol.net = SimpleNamespace(
        batch_invariant=True, reserve_graph_shapes=reserved.append, release_graphs=lambda: None
    )

    class Stop(Exception):
        pass

    def accept(*_):
        raise Stop

    monkeypatch.setattr(pol, "_accept_pipe", accept, raising=False)
    k2 = [[(0, 0, 12), (1, 0, 12)], [(0, 12, 24), (1, 12, 24)]]  # 2 workers x 2 parts of 12
    with pytest.raises(Stop):
        pol.serve_pipe("t", 4, k2, 2, 1.0)
    assert reserved == [GRAPH_ROOM + 4]  # 12, 24, 36, 48
    assert pol._to_record == {12, 24, 36, 48}  # recorded at the next act
    pol._to_record.clear()
    pol.net.batch_invariant = False  # lockstep: one call per ring group of 24 (already there)
    with pytest.raises(Stop):
        pol.serve_pipe("t", 4, k2, 2, 1.0)
    k1 = [[(0, 0, 24), (1, 0, 24)]]
    with pytest.raises(Stop):
        pol.serve_pipe("t", 4, k1, 2, 1.0)  # 48 rows (already there)
    k3 = [[(0, 0, 8), (1, 0, 8)], [(0, 8, 16), (1, 8, 16)], [(0, 16, 24), (1, 16, 24)]]
    pol.net.batch_invariant = True
    with pytest.raises(Stop):
        pol.serve_pipe("t", 4, k3, 2, 1.0)  # 8, 16, ..., 48: 8, 16, 32, 40 are new
    assert reserved == [GRAPH_ROOM + n for n in (4, 4, 4, 8)]
    assert pol._to_record == {8, 16, 32, 40}  # only the new ones
    pol._release_graphs()
    assert not pol._to_record
    with pytest.raises(Stop):
        pol.serve_pipe("t", 4, k1, 2, 1.0)
    assert reserved[-1] == GRAPH_ROOM + 1
    assert pol._to_record == {48}  # released: recorded again


def test_the_policy_worker_records_the_announced_graphs_at_its_next_act_before_acting():
    """The first act after serve_pipe announced a layout's row counts records all of their
    graphs (before its own forward, inside the rollout's untimed first iteration), with the
    act's observations as the pattern; later acts record nothing ahead."""
    from loomrl.embodied import PPOConfig
    from loomrl.workers.policy import PolicyWorker

    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    pol = PolicyWorker(obs, BOX, 4, PPOConfig(rollout_steps=8, num_minibatches=1), 0)
    seen = []
    pol.net.record_act_graphs = lambda sizes, like: seen.append(
        (set(sizes), like.shape, like.dtype)
    )
    pol.graphs = True  # as on a GPU; act_host acts as act on a CPU net
    pol._expect_calls({2, 4})
    pol.begin(2)
    reply = {"obs": np.zeros((4, 4), np.float32), "env_ids": np.arange(4)}
    reply["env_steps"] = np.zeros(4, np.int64)
    pol.act(0, reply)
    assert seen == [({2, 4}, (4, 4), pol._prep(reply["obs"]).dtype)]
    pol.act(0, reply)
    assert len(seen) == 1
    pol._expect_calls({4, 8})
    pol.act(0, reply)
    assert seen[-1][0] == {8}


def test_graph_cache_falls_back_to_eager_once_capture_fails(cpu_graphs, monkeypatch):
    calls = []

    def broken(fn, xs):
        calls.append(xs[0].shape)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cpu_graphs, "_capture", broken)
    net = MLPActorCritic(5, BOX, seed=0)
    cache = cpu_graphs._GraphCache()
    with pytest.warns(UserWarning, match="CUDA graphs disabled.*not permitted"):
        assert cache.run(net, net._rows, torch.zeros(2, 5)) is None
    assert cache.run(net, net._rows, torch.zeros(3, 5)) is None
    assert len(calls) == 1 and cache.captures == 0 and "not permitted" in cache.failed


def test_graph_cache_lets_errors_of_the_forward_itself_through(cpu_graphs):
    """A wrong input fails as it would eagerly, and does not switch graphs off."""
    net = MLPActorCritic(5, BOX, seed=0)
    cache = cpu_graphs._GraphCache()
    with torch.no_grad(), pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cache.run(net, net._rows, torch.zeros(2, 7))
    assert cache.failed is None
    with torch.no_grad():
        assert cache.run(net, net._rows, torch.zeros(2, 5)) is not None


@pytest.mark.parametrize(
    "make", [lambda: MLPActorCritic(5, BOX), lambda: CNNActorCritic((3, 16, 16), BOX)]
)
def test_packed_act_is_act_in_one_tensor_and_act_host_is_act_on_the_host(make, cpu_graphs):
    """``_act_packed`` (what act_host records as one graph on a GPU) does act's arithmetic, so
    it gives act's bits; replayed through the graph cache with host inputs it gives them too."""
    net = make()
    shape = (6, 5) if isinstance(net, MLPActorCritic) else (6, 3, 16, 16)
    g = torch.Generator().manual_seed(4)
    obs = (
        torch.randn(shape, generator=g)
        if len(shape) == 2
        else torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    )
    gens = lambda: row_generators(1, range(6), [9] * 6)  # noqa: E731
    want = net.act(obs, generators=gens())
    eps = net.heads.noise(gens(), "cpu")
    with torch.no_grad():
        (packed,) = net._act_packed(obs, eps)
        (replayed,) = cpu_graphs._GraphCache().run(net, net._act_packed, obs, eps, device="cpu")
    for got in (packed, replayed):
        assert torch.equal(got[:, :3], want[0]) and torch.equal(got[:, 3], want[1])
        assert torch.equal(got[:, 4], want[2])
    host = net.act_host(obs, gens())  # on a CPU net: act itself
    assert all(torch.equal(h, w) for h, w in zip(host, want, strict=True))
    with pytest.raises(ValueError, match="one per row"):
        net.act_host(obs, gens()[:2])


@pytest.mark.parametrize(
    "make", [lambda: MLPActorCritic(5, BOX), lambda: CNNActorCritic((3, 16, 16), BOX)]
)
def test_graphed_calls_are_rounded_to_whole_blocks_with_the_same_bits(make, cpu_graphs):
    """Calls of 1 to 16 rows record two graphs (8 and 16 rows) where the forward runs in
    blocks of 8, and each row keeps the bits of the call unpadded; row by row, every row count
    is its own graph. (Where this CPU's kernels fail the block check at 8 rows, as the MLP's
    did on a GPU host's Xeon, the forward runs row by row from the start: 16 graphs.)"""
    net = make()
    net.use_cuda_graphs(max_shapes=64)
    g = torch.Generator().manual_seed(7)
    full = (16, 5) if isinstance(net, MLPActorCritic) else (16, 3, 16, 16)
    obs = (
        torch.randn(full, generator=g)
        if len(full) == 2
        else torch.randint(0, 256, full, dtype=torch.uint8, generator=g)
    )
    eps = torch.randn(16, 3, generator=g)
    with torch.no_grad():
        for n in range(1, 17):
            (got,) = net._graph_run(net._act_packed, obs[:n], eps[:n], device="cpu")
            (want,) = net._act_packed(obs[:n], eps[:n])
            assert got.shape == want.shape and torch.equal(got, want)
        blocked = all(net._blocks_checked.values())
        assert net._blocks_checked and net.graph_captures == (2 if blocked else 16)
        before = net.graph_captures
        net.row_block = 1  # drops the graphs
        for n in range(1, 17):
            net._graph_run(net._act_packed, obs[:n], eps[:n], device="cpu")
        assert net.graph_captures == before + 16


def test_cuda_graphs_leave_cpu_acting_copies_and_pickles_alone():
    import copy
    import pickle

    net = CNNActorCritic((3, 16, 16), BOX, seed=1)
    ref = copy.deepcopy(net)
    net.use_cuda_graphs()
    obs = torch.randint(0, 255, (4, 3, 16, 16), dtype=torch.uint8)
    got = net.act(obs, generators=row_generators(0, range(4), [0] * 4))
    want = ref.act(obs, generators=row_generators(0, range(4), [0] * 4))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert net.graph_captures == 0 and ref.graph_captures == 0  # nothing recorded on CPU
    assert net.record_act_graphs({4, 9}, obs) == 0 and net.graph_captures == 0
    net._graphs.entries[("recorded",)] = object()  # stands in for a graph, which cannot be copied
    net._graphs.captures = 1
    for twin in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert twin._graphs is not net._graphs and twin.graph_captures == 0
        assert not twin._graphs.entries
    net.release_graphs()
    assert not net._graphs.entries
    net.use_cuda_graphs(False)
    assert net._graphs is None


def test_build_policy_passes_policy_kwargs_and_names_bad_ones():
    from loomrl.errors import ConfigError
    from loomrl.workers.policy import build_policy

    img = gym.spaces.Box(0, 255, (3, 32, 32), np.uint8)
    net = build_policy("cnn", img, BOX, 0, kwargs={"channels": (8, 16, 16), "feature_dim": 24})
    assert [m.out_channels for m in net.torso if isinstance(m, torch.nn.Conv2d)] == [8, 16, 16]
    assert net.fc[0].out_features == 24
    flat = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    mlp = build_policy("auto", flat, BOX, 0, hidden=(64, 64), kwargs={"hidden": (7,)})
    assert mlp.actor[0].out_features == 7  # policy_kwargs win over ppo.hidden
    with pytest.raises(ConfigError, match=r"policy='cnn': policy_kwargs=.*chanels.*do not fit"):
        build_policy("cnn", img, BOX, 0, kwargs={"chanels": (8, 16, 16)})
    # The user's kwargs are named, not the defaults filled in; the error inside stays its own.
    with pytest.raises(ConfigError, match=r"policy_kwargs=\{'x': 1\} do not fit"):
        build_policy("mlp", flat, BOX, 0, kwargs={"x": 1})
    with pytest.raises(TypeError):
        build_policy("mlp", flat, BOX, 0, kwargs={"hidden": 7})
    # Observations the chosen built-in cannot take: the user's config, said before building.
    with pytest.raises(ConfigError, match=r"policy='cnn': no built-in policy .* shape \(5,\)"):
        build_policy("cnn", flat, BOX, 0)
    grid = gym.spaces.Box(-1.0, 1.0, (4, 4), np.float32)
    with pytest.raises(ConfigError, match=r"policy='auto': no built-in policy .* \(4, 4\)"):
        build_policy("auto", grid, BOX, 0)
    assert build_policy("mlp", grid, BOX, 0).actor[0].in_features == 16


def test_build_policy_refuses_a_factory_policy_with_nothing_to_train(monkeypatch):
    """Adam refused the empty parameter list with a bare ValueError from the worker's
    constructor; the policy spec and the fix are named instead."""
    import types

    from loomrl.errors import ConfigError
    from loomrl.workers.policy import build_policy

    class Frozen(torch.nn.Module):
        def __init__(self, obs_space, action_space, seed=0, layers=1):
            super().__init__()
            self.body = torch.nn.Sequential(*[torch.nn.Linear(5, 5) for _ in range(layers)])
            self.body.requires_grad_(False)

        def act(self, obs):
            raise NotImplementedError

        def evaluate(self, obs, action):
            raise NotImplementedError

    monkeypatch.setitem(sys.modules, "my_policies", types.SimpleNamespace(Frozen=Frozen))
    flat = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    for layers in (0, 2):  # no parameters at all, and parameters that are all frozen
        with pytest.raises(
            ConfigError,
            match=r"policy='my_policies:Frozen' built a Frozen with "
            r"no trainable parameters",
        ):
            build_policy("my_policies:Frozen", flat, BOX, 0, kwargs={"layers": layers})


def test_build_policy_names_the_layer_sizes_of_a_built_in_policy_that_cannot_fit():
    """ppo.hidden=[100000, 100000] (a 40 GB MLP) ended the run with the CPU allocator's
    traceback from the policy worker's constructor; the key and its value are named instead."""
    from loomrl.errors import ConfigError
    from loomrl.workers.policy import build_policy

    flat = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    huge = 2**40  # 22 TB of weights in the first layer: no allocator gives that
    with pytest.raises(
        ConfigError,
        match=rf"policy='auto': the policy built with "
        rf"ppo.hidden=\[{huge}\] does not fit in the policy worker's memory",
    ):
        build_policy("auto", flat, BOX, 0, hidden=(huge,))
    with pytest.raises(ConfigError, match=rf"with policy_kwargs.hidden=\[64, {huge}\] does not"):
        build_policy("mlp", flat, BOX, 0, kwargs={"hidden": [64, huge]})


@pytest.mark.parametrize(
    "space",
    [BOX, DISC, gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)],
)
def test_mlp_training_bytes_counts_the_built_in_mlp_four_times(space):
    from loomrl.workers.policy import mlp_training_bytes

    net = MLPActorCritic(7, space, hidden=(48, 16))
    assert mlp_training_bytes(7, (48, 16), space) == 16 * sum(p.numel() for p in net.parameters())
    assert mlp_training_bytes(7, "wide", space) is None


def test_a_built_in_mlp_larger_than_the_machine_is_refused_before_it_is_built(monkeypatch):
    """Where the kernel overcommits memory a huge layer is allocated and then initialised until
    the process dies; the size is compared with the machine's memory first. The allocator's
    own refusal is still named the same way where the check cannot tell."""
    import loomrl.workers.policy as wp
    from loomrl.errors import ConfigError
    from loomrl.workers.policy import build_policy

    flat = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
    built = []
    monkeypatch.setattr(wp, "_host_memory_bytes", lambda: 10**6)  # a 1 MB machine
    monkeypatch.setattr("loomrl.policies.MLPActorCritic.__init__", lambda *a, **k: built.append(1))
    with pytest.raises(
        ConfigError,
        match=r"ppo.hidden=\[256, 256\] does not fit in the policy worker's memory \(its "
        r"weights, gradients and Adam's two moments take about 0.00217 GB, and this machine "
        r"has 0.001 GB\)",
    ):
        build_policy("mlp", flat, BOX, 0, hidden=(256, 256))
    assert not built  # refused before any allocation

    def no_memory(*a, **k):
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"
        )

    monkeypatch.setattr(wp, "_host_memory_bytes", lambda: None)
    monkeypatch.setattr("loomrl.policies.MLPActorCritic.__init__", no_memory)
    with pytest.raises(
        ConfigError, match=r"ppo.hidden=\[256, 256\] does not fit .*DefaultCPUAllocator"
    ):
        build_policy("mlp", flat, BOX, 0, hidden=(256, 256))


def test_row_seeds_are_stateless_distinct_and_reused_generators_draw_the_same():
    from loomrl.policies import row_seeds

    ids, steps = np.arange(256), np.arange(256) % 7
    s = row_seeds(3, ids, steps)
    assert s.dtype == np.uint64 and len(set(s.tolist())) == 256 and int(s.max()) < 2**63
    assert np.array_equal(s, row_seeds(3, ids.tolist(), steps.tolist()))  # lists or arrays
    assert np.array_equal(s[5:9], row_seeds(3, ids[5:9], steps[5:9]))  # per row, not per batch
    for other in (
        row_seeds(4, ids, steps),
        row_seeds(3, ids, steps + 1),
        row_seeds(3, ids + 1, steps),
    ):
        assert not np.intersect1d(s, other).size  # seed, step and env id each move every stream
    with pytest.raises(ValueError, match="3 env ids for 2 step counts"):
        row_seeds(0, [0, 1, 2], [0, 0])
    pool = []
    first = [torch.randn(3, generator=g) for g in row_generators(3, ids[:5], steps[:5], pool)]
    list(row_generators(9, ids[:8], steps[:8], pool))  # re-seeded in between, and grown
    again = [torch.randn(3, generator=g) for g in row_generators(3, ids[:5], steps[:5], pool)]
    fresh = [torch.randn(3, generator=g) for g in row_generators(3, ids[:5], steps[:5])]
    assert len(pool) == 8
    assert all(
        torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, fresh, strict=True)
    )


def test_time_update_warms_up_then_times_every_epoch_as_update_runs_them(monkeypatch):
    """The process's first backward is a warm-up, not timed; the timed update runs all of
    ppo.epochs at once (the advantages once), with no early stop on the random data."""
    import loomrl.embodied as emb
    from loomrl.embodied import PPOConfig
    from loomrl.workers.policy import PolicyWorker

    seen = []
    real = emb.ppo_update

    def spy(net, opt, buf, cfg, **kw):
        seen.append((cfg.epochs, cfg.target_kl, kw.get("rewards") is not None))
        return real(net, opt, buf, cfg, **kw)

    monkeypatch.setattr(emb, "ppo_update", spy)
    pol = PolicyWorker.__new__(PolicyWorker)
    pol.ppo = PPOConfig(rollout_steps=32, epochs=3, num_minibatches=2, target_kl=0.01)
    pol.num_envs, pol.obs_shape, pol.pixels, pol.device, pol.graphs = 4, (5,), False, "cpu", False
    pol.net = MLPActorCritic(5, BOX, seed=0)
    pol.scaler = None
    assert pol.time_update(8) > 0
    # the median of three timed updates (two where a host stall made those pass a second)
    assert seen[0] == (1, None, False) and seen[1:] in ([(3, None, False)] * n for n in (2, 3))
    # With reward scaling the timed updates scale rewards as update does (the warm-up need not).
    seen.clear()
    pol.scaler = emb.RewardScaler(4, 0.99)
    state = pol.scaler.state_dict()
    assert pol.time_update(8) > 0
    assert seen[1:] in ([(3, None, True)] * n for n in (2, 3))
    assert all(np.array_equal(v, state[k]) for k, v in pol.scaler.state_dict().items())  # a copy


def test_policy_step_graph_false_keeps_the_update_eager_with_acts_graphs_on():
    """step_graph=False: the trainer is the plain fused Adam and no recorded PPO step, even on a
    CUDA device with act's graphs on (a recorded step would need a capturable Adam there)."""
    from types import SimpleNamespace

    import torch

    from loomrl.workers.policy import PolicyWorker

    pol = PolicyWorker.__new__(PolicyWorker)
    pol.device, pol.graphs, pol.step_graph = "cuda", True, False
    pol.ppo = SimpleNamespace(lr=3e-4, adam_eps=1e-5)
    net = torch.nn.Linear(3, 2)
    net.use_cuda_graphs = lambda on=True: None  # a built-in policy's switch
    opt, step = pol._trainer(net)
    assert step is None
    assert isinstance(opt, torch.optim.Adam) and opt.defaults["fused"] is True
    assert opt.defaults["capturable"] is False


_BAD_POLICIES = """
from loomrl.policies import MLPActorCritic


class _Off(MLPActorCritic):
    def __init__(self, n, space, seed, fix):
        super().__init__(n, space, seed=seed)
        self.fix = fix

    def act(self, obs, generators=None):
        return self.fix(*super().act(obs))


def value_column(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a, l, v[:, None]))


def one_action(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a[:1], l, v))


def right(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a, l, v))


def two_values(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a, l))


def numpy_out(observation_space, action_space, seed=0):
    return _Off(
        observation_space.shape[0], action_space, seed, lambda a, l, v: (a.numpy(), l, v)
    )


def nan_actions(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a * float("nan"), l, v))


def nan_values(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a, l, v * float("nan")))


def inf_logp(observation_space, action_space, seed=0):
    return _Off(observation_space.shape[0], action_space, seed, lambda a, l, v: (a, l - float("inf"), v))
"""


def test_a_user_policy_returning_misshapen_outputs_is_named_with_the_shapes(tmp_path, monkeypatch):
    """A user policy's act() whose value comes as [n, 1], or whose actions cover one row, stops
    the rollout with an error naming the policy, the output and both shapes, not numpy's."""
    import gymnasium as gym

    from loomrl.embodied import PPOConfig
    from loomrl.errors import ConfigError
    from loomrl.workers.policy import PolicyWorker

    (tmp_path / "bad_policies.py").write_text(_BAD_POLICIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    reply = {"obs": np.zeros((3, 4), np.float32), "env_ids": np.arange(3)}
    reply["env_steps"] = np.zeros(3, np.int64)
    ppo = PPOConfig(rollout_steps=6, num_minibatches=1)
    for spec, said in [
        ("bad_policies:value_column", r"values of shape \[3, 1\], expected \[3\]"),
        ("bad_policies:one_action", r"actions of shape \[1, 2\], expected \[3, 2\]"),
    ]:
        pol = PolicyWorker(obs, act, 3, ppo, 0, policy=spec)
        pol.begin(2)
        with pytest.raises(
            ConfigError, match=rf"policy='{spec}': act\(\) on 3 observations .*{said}"
        ):
            pol.act(0, reply)
    for spec, said in [
        ("bad_policies:two_values", r"three torch tensors, got tuple of 2 values"),
        ("bad_policies:numpy_out", r"three torch tensors, got \(ndarray, Tensor, Tensor\)"),
        ("bad_policies:nan_actions", r"NaN or infinite actions"),
        ("bad_policies:nan_values", r"NaN or infinite values"),
        ("bad_policies:inf_logp", r"NaN or infinite log-probs"),
    ]:
        pol = PolicyWorker(obs, act, 3, ppo, 0, policy=spec)
        pol.begin(2)
        with pytest.raises(ConfigError, match=rf"policy='{spec}': act\(\) .*{said}"):
            pol.act(0, reply)
    good = PolicyWorker(obs, act, 3, ppo, 0, policy="bad_policies:right")
    good.begin(2)
    assert [a.shape for a in good.act(0, reply)] == [(3, 2)]


def _ks_distance(x: np.ndarray, cdf) -> float:
    """Kolmogorov-Smirnov distance between the sample ``x`` and ``cdf``."""
    x = np.sort(x.astype(np.float64))
    f = np.array([cdf(v) for v in x])
    n = len(x)
    return float(max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max()))


def test_row_streams_draw_normals_and_uniforms_with_the_right_law():
    from statistics import NormalDist

    from loomrl.policies import RowStreams, row_seeds

    streams = RowStreams(row_seeds(5, np.arange(4000), np.zeros(4000, np.int64)))
    z = streams.normal(3)
    u = streams.uniform(2)
    assert z.shape == (4000, 3) and z.dtype == np.float32
    assert u.shape == (4000, 2) and u.dtype == np.float64 and u.min() >= 0 and u.max() < 1
    # 5% critical values of the KS distance at n = 12000 and 8000 are 0.0124 and 0.0152; these
    # bounds sit near the 0.1% level, so a wrong law (an unscaled or shifted normal) fails them.
    assert _ks_distance(z.ravel(), NormalDist().cdf) < 0.018
    assert _ks_distance(u.ravel(), lambda v: v) < 0.022
    corr = np.corrcoef(z.T)  # the elements of a row are independent draws
    assert np.abs(corr[np.triu_indices(3, 1)]).max() < 0.06
    assert np.array_equal(z, streams.normal(3))  # stateless: the same draws again
    assert not np.array_equal(z[:, 0], streams.normal(3)[::-1, 0])


def test_row_streams_give_a_row_its_draws_in_any_company_and_position():
    """A row's draws are its own: not moved by the rows beside it, their number or its place
    (odd counts reach the tails of numpy's vector loops)."""
    from loomrl.policies import RowStreams

    seeds = np.random.default_rng(0).integers(0, 2**63, 1037, dtype=np.uint64)
    whole_n, whole_u = RowStreams(seeds).normal(5), RowStreams(seeds).uniform(3)
    perm = np.random.default_rng(1).permutation(1037)
    assert np.array_equal(RowStreams(seeds[perm]).normal(5), whole_n[perm])
    for lo, hi in ((0, 1), (3, 10), (17, 530), (1000, 1037)):
        part = RowStreams(seeds)[lo:hi]
        assert np.array_equal(part.normal(5), whole_n[lo:hi]), (lo, hi)
        assert np.array_equal(part.uniform(3), whole_u[lo:hi]), (lo, hi)
    # a shape's first draws are those of a smaller one: draws are the stream's first outputs
    assert np.array_equal(RowStreams(seeds).uniform(1)[:, 0], whole_u[:, 0])


def test_row_streams_read_as_one_torch_generator_per_row_made_on_first_use():
    from loomrl.policies import row_seeds

    pool: list = []
    s = row_generators(2, range(6), [1] * 6, pool)
    assert len(s) == 6 and not pool  # the vectorised draws need no generators
    assert [g.initial_seed() for g in s] == row_seeds(2, range(6), [1] * 6).tolist()
    assert len(pool) == 6 and s[2] is pool[2] and s[-1] is pool[5]
    head = s[:3]
    assert head[1] is s[1] and len(head) == 3  # a slice shares the generators already made
    drawn = torch.randn(2, generator=s[0])
    again = torch.Generator().manual_seed(s[0].initial_seed())
    assert torch.equal(drawn, torch.randn(2, generator=again))


def test_discrete_actions_from_row_streams_follow_the_softmax():
    from loomrl.policies import RowStreams, row_seeds

    p = MLPActorCritic(5, DISC, seed=0)
    logits = torch.tensor([[0.0, 1.0, float("-inf"), 2.0]]).repeat(6000, 1)
    streams = RowStreams(row_seeds(1, np.arange(6000), np.zeros(6000, np.int64)))
    a = p.heads.sample(logits, streams, deterministic=False)
    counts = np.bincount(a.numpy(), minlength=4)
    want = torch.softmax(logits[0], -1).double().numpy() * 6000
    assert counts[2] == 0  # an action of probability 0 never comes
    chi2 = float((((counts - want) ** 2)[[0, 1, 3]] / want[[0, 1, 3]]).sum())
    assert chi2 < 13.8  # 2 degrees of freedom, 0.1% level
    assert torch.equal(a[10:20], p.heads.sample(logits[10:20], streams[10:20], False))
