"""One default ``torch.distributed`` process group over the ranks of a worker group.

A trainer group that spans several GPUs (one process per GPU) shards its model with FSDP2, which
needs a default process group of exactly those ranks. Rank 0 opens a TCPStore and publishes its
address on the job's rendezvous actor under the group's launch id (unique per launch, so a group
replaced after a re-plan never meets the old one's address); the other ranks look it up.

On CPU a trainer holds all its devices in one process (bit-identical results whatever the plan),
so this is only used where the worker group really has several CUDA ranks. No torch import at
module import time.
"""

from __future__ import annotations

import datetime
from typing import Any

from loomrl.errors import LoomError


def join_process_group(worker: Any, backend: str | None = None, timeout: float = 300.0) -> bool:
    """Make the ranks of ``worker``'s group one default process group (no-op for one rank).

    Returns True when a group of several ranks is (now) initialised. ``backend`` defaults to NCCL
    when CUDA is available, Gloo otherwise. Every rank must call this, in its constructor.
    """
    import torch
    import torch.distributed as dist

    from loomrl.transport._collective import open_store
    from loomrl.weights import ActorRendezvous

    if worker.world_size <= 1:
        return False
    if dist.is_initialized():
        if dist.get_world_size() != worker.world_size:
            raise LoomError(
                f"{worker.name}: this process already belongs to a process group of "
                f"{dist.get_world_size()} ranks, not the {worker.world_size} of its group"
            )
        return True
    if not worker.launch_id:
        raise LoomError(f"{worker.name}: no launch id; start the group with Cluster.launch")
    cuda = torch.cuda.is_available()
    backend = backend or ("nccl" if cuda else "gloo")
    key = f"loomrl/dp/{worker.group_name}/{worker.launch_id}"
    store = open_store(ActorRendezvous(), key, worker.rank, worker.world_size, timeout)
    if cuda:
        torch.cuda.set_device(0)  # each rank sees only its own GPU
    dist.init_process_group(
        backend,
        store=store,
        rank=worker.rank,
        world_size=worker.world_size,
        timeout=datetime.timedelta(seconds=timeout),
    )
    worker._loom_store = store  # the store must outlive the group
    return True
