"""Moving Python objects between processes: flatten into buffers, pick a path, move the buffers.

- ``flatten`` / ``unflatten``: any object <-> (pickled skeleton, raw buffers), zero-copy for
  numpy arrays and torch tensors (bfloat16 included).
- ``select_path``: same process / shared memory / CUDA IPC / NCCL / Gloo for a (src, dst, data) triple.
- ``Link`` / ``PairGroups``: lazily created, cached two-rank NCCL or Gloo groups and
  ``send_object`` / ``recv_object`` over them.
- ``export_buffers`` / ``import_buffers``: CUDA IPC handles for device buffers.

Importing this package does not import torch or Ray.
"""

from loomrl.transport._collective import (
    Link,
    PairGroups,
    Rendezvous,
    StoreRendezvous,
    recv_object,
    send_object,
)
from loomrl.transport._flatten import as_host_array, buffer_nbytes, flatten, unflatten
from loomrl.transport._ipc import export_buffers, import_buffers
from loomrl.transport._path import Endpoint, Path, select_path

__all__ = [
    "Endpoint",
    "Link",
    "PairGroups",
    "Path",
    "Rendezvous",
    "StoreRendezvous",
    "as_host_array",
    "buffer_nbytes",
    "export_buffers",
    "flatten",
    "import_buffers",
    "recv_object",
    "select_path",
    "send_object",
    "unflatten",
]
