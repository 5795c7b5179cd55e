"""Which cores Cluster.launch gives workers on GPU nodes (the bookkeeping alone, no Ray)."""

from __future__ import annotations

from loomrl.cluster import Cluster, Device, Node


def _cluster(cores: tuple[int, ...] = (4, 4), kind: str = "gpu", pin: bool = True) -> Cluster:
    nodes = []
    for i, c in enumerate(cores):
        devs = tuple(Device(index=2 * i + j, node=i, local=j, kind=kind) for j in range(2))
        nodes.append(Node(i, f"n{i}", "127.0.0.1", float(c), 2.0, devs))
    return Cluster(nodes, owns_ray=False, pin_cores=pin)


def _ranks(c: Cluster, devices: list[int], n: int) -> list[list[Device]]:
    return [[c.devices[devices[r % len(devices)]]] for r in range(n)]


def test_each_node_hands_out_its_own_cores_and_takes_them_back():
    c = _cluster()
    per_rank = _ranks(c, [0, 2], 4)  # ranks 0 and 2 on node 0, ranks 1 and 3 on node 1
    got = c._take_cores(per_rank, 2.0)
    assert got == [[0, 1], [0, 1], [2, 3], [2, 3]]  # per node, the top four, two each
    assert c._free_cores == {0: [], 1: []}
    c._release({}, got, per_rank, 2.0)
    assert c._free_cores == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}


def test_fractions_share_cores_among_their_own_ranks_only():
    c = _cluster(cores=(6,))
    # 3 ranks x 1.5 = 4.5 cores: the top 5, each rank the cores its share [1.5 r, 1.5 (r+1)) covers.
    assert c._take_cores(_ranks(c, [0], 3), 1.5) == [[1, 2], [2, 3], [4, 5]]
    assert c._free_cores[0] == [0]
    assert c._take_cores(_ranks(c, [1], 2), 0.5) == [[0], [0]]  # two halves on the last core
    assert c._free_cores[0] == []
    # Ray still has half a core (5.5 of 6 reserved), but rounding up took every core: unpinned.
    assert c._take_cores(_ranks(c, [1], 1), 0.5) == [[]]


def test_gpu_workers_share_what_simulators_left_only_once_they_hold_some():
    c = _cluster(cores=(4,))
    gpu = _ranks(c, [0], 1)
    assert c._take_cores(gpu, 0.0) == [[]]  # nothing held: not pinned
    sims = c._take_cores(_ranks(c, [1], 1), 3.0)
    assert sims == [[1, 2, 3]]
    assert c._take_cores(gpu, 0.0) == [[0]]
    assert c._free_cores[0] == [0]  # shared cores stay free
    c._release({}, [[0]], gpu, 0.0)
    assert c._free_cores[0] == [0]


def test_cpu_slots_and_pin_cores_off_leave_cores_alone():
    for c in (_cluster(kind="cpu"), _cluster(pin=False)):
        assert c._take_cores(_ranks(c, [0], 2), 1.0) == [[], []]
        assert c._free_cores[0] == [0, 1, 2, 3]
