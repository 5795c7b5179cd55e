"""``run_with_restarts``: what a dead worker leads to, with a recipe that fails on cue (no Ray)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from loomrl.cli import _normalise_overrides, load_recipe_config, prepare_run_dir, run_with_restarts
from loomrl.errors import WorkerDiedError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_grpo.yaml"


def _cfg(tmp_path: Path, *extra: str):
    return load_recipe_config(
        TINY, _normalise_overrides([f"output_dir={tmp_path}", "steps=4", *extra])
    )[1]


def _steps(path: Path) -> list[int]:
    return [json.loads(x)["step"] for x in path.read_text().splitlines()]


def _recipe(deaths: int, out: Path, rows: int):
    """A recipe whose first ``deaths`` attempts log ``rows`` steps (from step 0, or after the
    step-1 checkpoint when resumed), then lose a worker; the next one finishes. ``seen`` keeps
    each attempt's ``resume``."""
    seen: list[bool] = []

    def main(cfg):
        seen.append(cfg.resume)
        if len(seen) <= deaths:
            with open(out / "metrics.jsonl", "a") as f:
                for s in range(2 if cfg.resume else 0, rows):
                    f.write(json.dumps({"step": s}) + "\n")
            raise WorkerDiedError("rollout", 0, "here", "generate")
        return {"status": "finished"}

    return SimpleNamespace(main=main), seen


def test_a_worker_dead_before_the_first_checkpoint_restarts_at_step_0(tmp_path, capsys):
    cfg = _cfg(tmp_path, "run.max_restarts=1", "run.checkpoint_every=2")
    assert prepare_run_dir(cfg) is None
    mod, seen = _recipe(1, tmp_path, rows=2)
    assert run_with_restarts(mod, cfg) == {"status": "finished"}
    assert seen == [False, True]
    err = capsys.readouterr().err
    assert "no complete checkpoint in" in err and "restarting at step 0" in err
    # The failed attempt's rows (its opening evaluation's step 0 too) went with it.
    assert _steps(tmp_path / "metrics.jsonl") == []
    (row,) = (tmp_path / "restarts.jsonl").read_text().splitlines()
    assert "rollout rank 0" in json.loads(row)["error"]


def test_two_deaths_take_two_restarts_and_a_third_is_raised(tmp_path):
    from loomrl.checkpoint import save_checkpoint

    cfg = _cfg(tmp_path, "run.max_restarts=2", "run.checkpoint_every=1")
    assert prepare_run_dir(cfg) is None
    save_checkpoint(tmp_path, 1, {"step": 1})
    mod, seen = _recipe(2, tmp_path, rows=4)
    assert run_with_restarts(mod, cfg) == {"status": "finished"}
    assert seen == [False, True, True]
    assert _steps(tmp_path / "metrics.jsonl") == [0, 1]  # cut back to the step-1 checkpoint
    assert len((tmp_path / "restarts.jsonl").read_text().splitlines()) == 2
    mod, seen = _recipe(3, tmp_path, rows=1)
    with pytest.raises(WorkerDiedError, match="rollout rank 0"):
        run_with_restarts(mod, cfg)
    assert len(seen) == 3
