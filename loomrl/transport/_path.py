"""Which mechanism moves data between two endpoints.

Pure logic: no Ray, no torch, no device needed, so it is tested on any machine.
"""

from __future__ import annotations

import enum
import os
import socket
from dataclasses import dataclass


class Path(enum.Enum):
    LOCAL = "local"  # same process: hand the object over, no copy
    SHARED_MEMORY = "shared_memory"  # same node, host memory: Ray object store (/dev/shm)
    CUDA_IPC = "cuda_ipc"  # same GPU, another process: share the allocation by handle
    NCCL = "nccl"  # different GPUs: device-to-device send/recv
    GLOO = "gloo"  # host memory across nodes: TCP send/recv


@dataclass(frozen=True)
class Endpoint:
    """Where a process runs. ``gpu`` is the physical GPU's id (UUID when known), None without one.

    The physical id matters: two processes with different CUDA_VISIBLE_DEVICES
    both call their GPU ``cuda:0`` while being on different chips.
    """

    node_id: str
    pid: int
    gpu: str | None = None

    @classmethod
    def here(cls, gpu: str | None = None) -> Endpoint:
        """The calling process. Uses Ray's node id when Ray is initialised, else the hostname."""
        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - ray is a dependency
            pass
        return cls(node_id=node or socket.gethostname(), pid=os.getpid(), gpu=gpu)


_LOCATIONS = ("cpu", "cuda")


def select_path(src: Endpoint, dst: Endpoint, data_location: str) -> Path:
    """Pick the transport for data living at ``data_location`` ("cpu" or "cuda[:i]") in ``src``.

    - same process: LOCAL, whatever the device;
    - host data: SHARED_MEMORY on one node, GLOO across nodes;
    - GPU data to a consumer without a GPU: staged through host memory (as host data);
    - GPU data, same node and same physical GPU: CUDA_IPC;
    - GPU data, different GPUs (same node or not): NCCL.
    """
    kind = data_location.split(":", 1)[0]
    if kind not in _LOCATIONS:
        raise ValueError(
            f"data_location={data_location!r} is not understood; use 'cpu' or 'cuda' (optionally 'cuda:<index>')"
        )
    if kind == "cuda" and src.gpu is None:
        raise ValueError(
            f"data_location={data_location!r} but the source endpoint {src} has no GPU; "
            "pass the source's GPU id in Endpoint(gpu=...) or move the data to 'cpu'"
        )
    same_node = src.node_id == dst.node_id
    if same_node and src.pid == dst.pid:
        return Path.LOCAL
    if kind == "cpu" or dst.gpu is None:
        return Path.SHARED_MEMORY if same_node else Path.GLOO
    if same_node and src.gpu == dst.gpu:
        return Path.CUDA_IPC
    return Path.NCCL
