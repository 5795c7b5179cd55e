"""CUDA IPC: share device buffers with another process on the same node by handle.

The producer exports each device tensor with torch's ``reduce_tensor`` (a
picklable ``(rebuild_fn, args)`` pair naming the allocation); the consumer calls
``rebuild_fn(*args)`` and maps the same memory: no copy. torch keeps the
allocation alive in the producer until every consumer has released it, so the
producer process must outlive the consumer's use of the tensors.
"""

from __future__ import annotations

from typing import Any


class _IpcHandle:
    __slots__ = ("rebuild", "args")

    def __init__(self, rebuild, args):
        self.rebuild, self.args = rebuild, args

    def __reduce__(self):
        return _IpcHandle, (self.rebuild, self.args)


def export_buffers(buffers: list[Any], device_indices: tuple[int, ...] | list[int]) -> list[Any]:
    """Replace the device tensors of ``flatten``'s buffers with IPC handles; host buffers pass through."""
    from torch.multiprocessing.reductions import reduce_tensor

    out = list(buffers)
    for i in device_indices:
        rebuild, args = reduce_tensor(buffers[i])
        out[i] = _IpcHandle(rebuild, args)
    return out


def import_buffers(exported: list[Any]) -> list[Any]:
    """Open the IPC handles made by ``export_buffers`` (in the consumer process)."""
    return [b.rebuild(*b.args) if isinstance(b, _IpcHandle) else b for b in exported]
