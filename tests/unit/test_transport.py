"""flatten/unflatten, path selection, CUDA IPC export logic and Gloo send/recv between two processes."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from loomrl.transport import (
    Endpoint,
    Link,
    PairGroups,
    Path,
    StoreRendezvous,
    as_host_array,
    buffer_nbytes,
    export_buffers,
    flatten,
    import_buffers,
    select_path,
    send_object,
    unflatten,
)


@dataclasses.dataclass
class Sample:
    tokens: torch.Tensor
    reward: float
    extra: dict


def _roundtrip(obj, keep_device=False):
    skeleton, buffers = flatten(obj, keep_device=keep_device)
    # Receivers get the buffers as flat uint8 arrays (what the object store / Gloo deliver).
    return unflatten(skeleton, [as_host_array(b) for b in buffers])


def _assert_same(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad
        assert torch.equal(a.detach(), b.detach())
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b)
        for f in dataclasses.fields(a):
            _assert_same(getattr(a, f.name), getattr(b, f.name))
    else:
        assert a == b


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_tensor_dtypes_roundtrip(dtype):
    t = (torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) - 7).to(dtype)
    _assert_same(t, _roundtrip(t))


def test_float8_roundtrip_through_uint8_view():
    t = torch.tensor([0.5, -2.0, 448.0]).to(torch.float8_e4m3fn)
    out = _roundtrip(t)
    assert out.dtype == torch.float8_e4m3fn
    assert torch.equal(out.view(torch.uint8), t.view(torch.uint8))


def test_bfloat16_is_one_raw_buffer_of_two_bytes_per_element():
    t = torch.randn(1000).to(torch.bfloat16)
    skeleton, buffers = flatten(t)
    assert len(buffers) == 1 and buffer_nbytes(buffers[0]) == 2000
    assert len(skeleton) < 400  # the data is not inside the skeleton


def test_nested_containers_and_dataclasses():
    obj = {
        "a": np.arange(12.0).reshape(3, 4),
        "f": np.asfortranarray(np.arange(6).reshape(2, 3)),
        "t": [
            torch.zeros(0),
            (torch.tensor(3.5), torch.randn(4, 5).t()),
        ],  # empty, 0-dim, non-contiguous
        "s": Sample(torch.arange(7), 1.25, {"note": "ok", "mask": np.ones(3, dtype=bool)}),
        "g": torch.ones(3, requires_grad=True),
        "plain": ("text", 3, None, 2.5),
    }
    _assert_same(obj, _roundtrip(obj))


def test_flatten_is_zero_copy_and_unflatten_reads_in_place():
    a = np.arange(1 << 16, dtype=np.float64)
    t = torch.arange(1 << 16, dtype=torch.float32)
    skeleton, buffers = flatten({"a": a, "t": t})
    assert len(buffers) == 2
    host = [as_host_array(b) for b in buffers]
    assert np.shares_memory(host[0], a)
    assert np.shares_memory(host[1], t.numpy())
    out = unflatten(skeleton, host)
    assert np.shares_memory(out["a"], host[0])
    assert out["t"].data_ptr() == host[1].ctypes.data


def test_parameters_and_small_objects():
    p = torch.nn.Parameter(torch.randn(2, 2))
    out = _roundtrip({"p": p, "n": 5})
    assert isinstance(out["p"], torch.Tensor) and out["p"].requires_grad
    assert torch.equal(out["p"].detach(), p.detach()) and out["n"] == 5


def test_lambda_falls_back_to_cloudpickle_and_keeps_tensors_out_of_band():
    obj = {"f": lambda x: x + 1, "a": np.ones(2), "t": torch.ones(3, dtype=torch.bfloat16)}
    skeleton, buffers = flatten(obj)
    assert len(buffers) == 2
    out = unflatten(skeleton, buffers)
    assert out["f"](1) == 2 and out["t"].dtype == torch.bfloat16


def test_unpicklable_names_the_type():
    with pytest.raises(TypeError, match=r"not picklable.*_thread\.lock"):
        flatten({"ok": 1, "bad": threading.Lock()})


def test_numpy_only_flatten_does_not_import_torch():
    code = (
        "import sys, numpy as np\n"
        "from loomrl.transport import flatten, unflatten\n"
        "s, b = flatten({'a': np.arange(3)})\n"
        "assert unflatten(s, b)['a'].tolist() == [0, 1, 2]\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_keep_device_buffers_are_tensors_at_recorded_indices():
    # The meta device stands in for CUDA: any non-CPU tensor takes the device-buffer path.
    dev = torch.empty(2, 3, dtype=torch.bfloat16, device="meta")
    obj = {"host": np.arange(4), "dev": dev}
    skeleton, buffers = flatten(obj, keep_device=True)
    kinds = [isinstance(b, torch.Tensor) for b in buffers]
    assert kinds == [False, True]
    assert buffers[1].dtype == torch.uint8 and buffers[1].numel() == 12
    # The receiver hands in the bytes that arrived for the device buffer (here, on CPU).
    arrived = torch.arange(6, dtype=torch.float32).to(torch.bfloat16).view(torch.uint8)
    out = unflatten(skeleton, [as_host_array(buffers[0]), arrived])
    assert out["dev"].dtype == torch.bfloat16 and out["dev"].shape == (2, 3)
    assert out["dev"].flatten().tolist() == [0, 1, 2, 3, 4, 5]
    assert out["host"].tolist() == [0, 1, 2, 3]


def test_keep_device_false_moves_non_cpu_tensors_to_host():
    dev = torch.empty(2, device="meta")
    with pytest.raises(TypeError, match="meta tensor"):
        flatten(dev)  # meta has no data to copy; a CUDA tensor would be copied with .cpu()
    skeleton, buffers = flatten(torch.ones(3), keep_device=True)
    assert not any(isinstance(b, torch.Tensor) for b in buffers)  # CPU data stays host data


def test_ipc_export_import_roundtrip_logic():
    t = torch.arange(10.0)
    exported = export_buffers([b"head", t], [1])
    assert exported[0] == b"head" and not isinstance(exported[1], torch.Tensor)
    imported = import_buffers(exported)
    assert imported[0] == b"head" and torch.equal(imported[1], t)


# ----------------------------------------------------------------- path selection
A0 = Endpoint("node-a", 100, gpu="GPU-0")
A0_other_proc = Endpoint("node-a", 101, gpu="GPU-0")
A1 = Endpoint("node-a", 102, gpu="GPU-1")
A_cpu = Endpoint("node-a", 103)
B0 = Endpoint("node-b", 100, gpu="GPU-7")
B_cpu = Endpoint("node-b", 104)


@pytest.mark.parametrize(
    "src,dst,loc,expected",
    [
        (A0, A0, "cuda", Path.LOCAL),
        (A_cpu, A_cpu, "cpu", Path.LOCAL),
        (A0, A0_other_proc, "cuda:0", Path.CUDA_IPC),
        (A0, A1, "cuda", Path.NCCL),
        (A0, B0, "cuda", Path.NCCL),
        (A0, A0_other_proc, "cpu", Path.SHARED_MEMORY),
        (A_cpu, A1, "cpu", Path.SHARED_MEMORY),
        (A_cpu, B_cpu, "cpu", Path.GLOO),
        (A0, A_cpu, "cuda", Path.SHARED_MEMORY),  # consumer has no GPU: staged through host memory
        (A0, B_cpu, "cuda", Path.GLOO),
    ],
)
def test_select_path(src, dst, loc, expected):
    assert select_path(src, dst, loc) is expected


def test_select_path_errors():
    with pytest.raises(ValueError, match="data_location='tpu'"):
        select_path(A0, A1, "tpu")
    with pytest.raises(ValueError, match="has no GPU"):
        select_path(A_cpu, A1, "cuda")


def test_pair_groups_and_nccl_argument_checks():
    groups = PairGroups("a", rendezvous=None)
    with pytest.raises(ValueError, match="this process itself"):
        groups.get("a", "gloo")
    with pytest.raises(ValueError, match="backend='mpi'"):
        groups.get("b", "mpi")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        send_object(1, pg=None, peer_rank=1, backend="nccl", device=None)


# ----------------------------------------------------------------- Gloo send/recv between processes
def _peer(me, other, port, first, result_q):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, None, False)
    link = Link(me, StoreRendezvous(store), timeout=30)
    if first:
        link.send(
            {"t": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), "a": np.arange(5)}, other
        )
        link.send(["second", torch.zeros(0)], other)
        reply = link.recv(other)
    else:
        got1 = link.recv(other)
        got2 = link.recv(other)
        reply = {"echo": got1["t"].float().sum().item(), "a": got1["a"].tolist(), "second": got2[0]}
        link.send(reply, other)
    result_q.put((me, reply, len(link.groups)))


def test_gloo_send_recv_between_two_processes():
    import torch.distributed as dist

    master = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_peer, args=("w1", "w0", master.port, True, q)),
        ctx.Process(target=_peer, args=("w0", "w1", master.port, False, q)),
    ]
    for p in procs:
        p.start()
    results = dict((me, (reply, n)) for me, reply, n in (q.get(timeout=60) for _ in procs))
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    reply, ngroups = results["w1"]
    assert reply == {"echo": 15.0, "a": [0, 1, 2, 3, 4], "second": "second"}
    assert ngroups == 1 and results["w0"][1] == 1  # one cached pair group, reused for all messages


def test_socket_messages_whole_objects_timeouts_and_a_closed_peer():
    import os
    import threading

    from loomrl.transport._socket import Listener, PeerClosed, connect

    lis = Listener()
    got = {}

    def server():
        conn = lis.accept(5.0, 5.0)
        got["small"] = conn.recv()
        got["big"] = conn.recv()
        conn.send(("actions", np.arange(3)))
        got["closed"] = None
        try:
            conn.recv()
        except PeerClosed as e:
            got["closed"] = str(e)
        conn.close()

    th = threading.Thread(target=server)
    th.start()
    c = connect(lis.address)
    big = np.random.default_rng(0).integers(0, 255, (64, 3, 96, 96), dtype=np.uint8)  # 1.8 MB
    c.send(("hello", 0))
    c.send(("reply", {"obs": big, "ids": np.arange(64)}))
    kind, a = c.recv(5.0)
    with pytest.raises(TimeoutError):
        c.recv(0.2)  # nothing more comes
    c.close()
    th.join(10)
    assert got["small"] == ("hello", 0) and kind == "actions" and a.tolist() == [0, 1, 2]
    assert np.array_equal(got["big"][1]["obs"], big)
    assert got["closed"] == "the other end closed the connection"
    with pytest.raises(TimeoutError):
        lis.accept(0.1)
    on_disk = lis.dir
    lis.close()
    assert on_disk is None or not os.path.exists(on_disk)  # Linux: no file at all
    with pytest.raises((FileNotFoundError, ConnectionRefusedError)):
        connect(lis.address, 1.0)


def test_a_sender_whose_reader_stops_reading_times_out():
    from loomrl.transport._socket import Listener, connect

    lis = Listener()
    c = connect(lis.address, 0.5)
    peer = lis.accept(1.0)  # accepted, never read
    with pytest.raises(TimeoutError):
        for _ in range(64):  # more than any socket buffer holds
            c.send(np.zeros(1 << 20, np.uint8))
    c.close()
    peer.close()
    lis.close()


def test_the_policy_takes_only_this_rollouts_env_workers_and_stops_on_abort():
    """A queued connection of an earlier rollout and strays (a wrong message, bytes that are
    not a pickle, a huge length) are closed, not taken for an env worker; the driver's abort and a missing worker each end the wait with a named error."""
    import threading

    from loomrl.transport._socket import Listener, connect
    from loomrl.workers.policy import HandoffError, PolicyWorker

    pol = PolicyWorker.__new__(PolicyWorker)  # only its socket is used here
    pol._listener = Listener()
    addr = pol._listener.address
    late = connect(addr)  # queued from a failed rollout
    late.send(("hello", "old", 0))
    stray = connect(addr)
    stray.send("hi")
    garbage = connect(addr)  # not a pickle
    garbage.sock.sendall(b"\x00" * 7 + b"\x03abc")
    huge = connect(addr)  # announces more than a hello can be
    huge.sock.sendall((1 << 40).to_bytes(8, "big"))
    now = [connect(addr), connect(addr)]
    now[0].send(("hello", "tok", 1))
    now[1].send(("hello", "tok", 0))
    conns = pol._accept_pipe("tok", 2, 5.0)
    assert sorted(conns) == [0, 1]
    conns[0].send("to rank 0")
    conns[1].send("to rank 1")
    assert (now[1].recv(1.0), now[0].recv(1.0)) == ("to rank 0", "to rank 1")
    for c in (late, stray, garbage, huge, *now, *conns.values()):
        c.close()
    waiting = connect(addr)
    waiting.send(("hello", "t2", 0))
    th = threading.Timer(0.3, lambda: connect(addr).send(("abort", "t2", "RemoteError: boom")))
    th.start()
    with pytest.raises(HandoffError, match="the driver stopped the rollout: RemoteError: boom"):
        pol._accept_pipe("t2", 2, 10.0)
    th.join()
    with pytest.raises(HandoffError, match=r"env workers \[0, 1\] did not connect within 0.3 s"):
        pol._accept_pipe("t3", 2, 0.3)
    waiting.close()
    pol._listener.close()


def test_last_error_reads_past_earlier_messages_to_the_peers_reason():
    from loomrl.transport._socket import Listener, connect

    lis = Listener()
    for sent, want in (
        ([("reply", 1), ("error", "env stepping failed")], "env stepping failed"),
        ([("reply", 1)], None),
    ):
        c = connect(lis.address, 2.0)
        peer = lis.accept(2.0, 2.0)
        for m in sent:
            peer.send(m)
        peer.close()  # as a worker does after telling why
        assert c.last_error(1.0) == want
        c.close()
    lis.close()
