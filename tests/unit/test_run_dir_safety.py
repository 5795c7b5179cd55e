"""A run directory's files the user wrote, and `loomrl resume` on what is not a run directory
(no Ray)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomrl.cli import _normalise_overrides, load_recipe_config, main, prepare_run_dir
from loomrl.runlog import config_text

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_grpo.yaml"


def test_a_hand_written_config_in_the_run_directory_is_set_aside_not_written_over(
    tmp_path, capsys
):
    mine = TINY.read_text() + "# my notes\n"
    (tmp_path / "config.yaml").write_text(mine)
    overrides = _normalise_overrides([f"output_dir={tmp_path}", "steps=1"])
    cfg = load_recipe_config(tmp_path / "config.yaml", overrides)[1]  # read before the move
    assert prepare_run_dir(cfg) is None
    (aside,) = tmp_path.glob("before-*")
    assert (aside / "config.yaml").read_text() == mine
    assert not (tmp_path / "config.yaml").exists()
    err = capsys.readouterr().err
    assert f"{tmp_path / 'config.yaml'} is not this run's config" in err
    assert f"moved to {aside / 'config.yaml'}" in err


def test_the_config_this_run_writes_is_no_reason_to_set_anything_aside(tmp_path, capsys):
    cfg = load_recipe_config(TINY, _normalise_overrides([f"output_dir={tmp_path}"]))[1]
    (tmp_path / "config.yaml").write_text(config_text(cfg))  # a run that failed at its start
    assert prepare_run_dir(cfg) is None
    assert not list(tmp_path.glob("before-*")) and (tmp_path / "config.yaml").is_file()
    assert capsys.readouterr().err == ""
