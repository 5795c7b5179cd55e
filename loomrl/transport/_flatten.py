"""Split any Python object into a small pickled skeleton plus raw buffers, and back.

The skeleton is a protocol-5 pickle whose large payloads (numpy arrays, torch
tensors) are left out-of-band: they appear as entries of ``buffers`` instead of
being copied into the pickle. Every transport moves the same pair: the object
store writes the buffers into shared memory, NCCL/Gloo send them as tensors,
CUDA IPC shares them as handles.

This module imports torch only when it meets a tensor (``sys.modules`` check), so
flattening numpy-only objects works without torch installed.
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

# Skeleton layout: pickle of (_Header, inner_pickle_bytes). The header says which
# buffer indices are device tensors (moved as tensors, not bytes).
_PROTOCOL = 5


@dataclass(frozen=True)
class _Header:
    device_indices: tuple[int, ...]


# Buffers of device tensors are handed to the unpickler through this thread-local,
# because a reduce function cannot receive extra arguments at load time.
_load_state = threading.local()


def _rebuild_tensor(arr: np.ndarray, dtype_name: str, view_dtype: str | None, requires_grad: bool):
    import torch

    with warnings.catch_warnings():
        # Buffers that come from shared memory are read-only; each channel item is
        # delivered to exactly one consumer, so writing to the tensor touches nobody else.
        warnings.simplefilter("ignore", UserWarning)
        t = torch.from_numpy(arr)
    if view_dtype is not None:
        t = t.view(getattr(torch, dtype_name))
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_device_tensor(
    index: int, dtype_name: str, shape: tuple[int, ...], requires_grad: bool
):
    import torch

    raw = _load_state.buffers[index]
    if not isinstance(raw, torch.Tensor):
        raw = torch.frombuffer(memoryview(raw), dtype=torch.uint8)
    t = raw.view(getattr(torch, dtype_name)).view(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


# numpy has no bfloat16 / float8 / complex32: such tensors travel as unsigned ints of the same width.
_UINT_BY_SIZE = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


def _host_tensor_reduction(t):
    import torch

    requires_grad = t.requires_grad
    t = t.detach()
    if t.layout != torch.strided or t.is_quantized:
        # Rare layouts keep torch's own (copying) reduction.
        return t.__reduce_ex__(2)
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    dtype_name = str(t.dtype).removeprefix("torch.")
    view_dtype = None
    try:
        arr = t.numpy()
    except TypeError:
        view_dtype = _UINT_BY_SIZE[t.element_size()]
        arr = t.view(getattr(torch, view_dtype)).numpy()
    return _rebuild_tensor, (arr, dtype_name, view_dtype, requires_grad)


class _Flattener:
    """One flatten call: collects out-of-band buffers in order of appearance."""

    def __init__(self, keep_device: bool):
        self.keep_device = keep_device
        self.buffers: list[Any] = []
        self.device_indices: list[int] = []

    def buffer_callback(self, buf: pickle.PickleBuffer) -> bool:
        self.buffers.append(buf)
        return False  # False = out-of-band

    def reduce_tensor(self, t):
        import torch

        if self.keep_device and t.device.type != "cpu" and t.layout == torch.strided:
            flat = t.detach().contiguous()
            idx = len(self.buffers)
            shape = tuple(flat.shape)
            dtype_name = str(flat.dtype).removeprefix("torch.")
            self.buffers.append(flat.reshape(-1).view(torch.uint8))
            self.device_indices.append(idx)
            return _rebuild_device_tensor, (idx, dtype_name, shape, t.requires_grad)
        return _host_tensor_reduction(t)

    def dispatch_table(self) -> dict:
        table = dict(copyreg.dispatch_table)
        torch = sys.modules.get("torch")
        if torch is not None:
            # dispatch_table is keyed by exact type, so list the tensor classes users send.
            table[torch.Tensor] = self.reduce_tensor
            table[torch.nn.Parameter] = self.reduce_tensor
        return table

    def dumps(self, obj: Any) -> bytes:
        f = io.BytesIO()
        p = pickle.Pickler(f, protocol=_PROTOCOL, buffer_callback=self.buffer_callback)
        p.dispatch_table = self.dispatch_table()
        p.dump(obj)
        return f.getvalue()

    def cloud_dumps(self, obj: Any) -> bytes:
        f = io.BytesIO()
        _cloud_pickler()(f, self, protocol=_PROTOCOL, buffer_callback=self.buffer_callback).dump(
            obj
        )
        return f.getvalue()


_CloudPickler = None


def _cloud_pickler():
    """cloudpickle's pickler with the same tensor reduction (its class-level dispatch_table
    cannot be replaced per instance, so tensors are caught in reducer_override)."""
    global _CloudPickler
    if _CloudPickler is None:
        try:
            import cloudpickle
        except ImportError:  # pragma: no cover - ray vendors it
            from ray import cloudpickle

        class _TensorCloudPickler(cloudpickle.CloudPickler):
            def __init__(self, file, flattener: _Flattener, **kwargs):
                super().__init__(file, **kwargs)
                self._flattener = flattener

            def reducer_override(self, obj):
                torch = sys.modules.get("torch")
                if torch is not None and isinstance(obj, torch.Tensor):
                    return self._flattener.reduce_tensor(obj)
                return super().reducer_override(obj)

        _CloudPickler = _TensorCloudPickler
    return _CloudPickler


def flatten(obj: Any, keep_device: bool = False) -> tuple[bytes, list[Any]]:
    """Split ``obj`` into ``(skeleton, buffers)``.

    ``buffers`` holds, in order, host buffers (``pickle.PickleBuffer`` over the
    original memory: no copy is made here) and, when ``keep_device`` is true,
    device tensors as flat ``uint8`` tensors. With ``keep_device=False`` GPU
    tensors are copied to host memory (``offload``). Numpy arrays and CPU torch
    tensors (any dtype, bfloat16 included) become zero-copy buffers.

    Raises ``TypeError`` naming the type when something in ``obj`` cannot be pickled.
    """
    fl = _Flattener(keep_device)
    try:
        inner = fl.dumps(obj)
    except Exception:
        # Lambdas, local classes and __main__ objects need cloudpickle; it is slower, so second.
        fl = _Flattener(keep_device)
        try:
            inner = fl.cloud_dumps(obj)
        except Exception as err:
            raise TypeError(
                f"cannot send an object of type {type(obj).__module__}.{type(obj).__qualname__}: "
                f"it (or something inside it) is not picklable: {err}. "
                "Send plain data (dicts, lists, numpy arrays, tensors, dataclasses) instead."
            ) from err
    header = _Header(tuple(fl.device_indices))
    skeleton = pickle.dumps((header, inner), protocol=_PROTOCOL)
    return skeleton, fl.buffers


def unflatten(skeleton: bytes, buffers: list[Any]) -> Any:
    """Rebuild the object from ``flatten``'s output. Host buffers are used in place (zero-copy).

    ``buffers`` may hold anything exposing the buffer protocol (bytes, memoryview,
    numpy uint8 arrays from the object store, PickleBuffer) and, at the device
    indices, tensors.
    """
    header, inner = pickle.loads(skeleton)
    device = set(header.device_indices)
    host = [b for i, b in enumerate(buffers) if i not in device]
    _load_state.buffers = buffers
    try:
        return pickle.loads(inner, buffers=host)
    finally:
        _load_state.buffers = None


def buffer_nbytes(buf: Any) -> int:
    """Size in bytes of one entry of ``flatten``'s buffers."""
    if isinstance(buf, pickle.PickleBuffer | memoryview):
        return memoryview(buf).nbytes
    if isinstance(buf, bytes | bytearray):
        return len(buf)
    if isinstance(buf, np.ndarray):
        return buf.nbytes
    nbytes = getattr(buf, "nbytes", None)  # torch tensors
    if nbytes is not None:
        return int(nbytes)
    return memoryview(buf).nbytes


def as_host_array(buf: Any) -> np.ndarray:
    """View one host buffer as a flat uint8 numpy array (no copy)."""
    if isinstance(buf, pickle.PickleBuffer):
        # raw() also flattens Fortran-ordered buffers; their order is recorded in the skeleton.
        mv = buf.raw()
    else:
        mv = memoryview(buf)
        if mv.ndim != 1 or mv.format != "B":
            mv = mv.cast("B")
    return np.frombuffer(mv, dtype=np.uint8)
