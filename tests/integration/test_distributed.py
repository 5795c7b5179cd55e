"""One process group over the ranks of a worker group (what FSDP2 trainers form on GPUs)."""

from __future__ import annotations

from loomrl import Worker, wait
from loomrl.weights import ActorRendezvous


class Reducer(Worker):
    def __init__(self):
        super().__init__()
        from loomrl.distributed import join_process_group

        self.joined = join_process_group(self, backend="gloo", timeout=60)

    def total(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t)


def test_ranks_of_a_group_join_one_process_group(cluster):
    """The process group an FSDP2 trainer's ranks form (here over Gloo, on CPU)."""
    ActorRendezvous()  # driver-owned, as Cluster.launch makes it for groups on real GPUs
    group = cluster.launch(Reducer, 2, devices=[0, 1], name="reducer")
    try:
        assert wait(group.total()) == [3.0, 3.0]
    finally:
        group.kill()
