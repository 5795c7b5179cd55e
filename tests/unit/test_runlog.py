"""RunLogger: metrics.jsonl, TensorBoard, wandb (faked), progress bar, summary."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import yaml

from loomrl.errors import ConfigError
from loomrl.runlog import RunLogger, read_metrics, read_summary


def test_metrics_jsonl_records(tmp_path):
    with RunLogger(tmp_path / "run", {"lr": 1e-5}, use_tensorboard=False, progress=False) as rl:
        rl.log(1, {"reward_mean": 0.5, "ok": True, "phase": "warmup"})
        rl.log(2, {"reward_mean": torch.tensor(0.75), "n": np.int64(3), "kl": float("nan")})
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert first["step"] == 1 and first["reward_mean"] == 0.5 and first["phase"] == "warmup"
    assert isinstance(first["time"], float) and first["elapsed_s"] >= 0
    # Strict JSON on disk; read_metrics gives the float back.
    assert '"kl": "NaN"' in lines[1]
    records = read_metrics(tmp_path / "run")
    assert records[1]["reward_mean"] == 0.75 and records[1]["n"] == 3
    assert math.isnan(records[1]["kl"])
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()) == {"lr": 1e-5}


def test_non_finite_values_inside_dicts_and_lists_read_back_as_floats(tmp_path):
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        rl.log(1, {"per_task": {"add": math.nan, "mul": [1.0, math.inf]}})
        rl.write_summary({"metrics": {"episode_return": -math.inf}})
    logged = read_metrics(tmp_path)[0]["per_task"]
    assert math.isnan(logged["add"]) and logged["mul"] == [1.0, math.inf]
    assert read_summary(tmp_path)["metrics"] == {"episode_return": -math.inf}


def test_appends_on_resume_and_skips_truncated_line(tmp_path, caplog):
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        rl.log(1, {"x": 1})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "x": ')  # a crash in the middle of a line
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        rl.log(2, {"x": 2})
    with caplog.at_level(logging.WARNING, logger="loomrl.runlog"):
        records = read_metrics(tmp_path)
    # Only the cut record is lost: the resumed logger starts a fresh line.
    assert [r["step"] for r in records] == [1, 2]
    assert "line 2 is not JSON" in caplog.text


def test_config_dataclass_is_written(tmp_path):
    @dataclass
    class Cfg:
        lr: float = 0.1
        sizes: tuple[int, int] = (1, 2)
        sub: dict = field(default_factory=lambda: {"a": 1})

    RunLogger(tmp_path, Cfg(), use_tensorboard=False, progress=False).close()
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {
        "lr": 0.1,
        "sizes": [1, 2],
        "sub": {"a": 1},
    }


def test_bad_inputs(tmp_path):
    rl = RunLogger(tmp_path, use_tensorboard=False, progress=False)
    with pytest.raises(ValueError, match=r"metric name\(s\) \['step'\] are reserved"):
        rl.log(1, {"step": 3})
    with pytest.raises(TypeError, match=r"metric 'v': cannot log a value with several elements"):
        rl.log(1, {"v": torch.ones(3)})
    with pytest.raises(TypeError, match=r"metric 'o': cannot log object"):
        rl.log(1, {"o": object()})
    with pytest.raises(TypeError, match=r"metric 'c': cannot log complex"):
        rl.log(1, {"c": torch.tensor(1 + 2j), "ok": 1.0})
    with pytest.raises(TypeError, match=r"metric 'd': cannot log datetime"):
        rl.log(1, {"d": np.datetime64("2026-01-01T00:00")})
    assert read_metrics(tmp_path) == []  # a refused row is refused whole
    with pytest.raises(TypeError, match=r"step must be an int, got 1.5"):
        rl.log(1.5, {})
    rl.close()
    rl.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        rl.log(2, {})
    with pytest.raises(
        ConfigError, match=r"wandb: expected one of 'off', 'offline', 'online', got 'yes'"
    ):
        RunLogger(tmp_path, wandb="yes")


def test_summary_is_atomic_json(tmp_path):
    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        p = rl.write_summary({"final_reward": 0.9, "best": float("inf")})
        rl.write_summary({"final_reward": 0.95, "best": float("inf")})
    assert p == tmp_path / "run_summary.json"
    assert json.loads(p.read_text())["final_reward"] == 0.95
    assert read_summary(tmp_path) == {"final_reward": 0.95, "best": math.inf}
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []


def test_config_and_summary_are_as_readable_as_the_other_outputs(tmp_path):
    import stat

    with RunLogger(tmp_path, config_dict={"lr": 1.0}, use_tensorboard=False) as rl:
        rl.log(1, {"x": 1})
        rl.write_summary({"steps": 1})
    modes = {
        name: stat.S_IMODE((tmp_path / name).stat().st_mode)
        for name in ("config.yaml", "run_summary.json", "metrics.jsonl")
    }
    # written atomically (a private temp file, renamed) yet as any file the umask lets be made
    assert len(set(modes.values())) == 1, modes


def test_tensorboard_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, progress=False) as rl:
        for step in range(3):
            rl.log(step, {"reward_mean": step / 2, "time/rollout": 1.0, "note": "text"})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward_mean", "time/rollout"}
    assert [e.value for e in acc.Scalars("reward_mean")] == [0.0, 0.5, 1.0]


def test_an_int_past_float_range_is_kept_exact_and_shown_as_infinity(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, progress=False) as rl:
        rl.log(1, {"count": 10**400, "neg": -(10**400), "reward_mean": 0.5})
    assert read_metrics(tmp_path)[0]["count"] == 10**400
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("count")] == [math.inf]
    assert [e.value for e in acc.Scalars("neg")] == [-math.inf]
    assert [e.value for e in acc.Scalars("reward_mean")] == [0.5]


def test_a_resumed_logger_continues_elapsed_time_and_tensorboard_hides_dropped_rows(tmp_path):
    """A run logged steps 1-4, crashed, and resumes from its step-2 checkpoint: metrics.jsonl
    was cut back to steps 1-2; TensorBoard shows each step once, with the resumed values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with RunLogger(tmp_path, progress=False) as rl:
        for step in (1, 2, 3, 4):
            rl.log(step, {"loss": float(step)})
    rows = (tmp_path / "metrics.jsonl").read_text().splitlines()
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows[:2]) + "\n")  # what a resume keeps
    before = json.loads(rows[1])["elapsed_s"]
    with RunLogger(tmp_path, progress=False, continues=True) as rl:
        assert rl.last_metrics == {"loss": 2.0}  # the last values before this attempt
        for step in (3, 4):
            rl.log(step, {"loss": 10.0 * step})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [
        (1, 1.0),
        (2, 2.0),
        (3, 30.0),
        (4, 40.0),
    ]
    elapsed = [r["elapsed_s"] for r in read_metrics(tmp_path)]
    assert elapsed == sorted(elapsed) and elapsed[2] >= before  # never back to zero


def test_tensorboard_missing_warns_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with caplog.at_level(logging.WARNING, logger="loomrl.runlog"):
        with RunLogger(tmp_path, progress=False) as rl:
            rl.log(1, {"x": 1.0})
    warnings = [r for r in caplog.records if "TensorBoard logging skipped" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    assert not (tmp_path / "tensorboard").exists()
    assert read_metrics(tmp_path)[0]["x"] == 1.0


def test_wandb_missing_says_pip_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(
        ConfigError,
        match=r"wandb: 'offline' needs the wandb package.*pip install wandb, or set wandb=off",
    ):
        RunLogger(tmp_path, wandb="offline", use_tensorboard=False)


def test_wandb_receives_scalars(tmp_path, monkeypatch):
    calls: dict = {"log": [], "summary": {}}

    class FakeRun:
        summary = calls["summary"]

        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self, exit_code=None):
            calls["finished"] = exit_code

    def init(**kwargs):
        calls["init"] = kwargs
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    with RunLogger(
        tmp_path, {"a": 1}, use_tensorboard=False, wandb="offline", progress=False, run_name="r1"
    ) as rl:
        rl.log(4, {"reward_mean": 1, "tag": "x"})
        rl.write_summary({"final": 2.0})
    assert calls["init"] == {
        "project": "loomrl",
        "name": "r1",
        "dir": str(tmp_path),
        "config": {"a": 1},
        "mode": "offline",
    }
    assert calls["log"] == [(4, {"reward_mean": 1.0})]
    assert calls["summary"] == {"final": 2.0}
    assert calls["finished"] == 0
    # A run stopped by an error ends its W&B run as failed.
    with pytest.raises(RuntimeError, match="boom"):
        with RunLogger(tmp_path, use_tensorboard=False, wandb="offline", progress=False) as rl:
            rl.log(5, {"reward_mean": 1})
            raise RuntimeError("boom")
    assert calls["finished"] == 1


def test_progress_bar_forced_shows_eta_and_postfix(tmp_path, capsys):
    with RunLogger(tmp_path, use_tensorboard=False, total_steps=10, progress="always") as rl:
        rl.log(0, {"reward_mean": 0.1})
        rl.log(5, {"reward_mean": 0.25, "kl": 0.01})
        rl.echo("evaluating")
    err = capsys.readouterr().err
    assert "5/10" in err
    assert "reward_mean=0.25" in err
    assert "<" in err  # tqdm's "elapsed<remaining" ETA field
    assert "evaluating" in err


def test_progress_auto_is_off_without_tty(tmp_path, capsys):
    with RunLogger(tmp_path, use_tensorboard=False, total_steps=10, progress=True) as rl:
        rl.log(1, {"reward_mean": 0.1})
    assert capsys.readouterr().err == ""


def test_read_metrics_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.jsonl in"):
        read_metrics(tmp_path)


def test_runlog_does_not_import_torch():
    code = "import loomrl.runlog, loomrl.plots, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_set_aside_records_moves_only_what_a_run_wrote(tmp_path):
    from loomrl.checkpoint import list_checkpoints, save_checkpoint
    from loomrl.runlog import set_aside_records

    assert set_aside_records(tmp_path) is None  # nothing there
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "config.yaml").write_text("recipe: grpo\n")
    assert set_aside_records(tmp_path) is None  # a config alone is no earlier run
    (tmp_path / "metrics.jsonl").write_text("")
    assert set_aside_records(tmp_path) is None  # nor with the empty log of a failed start
    failed = {"status": "failed", "steps_done": 0, "error": "ConfigError: ..."}
    (tmp_path / "run_summary.json").write_text(json.dumps(failed))
    assert set_aside_records(tmp_path) is None  # nor with the summary of a failed start,
    assert not (tmp_path / "run_summary.json").exists()  # which goes, not to show as the new run's
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "timeline.jsonl").write_text('{"step": 0}\n')
    save_checkpoint(tmp_path, 2, {"step": 2})
    moved = set_aside_records(tmp_path)
    assert moved is not None and moved.parent == tmp_path and moved.name.startswith("before-")
    assert sorted(p.name for p in moved.iterdir()) == [
        "checkpoints",
        "config.yaml",
        "metrics.jsonl",
        "timeline.jsonl",
    ]
    assert (tmp_path / "notes.txt").read_text() == "mine"  # not the run's: stays
    assert list_checkpoints(tmp_path) == [] and [s for s, _ in list_checkpoints(moved)] == [2]
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    again = set_aside_records(tmp_path)  # a second one within the same second: its own place
    assert again is not None and again != moved
    (tmp_path / "run_summary.json").write_text(json.dumps({**failed, "steps_done": 2}))
    assert set_aside_records(tmp_path) is not None  # a run that failed after 2 steps was a run
    (tmp_path / "restarts.jsonl").write_text('{"restart": 1}\n')  # restarts: a run went too
    last = set_aside_records(tmp_path)
    assert last is not None and (last / "restarts.jsonl").exists()


def test_set_aside_records_keeps_a_config_other_than_the_new_runs(tmp_path):
    from loomrl.runlog import set_aside_records

    (tmp_path / "config.yaml").write_text("recipe: grpo\n")
    assert set_aside_records(tmp_path, config="recipe: grpo\n") is None  # its own: written again
    assert (tmp_path / "config.yaml").is_file()
    (tmp_path / "config.yaml").write_text("recipe: grpo  # mine\n")
    moved = set_aside_records(tmp_path, config="recipe: grpo\n")
    assert moved is not None and (moved / "config.yaml").read_text() == "recipe: grpo  # mine\n"
    assert not (tmp_path / "config.yaml").exists()


def test_trim_records_cuts_back_to_the_checkpoint_and_drops_torn_lines(tmp_path):
    from loomrl.runlog import read_metrics, trim_records

    rows = [{"step": s, "reward": s / 10} for s in (0, 1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "rew'
    )
    (tmp_path / "timeline.jsonl").write_text(
        "".join(json.dumps({"step": s, "measured_s": 1.0}) + "\n" for s in range(5))
    )
    (tmp_path / "adapt.jsonl").write_text(  # adaptation events name the iteration they follow
        "".join(json.dumps({"step": s, "action": "replan"}) + "\n" for s in (1, 3))
    )
    assert trim_records(tmp_path, 2) == {
        "metrics.jsonl": 3,
        "timeline.jsonl": 3,
        "adapt.jsonl": 1,
    }
    assert json.loads((tmp_path / "adapt.jsonl").read_text())["step"] == 1
    # tool events carry the metrics row they belong to (the step logged after them)
    (tmp_path / "tool_events.jsonl").write_text(
        "".join(json.dumps({"step": s, "phase": "train"}) + "\n" for s in (0, 1, 2, 3))
    )
    assert trim_records(tmp_path, 2) == {"tool_events.jsonl": 1}
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]  # rows of steps <= 2
    timeline = (tmp_path / "timeline.jsonl").read_text()
    assert [json.loads(x)["step"] for x in timeline.splitlines()] == [0, 1]  # iterations 0, 1
    assert timeline.endswith("\n")
    assert trim_records(tmp_path, 2) == {}  # nothing more to drop


def test_a_lock_file_that_cannot_be_made_is_a_config_error(tmp_path):
    """A run directory the lock file cannot be made in (one that is gone, or not writable) is
    said with the directory and the fix, not an OSError's traceback."""
    from loomrl.errors import ConfigError
    from loomrl.runlog import lock_run_dir

    with pytest.raises(ConfigError, match=r"gone: cannot hold its lock file .*give another"):
        lock_run_dir(tmp_path / "gone")


def test_a_restart_with_no_step_left_takes_its_logged_row_and_logs_no_second_one(tmp_path):
    from types import SimpleNamespace

    from loomrl.reasoning import opening_metrics
    from loomrl.runlog import read_metrics

    calls = []

    def measure():
        calls.append(1)
        return {"eval_accuracy": 0.25}

    with RunLogger(tmp_path, use_tensorboard=False, progress=False) as rl:
        run = SimpleNamespace(dir=tmp_path, logger=rl)
        assert opening_metrics(run, 0, 2, measure) == {"eval_accuracy": 0.25}  # fresh: logged
        rl.log(1, {"loss": 1.0})
        rl.log(2, {"loss": 0.5, "eval_accuracy": 0.75})
        assert opening_metrics(run, 1, 2, measure) == {}  # a resume with steps left: nothing
        # A restart after the last checkpoint: step 2's row stands, once.
        assert opening_metrics(run, 2, 2, measure) == {"loss": 0.5, "eval_accuracy": 0.75}
    assert len(calls) == 1
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    with RunLogger(tmp_path / "other", use_tensorboard=False, progress=False) as rl:
        run = SimpleNamespace(dir=tmp_path / "other", logger=rl)
        assert opening_metrics(run, 3, 3, measure) == {"eval_accuracy": 0.25}  # no row: measured
    assert len(calls) == 2
