"""Checkpoints: round trip, atomicity under a kill, corruption fallback, pruning, RNG state."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from loomrl import checkpoint as ckpt
from loomrl.checkpoint import (
    CheckpointError,
    capture_rng,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_rng,
    save_checkpoint,
    verify_checkpoint,
)


def _state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.randn(2, 3, generator=g))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "trainer": {"step": seed, "samples_seen": 10 * seed, "name": "run", "lrs": [0.1, 0.2]},
        "rng": capture_rng(),
    }


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_round_trip(tmp_path):
    state = _state(1)
    path = save_checkpoint(tmp_path, 12, state)
    assert path == tmp_path / "checkpoints" / "step-000012"
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "meta.json",
        "model.pt",
        "optimizer.pt",
        "rng.pt",
    ]
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 12 and set(manifest["files"]) == {
        "meta.json",
        "model.pt",
        "optimizer.pt",
        "rng.pt",
    }
    assert all(len(info["sha256"]) == 64 for info in manifest["files"].values())
    loaded = load_checkpoint(path)
    assert _same(loaded, state)
    assert checkpoint_step(path) == 12
    assert latest_checkpoint(tmp_path) == path
    assert not any(p.name.startswith(".") for p in (tmp_path / "checkpoints").iterdir())


def test_json_only_state_needs_no_pt_files(tmp_path):
    path = save_checkpoint(tmp_path, 0, {"counters": {"a": 1}, "done": True})
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "meta.json"]
    assert load_checkpoint(path) == {"counters": {"a": 1}, "done": True}


def test_non_plain_json_values_keep_their_type(tmp_path):
    # A tuple or an int-keyed dict would come back changed through JSON, so they go through torch.save.
    path = save_checkpoint(tmp_path, 1, {"t": (1, 2), "d": {1: "a"}})
    assert load_checkpoint(path) == {"t": (1, 2), "d": {1: "a"}}


def test_latest_is_newest_by_step_number_not_name(tmp_path):
    save_checkpoint(tmp_path, 999_999, {"x": 1}, keep=None)
    p = save_checkpoint(tmp_path, 1_000_000, {"x": 2}, keep=None)
    assert p.name == "step-1000000"
    assert latest_checkpoint(tmp_path) == p


def test_no_checkpoints(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    assert list_checkpoints(tmp_path) == []


def test_pruning_keeps_newest(tmp_path):
    for step in range(0, 50, 10):
        save_checkpoint(tmp_path, step, {"step": step}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 40]
    save_checkpoint(tmp_path, 50, {"step": 50}, keep=None)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 40, 50]
    save_checkpoint(tmp_path, 60, {"step": 60}, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [60]


def test_pruning_never_removes_later_steps(tmp_path):
    # Resuming from an older checkpoint must not delete the newer ones the user may want back.
    for step in (10, 20, 30):
        save_checkpoint(tmp_path, step, {"step": step})
    save_checkpoint(tmp_path, 15, {"step": 15}, keep=1)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [15, 20, 30]


def test_resave_same_step_replaces(tmp_path):
    save_checkpoint(tmp_path, 5, {"v": 1})
    p = save_checkpoint(tmp_path, 5, {"v": 2})
    assert load_checkpoint(p) == {"v": 2}
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000005"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="step must be a non-negative int, got -1"):
        save_checkpoint(tmp_path, -1, {})
    with pytest.raises(ValueError, match=r"keep must be an int >= 1 or None \(keep all\), got 0"):
        save_checkpoint(tmp_path, 1, {}, keep=0)
    with pytest.raises(ValueError, match=r"entry name 'a/b' is not file-name safe"):
        save_checkpoint(tmp_path, 1, {"a/b": 1})
    with pytest.raises(ValueError, match=r"entry name 'manifest' is reserved"):
        save_checkpoint(tmp_path, 1, {"manifest": 1})
    assert list_checkpoints(tmp_path) == []


def test_partial_temp_dir_and_corrupted_checkpoint_are_skipped(tmp_path, caplog):
    good = save_checkpoint(tmp_path, 10, {"model": {"w": torch.ones(3)}, "step": 10})
    bad = save_checkpoint(tmp_path, 20, {"model": {"w": torch.zeros(3)}, "step": 20})
    # A corrupted byte in a finished checkpoint (same size, different content).
    pt = bad / "model.pt"
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt.write_bytes(bytes(data))
    # A later save that died before its manifest: only the hidden temp dir exists.
    partial = tmp_path / "checkpoints" / ".tmp-step-000030-999999"
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half")
    # And a step dir without a manifest (e.g. copied by hand, incompletely).
    (tmp_path / "checkpoints" / "step-000040").mkdir()

    with caplog.at_level(logging.INFO, logger="loomrl.checkpoint"):
        assert latest_checkpoint(tmp_path) == good
    text = caplog.text
    assert "step-000040: no manifest.json (the save did not finish)" in text
    assert "step-000020: model.pt does not match its sha256 in the manifest" in text
    assert ".tmp-step-000030-999999: an unfinished write or delete" in text
    assert verify_checkpoint(bad) == ["model.pt does not match its sha256 in the manifest"]
    with pytest.raises(
        CheckpointError, match=r"step-000020 is not intact: model.pt does not match its sha256"
    ):
        load_checkpoint(bad)
    assert load_checkpoint(good)["step"] == 10


def test_truncated_and_missing_files_are_detected(tmp_path):
    p = save_checkpoint(tmp_path, 1, {"a": torch.ones(4), "b": torch.ones(2), "m": 1})
    (p / "a.pt").write_bytes((p / "a.pt").read_bytes()[:-10])
    (p / "b.pt").unlink()
    problems = verify_checkpoint(p)
    assert problems[0].startswith("a.pt has ") and "the manifest says" in problems[0]
    assert problems[1] == "b.pt is missing"
    (p / "manifest.json").write_text("{not json")
    assert verify_checkpoint(p)[0].startswith("manifest.json is unreadable")
    assert latest_checkpoint(tmp_path) is None


def _edit_manifest(p: Path, edit) -> None:
    m = json.loads((p / "manifest.json").read_text())
    edit(m)
    (p / "manifest.json").write_text(json.dumps(m))


def test_an_entry_without_a_checksum_or_a_malformed_manifest_is_skipped_not_loaded(tmp_path):
    good = save_checkpoint(tmp_path, 1, {"w": torch.ones(3), "step": 1})
    bad = save_checkpoint(tmp_path, 2, {"w": torch.zeros(3), "step": 2})
    # The manifest lost w.pt's line, and w.pt was cut short: nothing vouches for it.
    _edit_manifest(bad, lambda m: m["files"].pop("w.pt"))
    (bad / "w.pt").write_bytes((bad / "w.pt").read_bytes()[:20])
    assert verify_checkpoint(bad) == [
        "entry 'w' is stored in w.pt, which manifest.json lists no checksum for"
    ]
    assert latest_checkpoint(tmp_path) == good
    with pytest.raises(CheckpointError, match="entry 'w' is stored in w.pt"):
        load_checkpoint(bad)
    for files, said in [
        ([], "'files' is not a mapping"),
        ({"w.pt": "abc"}, "'files' is not a mapping"),
    ]:
        _edit_manifest(bad, lambda m, f=files: m.update(files=f))
        assert said in verify_checkpoint(bad)[0]
        assert latest_checkpoint(tmp_path) == good
    _edit_manifest(bad, lambda m: m.update(files={}, entries=["w"]))
    assert "'entries' is not a mapping" in verify_checkpoint(bad)[0]
    outside = {"../x.pt": {"bytes": 1, "sha256": "0"}}
    _edit_manifest(bad, lambda m: m.update(files=outside, entries={}))
    assert verify_checkpoint(bad) == ["../x.pt is not a file of the checkpoint directory"]
    assert latest_checkpoint(tmp_path) == good


def test_stale_temp_dirs_of_dead_writers_are_cleaned(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = root / f".tmp-step-000007-{dead.stdout.strip()}"
    stale.mkdir()
    mine = root / f".tmp-step-000008-{os.getppid()}"  # a live process: left alone
    mine.mkdir()
    save_checkpoint(tmp_path, 9, {"x": 1})
    assert not stale.exists() and mine.exists()


def test_failure_during_save_leaves_nothing(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, 1, {"w": torch.ones(1)})

    def boom(path: Path) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_after_file_hook", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, 2, {"w": torch.ones(1)})
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000001"]


_KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import torch
    from loomrl import checkpoint as ckpt

    run_dir, marker = Path(sys.argv[1]), Path(sys.argv[2])
    ckpt.save_checkpoint(run_dir, 1, {"model": {"w": torch.ones(8)}, "step": 1})

    def stall(path):
        if path.name == "model.pt":
            marker.write_text(str(path))
            time.sleep(60)

    ckpt._after_file_hook = stall
    ckpt.save_checkpoint(run_dir, 2, {"model": {"w": torch.zeros(8)}, "extra": torch.ones(2), "step": 2})
    """
)


def test_sigkill_mid_save_never_yields_a_half_checkpoint(tmp_path):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(tmp_path), str(marker)])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer never reached the middle of the save"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [f".tmp-step-000002-{proc.pid}", "step-000001"]
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step-000001"
    state = load_checkpoint(latest)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.ones(8))
    # The next save by a live process cleans up the dead writer's temp dir.
    save_checkpoint(tmp_path, 2, {"step": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-000001",
        "step-000002",
    ]


def test_rng_round_trip_through_checkpoint(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.randn()  # leaves a cached gaussian in numpy's state
    saved = capture_rng()
    expected = (random.random(), np.random.rand(), np.random.randn(), torch.rand(2))
    path = save_checkpoint(tmp_path, 1, {"rng": saved})
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    restore_rng(load_checkpoint(path)["rng"])  # weights_only=True works: no pickled numpy objects
    got = (random.random(), np.random.rand(), np.random.randn(), torch.rand(2))
    assert got[:3] == expected[:3]
    assert torch.equal(got[3], expected[3])


def test_cuda_rng_mismatch_is_logged_not_fatal(caplog):
    state = capture_rng()
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 3
    with caplog.at_level(logging.WARNING, logger="loomrl.checkpoint"):
        restore_rng(state)
    if not torch.cuda.is_available():
        assert "not restoring CUDA RNG state: saved for 3 device(s), 0 visible" in caplog.text


class Custom:
    """Not a tensor or container: refused by weights_only loading."""


def test_weights_only_refusal_is_explained(tmp_path):
    path = save_checkpoint(tmp_path, 1, {"obj": Custom()})
    with pytest.raises(CheckpointError, match="load it with weights_only=False"):
        load_checkpoint(path)


def test_set_aside_moves_an_earlier_runs_checkpoints_whole(tmp_path):
    from loomrl.checkpoint import latest_checkpoint, list_checkpoints, set_aside

    assert set_aside(tmp_path) is None  # nothing there: nothing moved
    save_checkpoint(tmp_path, 3, {"step": 3})
    save_checkpoint(tmp_path, 7, {"step": 7})
    moved = set_aside(tmp_path)
    assert moved is not None and moved.name.startswith("checkpoints-before-")
    assert latest_checkpoint(tmp_path) is None and list_checkpoints(tmp_path) == []
    assert sorted(p.name for p in moved.iterdir() if p.name.startswith("step-")) == [
        "step-000003",
        "step-000007",
    ]
    save_checkpoint(tmp_path, 1, {"step": 1})
    again = set_aside(tmp_path)  # a second earlier run, within the same second: its own place
    assert again is not None and again != moved and again.is_dir() and moved.is_dir()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_follow_umask_gives_files_the_mode_a_new_file_gets(tmp_path, umask):
    """safetensors writes through a private temp file: its 0600 becomes 0666 less the umask."""
    import stat

    from loomrl.checkpoint import follow_umask

    (tmp_path / "sub").mkdir()
    for name in ("model.safetensors", "config.json", "sub/x.bin"):
        (tmp_path / name).write_text("x")
        os.chmod(tmp_path / name, 0o600)
    before = os.umask(umask)
    try:
        follow_umask(tmp_path)
    finally:
        os.umask(before)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in tmp_path.rglob("*") if p.is_file()}
    assert modes == {0o666 & ~umask}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "sub"]


def test_a_model_written_to_the_cache_is_readable_as_the_umask_allows(tmp_path):
    """A cached model may be shared by a group: safetensors' 0600 must not leak into it."""
    import stat

    from loomrl.models import tiny_model

    before = os.umask(0o022)
    try:
        d = tiny_model(tmp_path / "tiny", hidden=32, layers=1)
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in d.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == 0o644, modes
    assert set(modes.values()) == {0o644}
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_a_resume_reads_each_file_once_and_says_a_skip_once(tmp_path, caplog, monkeypatch):
    import loomrl.checkpoint as ck

    good = save_checkpoint(tmp_path, 1, {"a": torch.ones(4)})
    bad = save_checkpoint(tmp_path, 2, {"a": torch.zeros(4)})
    data = bytearray((bad / "a.pt").read_bytes())
    data[-3] ^= 0xFF
    (bad / "a.pt").write_bytes(bytes(data))
    reads = []
    real = ck._sha256
    monkeypatch.setattr(ck, "_sha256", lambda p: reads.append(p.parent.name) or real(p))
    with caplog.at_level(logging.WARNING, logger="loomrl.checkpoint"):
        # Where a resume picks its checkpoint, where it restores, and where it loads it.
        assert latest_checkpoint(tmp_path) == good
        assert latest_checkpoint(tmp_path) == good
        assert load_checkpoint(good)["a"].sum() == 4
    assert sorted(reads) == ["step-000001", "step-000002"]
    assert caplog.text.count("skipping checkpoint") == 1
    # A file changed since it was read (its modification time moves) is read again.
    f = good / "a.pt"
    before = f.stat().st_mtime_ns
    f.write_bytes(b"x" + f.read_bytes()[1:])
    os.utime(f, ns=(before + 10**9, before + 10**9))  # past a coarse clock's tick, for sure
    assert latest_checkpoint(tmp_path) is None
