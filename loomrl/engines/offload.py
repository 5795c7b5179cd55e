"""Moving an engine's tensors (weights, optimizer state) off the compute device and back.

On a GPU, offloading copies tensors to (pinned) host memory and frees device memory. On a
CPU-only machine "the device" *is* host memory, so moving tensors to the CPU frees nothing:
instead the raw bytes are written to one file on disk and the tensors are replaced by empty
placeholders; ``malloc_trim`` then hands the freed heap back to the OS so RSS really drops.
Onload reads the bytes back into fresh tensors, bit-identical to what was offloaded.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import torch


def release_host_memory() -> None:
    """Return freed heap pages to the OS (glibc only; a no-op elsewhere)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_bytes() -> int:
    """Resident set size of this process in bytes (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


@dataclass
class _Slot:
    holder: object  # a Parameter (set .data) or a dict (set [key])
    key: str | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    offset: int
    nbytes: int


@dataclass
class DiskStash:
    """Tensors parked in a single file. Build with ``stash_to_disk``; restore with ``restore``."""

    path: str
    slots: list[_Slot] = field(default_factory=list)
    # The file is unlinked as soon as it is written and read back through this open handle, so a
    # worker that dies while offloaded leaves nothing behind.
    handle: Any = None

    def restore(self) -> None:
        f = self.handle if self.handle is not None else open(self.path, "rb")
        with f:
            for s in self.slots:
                t = torch.empty(s.shape, dtype=s.dtype)
                if s.nbytes:
                    f.seek(s.offset)
                    view = memoryview(t.view(-1).view(torch.uint8).numpy())
                    got = f.readinto(view)
                    if got != s.nbytes:
                        raise OSError(
                            f"offload file {self.path} is truncated ({got} of {s.nbytes} bytes)"
                        )
                t = t.to(s.device)
                _put(s.holder, s.key, t)
        if self.handle is None:
            os.unlink(self.path)
        self.handle = None
        self.slots = []


def _put(holder, key, tensor):
    if key is None:
        holder.data = tensor
    else:
        holder[key] = tensor


def _get(holder, key):
    return holder.data if key is None else holder[key]


def stash_to_disk(
    targets: list[tuple[object, str | None]], directory: str | None = None
) -> DiskStash:
    """Write each target tensor's bytes to one file and replace it by an empty placeholder.

    ``targets``: (parameter, None) pairs for parameters and (dict, key) pairs for optimizer
    state entries. Scalars (e.g. Adam's step) are skipped by callers: they cost nothing.
    """
    fd, path = tempfile.mkstemp(prefix="loomrl-offload-", suffix=".bin", dir=directory)
    stash = DiskStash(path=path)
    offset = 0
    with os.fdopen(fd, "wb") as f:
        for holder, key in targets:
            t = _get(holder, key)
            cpu = t.detach().to("cpu").contiguous()
            nbytes = cpu.numel() * cpu.element_size()
            if nbytes:
                f.write(memoryview(cpu.view(-1).view(torch.uint8).numpy()))
            stash.slots.append(
                _Slot(holder, key, tuple(t.shape), t.dtype, t.device, offset, nbytes)
            )
            offset += nbytes
            _put(holder, key, torch.empty(0, dtype=t.dtype, device=t.device))
            del cpu, t
    release_host_memory()
    stash.handle = open(path, "rb")
    os.unlink(path)
    return stash


def move_to(
    targets: list[tuple[object, str | None]], device: torch.device | str, pin: bool = False
) -> None:
    """Move each target tensor to ``device`` in place (GPU <-> host offload)."""
    for holder, key in targets:
        t = _get(holder, key)
        moved = t.detach().to(device, non_blocking=True)
        # Pinned host memory makes the way back faster; a DTensor (FSDP2 optimizer state) has no
        # pinning rule, so its shard stays in pageable memory.
        pinnable = not hasattr(moved, "to_local")
        if pin and pinnable and moved.device.type == "cpu" and torch.cuda.is_available():
            moved = moved.pin_memory()
        _put(holder, key, moved)
