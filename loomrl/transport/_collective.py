"""Point-to-point transfer of flattened objects over torch.distributed (NCCL or Gloo).

Each pair of peers gets its own two-rank process group, created on first use
and cached: no global ``init_process_group`` is needed, so any two Ray actors
can talk without the rest of the job joining a collective. The lower peer id is
rank 0: it opens a TCPStore and publishes its address through a ``Rendezvous``.

The wire format is the same for both backends; only the staging device
differs (host for Gloo, the peer's GPU for NCCL):
  1. int64[1]  length of the header
  2. uint8[n]  header: pickle of (skeleton, buffer sizes, which buffers are device tensors)
  3. uint8[k]  one message per buffer
"""

from __future__ import annotations

import datetime
import pickle
import socket
import threading
from typing import Any, Protocol

from loomrl.transport._flatten import as_host_array, buffer_nbytes, flatten, unflatten


class Rendezvous(Protocol):
    """A small key-value meeting point for peers that do not know each other's address yet."""

    def publish(self, key: str, value: str) -> None: ...

    def lookup(self, key: str, timeout: float) -> str: ...


class StoreRendezvous:
    """Rendezvous over an existing torch ``Store`` (e.g. a TCPStore both peers can reach)."""

    def __init__(self, store):
        self.store = store

    def publish(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def lookup(self, key: str, timeout: float) -> str:
        self.store.set_timeout(datetime.timedelta(seconds=timeout))
        return self.store.get(key).decode()


def _local_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:  # pragma: no cover
        pass
    return socket.gethostbyname(socket.gethostname())


def open_store(rendezvous: Rendezvous, key: str, rank: int, world_size: int, timeout: float):
    """A TCPStore shared by ``world_size`` processes: rank 0 opens it on a free port and
    publishes ``host:port`` under ``key``; the others look it up and connect."""
    import torch.distributed as dist

    td = datetime.timedelta(seconds=timeout)
    if rank == 0:
        host = _local_ip()
        store = dist.TCPStore(host, 0, world_size, True, td, wait_for_workers=False)
        rendezvous.publish(key, f"{host}:{store.port}")
        return store
    host, port = rendezvous.lookup(key, timeout).rsplit(":", 1)
    return dist.TCPStore(host, int(port), world_size, False, td)


class PairGroups:
    """Two-rank process groups between this process (``me``) and each peer, per backend, cached."""

    def __init__(self, me: str, rendezvous: Rendezvous, timeout: float = 300.0):
        self.me = me
        self.rendezvous = rendezvous
        self.timeout = timeout
        self._groups: dict[tuple[str, str], tuple[Any, int, Any]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, peer: str, backend: str) -> tuple[Any, int]:
        """Return ``(process_group, peer_rank)`` for talking to ``peer``; creates it on first use."""
        if peer == self.me:
            raise ValueError(
                f"peer {peer!r} is this process itself; use Path.LOCAL, not a process group"
            )
        if backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={backend!r}; use 'gloo' or 'nccl'")
        with self._lock:
            cached = self._groups.get((peer, backend))
            if cached is None:
                cached = self._create(peer, backend)
                self._groups[(peer, backend)] = cached
        pg, my_rank, _store = cached
        return pg, 1 - my_rank

    def _create(self, peer: str, backend: str):
        import torch.distributed as dist

        lo, hi = sorted((self.me, peer))
        rank = 0 if self.me == lo else 1
        key = f"loomrl/pair/{backend}/{lo}/{hi}"
        td = datetime.timedelta(seconds=self.timeout)
        store = open_store(self.rendezvous, key, rank, 2, self.timeout)
        if backend == "gloo":
            pg = dist.ProcessGroupGloo(store, rank, 2, td)
        else:  # pragma: no cover - needs two GPUs
            pg = dist.ProcessGroupNCCL(store, rank, 2)
        return pg, rank, store


def _staging_device(backend: str, device: str | None) -> str:
    if backend == "gloo":
        return "cpu"
    if device is None or not device.startswith("cuda"):
        raise ValueError(f"backend='nccl' needs a CUDA device to stage on, got device={device!r}")
    return device


def send_object(
    obj: Any, pg, peer_rank: int, backend: str = "gloo", device: str | None = None
) -> int:
    """Send ``obj`` to ``peer_rank`` of the two-rank group ``pg``. Returns the payload bytes sent.

    With NCCL, GPU tensors go device-to-device without a host copy; host buffers are staged on ``device``.
    With Gloo, everything travels through host memory.
    """
    import numpy as np
    import torch

    stage = _staging_device(backend, device)
    keep_device = backend == "nccl"
    skeleton, buffers = flatten(obj, keep_device=keep_device)
    is_device = [isinstance(b, torch.Tensor) for b in buffers]
    sizes = [buffer_nbytes(b) for b in buffers]
    header = pickle.dumps((skeleton, sizes, is_device), protocol=5)
    head = torch.from_numpy(np.frombuffer(header, dtype=np.uint8).copy())
    msgs = [torch.tensor([len(header)], dtype=torch.int64), head]
    for b, dev in zip(buffers, is_device, strict=True):
        msgs.append(b if dev else torch.from_numpy(as_host_array(b)))
    for tag, t in enumerate(msgs):
        if t.numel() == 0:
            continue  # zero-length messages are not sent; the receiver knows the size
        pg.send([t.to(stage, non_blocking=True)], peer_rank, tag).wait()
    return sum(sizes)


def recv_object(pg, peer_rank: int, backend: str = "gloo", device: str | None = None) -> Any:
    """Receive one object sent by ``send_object`` from ``peer_rank``."""
    import torch

    stage = _staging_device(backend, device)
    length = torch.zeros(1, dtype=torch.int64, device=stage)
    pg.recv([length], peer_rank, 0).wait()
    head = torch.empty(int(length.item()), dtype=torch.uint8, device=stage)
    pg.recv([head], peer_rank, 1).wait()
    skeleton, sizes, is_device = pickle.loads(head.cpu().numpy().tobytes())
    buffers: list[Any] = []
    for i, (n, dev) in enumerate(zip(sizes, is_device, strict=True)):
        t = torch.empty(n, dtype=torch.uint8, device=stage)
        if n:
            pg.recv([t], peer_rank, i + 2).wait()
        buffers.append(t if dev else t.cpu().numpy())
    return unflatten(skeleton, buffers)


class Link:
    """Send/receive objects to/from named peers, choosing NCCL or Gloo, with cached pair groups.

    ``device`` is this process's CUDA device for NCCL ("cuda:0"), None on CPU.
    """

    def __init__(
        self, me: str, rendezvous: Rendezvous, device: str | None = None, timeout: float = 300.0
    ):
        self.groups = PairGroups(me, rendezvous, timeout)
        self.device = device

    def send(self, obj: Any, peer: str, backend: str = "gloo") -> int:
        pg, peer_rank = self.groups.get(peer, backend)
        return send_object(obj, pg, peer_rank, backend, self.device)

    def recv(self, peer: str, backend: str = "gloo") -> Any:
        pg, peer_rank = self.groups.get(peer, backend)
        return recv_object(pg, peer_rank, backend, self.device)
