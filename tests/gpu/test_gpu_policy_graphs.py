"""CUDA graphs of the built-in policies' act: the same bits as eager acting, per row and per
grouping, after in-place updates and after the weights moved. Skipped where torch sees no GPU."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from loomrl.policies import make_policy, row_generators  # noqa: E402

BOX = gym.spaces.Box(-3.0, 3.0, (2,), np.float32)
SPACES = {
    "cnn": gym.spaces.Box(0, 255, (3, 64, 64), np.uint8),
    "mlp": gym.spaces.Box(-np.inf, np.inf, (11,), np.float32),
}


def _obs(space, n, seed):
    g = np.random.default_rng(seed)
    if space.dtype == np.uint8:
        return torch.as_tensor(g.integers(0, 255, (n, *space.shape), dtype=np.uint8)).cuda()
    return torch.as_tensor(g.standard_normal((n, *space.shape)).astype(np.float32)).cuda()


def _act(net, obs, ids, step=5):
    out = net.act(obs, generators=row_generators(3, ids, [step] * len(ids)))
    return [t.cpu() for t in out]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_graphed_act_gives_the_eager_bits_per_row_and_grouping(kind):
    eager = make_policy(SPACES[kind], BOX, seed=0).cuda()
    graphed = copy.deepcopy(eager)
    graphed.use_cuda_graphs()
    ids = list(range(8))
    seen = []
    for seed, n in enumerate((8, 3, 8, 1, 3, 8)):  # new observations every call: replays
        obs = _obs(SPACES[kind], n, seed)
        got = _act(graphed, obs, ids[:n])
        assert _same(got, _act(eager, obs, ids[:n])), (seed, n)
        seen.append((got, _act(eager, obs, ids[:n])))
    # One graph per row count rounded up to whole blocks: 8, 3 and 1 rows are all 8 rows where
    # the forward runs in blocks of 8 (three graphs where the block check sent it row by row).
    like = _obs(SPACES[kind], 0, 0)
    assert graphed.graph_captures == len({graphed._graph_rows(n, like) for n in (8, 3, 1)})
    assert graphed.graph_captures == (1 if all(graphed._blocks_checked.values()) else 3)
    assert all(_same(g, e) for g, e in seen)  # later replays left earlier results alone
    # Groups of 3 and 5 rows give each row what the 8-row call gave it.
    obs = _obs(SPACES[kind], 8, 99)
    whole = _act(graphed, obs, ids)
    parts = [_act(graphed, obs[:3], ids[:3]), _act(graphed, obs[3:], ids[3:])]
    assert _same(whole, [torch.cat([p[i] for p in parts]) for i in range(3)])


def test_graphs_follow_in_place_updates_and_moved_weights():
    eager = make_policy(SPACES["cnn"], BOX, seed=0).cuda()
    graphed = copy.deepcopy(eager)
    graphed.use_cuda_graphs()
    ids = list(range(4))
    _act(graphed, _obs(SPACES["cnn"], 4, 1), ids)
    with torch.no_grad():  # an optimizer step changes weights in place: replays must see it
        for a, b in zip(eager.parameters(), graphed.parameters(), strict=True):
            a.mul_(1.01)
            b.mul_(1.01)
    obs = _obs(SPACES["cnn"], 4, 2)
    assert _same(_act(graphed, obs, ids), _act(eager, obs, ids))
    assert graphed.graph_captures == 1
    graphed.cpu()  # new storage for the weights, graphs not released: they must not replay
    graphed.cuda()
    obs = _obs(SPACES["cnn"], 4, 3)
    assert _same(_act(graphed, obs, ids), _act(eager, obs, ids))
    assert graphed.graph_captures == 2


@pytest.mark.parametrize("block", [8, 16, 32])
@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_blocked_forward_gives_a_row_its_bits_in_any_group_and_position(kind, block):
    """On the GPU, blocks of ``block`` rows pass the policy's own position check (no fallback to
    rows one by one), and a row's action, log-prob and value do not depend on how many rows came
    with it, on its position or on its neighbours; graphed replays give the eager bits."""
    eager = make_policy(SPACES[kind], BOX, seed=0, row_block=block).cuda()
    graphed = copy.deepcopy(eager)
    graphed.use_cuda_graphs()
    n = 40
    obs, ids = _obs(SPACES[kind], n, 7), list(range(n))
    whole = _act(eager, obs, ids)
    # Measured on the H200 this is written for; another GPU may legitimately fall back.
    assert list(eager._blocks_checked.values()) == [True], "blocks fell back to rows one by one"
    for cuts in ((3, 37), (17, 23), (1, 39), (block, n - block)):
        for net in (eager, graphed):
            parts = [
                _act(net, obs[: cuts[0]], ids[: cuts[0]]),
                _act(net, obs[cuts[0] :], ids[cuts[0] :]),
            ]
            assert _same(whole, [torch.cat([p[i] for p in parts]) for i in range(3)]), cuts
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    moved = _act(graphed, obs[perm.cuda()], perm.tolist())
    assert _same(moved, [t[perm] for t in whole])
    others = torch.cat([obs[:1], _obs(SPACES[kind], n - 1, 8)])  # row 0 among new neighbours
    alone = _act(graphed, others, [0] * n)
    assert _same([t[:1] for t in alone], [t[:1] for t in whole])


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_act_host_replays_one_graph_with_the_eager_bits(kind):
    """act_host on host observations: forward, sampling and log-prob as one graph, copied back
    once; the bits of eager act for every call, groups and shapes, new observations each time."""
    eager = make_policy(SPACES[kind], BOX, seed=0).cuda()
    fused = copy.deepcopy(eager)
    fused.use_cuda_graphs()
    for seed, n in enumerate((8, 3, 8, 40, 3)):
        obs = _obs(SPACES[kind], n, seed)
        ids = list(range(n))
        got = fused.act_host(obs.cpu(), row_generators(3, ids, [5] * n))
        assert all(t.device.type == "cpu" for t in got)
        assert _same(got, _act(eager, obs, ids)), (seed, n)
    # 8, 3 and 40 rows: two graphs (8 and 40 rows) in blocks of 8, three row by row
    assert fused.graph_captures == (2 if all(fused._blocks_checked.values()) else 3)
    held = fused.act_host(_obs(SPACES[kind], 8, 50).cpu(), row_generators(3, range(8), [5] * 8))
    again = [t.clone() for t in held]
    fused.act_host(_obs(SPACES[kind], 8, 51).cpu(), row_generators(3, range(8), [5] * 8))
    assert _same(held, again)  # what a call returned is its own, not the next call's buffer


@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_recorded_ahead_graphs_serve_every_count_without_recording_again(kind):
    """record_act_graphs records each announced row count's graph up front (counts that round
    to one graph once); calls of those counts then only replay, with the eager bits, and the
    throw-away generators left the callers' generators where they were."""
    eager = make_policy(SPACES[kind], BOX, seed=0).cuda()
    fused = copy.deepcopy(eager)
    fused.use_cuda_graphs()
    sizes = {3, 8, 16, 40}
    like = _obs(SPACES[kind], 1, 0).cpu()
    made = fused.record_act_graphs(sizes, like)
    blocked = all(fused._blocks_checked.values())
    assert made == (3 if blocked else 4)  # 3 and 8 share the 8-row graph in blocks of 8
    assert fused.graph_captures == made
    for seed, n in enumerate(sorted(sizes)):
        obs = _obs(SPACES[kind], n, seed + 10)
        ids = list(range(n))
        got = fused.act_host(obs.cpu(), row_generators(3, ids, [5] * n))
        assert _same(got, _act(eager, obs, ids)), (seed, n)
    assert fused.graph_captures == made  # every call replayed
    assert fused.record_act_graphs(sizes, like) == 0  # all there already
