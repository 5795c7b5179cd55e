"""Shared-memory channel slots: the pool's reuse rule, and the sweep of slots of dead creators."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

from loomrl.transport import _shm


def test_slots_are_reused_after_release_and_sized_in_powers_of_two():
    pool = _shm.SlotPool(limit_bytes=64 << 20)
    try:
        a = pool.acquire(3 << 20)
        assert a is not None and a.size >= _shm.HEADER + (4 << 20)
        assert pool.acquire(1 << 20) is not a  # a is taken: a new slot
        assert pool.in_use() == 2
        a.buf[0] = 0  # what the consumer's finalizer does
        assert pool.acquire(2 << 20) is a  # smallest free slot that fits
        assert len(pool.slots) == 2
        assert pool.acquire(128 << 20) is None  # over the pool's limit: use the object store
    finally:
        pool.close()
    assert pool.slots == [] and pool.total == 0


def test_read_views_release_the_slot_when_dropped():
    pool = _shm.SlotPool(limit_bytes=16 << 20)
    old, _shm._pool = _shm._pool, pool
    try:
        data = [np.arange(300_000, dtype=np.float32), np.ones(10, dtype=np.int64)]
        name, spans = _shm.write_buffers(data)
        views = _shm.read_buffers(name, spans)
        got = views[0].view(np.float32)
        np.testing.assert_array_equal(got, data[0])
        del views
        assert pool.in_use() == 1  # `got` still reads the slot
        del got
        assert pool.in_use() == 0
    finally:
        _shm._pool = old
        pool.close()


def test_sweep_removes_only_slots_of_dead_creators(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    names = {
        f"loomrl_{dead.pid}_aaaa": False,  # creator gone: removed
        f"loomrl_{os.getpid()}_bbbb": True,  # this process: kept
        "loomrl_notapid_cccc": True,
        "someone_else": True,
    }
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    assert _shm.sweep_orphans(str(tmp_path)) == 1
    assert {p.name for p in tmp_path.iterdir()} == {n for n, keep in names.items() if keep}
