"""Run-time faults of a run's own records: a full disk under metrics.jsonl or a checkpoint,
metrics.jsonl deleted while the run writes it. Fast: no Ray, no model."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch

from loomrl import checkpoint as ckpt
from loomrl.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, save_checkpoint
from loomrl.runlog import RunDirWriteError, RunLogger, read_metrics

needs_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")


def _rows(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir)]


def test_metrics_deleted_mid_run_starts_a_new_file_and_says_at_which_step(tmp_path, capsys):
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        rl.log(1, {"loss": 1.0})
        (tmp_path / "metrics.jsonl").unlink()  # a user's `rm`, or a cleanup script
        rl.log(2, {"loss": 2.0})
        rl.log(3, {"loss": 3.0})
        assert rl.metrics_restarted_at == [2]
    # Before: both rows went to the deleted file, and the run's end found no metrics.jsonl.
    assert _rows(tmp_path) == [2, 3]
    err = capsys.readouterr().err
    assert "metrics.jsonl was deleted or moved" in err and "at step 2" in err


def test_metrics_moved_mid_run_keeps_the_moved_file_and_starts_a_new_one(tmp_path):
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        rl.log(1, {"loss": 1.0})
        (tmp_path / "metrics.jsonl").rename(tmp_path / "old.jsonl")
        rl.log(2, {"loss": 2.0})
    assert _rows(tmp_path) == [2]
    assert json.loads((tmp_path / "old.jsonl").read_text())["step"] == 1


@needs_dev_full
def test_metrics_on_a_full_disk_names_the_file_the_cause_and_resume(tmp_path):
    # /dev/full takes the open and refuses every write with ENOSPC, as a full filesystem does.
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    rl = RunLogger(tmp_path, use_tensorboard=False, progress=False)
    with pytest.raises(RunDirWriteError, match=r"step 4's metrics.*filesystem is full") as ei:
        try:
            rl.log(4, {"loss": 1.0})
        finally:
            rl.close()  # the record still buffered fails again: not the error reported
    assert f"loomrl resume {tmp_path}" in str(ei.value)


@needs_dev_full
def test_logger_close_on_a_full_disk_is_a_run_dir_error(tmp_path):
    (tmp_path / "metrics.jsonl").symlink_to("/dev/full")
    rl = RunLogger(tmp_path, use_tensorboard=False, progress=False)
    rl._file.reconfigure(line_buffering=False)  # the record waits in the buffer until close
    rl.log(1, {"loss": 1.0})
    with pytest.raises(RunDirWriteError, match="metrics.jsonl.*filesystem is full"):
        rl.close()


def test_run_summary_on_a_full_disk_is_a_run_dir_error_that_keeps_the_old_one(
    tmp_path, monkeypatch
):
    """A full disk at the run's very end raised a bare OSError (a traceback, not a message)."""
    from loomrl import config

    rl = RunLogger(tmp_path, use_tensorboard=False, progress=False)
    rl.write_summary({"status": "running", "steps": 1})

    def full(path: Path, text: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(config, "atomic_write_text", full)
    with pytest.raises(RunDirWriteError, match=r"run_summary.json.*filesystem is full") as ei:
        rl.write_summary({"status": "finished", "steps": 2})
    rl.close()
    assert "steps had ended" in str(ei.value) and "loomrl resume" not in str(ei.value)
    assert json.loads((tmp_path / "run_summary.json").read_text())["steps"] == 1


@pytest.mark.parametrize("torch_wraps_it", [False, True])
def test_checkpoint_on_a_full_disk_keeps_the_last_one_and_says_how_to_go_on(
    tmp_path, monkeypatch, torch_wraps_it
):
    save_checkpoint(tmp_path, 2, {"actor": {"w": torch.ones(3)}, "step": 2})

    def disk_full(path: Path) -> None:
        full = OSError(errno.ENOSPC, "No space left on device")
        if not torch_wraps_it:
            raise full
        try:  # what torch.save raises when the zip writer's write failed on a full disk
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos")  # noqa: B904

    monkeypatch.setattr(ckpt, "_after_file_hook", disk_full)
    with pytest.raises(CheckpointError, match=r"checkpoint of step 4.*filesystem is full") as ei:
        save_checkpoint(tmp_path, 4, {"actor": {"w": torch.zeros(3)}, "step": 4})
    assert f"loomrl resume {tmp_path}" in str(ei.value)
    monkeypatch.setattr(ckpt, "_after_file_hook", None)
    # Nothing half-written stays behind, and the previous checkpoint is the one to resume from.
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert latest_checkpoint(tmp_path).name == "step-000002"


def test_checkpoint_error_that_is_not_the_disk_passes_unchanged(tmp_path, monkeypatch):
    def bug(path: Path) -> None:
        raise ValueError("a bug of the caller's state, not the disk")

    monkeypatch.setattr(ckpt, "_after_file_hook", bug)
    with pytest.raises(ValueError, match="not the disk"):
        save_checkpoint(tmp_path, 1, {"step": 1})
